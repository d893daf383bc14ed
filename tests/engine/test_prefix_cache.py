"""The prefix cache in-process on the real model: exact KV reuse, waits, eviction, pins.

"Exact" is judged like with like: llama.cpp's CPU kernels are not guaranteed
invariant to batch shape, nor to where a sequence's cells lie in the KV cache. So a
cached request is compared, bit for bit, with a fresh request in a fresh context whose
prompt is computed in the same pieces: with a 64-token step budget and a 128-token
prefix, a fresh 148-token prompt is computed as [0,64) [64,128) [128,148), exactly the
pieces of "prefix first, then the suffix on top of the cached prefix". Where the
cache's layout cannot match a fresh context (after evictions left holes), the check is
the same top token and a tiny divergence.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Iterator

import pytest

from edgeinfer.config import load_config, override_model
from edgeinfer.engine.logprobs import TokenLogprob
from edgeinfer.engine.loop import Delta, Engine
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.models.served import ServedModel, load_model

TEXT = ("The history of the lighthouse begins in the ancient world, where fires were lit on hills "
        "to guide ships home. Over the centuries these fires became towers of stone, and the "
        "towers carried lamps of oil, then of gas, and finally of electricity. Each keeper lived "
        "beside the lamp, trimmed the wick, wound the clockwork and watched the sea through the "
        "long nights of winter. Many stories are told of keepers who saved sailors from storms, "
        "and of lonely stations on rocks far from any shore. Today most lights are automatic, but "
        "the towers still stand along the coasts, and visitors climb their stairs to look out over "
        "the water and imagine the lives of those who kept the light burning through every storm. "
        "Some of the old lamps now rest in museums, where their great glass lenses still catch "
        "the sun and throw bands of colour across the walls of quiet rooms.")
FIRST = SamplingParams(temperature=0, max_tokens=1, logprobs=20)


class Loop:
    """One event loop for a module's engine (the engine delivers to one loop)."""

    def __init__(self, served: ServedModel) -> None:
        self.loop = asyncio.new_event_loop()
        self.served = served
        served.engine.start(self.loop)

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.served.engine.stop()
        self.loop.close()


def _model(batch: int, entries: int = 8) -> ServedModel:
    # prompts in pieces of ``batch`` tokens, alone or not (adaptive prefill off), so that
    # "the same pieces" is what the docstring says
    cfg = override_model(load_config().models[0], context=2048, slots=4, batch=batch,
                         prefill_batch=batch, threads=2, cache_entries=entries)
    return load_model(cfg)


@pytest.fixture(scope="module")
def lp() -> Iterator[Loop]:
    loop = Loop(_model(batch=64, entries=4))
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def tokens(lp: Loop) -> list[int]:
    toks = lp.served.runtime.tokenize(TEXT, add_special=False, parse_special=False)
    assert len(toks) >= 148
    return toks[:148]


async def drain(gen: AsyncIterator[Delta]) -> list[Delta]:
    return [d async for d in gen]


def first(lp: Loop, rid: str, prompt: list[int], use_cache: bool = True) -> tuple[TokenLogprob,
                                                                                   Delta]:
    out = lp.run(drain(lp.served.engine.generate(rid, prompt, FIRST, use_cache=use_cache)))
    assert out[0].logprob is not None and out[-1].finish_reason == "length"
    return out[0].logprob, out[-1]


def kl_top(p: TokenLogprob, q: TokenLogprob) -> float:
    """KL(p || q) over p's top tokens (a lower bound of the full KL's main mass)."""
    qd = dict(q.top)
    floor = min(v for _, v in q.top)
    return sum(math.exp(v) * (v - qd.get(t, floor)) for t, v in p.top)


def engine(lp: Loop) -> Engine:
    return lp.served.engine


@pytest.fixture(scope="module")
def reference(tokens: list[int]) -> TokenLogprob:
    """First-token logprobs of the full prompt, fresh context, no cache, pieces 64+64+20."""
    fresh = Loop(_model(batch=64))
    try:
        return first(fresh, "fresh2", tokens, use_cache=False)[0]
    finally:
        fresh.close()


