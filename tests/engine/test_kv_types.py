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
from edgeinfer.models.modelinfo import estimate_bytes
from edgeinfer.models.pool import MODEL_OVERHEAD
from edgeinfer.models.served import load_model
from edgeinfer.models.source import resolve_model_path

PROMPT = ("<|im_start|>user\nWhat does a lighthouse keeper do in winter, when the storms "
          "come from the west?<|im_end|>\n<|im_start|>assistant\n")


def _cfg(kind: str, context: int = 4096, flash_attn: str = "auto") -> ModelConfig:
    return override_model(load_config().models[0], context=context, slots=2, threads=2,
                          cache_type_k=kind, cache_type_v=kind, flash_attn=flash_attn)


def _first(kind: str, flash_attn: str = "auto", lines: list[str] | None = None
           ) -> tuple[int, int, TokenLogprob]:
    """(KV bytes edgeinfer reports, KV bytes llama.cpp logged, first-token logprobs);
    llama.cpp's log lines go to ``lines``."""
    lines = [] if lines is None else lines
    native.init_backend()
    native.log_listener = lines.append
    try:
        served = load_model(_cfg(kind, flash_attn=flash_attn))
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


def _kl(p: TokenLogprob, q: TokenLogprob) -> float:
    """KL(p || q) over p's top tokens."""
    o = dict(q.top)
    floor = min(o.values())
    return sum(math.exp(lp) * (lp - o.get(t, floor)) for t, lp in p.top)


def test_q8_0_halves_the_kv_cache_and_keeps_the_first_token_close() -> None:
    f16_kv, f16_logged, f16 = _first("f16")
    q8_kv, q8_logged, q8 = _first("q8_0")
    assert abs(f16_kv - f16_logged) < 2**14 and abs(q8_kv - q8_logged) < 2**14  # as allocated
    assert 0.5 < q8_kv / f16_kv < 0.56  # 34 bytes per 32 values against 64
    assert q8.top[0][0] == f16.top[0][0]
    assert _kl(f16, q8) < 0.02, _kl(f16, q8)  # KL(f16 || q8_0) over the top 20


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


def test_flash_attention_off_reaches_llama_cpp_and_keeps_the_first_token_close() -> None:
    on_lines: list[str] = []
    off_lines: list[str] = []
    on_kv, _, on = _first("f16", "auto", on_lines)
    off_kv, _, off = _first("f16", "off", off_lines)
    assert any("Flash Attention enabled" in line for line in on_lines)  # llama.cpp's auto
    assert any(re.search(r"flash_attn\s+= disabled", line) for line in off_lines)
    assert not any("Flash Attention enabled" in line for line in off_lines)
    assert off_kv == on_kv  # the same cells, V laid out another way
    assert on != off  # another kernel: not bit for bit the same numbers
    # both as close to attention in f32 (no f16 rounding of its products): this small
    # model's first-token KL between the two was 0.03, each about 0.006-0.008 from it
    _, _, f32 = _first("f32", "off")
    assert off.top[0][0] == on.top[0][0] == f32.top[0][0]
    assert _kl(f32, on) < 0.02 and _kl(f32, off) < 0.02, (_kl(f32, on), _kl(f32, off))
