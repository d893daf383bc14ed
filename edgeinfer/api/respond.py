"""Running a generation for an HTTP request: leases, streaming or one body, disconnects.

Every dialect uses ``start`` (the service's ``generate`` with this request's pool and
leases), ``unless_disconnected`` (a whole answer, abandoned when the client goes away)
and ``sse`` (a server-sent event stream with keep-alive pings and the send timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sse_starlette import ServerSentEvent
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgeinfer.api.openai_render import CompletionMeta, Stream, collect, sse_chunks
from edgeinfer.errors import InvalidRequest
from edgeinfer.models.lease import Lease
from edgeinfer.models.pool import ModelPool
from edgeinfer.service.events import Event, UsageReport
from edgeinfer.service.generation import Generation, generate, prompt_fits
from edgeinfer.service.request import GenerateRequest

LEASES = "edgeinfer.leases"
CLIENT_GONE = 499  # nginx's status for a request whose client closed the connection
PING_SECONDS = 10  # a stream that sends nothing for this long gets a keep-alive
T = TypeVar("T")
Save = Callable[[dict[str, Any]], Awaitable[None]]


def leases(request: Request) -> list[Lease]:
    """This request's model leases, given back once its response has been sent (by
    ``middleware.ReleaseLeases``), so a model is never freed under a stream."""
    held: list[Lease] = request.scope[LEASES]
    return held


def pool(request: Request) -> ModelPool:
    p: ModelPool = request.app.state.pool
    return p


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def start(request: Request, req: GenerateRequest, request_id: str) -> Generation:
    """Start ``req`` on this request's pool, its leases held until the response is sent."""
    return await generate(pool(request), req, leases(request), request_id)


def turn_cuts(messages: Sequence[dict[str, Any]]) -> list[int]:
    """Where a conversation too long for the context may be cut, from keeping everything
    to keeping least: 0 (nothing dropped), then before each user message after the first
    message (the last one always stays)."""
    return [0, *(i for i, m in enumerate(messages) if i > 0 and m["role"] == "user")]


async def start_fitting(request: Request, cuts: list[int],
                        request_at: Callable[[int], GenerateRequest],
                        request_id: str) -> tuple[Generation, int]:
    """Start ``request_at(cut)`` for the first of ``cuts`` whose prompt fits the context
    (the last cut's error when none fits); returns the generation and that cut. Fewer
    turns never make a longer prompt, so the first fitting cut is searched from the end
    (1, 2, 4, ... turns kept, then halving): few prompts are rendered, the short ones."""
    try:
        return await start(request, request_at(cuts[0]), request_id), cuts[0]
    except InvalidRequest as exc:
        if exc.code != "context_length_exceeded" or len(cuts) == 1:
            raise
    bad, good, step = 0, len(cuts) - 1, 1  # cuts[bad] does not fit; cuts[good] is tried
    while good - bad > 1:
        i = max(good - step, bad + 1) if step else (bad + good) // 2
        if await prompt_fits(pool(request), request_at(cuts[i]), leases(request)):
            good, step = i, step * 2 if step else 0
        else:
            bad, step = i, 0  # from here on, halving between the two
    for cut in cuts[good:]:  # (the probes and the start may meet other models: "auto",
        try:  # a fallback with another context; then the next cuts, one by one)
            return await start(request, request_at(cut), request_id), cut
        except InvalidRequest as exc:
            if exc.code != "context_length_exceeded" or cut == cuts[-1]:
                raise
    raise AssertionError("unreachable")


def sse(request: Request, events: AsyncIterator[dict[str, str]],
        ping: Callable[[], ServerSentEvent] | None = None) -> Stream:
    """Server-sent events (``{"event": ..., "data": ...}`` dicts), pinged every 10 s (a
    comment, or ``ping()``'s event) and closed when the client stops reading for the
    server's ``send_timeout``."""
    return Stream(events, ping=PING_SECONDS, sep="\n",
                  send_timeout=request.app.state.send_timeout, ping_message_factory=ping)


async def json_response(content: Any, **kwargs: Any) -> Response:
    """A JSON response made in a worker thread, as starlette's JSONResponse writes it. A
    large one (2,048 embeddings) is seconds of encoding: in one ``json.dumps`` call, which
    holds the GIL throughout, every other request and /health would wait for it, so
    objects and lists of objects are encoded part by part (``_encoded``)."""
    return Response(await asyncio.to_thread(_encoded, content), media_type="application/json",
                    **kwargs)


def _encoded(value: Any) -> bytes:
    if isinstance(value, dict):
        return b"{" + b",".join(_encoded(str(k)) + b":" + _encoded(v)
                                for k, v in value.items()) + b"}"
    if isinstance(value, list) and value and isinstance(value[0], dict | list):
        return b"[" + b",".join(map(_encoded, value)) + b"]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode()


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """The result of ``work``, or None when the client disconnected first (then ``work``
    is cancelled, which aborts its generation and frees its slots)."""
    task: asyncio.Future[T] = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        both: list[asyncio.Future[Any]] = [task, watcher]
        await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
    return task.result()


async def respond(request: Request, req: GenerateRequest, meta: CompletionMeta, stream: bool,
                  include_usage: bool, save: Save | None = None) -> Response:
    """Generate ``req`` and answer in OpenAI's shape (``meta.kind``: chat or text);
    ``save`` gets the whole body once it is answered (a stream's, once it has ended)."""
    gen = await start(request, req, meta.id)
    meta.model, meta.piece = gen.model, gen.piece
    meta.logprobs = req.params.logprobs is not None
    if stream:
        events = gen.events if save is None else _saved(meta, gen.events, gen.num_choices, save)
        return sse(request, sse_chunks(meta, events, gen.num_choices, include_usage))
    body = await unless_disconnected(request, collect(meta, gen.events, gen.num_choices))
    if body is None:
        return Response(status_code=CLIENT_GONE)
    if save is not None:
        await save(body)
    return JSONResponse(body)


async def _saved(meta: CompletionMeta, events: AsyncIterator[Event], num_choices: int,
                 save: Save) -> AsyncIterator[Event]:
    """``events`` passed on; after the last (the usage), the whole body they make is saved.
    A stream ended early (an error, the client gone) saves nothing."""
    seen: list[Event] = []
    try:
        async for e in events:
            seen.append(e)
            yield e
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    if seen and isinstance(seen[-1], UsageReport):
        await save(await collect(meta, _replay(seen), num_choices))


async def _replay(events: list[Event]) -> AsyncIterator[Event]:
    for e in events:
        yield e
