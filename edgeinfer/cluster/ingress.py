"""The ingress deployment: Ray Serve's proxy hands it HTTP requests; it forwards them.

It reads the body (bounded like the app's own limit), computes the prefix key, and
calls the engine deployment with ``handle.options(stream=True)``, so the engine
deployment's request router sees the key. The answer streams back as it comes.

Faults: if the engine replica dies before its response started, the request is sent
again (``retries`` times) to another replica; if it dies mid-stream, the stream ends
with an error event in its dialect; either way the client gets a clean error, never
a hang. A client that goes away cancels the call on the replica.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

from ray.exceptions import RayActorError, RayError
from ray.serve.exceptions import BackPressureError, RayServeException, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from edgeinfer.api.body import read_bytes
from edgeinfer.api.errors import error_response
from edgeinfer.cluster.exchange import Envelope, Head, stream_error
from edgeinfer.cluster.prefix import prefix_key
from edgeinfer.errors import APIError, Overloaded, ServerError, Unavailable

log = logging.getLogger("edgeinfer.cluster")


def app_path(scope: Mapping[str, Any]) -> str:
    """The request's path inside the application (Serve's route prefix removed)."""
    path, root = str(scope.get("path", "/")), str(scope.get("root_path", ""))
    if root and path.startswith(root):
        path = path[len(root):]
    return path or "/"




class IngressForwarder:
    """The HTTP entry of the application; see the module docstring."""

    def __init__(self, engine: DeploymentHandle[Any], retries: int = 1) -> None:
        self.engine = engine.options(method_name="handle", stream=True)
        self.retries = retries

    async def __call__(self, request: Request) -> Response:
        path = app_path(request.scope)
        try:
            body = await read_bytes(request)
        except APIError as exc:
            return error_response(exc, path)
        client = request.client
        env = Envelope(request.method, path, request.scope.get("query_string", b""),
                       tuple((bytes(k), bytes(v)) for k, v in request.scope["headers"]),
                       body, prefix_key(request.method, path, body),
                       (client.host, client.port) if client else None,
                       request.url.scheme)
        return await self.forward(env)

    async def _first(self, env: Envelope) -> tuple[Head, DeploymentResponseGenerator[Any]]:
        """The head of the answer, sending the request again if a replica dies first."""
        for attempt in range(self.retries + 1):
            gen = cast(DeploymentResponseGenerator[Any], self.engine.remote(env))
            try:
                head = await gen.__anext__()
                assert isinstance(head, Head)
                return head, gen
            except (RayActorError, ReplicaUnavailableError) as exc:
                gen.cancel()  # type: ignore[no-untyped-call]
                log.warning("%s %s: replica died before answering (attempt %d): %s",
                            env.method, env.path, attempt + 1, type(exc).__name__)
        raise Unavailable("the replica serving this request stopped; try again",
                          code="replica_died", retry_after=1)

    async def forward(self, env: Envelope) -> Response:
        try:
            head, gen = await self._first(env)
        except APIError as exc:
            return error_response(exc, env.path)
        except BackPressureError:
            return error_response(Overloaded("all replicas are busy", 1), env.path)
        except (RayError, RayServeException) as exc:
            log.error("%s %s failed: %s", env.method, env.path, exc)
            return error_response(ServerError("the replica failed", code="replica_error"),
                                  env.path)
        response: Response
        if head.done:
            response = Response(head.body, status_code=head.status)
        else:
            response = StreamingResponse(self._rest(env.path, head, gen),
                                         status_code=head.status)
        # Serve's proxy sends x-request-id itself, the id the replica's app got as ours
        response.raw_headers = [(k, v) for k, v in head.headers if k != b"x-request-id"]
        return response

    async def _rest(self, path: str, head: Head,
                    gen: DeploymentResponseGenerator[Any]) -> AsyncIterator[bytes]:
        content_type = dict(head.headers).get(b"content-type", b"").decode("latin-1")
        ended = False
        try:
            if head.body:
                yield head.body
            async for piece in gen:
                yield piece
            ended = True
        except (RayError, RayServeException) as exc:
            ended = True
            log.warning("%s: stream cut by a replica failure: %s", path, type(exc).__name__)
            yield stream_error(path, content_type, Unavailable(
                "the replica serving this request stopped; try again", code="replica_died"))
        finally:
            if not ended:
                gen.cancel()  # type: ignore[no-untyped-call]  # the client went away: stop the generation on the replica
