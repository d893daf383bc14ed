"""What crosses the engine boundary back to the event loop: typed output pieces.

A request's output is a sequence of ``Delta`` values; the last one has
``finish_reason`` set. A request the engine could not complete ends with
``finish_reason == "error"`` and a ``Failure`` saying why, as a code the layers
above map to their own errors (never a string to be parsed).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from edgeinfer.engine.logprobs import TokenLogprob


class FailureCode(StrEnum):
    TIMEOUT = "timeout"  # the request's time limit passed
    SHUTDOWN = "shutdown"  # the engine stopped (server shutting down, model unloaded)
    KV_FULL = "kv_cache_full"  # no KV cells left for this request
    DECODE = "decode_error"  # llama_decode failed for the batch
    SAMPLER = "sampler_error"  # the request's sampler could not be built
    GRAMMAR = "grammar_dead_end"  # its grammar allows no token the model can write
    INTERNAL = "internal_error"  # a bug, contained to this request


@dataclass(frozen=True, slots=True)
class Failure:
    code: FailureCode
    message: str


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of one request's output, delivered on the event loop.

    The last delta of a request has ``finish_reason`` set ("stop", "length",
    or "error" with ``failure`` saying why).
    """

    text: str
    tokens: tuple[int, ...] = ()
    finish_reason: str | None = None
    failure: Failure | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    timings: dict[str, float] | None = None
    logprob: TokenLogprob | None = None  # of the token in ``tokens``, when asked for
    stop_word: str | None = None  # the stop string that ended the request, if one did
