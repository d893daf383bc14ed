"""What the ingress and an engine replica pass each other through a DeploymentHandle.

The ingress sends one ``Envelope`` (the HTTP request, read whole, and its prefix key);
the engine replica answers with a stream: a ``Head`` (status, headers and the first
body bytes), then the rest of the body as ``bytes``. A response whose body is complete
in its head (every non-streaming answer) is therefore one message: if the replica dies
before sending it, nothing reached the client and the ingress may try another replica.

``call_app`` runs an ASGI app for one envelope in memory; ``stream_error`` is the
last piece of a stream cut by a replica's death, in the stream's own dialect.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from edgeinfer.api.errors import ANTHROPIC_PREFIX, shape
from edgeinfer.errors import APIError

Message = MutableMapping[str, Any]
ASGIApp = Callable[[Message, Callable[[], Awaitable[Message]],
                    Callable[[Message], Awaitable[None]]], Awaitable[None]]
Headers = tuple[tuple[bytes, bytes], ...]
REPLICA_HEADER = b"x-edgeinfer-replica"
RESPONSES_PREFIX = "/v1/responses"
log = logging.getLogger("edgeinfer.cluster")


@dataclass(frozen=True, slots=True)
class Envelope:
    """One HTTP request, body included, as the ingress received it.

    ``prefix``: the prompt's block hashes (``edgeinfer.cluster.prefix``), read by the
    request router; empty for requests that are not generations.
    """

    method: str
    path: str
    query: bytes
    headers: Headers
    body: bytes
    prefix: tuple[int, ...] = ()
    client: tuple[str, int] | None = None
    scheme: str = "http"


@dataclass(frozen=True, slots=True)
class Head:
    """The start of a response: ``done`` when ``body`` is all of it."""

    status: int
    headers: Headers
    body: bytes
    done: bool


def _scope(env: Envelope) -> Message:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": env.method, "scheme": env.scheme,
            "path": env.path, "raw_path": env.path.encode(), "root_path": "",
            "query_string": env.query, "headers": list(env.headers), "client": env.client,
            "server": None, "state": {}}


async def call_app(app: ASGIApp, env: Envelope, replica: str = "") -> AsyncIterator[Head | bytes]:
    """Run ``app`` on ``env``: yields a ``Head``, then body pieces, until the body ends.

    Closing the generator early (the client went away) tells the app the client
    disconnected and cancels it, which aborts the request in the engine.
    """
    queue: asyncio.Queue[Message | None] = asyncio.Queue()
    gone = asyncio.Event()
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": env.body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def run() -> None:
        try:
            await app(_scope(env), receive, queue.put)
        finally:
            queue.put_nowait(None)

    task = asyncio.create_task(run())
    finished = False
    try:
        async for part in _parts(queue, replica):
            yield part
        finished = True
        try:
            await task
        except Exception:  # the app already answered (a 500 for its own errors)
            log.exception("the app failed after its response on %s", env.path)
    finally:
        if not finished:
            gone.set()
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


async def _parts(queue: asyncio.Queue[Message | None],
                 replica: str) -> AsyncIterator[Head | bytes]:
    start: Message | None = None
    while (msg := await queue.get()) is not None:
        if msg["type"] == "http.response.start":
            start = msg
            continue
        if msg["type"] != "http.response.body":
            continue
        body, more = bytes(msg.get("body", b"")), bool(msg.get("more_body", False))
        if start is not None:
            headers = (*((bytes(k), bytes(v)) for k, v in start.get("headers", ())),
                       (REPLICA_HEADER, replica.encode()))
            yield Head(int(start["status"]), headers, body, not more)
            start = None
        elif body:
            yield body
        if not more:
            return
    raise RuntimeError("the app ended without a complete response")


def stream_error(path: str, content_type: str, exc: APIError) -> bytes:
    """The piece that ends a stream cut short, in the dialect of ``path``."""
    body = shape(exc, path)
    if content_type.startswith("application/x-ndjson"):
        return json.dumps(body).encode() + b"\n"
    if path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/"):
        return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"
    if path.startswith(RESPONSES_PREFIX):
        err = body["error"]
        event = {"type": "error", "code": err.get("code") or err.get("type"),
                 "message": err["message"], "param": None}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
    return b"data: " + json.dumps(body).encode() + b"\n\n"
