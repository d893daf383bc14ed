"""The model endpoints: list, describe, load and unload (GET/POST /v1/models...)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgeinfer.api import anthropic_models
from edgeinfer.api.respond import pool
from edgeinfer.errors import Conflict, MethodNotAllowed
from edgeinfer.models.pool import ModelState, PoolEntry
from edgeinfer.prompt.reasoning import splits


def model_card(entry: PoolEntry) -> dict[str, Any]:
    cfg, served = entry.cfg, entry.served
    card: dict[str, Any] = {
        "id": cfg.id, "object": "model", "created": entry.created,
        "owned_by": "edgeinfer", "aliases": list(cfg.aliases), "tags": list(cfg.tags),
        "state": entry.state.value, "runs_on": "gpu" if cfg.gpu_layers else "cpu",
    }
    if entry.error:
        card["error"] = entry.error
    if served is not None:
        info = served.runtime.info
        card["meta"] = {"description": info.description, "n_ctx": info.n_ctx,
                        "n_ctx_train": info.n_ctx_train, "n_vocab": info.n_vocab,
                        "slots": served.cfg.slots, "size_bytes": info.size_bytes,
                        "memory_bytes": served.runtime.memory_bytes(),
                        "tool_format": served.tool_format.name,
                        "reasoning_format": cfg.reasoning_format,
                        "splits_reasoning": splits(cfg.reasoning_format,
                                                   served.template.source)}
    return card


async def list_models(request: Request) -> Response:
    entries = list(pool(request).entries.values())
    if anthropic_models.wanted(request):
        return JSONResponse(anthropic_models.models_page(entries, request.query_params))
    return JSONResponse({"object": "list", "data": [model_card(e) for e in entries]})


async def get_model(request: Request) -> Response:
    p = pool(request)
    name = request.path_params["model_id"]
    action = name.rpartition("/")[2]
    if action in ("load", "unload") and not p.knows(name):
        raise MethodNotAllowed(f"use POST to {action} a model", code="method_not_allowed",
                               headers={"Allow": "POST"})
    entry = p.entries[p.resolve(name)]
    if anthropic_models.wanted(request):
        return JSONResponse(anthropic_models.model_object(entry))
    return JSONResponse(model_card(entry))


async def load_model(request: Request) -> Response:
    """POST /v1/models/{id}/load: load now (waits until loaded or failed)."""
    p = pool(request)
    model_id = p.resolve(request.path_params["model_id"])
    await p.retry(model_id)  # a model that failed is tried again
    return JSONResponse(model_card(p.entries[model_id]))


async def unload_model(request: Request) -> Response:
    """POST /v1/models/{id}/unload: free it; 409 while anything uses it or it loads."""
    p = pool(request)
    model_id = p.resolve(request.path_params["model_id"])
    entry = p.entries[model_id]
    if entry.state is ModelState.LOADING:
        raise Conflict(f"the model '{model_id}' is loading; unload it once it has loaded",
                       code="model_loading")
    if entry.served is not None and not await p.unload(model_id):
        raise Conflict(f"the model '{model_id}' is serving requests", code="model_busy")
    return JSONResponse(model_card(entry))
