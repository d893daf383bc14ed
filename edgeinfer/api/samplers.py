"""llama-server's request fields beyond OpenAI's, as the llama.cpp web UI, SillyTavern and
other llama.cpp clients send them to /v1/chat/completions and /v1/completions.

- Samplers, honoured in llama-server's chain order (``engine.sampler``): DRY
  (``dry_multiplier`` > 0, ``dry_base``, ``dry_allowed_length``, ``dry_penalty_last_n``,
  ``dry_sequence_breakers``), ``top_n_sigma``, ``typical_p``, XTC (``xtc_probability``,
  ``xtc_threshold``), dynamic temperature (``dynatemp_range``, ``dynatemp_exponent``) and
  Mirostat (``mirostat`` 1 or 2, ``mirostat_tau``, ``mirostat_eta``). At their defaults
  they are off, as in llama-server.
- Aliases: ``n_predict`` (llama-server's ``max_tokens``; -1 and -2: no limit; on chat
  read first, as llama-server reads it, and ``max_tokens`` -1 or -2 is no limit there too:
  ``max_tokens``) and vLLM's ``repetition_penalty`` (``repeat_penalty``, taken when that is
  absent).
- Hints about llama-server's own reporting and slots (``HINTS``: ``timings_per_token``,
  ``id_slot``, ``samplers`` ...), accepted when their type is right and ignored: the
  answer is the same without them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from edgeinfer.api import fields
from edgeinfer.api.fields import MAX_TOKENS_LIMIT, Body
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.errors import InvalidRequest

_NUM = "number"
_INT = "integer"
# name -> (kind, lowest, highest): the sampler fields SamplingParams takes as they are
RANGES: dict[str, tuple[str, float, float]] = {
    "dry_multiplier": (_NUM, 0.0, 100.0), "dry_base": (_NUM, 0.0, 100.0),
    "dry_allowed_length": (_INT, 0, 1 << 16), "dry_penalty_last_n": (_INT, -1, 1 << 20),
    "top_n_sigma": (_NUM, -1.0, 100.0), "typical_p": (_NUM, 0.0, 1.0),
    "xtc_probability": (_NUM, 0.0, 1.0), "xtc_threshold": (_NUM, 0.0, 1.0),
    "dynatemp_range": (_NUM, 0.0, 10.0), "dynatemp_exponent": (_NUM, 0.0, 10.0),
    "mirostat": (_INT, 0, 2), "mirostat_tau": (_NUM, 0.0, 100.0),
    "mirostat_eta": (_NUM, 0.0, 10.0),
}
MAX_BREAKERS = 8
MAX_BREAKER_LEN = 16  # a long breaker costs its sampler seconds to build (llama.cpp)
# accepted and ignored: name -> the JSON types it may have
HINTS: dict[str, tuple[type, ...]] = {
    "timings_per_token": (bool,), "return_progress": (bool,), "post_sampling_probs": (bool,),
    "return_tokens": (bool,), "include_reasoning": (bool,), "id_slot": (int,),
    "t_max_predict_ms": (int,), "t_max_prompt_ms": (int,), "n_probs": (int,),
    "samplers": (list, str), "n_cache_reuse": (int,),  # (llama.vim, llama.nvim, ...)
    # llama.cpp's web UI: typ_p (llama-server reads typical_p), backend_sampling
    "typ_p": (float, int), "backend_sampling": (bool,),
}
ALIASES = ("n_predict", "repetition_penalty")
NAMES = {*RANGES, "dry_sequence_breakers", *HINTS, *ALIASES}


def params(b: Body) -> dict[str, Any]:
    """The SamplingParams fields these requests set (only those present), checked."""
    out: dict[str, Any] = {}
    for name, (kind, lo, hi) in RANGES.items():
        if b.present(name):
            out[name] = (b.number(name, lo, hi, 0.0) if kind == _NUM
                         else b.integer(name, int(lo), int(hi), 0))
    breakers = b.body.get("dry_sequence_breakers")
    if breakers is not None:
        if (not isinstance(breakers, list) or len(breakers) > MAX_BREAKERS
                or not all(isinstance(s, str) and 0 < len(s) <= MAX_BREAKER_LEN
                           for s in breakers)):
            raise InvalidRequest(f"'dry_sequence_breakers' must be a list of at most "
                                 f"{MAX_BREAKERS} non-empty strings of up to {MAX_BREAKER_LEN} "
                                 "characters", param="dry_sequence_breakers")
        out["dry_sequence_breakers"] = tuple(breakers)
    if b.present("repetition_penalty") and not b.present("repeat_penalty"):
        out["repeat_penalty"] = b.number("repetition_penalty", 0.01, 10.0, 1.0)
    for name, kinds in HINTS.items():
        v = b.body.get(name)
        if v is not None and (not isinstance(v, kinds) or isinstance(v, bool) != (bool in kinds)):
            what = " or ".join({bool: "a boolean", int: "an integer", float: "a number",
                                list: "a list", str: "a string"}[k] for k in kinds)
            raise InvalidRequest(f"'{name}' must be {what}", param=name)
    return out


def sampling_params(b: Body, max_tokens: int | None,
                    logprobs: int | None = None) -> SamplingParams:
    """``fields.sampling_params`` with these samplers (for the bodies that allow them)."""
    return replace(fields.sampling_params(b, max_tokens, logprobs), **params(b))


def max_tokens(b: Body, default: int | None) -> int | None:
    """``n_predict`` where given (as llama-server reads it first), else ``max_tokens`` (-1
    or -2: no limit, as llama-server takes it and llama.cpp's web UI sends it), else
    ``default``."""
    if b.present("n_predict"):
        b.integer("max_tokens", -2, MAX_TOKENS_LIMIT, None)  # (still of the right kind)
        return n_predict(b, default)
    if b.body.get("max_tokens") in (-1, -2) and not isinstance(b.body["max_tokens"], bool):
        return None
    return b.integer("max_tokens", 1, MAX_TOKENS_LIMIT, default)


def chat_max_tokens(b: Body) -> int | None:
    """A chat request's limit: ``max_completion_tokens`` where given, else as
    ``max_tokens``. Its -1 or -2 is no limit of its own, as ``max_tokens``' (Roo Code sends
    -1 for a model without a maximum): ``max_tokens`` then decides, if given."""
    v = b.body.get("max_completion_tokens")
    if v in (-1, -2) and not isinstance(v, bool):
        return max_tokens(b, None)
    given = b.integer("max_completion_tokens", 1, MAX_TOKENS_LIMIT, None)
    return given if given is not None else max_tokens(b, None)


def n_predict(b: Body, default: int | None) -> int | None:
    """``max_tokens`` from llama-server's ``n_predict`` (-1 or -2: no limit), or
    ``default`` when the request has none."""
    if not b.present("n_predict"):
        return default
    n = b.integer("n_predict", -2, MAX_TOKENS_LIMIT, None)
    if n == 0:
        raise InvalidRequest("'n_predict' must be at least 1 (or -1: no limit)",
                             param="n_predict")
    return None if n is None or n < 0 else n


def schema() -> dict[str, Any]:
    """The OpenAPI properties of these fields."""
    out: dict[str, Any] = {name: {"type": kind, "minimum": lo, "maximum": hi}
                           for name, (kind, lo, hi) in RANGES.items()}
    out["dry_sequence_breakers"] = {"type": "array", "items": {"type": "string"},
                                    "maxItems": MAX_BREAKERS}
    out["n_predict"] = {"type": "integer", "minimum": -2}
    out["repetition_penalty"] = {"type": "number", "minimum": 0.01, "maximum": 10}
    types = {bool: "boolean", int: "integer", float: "number", list: "array", str: "string"}
    out |= {name: {"type": [types[k] for k in kinds] if len(kinds) > 1 else types[kinds[0]],
                   "description": "llama-server's; accepted and ignored"}
            for name, kinds in HINTS.items()}
    return out
