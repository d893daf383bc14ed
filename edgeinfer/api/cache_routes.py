"""The prefix cache endpoints: statistics, pinning a prompt, unpinning."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgeinfer.api.body import read_json
from edgeinfer.api.fields import Body
from edgeinfer.api.messages import messages
from edgeinfer.api.respond import leases, pool
from edgeinfer.errors import InvalidRequest
from edgeinfer.service.request import ChatPrompt, GenerateRequest, TextPrompts, check_text_size
from edgeinfer.service.selection import model_named


def parse_pin(body: Any) -> tuple[str, tuple[dict[str, Any], ...] | None, str | None]:
    """POST /v1/cache/pin: (model, messages, prompt), exactly one of the last two."""
    b = Body(body, {"model", "messages", "prompt"})
    model = b.string("model", required=True)
    assert model is not None
    if b.present("messages") == b.present("prompt"):
        raise InvalidRequest("give exactly one of 'messages' or 'prompt'", param="messages")
    if b.present("messages"):
        return model, messages(b), None
    return model, None, b.string("prompt")


async def pin_prefix(request: Request) -> Response:
    """Keep a system prompt (messages) or a raw prompt resident in the prefix cache."""
    name, msgs, prompt = parse_pin(await read_json(request))
    served = await model_named(pool(request), name, leases(request))
    check_text_size(GenerateRequest(name, ChatPrompt(msgs) if msgs is not None else
                                    TextPrompts((prompt or "",))), served.n_ctx)
    if msgs is not None:
        tokens = await served.run(served.system_prefix, [dict(m) for m in msgs])
    else:
        assert prompt is not None
        tokens = await served.run(served.tokenize_text, prompt)
    n = await served.pin(tokens, runtime=True)
    return JSONResponse({"object": "cache.pin", "model": served.cfg.id, "tokens": n})


async def unpin_prefixes(request: Request) -> Response:
    """DELETE /v1/cache/pins?model=ID: unpin every prefix of that model (of one not loaded,
    the run-time pins' files are removed)."""
    name = request.query_params.get("model")
    if not name:
        raise InvalidRequest("name the model: DELETE /v1/cache/pins?model=ID", param="model")
    return JSONResponse({"object": "cache.unpin", "model": await pool(request).unpin_all(name)})


async def cache_stats(request: Request) -> Response:
    """Per loaded model: the KV-cache tier, and the disk tier of pinned prefixes
    (``disk``: null when it is off)."""
    return JSONResponse({"object": "list", "data": [
        {"model": mid, **m.engine.stats_snapshot()["prefix_cache"],  # type: ignore[dict-item]
         "disk": m.prefix_store.snapshot() if m.prefix_store is not None else None}
        for mid, m in pool(request).models.items()]})
