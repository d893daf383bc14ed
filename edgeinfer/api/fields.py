"""Reading request bodies field by field: the helpers every dialect module shares.

Every user error is raised here as an ``InvalidRequest`` naming the field,
before anything reaches the tokenizer or the engine. Checks that need the
model (token ids against its vocabulary) are the service's.
"""

from __future__ import annotations

import math
import re
from typing import Any

from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.errors import InvalidRequest
from edgeinfer.service.request import MixedPrompt

MAX_TOKENS_LIMIT = 1 << 20
MAX_STOP = 16
MAX_STOP_LEN = 512
MAX_LOGIT_BIAS = 1024
MAX_CHOICES = 16
MAX_PROMPTS = 16
MAX_VOCAB = 1 << 24  # token ids above this are in no vocabulary

class Body:
    """A JSON object body whose keys must all be among ``allowed``. A key whose value is
    null is as if absent, as OpenAI takes an explicit null for any optional field."""

    def __init__(self, body: Any, allowed: set[str]) -> None:
        if not isinstance(body, dict):
            raise InvalidRequest("the request body must be a JSON object")
        body = {k: v for k, v in body.items() if v is not None}
        for key in body:
            if key not in allowed:
                raise InvalidRequest(f"unrecognized request argument: {key}", param=key)
        self.body = body

    def present(self, name: str) -> bool:
        return self.body.get(name) is not None

    def number(self, name: str, lo: float, hi: float, default: float) -> float:
        v = self.body.get(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int | float) or (
                isinstance(v, float) and not math.isfinite(v)):  # (isfinite overflows on ints)
            raise InvalidRequest(f"'{name}' must be a number", param=name)
        if not lo <= v <= hi:
            raise InvalidRequest(f"'{name}' must be between {lo} and {hi}, got {v}", param=name)
        return float(v)

    def integer(self, name: str, lo: int, hi: int, default: int | None) -> int | None:
        v = self.body.get(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidRequest(f"'{name}' must be an integer", param=name)
        if not lo <= v <= hi:
            raise InvalidRequest(f"'{name}' must be between {lo} and {hi}, got {v}", param=name)
        return v

    def boolean(self, name: str, default: bool = False) -> bool:
        v = self.body.get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise InvalidRequest(f"'{name}' must be a boolean", param=name)
        return v

    def string(self, name: str, *, required: bool = False) -> str | None:
        v = self.body.get(name)
        if v is None:
            if required:
                raise InvalidRequest(f"'{name}' is required", param=name)
            return None
        if not isinstance(v, str):
            raise InvalidRequest(f"'{name}' must be a string", param=name)
        return v


def stop(b: Body) -> tuple[str, ...]:
    v = b.body.get("stop")
    if v is None:
        return ()
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise InvalidRequest("'stop' must be a string or a list of strings", param="stop")
    if len(items) > MAX_STOP:
        raise InvalidRequest(f"'stop' may hold at most {MAX_STOP} strings", param="stop")
    if any(len(s) > MAX_STOP_LEN for s in items):
        raise InvalidRequest(f"each stop string may be at most {MAX_STOP_LEN} characters",
                             param="stop")
    return tuple(s for s in items if s)


def logit_bias(b: Body) -> tuple[tuple[int, float], ...]:
    v = b.body.get("logit_bias")
    if v is None:
        return ()
    if isinstance(v, list) and all(isinstance(p, list) and len(p) == 2 for p in v):
        # llama-server's pairs: [[token id, bias or false (never)], ...]
        v = {str(t) if isinstance(t, int) and not isinstance(t, bool) else
             t if isinstance(t, str) else repr(t): -100 if bias is False else bias
             for t, bias in v}  # (a list or object as the id: refused below, by its repr)
    if not isinstance(v, dict) or len(v) > MAX_LOGIT_BIAS:
        raise InvalidRequest(f"'logit_bias' must be an object of at most {MAX_LOGIT_BIAS} "
                             "token ids to numbers (or llama-server's [[id, bias], ...])",
                             param="logit_bias")
    out = []
    for key, bias in v.items():
        if not isinstance(key, str) or not key.isascii() or not key.isdigit():
            raise InvalidRequest(f"'logit_bias' key {key!r} is not a token id (ASCII digits)",
                                 param="logit_bias")
        tok = int(key)
        if not 0 <= tok < MAX_VOCAB:
            raise InvalidRequest(f"'logit_bias' token id {tok} is outside the vocabulary",
                                 param="logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise InvalidRequest("'logit_bias' values must be numbers between -100 and 100",
                                 param="logit_bias")
        out.append((tok, float(bias)))
    return tuple(out)


def sampling_params(b: Body, max_tokens: int | None,
            logprobs: int | None = None) -> SamplingParams:
    seed = b.integer("seed", -(1 << 63), (1 << 63) - 1, None)
    defaults = SamplingParams()
    return SamplingParams(
        temperature=b.number("temperature", 0.0, 2.0, defaults.temperature),
        top_p=b.number("top_p", 0.0, 1.0, defaults.top_p),
        top_k=int(b.integer("top_k", 0, 1_000_000, defaults.top_k) or 0),
        min_p=b.number("min_p", 0.0, 1.0, defaults.min_p),
        presence_penalty=b.number("presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=b.number("frequency_penalty", -2.0, 2.0, 0.0),
        repeat_penalty=b.number("repeat_penalty", 0.01, 10.0, 1.0),
        repeat_last_n=int(b.integer("repeat_last_n", 0, 1 << 16, 64) or 0),
        seed=seed,
        max_tokens=max_tokens,
        stop=stop(b),
        ignore_eos=b.boolean("ignore_eos"),
        logit_bias=logit_bias(b),
        logprobs=logprobs,
        speculative=b.boolean("speculative", True),
        # None: the model's setting
        deterministic=(b.boolean("deterministic") if b.body.get("deterministic") is not None
                       else None),
    )


def stream_options(b: Body) -> tuple[bool, bool]:
    stream = b.boolean("stream")
    opts = b.body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise InvalidRequest("'stream_options' must be an object", param="stream_options")
        if not stream:
            raise InvalidRequest("'stream_options' is only allowed when 'stream' is true",
                                 param="stream_options")
        iu = opts.get("include_usage", False)
        if not isinstance(iu, bool):
            raise InvalidRequest("'stream_options.include_usage' must be a boolean",
                                 param="stream_options.include_usage")
        include_usage = iu
    return stream, include_usage


def _is_tokens(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in v)


def texts_or_tokens(value: Any, param: str, limit: int) -> tuple[str | list[int], ...]:
    """A string, a list of token ids, or a non-empty list of either (at most ``limit``)."""
    return tuple(_prompt_items(value, param, limit, mixed=False))


def prompts(value: Any, param: str, limit: int) -> tuple[str | list[int] | MixedPrompt, ...]:
    """``texts_or_tokens``, and llama-server's mixed prompt too: a list of token ids and
    strings both (one prompt), alone or in a list of prompts."""
    return tuple(MixedPrompt(tuple(p)) if _is_mixed(p) else p
                 for p in _prompt_items(value, param, limit, mixed=True))


def _prompt_items(value: Any, param: str, limit: int, mixed: bool) -> list[Any]:
    def one(p: Any) -> bool:
        return isinstance(p, str) or _is_tokens(p) or mixed and _is_mixed(p)
    if one(value):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(one(p) for p in value):
        items = value
    else:
        either = "either, or of token ids and strings mixed" if mixed else "either"
        raise InvalidRequest(f"'{param}' must be a string, a list of token ids, or a non-empty "
                             f"list of {either}", param=param)
    if len(items) > limit:
        raise InvalidRequest(f"at most {limit} items in '{param}'", param=param)
    for p in items:
        if isinstance(p, list) and not all(0 <= t < MAX_VOCAB for t in p if isinstance(t, int)):
            raise InvalidRequest(f"'{param}' token ids must be in 0..{MAX_VOCAB - 1} (and in "
                                 "the model's vocabulary)",
                                 param=param)
    return items


def _is_mixed(v: Any) -> bool:
    """Token ids and strings, both, in one list."""
    return isinstance(v, list) and all(
        isinstance(t, str | int) and not isinstance(t, bool) for t in v) and any(
        isinstance(t, str) for t in v) and any(isinstance(t, int) for t in v)


def token_ids(value: Any, param: str) -> tuple[int, ...]:
    """A list of token ids (null or [] for none)."""
    if value is None or value == []:
        return ()
    if not _is_tokens(value) or not all(0 <= t < MAX_VOCAB for t in value):
        raise InvalidRequest(f"'{param}' must be a list of token ids (integers in "
                             f"0..{MAX_VOCAB - 1})", param=param)
    return tuple(value)


def metadata(b: Body) -> dict[str, str]:
    """OpenAI's ``metadata``: at most 16 keys (64 characters) mapped to strings (512)."""
    raw = b.body.get("metadata", {})
    if not isinstance(raw, dict) or len(raw) > 16 or not all(
            isinstance(v, str) and len(v) <= 512 and len(k) <= 64 for k, v in raw.items()):
        raise InvalidRequest("'metadata' must map at most 16 keys (64 characters) to strings "
                             "(512 characters)", param="metadata")
    return dict(raw)


def unsupported(b: Body, names: tuple[str, ...]) -> None:
    for name in names:
        v = b.body.get(name)
        if v not in (None, False, [], 0, ""):
            raise InvalidRequest(f"'{name}' is not supported by this server yet", param=name)




def priority(value: Any, header: str | None) -> int:
    """``priority`` from the body (or the ``x-priority`` header): an integer in -10..10."""
    raw = value
    if raw is None:
        if header is None:
            return 0
        raw = int(header.strip()) if re.fullmatch(r"\s*[-+]?\d{1,3}\s*", header) else header
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise InvalidRequest("'priority' must be an integer", param="priority")
    if not -10 <= raw <= 10:
        raise InvalidRequest("'priority' must be an integer between -10 and 10",
                             param="priority")
    return raw