def test_idle_hit_equals_fresh_two_piece_prefill(tokens: list[int],
                                                 reference: TokenLogprob) -> None:
    lp = Loop(_model(batch=64))
    try:
        first(lp, "prefix", tokens[:128])  # computes and caches the prefix
        cached, last = first(lp, "cached", tokens)
    finally:
        lp.close()
    assert last.cached_tokens == 128
    assert cached == reference  # bit for bit: token, logprob and the top 20

    # Against a one-piece prefill (another batch shape): same top token, tiny divergence.
    one = Loop(_model(batch=256))
    try:
        fresh1, _ = first(one, "fresh1", tokens, use_cache=False)
    finally:
        one.close()
    assert fresh1.top[0][0] == cached.top[0][0]
    assert kl_top(fresh1, cached) < 0.01


def test_hit_from_a_running_slot_is_exact(tokens: list[int], reference: TokenLogprob) -> None:
    lp = Loop(_model(batch=64))

    async def main() -> tuple[TokenLogprob, Delta]:
        eng = lp.served.engine
        # (it never generates tokens[128], so the shared part is exactly the prefix)
        busy = eng.generate("busy", tokens[:128], SamplingParams(
            temperature=0, max_tokens=400, ignore_eos=True, logit_bias=((tokens[128], -100),)))
        await busy.__anext__()  # the busy request has its prefix computed and decodes on
        out = await drain(eng.generate("from-busy", tokens, FIRST))
        await busy.aclose()  # abort
        assert out[0].logprob is not None
        return out[0].logprob, out[-1]

    try:
        got, last = lp.run(main())
    finally:
        lp.close()
    assert last.cached_tokens == 128
    assert got == reference


def test_simultaneous_requests_compute_a_shared_prefix_once(lp: Loop, tokens: list[int]) -> None:
    prefix = tokens[20:120]  # a prefix nobody has cached (new first token)
    suffixes = [[1000 + 7 * i, 2000 + i, 3000 + i] for i in range(4)]
    before = engine(lp).stats.prompt_tokens

    async def main() -> list[list[Delta]]:
        return await asyncio.gather(*(drain(engine(lp).generate(
            f"sim{i}", prefix + s, SamplingParams(temperature=0, max_tokens=2)))
            for i, s in enumerate(suffixes)))

    outs = lp.run(main())
    computed = engine(lp).stats.prompt_tokens - before
    # one prefix plus four suffixes, not four prefixes
    assert computed <= len(prefix) + sum(len(s) for s in suffixes) + 4
    cached = sorted(o[-1].cached_tokens for o in outs)
    assert cached[0] == 0 and cached[1:] == [len(prefix)] * 3


def test_lru_eviction_keeps_recent_and_pinned_prefixes(lp: Loop, tokens: list[int],
                                                       reference: TokenLogprob) -> None:
    eng = engine(lp)
    pinned = tokens[5:70]
    lp.run(drain(eng.generate("pin", pinned, FIRST, pin=True)))
    evictions = eng.cache.stats.evictions
    for i in range(8):  # more distinct prompts than the 4 cache entries
        first(lp, f"filler{i}", [4000 + i] + tokens[30:60])
    assert eng.cache.stats.evictions > evictions
    assert sum(e.pinned for e in eng.cache.entries.values()) == 1
    _, last = first(lp, "pinned-hit", pinned + [17, 18])
    assert last.cached_tokens == len(pinned)
    # a hit after evictions (cells now lie around the holes they left)
    first(lp, "prefix-again", tokens[:128])
    cached, last = first(lp, "cached-again", tokens)
    assert last.cached_tokens == 128
    assert cached.top[0][0] == reference.top[0][0]
    assert kl_top(reference, cached) < 0.01


def test_kv_cells_used_stay_near_one_prefix_plus_suffixes(lp: Loop, tokens: list[int]) -> None:
    eng = engine(lp)
    prefix = tokens[:140]
    first(lp, "warm", prefix)

    async def main() -> tuple[int, int]:
        used_before = eng.cache.index.num_tokens  # holds the prefix once already
        gens = [eng.generate(f"mem{i}", prefix + [500 + i], SamplingParams(
            temperature=0, max_tokens=200, ignore_eos=True)) for i in range(4)]
        for _ in range(6):
            for g in gens:
                await g.__anext__()
        used = eng.cache.index.num_tokens
        for g in gens:
            await g.aclose()
        return used_before, used

    used_before, used = lp.run(main())
    # Each request added its own suffix token and ~6 generated tokens: no copy of the prefix
    # (4 x 141 cells without sharing).
    assert used - used_before <= 4 * (1 + 8)


