"""Log-probabilities of a token distribution, from one row of llama.cpp logits."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """The sampled token's log-probability and the ``top`` most likely alternatives."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def token_logprob(row: npt.NDArray[np.float32], token: int, k: int) -> TokenLogprob:
    """log-softmax of ``row`` at ``token``, and the top ``k`` (token, logprob), best first.

    Computed in float64 from the raw logits (before any sampler changed them),
    as OpenAI reports the model's distribution.
    """
    x = row.astype(np.float64)
    m = float(x.max())
    lse = m + float(np.log(np.exp(x - m).sum()))
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        k = min(k, x.shape[0])
        idx = np.argpartition(-x, k - 1)[:k]
        idx = idx[np.argsort(-x[idx], kind="stable")]
        top = tuple((int(i), float(x[i] - lse)) for i in idx)
    return TokenLogprob(token, float(x[token] - lse), top)
