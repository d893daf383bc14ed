"""KV cache types (models.toml cache_type_k / cache_type_v) on the real model: the size
edgeinfer reports is the size llama.cpp allocates, q8_0 takes about half of f16, the first
token's distribution stays close, and a context too large for a memory budget in f16
fits it in q8_0."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import AsyncIterator

import pytest

from edgeinfer.config import ModelConfig, load_config, override_model
from edgeinfer.engine import native
from edgeinfer.engine.logprobs import TokenLogprob
from edgeinfer.engine.loop import Delta
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.models.pool import MODEL_OVERHEAD, estimate_bytes
from edgeinfer.models.served import load_model
from edgeinfer.models.source import resolve_model_path

PROMPT = ("<|im_start|>user\nWhat does a lighthouse keeper do in winter, when the storms "
          "come from the west?<|im_end|>\n<|im_start|>assistant\n")


def _cfg(kind: str, context: int = 4096) -> ModelConfig:
    return override_model(load_config().models[0], context=context, slots=2, threads=2,
                          cache_type_k=kind, cache_type_v=kind)


def _first(kind: str) -> tuple[int, int, TokenLogprob]:
    """(KV bytes edgeinfer reports, KV bytes llama.cpp logged, first-token logprobs)."""
    lines: list[str] = []
    native.init_backend()
    native.log_listener = lines.append
    try:
        served = load_model(_cfg(kind))
    finally:
        native.log_listener = None
    logged = next(float(m.group(1)) for line in lines
                  if (m := re.search(r"llama_kv_cache: size =\s+([\d.]+) MiB", line)))
    loop = asyncio.new_event_loop()
    served.engine.start(loop)
    try:
        prompt = served.runtime.tokenize(PROMPT, add_special=False, parse_special=True)

        async def drain(gen: AsyncIterator[Delta]) -> list[Delta]:
            return [d async for d in gen]
        out = loop.run_until_complete(drain(served.engine.generate(
            "kv", prompt, SamplingParams(temperature=0, max_tokens=1, logprobs=20))))
    finally:
        served.engine.stop()
        loop.close()
    assert out[0].logprob is not None
    kv = served.runtime.memory_bytes() - served.runtime.info.size_bytes
    return kv, round(logged * 2**20), out[0].logprob


def test_q8_0_halves_the_kv_cache_and_keeps_the_first_token_close() -> None:
    f16_kv, f16_logged, f16 = _first("f16")
    q8_kv, q8_logged, q8 = _first("q8_0")
    assert abs(f16_kv - f16_logged) < 2**14 and abs(q8_kv - q8_logged) < 2**14  # as allocated
    assert 0.5 < q8_kv / f16_kv < 0.56  # 34 bytes per 32 values against 64
    assert q8.top[0][0] == f16.top[0][0]
    q = dict(q8.top)
    floor = min(q.values())
    kl = sum(math.exp(lp) * (lp - q.get(t, floor)) for t, lp in f16.top)
    assert kl < 0.02, kl  # KL(f16 || q8_0) over the top 20


@pytest.mark.parametrize("kind", ["q8_0"])
def test_a_context_too_large_in_f16_fits_a_budget_in_q8_0(kind: str) -> None:
    path = resolve_model_path(load_config().models[0])
    big_f16, big_q8 = _cfg("f16", 32768), _cfg(kind, 32768)
    budget = (estimate_bytes(big_f16, path) + estimate_bytes(big_q8, path)) // 2
    assert estimate_bytes(big_f16, path) > budget >= estimate_bytes(big_q8, path)
    served = load_model(big_q8)
    try:  # and what it takes once loaded is what was estimated (the file's header aside)
        loaded = served.runtime.memory_bytes() + MODEL_OVERHEAD
        assert abs(loaded - estimate_bytes(big_q8, path)) < 0.01 * loaded
        assert loaded <= budget
    finally:
        served.engine.stop()
