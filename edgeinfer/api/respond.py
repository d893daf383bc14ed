"""Running a generation for an HTTP request: leases, streaming or one body, disconnects."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgeinfer.api.openai_render import CompletionMeta, Stream, collect, sse_chunks
from edgeinfer.models.pool import ModelPool
from edgeinfer.models.served import Lease
from edgeinfer.service.generation import generate
from edgeinfer.service.request import GenerateRequest

LEASES = "edgeinfer.leases"


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


async def respond(request: Request, req: GenerateRequest, meta: CompletionMeta, stream: bool,
                  include_usage: bool) -> Response:
    """Generate ``req`` and answer in OpenAI's shape (``meta.kind``: chat or text)."""
    gen = await generate(pool(request), req, leases(request), meta.id)
    meta.model, meta.piece = gen.model, gen.piece
    if stream:
        return Stream(sse_chunks(meta, gen.events, gen.num_choices, include_usage), ping=10,
                      sep="\n", send_timeout=request.app.state.send_timeout)
    work: asyncio.Future[dict[str, Any]] = asyncio.ensure_future(
        collect(meta, gen.events, gen.num_choices))
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not work.done():  # the client went away: abort the generation, free its slots
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return Response(status_code=499)
    return JSONResponse(work.result())
