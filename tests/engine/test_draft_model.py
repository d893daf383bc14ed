"""Speculative decoding with a draft model (models.toml ``speculative = "draft"``), in-process
on real models: the output is the one decoding without drafts gives (greedy, a fixed seed, a
grammar), drafts of several streams are guessed together, and a draft model the target
cannot read is refused at load."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from edgeinfer.config import load_config, override_model
from edgeinfer.engine.loop import Delta
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.errors import ModelLoadError
from edgeinfer.models.served import load_model
from edgeinfer.models.source import resolve_model_path
from tests.engine import synthetic_model
from tests.engine.test_speculation import (
    ASK,
    GRAMMAR,
    Loop,
    _answer,
    same_with_and_without_drafts,
)

FREE = ("<|im_start|>user\nWrite a short story about a fox who learns to sail.<|im_end|>\n"
        "<|im_start|>assistant\n")


def _models() -> tuple[object, object]:
    models = {m.id: m for m in load_config().models}
    return models["smollm2-135m-instruct"], models["smollm2-135m-instruct-q8"]


@pytest.fixture(scope="module")
def lp() -> Iterator[Loop]:
    """SmolLM2 Q8_0 drafted by SmolLM2 Q4_1: the same vocabulary, close guesses."""
    base, q8 = _models()
    configs = {m.id: m for m in load_config().models}
    cfg = override_model(q8, context=1024, slots=4, batch=64, threads=2, draft_max=4)
    cfg = replace(cfg, speculative="draft", draft_model=base.id)
    draft = (base, resolve_model_path(base, configs))
    loop = Loop(load_model(cfg, resolve_model_path(q8, configs), draft))
    yield loop
    loop.close()


def _prompt(lp: Loop, text: str) -> list[int]:
    return lp.served.runtime.tokenize(text, add_special=False, parse_special=True)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=64, logprobs=3),
    SamplingParams(temperature=0.9, seed=77, max_tokens=64, logprobs=3),
    SamplingParams(temperature=0, max_tokens=40, grammar=GRAMMAR, logprobs=3),
], ids=["greedy", "seeded", "grammar"])
@pytest.mark.parametrize("text", [ASK, FREE], ids=["copy", "free"])
def test_drafts_change_nothing_in_the_output(lp: Loop, params: SamplingParams,
                                             text: str) -> None:
    drafted, accepted = same_with_and_without_drafts(lp, _prompt(lp, text), params)
    if params.temperature == 0 and params.grammar is None:
        assert accepted > 0.5 * drafted  # Q4_1 guesses Q8_0's greedy tokens mostly right


def test_streams_are_drafted_together(lp: Loop) -> None:
    """Four streams at once: one draft-model call guesses for several of them (a greedy answer
    among others is not bit-identical to the same answer alone, drafts or not: the batch's
    shape changes llama.cpp's rounding; see the deterministic mode)."""
    prompts = [_prompt(lp, ASK.replace("keeper", name)) for name in
               ("keeper", "warden", "sailor", "painter")]  # copying: the draft is confident
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    draft = lp.served.engine.draft
    assert draft is not None
    accepted = lp.served.engine.stats.accepted_drafts
    sizes: list[int] = []  # the runs of each draft-model call
    decode = draft.runtime.decode

    def counting(runs):  # type: ignore[no-untyped-def]
        sizes.append(len(runs))
        return decode(runs)
    draft.runtime.decode = counting  # type: ignore[method-assign]

    async def together() -> list[list[Delta]]:
        async def one(i: int, p: list[int]) -> list[Delta]:
            return [d async for d in lp.served.engine.generate(f"t{i}", p, params,
                                                               use_cache=False)]
        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
    try:
        answers = lp.loop.run_until_complete(together())
    finally:
        del draft.runtime.decode
    assert [len(_answer(a)[1]) for a in answers] == [48] * 4
    assert max(sizes) >= 3  # one call guessed for several streams
    assert lp.served.engine.stats.accepted_drafts > accepted


def test_a_draft_model_of_another_vocabulary_is_refused() -> None:
    base, _ = _models()
    gemma = next(m for m in load_config().models if m.id == "gemma-3-270m")
    configs = {m.id: m for m in load_config().models}
    cfg = replace(override_model(base, context=512, slots=2, batch=32, threads=2),
                  speculative="draft", draft_model=gemma.id)
    with pytest.raises(ModelLoadError, match="vocabulary"):
        load_model(cfg, resolve_model_path(base, configs),
                   (gemma, resolve_model_path(gemma, configs)))


def test_a_draft_model_that_cannot_drop_drafts_is_refused(tmp_path: Path) -> None:
    """A recurrent draft model (SmolLM2's tokenizer, so the vocabulary matches) cannot take
    rejected drafts back."""
    base, _ = _models()
    configs = {m.id: m for m in load_config().models}
    mamba = synthetic_model.write(tmp_path / "mamba.gguf", "mamba")
    cfg = replace(override_model(base, context=512, slots=2, batch=32, threads=2),
                  speculative="draft", draft_model="mamba")
    draft_cfg = replace(base, id="mamba", path=mamba, source=None)
    with pytest.raises(ModelLoadError, match="cannot drop rejected drafts"):
        load_model(cfg, resolve_model_path(base, configs), (draft_cfg, mamba))


def test_a_prompt_another_slot_holds_is_shared_not_computed_again(lp: Loop) -> None:
    """A request whose prompt another slot's draft sequence already holds (a shared system
    prompt) computes only what differs, and guesses as if it had computed it all."""
    draft = lp.served.engine.draft
    assert draft is not None
    prompt = _prompt(lp, ASK + "The keeper climbed the stairs of the")  # a confident guess
    rows: list[int] = []
    decode = draft.runtime.decode

    def counting(runs):  # type: ignore[no-untyped-def]
        rows.append(sum(len(r.tokens) for r in runs))
        return decode(runs)

    def clear() -> None:
        for slot in list(draft.held):
            draft.runtime.seq_rm(slot)
        draft.held.clear()

    def caught_up(slot: int, tokens: list[int]) -> list[list[int]]:
        for _ in range(len(tokens) // 32):  # a prompt over the step's budget takes steps
            if (guesses := draft.draft([(slot, tokens, 4)]))[0]:
                return guesses
        raise AssertionError("the draft model never caught up")

    def work() -> tuple[list[list[int]], list[list[int]], list[int]]:
        draft.runtime.decode = counting  # type: ignore[method-assign]
        try:
            clear()
            first = caught_up(1, prompt)[0][0]
            other = [*prompt, first]  # the prompt and its first token
            del rows[:]
            shared = draft.draft([(2, other, 4)])
            counted = list(rows)
            clear()
            return shared, caught_up(2, other), counted
        finally:
            del draft.runtime.decode
    shared, fresh, counted = lp.loop.run_until_complete(
        lp.served.engine.call(work))  # type: ignore[misc]
    assert shared == fresh and shared[0]
    assert counted and set(counted) == {1}  # the last token, then one row per guess


def test_idle_slots_make_room_in_the_draft_context(lp: Loop,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The draft context has the target's cells; slots that finished keep their draft
    sequences for reuse until a drafted one needs the room: then those are cleared first,
    and no call fails."""
    draft = lp.served.engine.draft
    assert draft is not None
    long = (_prompt(lp, ASK) * 10)[:600]
    other = list(reversed(long))  # shares nothing with it

    def work() -> tuple[bool, list[list[int]]]:
        for slot in list(draft.held):
            draft.runtime.seq_rm(slot)
        draft.held.clear()
        for _ in range(20):
            if draft.draft([(1, long, 2)])[0]:
                break
        # slot 1 holds 601 tokens; slot 2 needs 600 of its own: 1024 cells cannot hold both
        for _ in range(20):
            if (guesses := draft.draft([(2, [*other, 7], 2)]))[0]:
                return 1 in draft.held, guesses
        raise AssertionError("the draft model never caught up")
    with caplog.at_level("WARNING", logger="edgeinfer.engine.draft_model"):
        kept, guesses = lp.loop.run_until_complete(lp.served.engine.call(work))  # type: ignore[misc]
    assert not kept and guesses[0]
    assert "llama_decode returned" not in caplog.text
