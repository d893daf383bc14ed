"""Which loaded model answers a request: routing ("auto"), fallback, admission, leases."""

from __future__ import annotations

import logging

from edgeinfer.errors import APIError, NotFound, Overloaded, Unavailable
from edgeinfer.models.lease import Lease
from edgeinfer.models.pool import ModelPool
from edgeinfer.models.routing import Features, route
from edgeinfer.models.served import ServedModel
from edgeinfer.service.request import ChatPrompt, GenerateRequest, MixedPrompt

log = logging.getLogger("edgeinfer.service")


def features(req: GenerateRequest) -> Features:
    """What the routing rules look at: tools offered, the prompt text, max_tokens."""
    texts: list[str] = []
    if isinstance(req.prompt, ChatPrompt):
        texts = [m.get("content") or "" for m in req.prompt.messages]
    else:
        texts = [t for p in req.prompt.prompts
                 for t in ((p,) if isinstance(p, str) else p.parts if isinstance(p, MixedPrompt)
                           else ()) if isinstance(t, str)]
    return Features(bool(req.constraint.tools), "\n".join(texts), req.params.max_tokens or 0)


def hold(leases: list[Lease], served: ServedModel) -> ServedModel:
    """Lease ``served`` for the caller (it gives the leases back when done)."""
    leases.append(served.lease())
    return served


def _served(pool: ModelPool, names: tuple[str, ...] | list[str]) -> list[str]:
    """The ids of those names this server serves (``serve --model`` keeps one model, and
    its fallbacks in models.toml name others)."""
    out = []
    for name in names:
        try:
            out.append(pool.resolve(name))
        except NotFound:
            continue
    return out


class NoneLeft(LookupError):
    """``model_for`` was told to skip every model of the chain."""


async def model_for(pool: ModelPool, name: str, leases: list[Lease], *, choices: int = 1,
                    routing: Features | None = None, wait: bool = True,
                    skip: tuple[str, ...] = ()) -> ServedModel:
    """The model that answers: the one named (or routed by ``routing``, for "auto"), or the
    first of its fallbacks when it is saturated (429) or unavailable (503). Admission is
    checked for ``choices`` engine requests; the model is leased into ``leases``. The
    models in ``skip`` are passed over (found saturated since); NoneLeft when that is all."""
    if name == "auto":
        name = route(pool.config.routing, list(pool.config.models),
                     routing or Features(False, "", 0))
    first = pool.resolve(name or pool.config.models[0].id)  # "": left out by the client
    chain = [m for m in [first, *_served(pool, pool.entries[first].cfg.fallback)]
             if m not in skip]
    if not chain:
        raise NoneLeft(name)
    first_error: APIError | None = None
    for model_id in chain:
        try:
            served = await pool.acquire(model_id, wait=wait)
            served.admit(choices)  # raises Overloaded when the queue is full
            return hold(leases, served)
        except (Overloaded, Unavailable) as exc:
            first_error = first_error or exc  # (the model asked for is the one named)
            if model_id != chain[-1]:
                log.info("model %s unavailable (%s): falling back", model_id, exc.code)
    assert first_error is not None
    raise first_error


async def model_named(pool: ModelPool, name: str | None, leases: list[Lease]) -> ServedModel:
    """A model by name (the first configured one when None), loaded and leased."""
    return hold(leases, await pool.acquire(name if name is not None
                                           else pool.config.models[0].id))
