"""Deterministic mode, in-process on the real model: a greedy (or seeded) request's 128 tokens and
their log-probabilities are bit for bit the same alone, among 7 other requests (long
prompts computed beside it, other streams speculating), after a prefix-cache hit, and
after another deterministic request, on an engine other requests have used.
Without the mode the same comparison differs, which is what the mode is for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import pytest

from edgeinfer.config import load_config, override_model
from edgeinfer.engine.delta import Delta
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.models.served import ServedModel, load_model

STORY = ("Write a long story about a lighthouse keeper named Ada who finds a message in a "
         "bottle, the storm that follows, and the ship she guides home. ")
GREEDY = SamplingParams(temperature=0, max_tokens=128, logprobs=3, ignore_eos=True)

Answer = tuple[str, list[object]]


class Loop:
    def __init__(self, served: ServedModel) -> None:
        self.loop = asyncio.new_event_loop()
        self.served = served
        served.engine.start(self.loop)

    def tokens(self, text: str) -> list[int]:
        return self.served.runtime.tokenize(
            f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n",
            add_special=False, parse_special=True)

    async def _one(self, rid: str, prompt: list[int], params: SamplingParams,
                   use_cache: bool, delay: float = 0.0) -> Answer:
        await asyncio.sleep(delay)
        gen: AsyncIterator[Delta] = self.served.engine.generate(rid, prompt, params,
                                                                use_cache=use_cache)
        deltas = [d async for d in gen]
        assert deltas[-1].finish_reason in ("length", "stop"), deltas[-1]
        return "".join(d.text for d in deltas), [d.logprob for d in deltas if d.logprob]

    def alone(self, rid: str, prompt: list[int], params: SamplingParams,
              use_cache: bool) -> Answer:
        return self.loop.run_until_complete(self._one(rid, prompt, params, use_cache))

    def among_others(self, rid: str, prompt: list[int], params: SamplingParams,
                     use_cache: bool = False) -> Answer:
        """The request, 0.3 s after 7 others started (long prompts still being computed,
        streams generating with speculation on), none of its prefix cached unless
        ``use_cache``."""
        others = [(f"{rid}-o{i}", self.tokens(STORY * (1 + 2 * i) + f"Chapter {i}."),
                   SamplingParams(temperature=0.9, seed=i, max_tokens=80 + 10 * i))
                  for i in range(7)]

        async def run() -> Answer:
            tasks = [self._one(r, p, s, True) for r, p, s in others]
            mine = self._one(rid, prompt, params, use_cache, delay=0.3)
            *_, answer = await asyncio.gather(*tasks, mine)
            return answer
        return self.loop.run_until_complete(run())

    def detailed(self, rid: str, prompt: list[int], params: SamplingParams, use_cache: bool
                 ) -> tuple[list[int], list[object], int]:
        """(tokens, log-probabilities, cached prompt tokens) of one request."""
        async def run() -> tuple[list[int], list[object], int]:
            gen: AsyncIterator[Delta] = self.served.engine.generate(rid, prompt, params,
                                                                    use_cache=use_cache)
            deltas = [d async for d in gen]
            return ([t for d in deltas for t in d.tokens],
                    [d.logprob for d in deltas if d.logprob], deltas[-1].cached_tokens)
        return self.loop.run_until_complete(run())

    def close(self) -> None:
        self.served.engine.stop()
        self.loop.close()


@pytest.fixture(scope="module")
def lp() -> Iterator[Loop]:
    """One engine for the module: each test finds what the earlier ones left in its KV
    cache (cached prefixes, cells freed by finished requests)."""
    cfg = override_model(load_config().models[0], context=6144, slots=8, batch=256,
                         threads=2)
    loop = Loop(load_model(cfg))
    yield loop
    loop.close()


def _same(a: Answer, b: Answer) -> bool:
    return a[0] == b[0] and a[1] == b[1]


@pytest.mark.parametrize("sampling", [GREEDY, replace(GREEDY, temperature=0.8, seed=7)],
                         ids=["greedy", "seeded"])
def test_deterministic_request_is_bit_identical_alone_among_others_and_cached(
        lp: Loop, sampling: SamplingParams) -> None:
    topic = "lens focuses light" if sampling.is_greedy else "keeper trims the wick"
    # about 170 prompt tokens: its 128 tokens are decoded alone under 256 positions and
    # with a pad row past them (``invariance.pad``)
    prompt = lp.tokens(f"Explain, step by step, how a lighthouse {topic}, and why it "
                       "matters on a stormy night. " * 8)
    params = replace(sampling, deterministic=True)
    # a used engine: other requests ran, were cached and finished, and freed cells
    lp.among_others(f"warm-{sampling.seed}", lp.tokens(STORY), GREEDY)
    assert 128 < len(prompt) < 256
    alone = lp.alone("d-alone", prompt, params, use_cache=True)
    assert len(alone[1]) == 128
    busy = lp.among_others("d-busy", prompt, params)
    before = lp.served.engine.cache.stats.hit_tokens
    cached = lp.alone("d-cached", prompt, params, use_cache=True)
    # its whole prompt but the last token came from the cache
    assert lp.served.engine.cache.stats.hit_tokens - before == len(prompt) - 1
    # another deterministic request in between (the lane keeps only a shared prefix)
    lp.alone("d-between", lp.tokens(STORY + "Begin at dawn."), params, use_cache=True)
    again = lp.among_others("d-again", prompt, params, use_cache=True)
    assert busy[0] == alone[0]
    assert busy[1] == alone[1]  # every token's log-probability (and top 3), bit for bit
    assert cached[0] == alone[0] and cached[1] == alone[1]
    assert again[0] == alone[0] and again[1] == alone[1]


def test_without_the_mode_the_same_comparison_differs(lp: Loop) -> None:
    """The control: the engine's normal batching moves the numbers (so the test above
    can fail)."""
    prompt = lp.tokens("Describe the ships that pass a lighthouse on a winter night, "
                       "one by one, with their names and cargo. " * 3)
    alone = lp.alone("n-alone", prompt, GREEDY, use_cache=False)
    busy = lp.among_others("n-busy", prompt, GREEDY)
    assert not _same(alone, busy)


def test_a_conversation_going_on_reuses_its_answer_exactly(lp: Loop) -> None:
    """The next turn of a deterministic conversation keeps the previous prompt and answer
    in the lane (past 256 positions, where a lone token takes a pad row) and computes only
    the new turn: the same tokens and log-probabilities as the whole prompt computed
    afresh."""
    params = replace(GREEDY, deterministic=True)
    first = lp.tokens("Tell the story of the lighthouse keeper and the lost ship, "
                      "in many short chapters. " * 8)

    answer, _, _ = lp.detailed("c-1", first, params, True)
    assert len(first) + len(answer) > 256 + 16
    turn = lp.served.runtime.tokenize("<|im_end|>\n<|im_start|>user\nGo on.<|im_end|>\n"
                                      "<|im_start|>assistant\n", add_special=False,
                                      parse_special=True)
    second = first + answer + turn
    kept, kept_lp, cached = lp.detailed("c-2", second, params, True)
    assert cached == len(first) + len(answer) - 1  # all but the last answer token
    fresh, fresh_lp, cached = lp.detailed("c-3", second, params, False)
    assert cached == 0
    assert kept == fresh and kept_lp == fresh_lp


def test_the_lane_is_made_on_first_use_and_its_memory_counted() -> None:
    cfg = override_model(load_config().models[0], context=2048, slots=2, threads=2)
    lp = Loop(load_model(cfg))
    try:
        rt = lp.served.runtime
        before = rt.memory_bytes()
        assert lp.served.engine._lane is None
        prompt = lp.tokens("Say hello.")
        lp.alone("plain", prompt, replace(GREEDY, max_tokens=2), use_cache=True)
        assert lp.served.engine._lane is None and rt.memory_bytes() == before
        lp.alone("det", prompt, replace(GREEDY, max_tokens=2, deterministic=True),
                 use_cache=True)
        assert lp.served.engine._lane is not None
        # a second KV cache of the context's size (memory_bytes: weights + KV cache)
        assert rt.memory_bytes() - before == before - rt.info.size_bytes
    finally:
        lp.close()


def test_a_sliding_window_lane_keeps_no_prefix_its_window_has_pruned() -> None:
    """Gemma 3 without the full-size window cache: its cache has dropped what lies a
    window before a sequence's end, so the lane keeps a prefix only when the next prompt
    extends all it holds; otherwise it starts afresh (the same answer as without cache)."""
    gemma = next(m for m in load_config().models if m.id == "gemma-3-270m")
    cfg = override_model(gemma, context=2048, slots=2, threads=2, swa_full=False)
    lp = Loop(load_model(cfg))
    try:
        rt = lp.served.runtime
        assert rt.sliding_window and rt.memory_kind == "checkpoint"
        first = rt.tokenize(STORY * 30, add_special=True, parse_special=False)[:800]
        params = replace(GREEDY, max_tokens=8, deterministic=True)
        lp.detailed("w-1", first, params, True)
        second = first[:700] + rt.tokenize(" What happened next?", add_special=False,
                                           parse_special=False)
        kept, kept_lp, cached = lp.detailed("w-2", second, params, True)
        fresh, fresh_lp, _ = lp.detailed("w-3", second, params, False)
        assert cached == 0
        assert kept == fresh and kept_lp == fresh_lp
        # a prompt that extends all the lane holds keeps it
        third = second + fresh + rt.tokenize(" Go on.", add_special=False,
                                             parse_special=False)
        _, _, cached = lp.detailed("w-4", third, params, True)
        assert cached == len(second) + len(fresh) - 1
    finally:
        lp.close()


def test_a_deterministic_model_still_pins_prefixes() -> None:
    """A pin computes its prompt in the shared context even where every request is
    deterministic (the lane has no pins)."""
    cfg = override_model(load_config().models[0], context=2048, slots=2, threads=2,
                         deterministic=True, cache_disk_mb=0)  # computed, not from disk
    lp = Loop(load_model(cfg))
    try:
        assert lp.served.prefix_store is None
        tokens = lp.tokens("You are a careful assistant who answers briefly. " * 4)
        lp.loop.run_until_complete(lp.served.pin(tokens))
        cache = lp.served.engine.cache
        assert [cache.index.tokens_of(e.seq_id) for e in cache.entries.values()
                if e.pinned] == [tokens]
    finally:
        lp.close()


def test_the_mode_holds_beside_a_context_without_flash_attention() -> None:
    """The mode holds for a model whose own context has no flash attention (flash_attn
    "off"): the lane keeps it on, the path whose kernels were checked row by row."""
    cfg = override_model(load_config().models[0], context=4096, slots=8, batch=256,
                         threads=2, flash_attn="off")
    other = Loop(load_model(cfg))
    try:
        prompt = other.tokens("Explain, step by step, how a lighthouse lens focuses light, "
                              "and why it matters on a stormy night. " * 8)
        params = replace(GREEDY, deterministic=True)
        alone = other.alone("f-alone", prompt, params, use_cache=True)
        busy = other.among_others("f-busy", prompt, params)
        assert len(alone[1]) == 128 and _same(busy, alone)
    finally:
        other.close()
