"""The prefix cache's checkpoints, for memories that cannot share or trim part of a
sequence: a recurrent model (Mamba), a hybrid one (Jamba: Mamba and attention layers),
both tiny with random weights (tests/engine/synthetic_model.py) but run by real
llama.cpp, and SmolLM2 with checkpoints asked for in its configuration.

Exactness is judged like with like (as in test_prefix_cache.py): a request whose prefix
comes from a saved state gives, bit for bit, the first-token log-probabilities of the
same request computed in a fresh context, whose prompt then pauses at the same
checkpoint positions and so is computed in the same pieces.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import synthetic_model

from edgeinfer.config import ModelConfig, load_config, override_model
from edgeinfer.engine.logprobs import TokenLogprob
from edgeinfer.engine.loop import Delta
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.models.served import ServedModel, load_model

FIRST = SamplingParams(temperature=0, max_tokens=1, logprobs=20)
EVERY = 64


def _cfg(path: Path | None, **changes: object) -> ModelConfig:
    base = load_config().models[0]
    cfg = override_model(base, **{"context": 1024, "slots": 2, "batch": 64, "prefill_batch": 64,
                                  "threads": 2, "checkpoint_every": EVERY, **changes})
    if path is not None:
        cfg = replace(cfg, id=f"synthetic-{path.stem}", path=path, source=None)
    return cfg


class Loop:
    def __init__(self, cfg: ModelConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self.served: ServedModel = load_model(cfg)
        self.served.engine.start(self.loop)

    def first(self, rid: str, prompt: list[int]) -> tuple[TokenLogprob, Delta]:
        async def drain(gen: AsyncIterator[Delta]) -> list[Delta]:
            return [d async for d in gen]
        out = self.loop.run_until_complete(drain(self.served.engine.generate(rid, prompt, FIRST)))
        assert out[0].logprob is not None and out[-1].finish_reason == "length"
        return out[0].logprob, out[-1]

    def close(self) -> None:
        self.served.engine.stop()
        self.loop.close()


@pytest.fixture(scope="module", params=["mamba", "jamba", "smollm2"])
def cfg(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ModelConfig:
    if request.param == "smollm2":
        return _cfg(None, cache_mode="checkpoint")
    path = tmp_path_factory.mktemp("models") / f"{request.param}.gguf"
    return _cfg(synthetic_model.write(path, request.param))


def _prompt(lp: Loop, n: int, salt: str = "") -> list[int]:
    text = " ".join(f"{salt}word{i} of the long shared system prompt" for i in range(n))
    toks = lp.served.runtime.tokenize(text, add_special=False, parse_special=False)
    assert len(toks) >= n
    return toks[:n]


def test_the_memory_kind_comes_from_llama_cpp(cfg: ModelConfig) -> None:
    lp = Loop(cfg)
    try:
        rt = lp.served.runtime
        cache = lp.served.engine.cache
        assert rt.memory_kind == "checkpoint" and cache.mode == "checkpoint" and cache.enabled
        assert cache.entries == {}  # nothing kept in the KV cache itself
    finally:
        lp.close()
    assert Loop(override_model(cfg, cache_ram_mb=0)).served.engine.cache.enabled is False


def test_a_restored_checkpoint_equals_a_fresh_computation(cfg: ModelConfig) -> None:
    """A (200 tokens) saves states at 64, 128, 192 and 199; B shares A's first 150 tokens,
    so it restores 128 and computes only from there; B in a fresh context is computed in
    the same pieces (0-64-128-192-229-230) and gives the same bits."""
    fresh = Loop(cfg)
    try:
        a = _prompt(fresh, 200)
        b = a[:150] + _prompt(fresh, 80, salt="other ")
        reference, _ = fresh.first("fresh-b", b)
    finally:
        fresh.close()
    lp = Loop(cfg)
    try:
        eng = lp.served.engine
        lp.first("a", a)
        assert eng.cache.stats.checkpoints == 4  # 64, 128, 192, 199
        before = eng.stats.prompt_tokens
        restored, last = lp.first("b", b)
        computed = eng.stats.prompt_tokens - before
        again, last_again = lp.first("a-again", a)
        ram = eng.cache.ram.snapshot()
    finally:
        lp.close()
    assert last.cached_tokens == 128 and computed == len(b) - 128
    assert restored == reference  # token, logprob and the top 20, bit for bit
    assert last_again.cached_tokens == 199  # the same prompt: only its last token computed
    assert ram["restored"] == 2 and ram["restored_tokens"] == 128 + 199


def test_a_multi_turn_chat_continues_from_the_last_turn(cfg: ModelConfig) -> None:
    """A conversation's next prompt begins with the previous prompt and answer: the state
    saved when the previous request ended is restored, whatever its length."""
    lp = Loop(cfg)
    try:
        first_turn = _prompt(lp, 100)
        lp.first("turn1", first_turn)  # the state of the prompt is saved when it ends
        second_turn = first_turn + _prompt(lp, 30, salt="next ")
        _, last = lp.first("turn2", second_turn)
    finally:
        lp.close()
    assert last.cached_tokens == 100  # prompt 1 (its answer token was never decoded)


def test_a_ram_budget_of_zero_serves_cold() -> None:
    path = synthetic_model.write(Path("/tmp") / "edgeinfer-test-mamba-zero.gguf", "mamba")
    lp = Loop(_cfg(path, cache_ram_mb=0))
    try:
        a = _prompt(lp, 130)
        lp.first("a", a)
        _, last = lp.first("a2", a)
        assert lp.served.engine.cache.stats.checkpoints == 0
    finally:
        lp.close()
        path.unlink()
    assert last.cached_tokens == 0


def test_a_saved_state_goes_back_only_where_it_fits(caplog: pytest.LogCaptureFixture) -> None:
    """With another request holding most of the cells, the longest saved state that fits
    beside it is restored (llama.cpp refused a longer one after the copy, logging errors);
    the prompt that then finds no room waits for the other to end, and takes the longest
    state when it is admitted again."""
    lp = Loop(_cfg(None, cache_mode="checkpoint", context=512))
    try:
        saved = _prompt(lp, 280)
        lp.first("saved", saved)  # states at 64, 128, 192, 256 and 279
        rt = lp.served.runtime

        async def main() -> list[Delta]:
            hog = lp.served.engine.generate("hog", _prompt(lp, 300, salt="hog "), SamplingParams(
                temperature=0, max_tokens=40, ignore_eos=True))
            await hog.__anext__()  # over 300 cells held: fewer than 212 free
            part = lp.served.engine.generate("part", saved[:270] + [7, 8, 9], FIRST)
            parts = asyncio.ensure_future(_drain(part))
            async for _ in hog:
                pass
            return await parts
        with caplog.at_level(logging.INFO, logger="edgeinfer.llama"):
            out = lp.loop.run_until_complete(main())
        ram = lp.served.engine.cache.ram.snapshot()
    finally:
        lp.close()
    assert rt.info.n_ctx == 512
    assert out[-1].finish_reason == "length" and out[-1].cached_tokens == 256
    assert ram["restored_tokens"] == 192 + 256  # the 192 that fitted, then after the wait
    assert "available cells" not in caplog.text and "could not be restored" not in caplog.text


async def _drain(gen: AsyncIterator[Delta]) -> list[Delta]:
    return [d async for d in gen]
