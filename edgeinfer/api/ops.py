"""Operations endpoints: health, metrics, slots, the OpenAPI description, the chat page."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from edgeinfer.api.openapi import openapi_spec
from edgeinfer.api.respond import pool

CHAT_PAGE = Path(__file__).resolve().parent / "static" / "chat.html"


async def health(request: Request) -> Response:
    p = pool(request)
    models = {mid: m.engine.stats_snapshot() for mid, m in p.models.items()}
    ok = bool(models) and all(m.engine.is_running for m in p.models.values())
    return JSONResponse({"status": "ok" if ok else "error", "models": models},
                        status_code=200 if ok else 503)


async def openapi(request: Request) -> Response:
    return JSONResponse(openapi_spec())


async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def slots(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [
        {"model": mid, "slots": m.engine.slots_snapshot()}
        for mid, m in pool(request).models.items()]})


async def chat_page(request: Request) -> Response:
    return HTMLResponse(CHAT_PAGE.read_text(encoding="utf-8"))
