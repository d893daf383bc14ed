"""Operations endpoints: liveness and readiness, metrics, slots, OpenAPI, the chat page."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from edgeinfer.api.lifecycle import Lifecycle, Phase, liveness, readiness
from edgeinfer.api.openapi import openapi_spec
from edgeinfer.api.respond import pool

CHAT_PAGE = Path(__file__).resolve().parent / "static" / "chat.html"


def lifecycle(request: Request) -> Lifecycle:
    life = request.app.state.lifecycle
    assert isinstance(life, Lifecycle)
    return life


async def health(request: Request) -> Response:
    """Liveness (see ``lifecycle``): 200 while the server answers and nothing is wedged,
    loading and draining included; ``status`` says which (``ok`` once serving)."""
    p, life = pool(request), lifecycle(request)
    models = {mid: m.engine.stats_snapshot() for mid, m in p.models.items()}
    problems = liveness(life, p)
    status = "error" if problems else "ok" if life.phase is Phase.SERVING else life.phase.value
    body: dict[str, object] = {"status": status, "models": models}
    if problems:
        body["reasons"] = problems
    return JSONResponse(body, status_code=503 if problems else 200)


async def ready(request: Request) -> Response:
    """Readiness (see ``lifecycle``): 200 when the server should get requests, else 503
    with the reasons (loading, a start-up model that failed, draining)."""
    p, life = pool(request), lifecycle(request)
    reasons = readiness(life, p)
    return JSONResponse({
        "status": "ready" if not reasons else life.phase.value, "reasons": reasons,
        "models": {mid: e.state.value for mid, e in p.entries.items()}},
        status_code=503 if reasons else 200)


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
