"""Embeddings of texts or token lists, from the model's separate embedding context."""

from __future__ import annotations

from dataclasses import dataclass

from edgeinfer.errors import InvalidRequest
from edgeinfer.models.lease import Lease
from edgeinfer.models.pool import ModelPool
from edgeinfer.service.request import EmbedRequest
from edgeinfer.service.selection import model_for


@dataclass(frozen=True, slots=True)
class Embeddings:
    model: str
    vectors: list[list[float]]
    tokens: int  # input tokens, all inputs together


async def embed(pool: ModelPool, req: EmbedRequest, leases: list[Lease]) -> Embeddings:
    served = await model_for(pool, req.model, leases)
    n_vocab = served.runtime.info.n_vocab
    inputs: list[list[int]] = []
    for x in req.inputs:
        if isinstance(x, list) and any(t >= n_vocab for t in x):
            raise InvalidRequest(f"'input' token ids must be in 0..{n_vocab - 1}", param="input")
        inputs.append(await served.run(served.tokenize_text, x) if isinstance(x, str) else x)
    vectors = await served.embedder.embed(inputs)
    return Embeddings(served.cfg.id, vectors, sum(len(t) for t in inputs))
