"""Embeddings of texts or token lists, from the model's separate embedding context."""

from __future__ import annotations

import math
from dataclasses import dataclass

from edgeinfer.errors import InvalidRequest
from edgeinfer.models.lease import Lease
from edgeinfer.models.pool import ModelPool
from edgeinfer.service.request import EmbedRequest, check_chars
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
        if isinstance(x, str):  # (before seconds of tokenizing a text that cannot fit)
            check_chars(len(x), served.embedder.n_ctx, "input")
        inputs.append(await served.run(served.tokenize_text, x) if isinstance(x, str) else x)
    vectors = await served.embedder.embed(inputs)
    return Embeddings(served.cfg.id, vectors, sum(len(t) for t in inputs))


def shortened(vectors: list[list[float]], dimensions: int) -> list[list[float]]:
    """The first ``dimensions`` numbers of each vector, L2-normalised again, as OpenAI's
    ``dimensions`` and Ollama's shorten embeddings (meaningful for models trained for it,
    Matryoshka style; a vector no longer than that is returned as it is)."""
    out = []
    for v in vectors:
        if len(v) <= dimensions:
            out.append(v)
            continue
        head = v[:dimensions]
        norm = math.sqrt(sum(x * x for x in head))
        out.append([x / norm for x in head] if norm > 0 else head)
    return out