def test_an_evicted_prefix_comes_back_from_the_ram_tier(tokens: list[int],
                                                        reference: TokenLogprob) -> None:
    """Evicted from the KV cache, the prefix's state waits in host RAM; a later request
    gets it restored (not recomputed): the same first-token log-probabilities as the
    fresh prefill in the same pieces."""
    lp = Loop(_model(batch=64, entries=2))
    try:
        eng = engine(lp)
        first(lp, "prefix", tokens[:128])
        for i in range(4):  # push it out of the two cache entries
            first(lp, f"filler{i}", [4000 + i] + tokens[30:60])
        assert not any(eng.cache.index.tokens_of(c) == tokens[:128] for c in eng.cache.entries)
        assert eng.cache.ram.snapshot()["entries"] >= 1
        before = eng.stats.prompt_tokens
        cached, last = first(lp, "from-ram", tokens)
        computed = eng.stats.prompt_tokens - before
        ram = eng.cache.ram.snapshot()
    finally:
        lp.close()
    assert last.cached_tokens == 128 and computed == 20  # restored, only the rest computed
    assert ram["restored"] == 1 and ram["restored_tokens"] == 128
    assert cached == reference


def test_a_saved_state_with_no_room_for_it_is_not_tried(
        tokens: list[int], caplog: pytest.LogCaptureFixture) -> None:
    """A RAM-tier state goes back whole, however little of it a prompt shares: with the
    KV cache held by a running request, llama.cpp refused it after the copy, logging two
    errors, on every request that shared a part of it (a long agent loop's every turn).
    Now it is not tried when even evicting every idle entry would leave no room."""
    cfg = override_model(load_config().models[0], context=512, slots=2, batch=64,
                         prefill_batch=64, threads=2, cache_entries=2)
    lp = Loop(load_model(cfg))
    try:
        eng = engine(lp)
        saved = tokens[:140] + tokens[:140]
        first(lp, "saved", saved)
        for i in range(3):  # push it out of the two cache entries, into the RAM tier
            first(lp, f"filler{i}", [4000 + i] + tokens[30:60])
        assert eng.cache.ram.match(saved)[0] == len(saved)

        async def main() -> list[Delta]:
            hog = eng.generate("hog", [5000] + tokens[:140] + tokens[:100], SamplingParams(
                temperature=0, max_tokens=40, ignore_eos=True))
            await hog.__anext__()  # 242 cells held: fewer than 280 can be free
            try:
                return await drain(eng.generate("part", saved[:60] + [7, 8, 9], FIRST))
            finally:
                await hog.aclose()
        with caplog.at_level(logging.INFO, logger="edgeinfer.llama"):
            out = lp.run(main())
    finally:
        lp.close()
    assert out[-1].finish_reason == "length" and out[-1].cached_tokens == 0
    assert "failed to find" not in caplog.text and "failed to restore" not in caplog.text


def test_a_sliding_window_model_shares_prefixes_exactly() -> None:
    """Gemma 3 (sliding-window attention, a 512-token window) with the full-size window
    cache: a prefix longer than the window is reused, and the answer equals, bit for bit,
    a fresh prefill in the same pieces in a fresh context."""
    gemma = next(m for m in load_config().models if m.id == "gemma-3-270m")
    cfg = override_model(gemma, context=2048, slots=2, batch=128, prefill_batch=128, threads=2,
                         cache_entries=4)
    prompt: list[int] = []
    fresh = Loop(load_model(cfg))
    try:
        rt = fresh.served.runtime
        assert rt.sliding_window and fresh.served.engine.cache.enabled
        prompt = rt.tokenize(TEXT * 7, add_special=True, parse_special=False)[:704]
        assert len(prompt) == 704
        # pieces 128 x 5 + 64 (a tail under 64 would take tokens from the piece before)
        reference, _ = first(fresh, "fresh", prompt, use_cache=False)
    finally:
        fresh.close()
    lp = Loop(load_model(cfg))
    try:
        first(lp, "prefix", prompt[:640])
        cached, last = first(lp, "cached", prompt)
    finally:
        lp.close()
    assert last.cached_tokens == 640
    assert cached == reference
