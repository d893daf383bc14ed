"""ASGI middleware of the app besides the front door (``guard``): request ids, request
counting for /metrics and the release of the model leases a request took."""

from __future__ import annotations

import re
import uuid
from typing import Any

from edgeinfer.api.metrics import Metrics
from edgeinfer.api.respond import LEASES
from edgeinfer.models.lease import Lease


class CountRequests:
    """Requests by route and status, for /metrics."""

    def __init__(self, app: Any, metrics: Metrics, routes: set[str]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def wrapped(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, wrapped)
        finally:
            route = scope["path"] if scope["path"] in self.routes else "other"
            self.metrics.requests.labels(route, str(status[0])).inc()


class HttpOnly:
    """A middleware that sees HTTP requests only (``http``); the rest pass through."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Any, receive: Any, send: Any) -> None:
        raise NotImplementedError


class ReleaseLeases(HttpOnly):
    """Gives back the model leases a request took, once its whole response (a stream
    included) has been sent or abandoned: a model is never freed under a request."""

    async def http(self, scope: Any, receive: Any, send: Any) -> None:
        leases: list[Lease] = []
        scope[LEASES] = leases
        try:
            await self.app(scope, receive, send)
        finally:
            for lease in leases:
                lease.release()


_CLIENT_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")


class RequestIds(HttpOnly):
    """An ``x-request-id`` header on every response, as OpenAI's API sends (its SDKs show it
    as ``_request_id``), and the same as ``request-id``, which Anthropic's SDK reads: the
    client's own when it sent a plain one, else ``req_`` and a random hex."""

    async def http(self, scope: Any, receive: Any, send: Any) -> None:
        given = dict(scope.get("headers") or ()).get(b"x-request-id", b"")
        rid = given if _CLIENT_ID.fullmatch(given) else f"req_{uuid.uuid4().hex}".encode()

        async def wrapped(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()),
                                                   (b"x-request-id", rid),
                                                   (b"request-id", rid)]}
            await send(message)

        await self.app(scope, receive, wrapped)
