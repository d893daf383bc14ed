"""Speculative decoding with prompt-lookup drafts, in-process on the real model: the output
is the one decoding without drafts gives, bit for bit (greedy, a fixed seed, a grammar),
while most drafts on a copying task are accepted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import numpy as np
import pytest

from edgeinfer.config import load_config, override_model
from edgeinfer.engine.batch import Run
from edgeinfer.engine.loop import Delta
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.models.served import ServedModel, load_model

TEXT = ("The keeper climbed the stairs of the lighthouse at dusk, trimmed the wick, wound the "
        "clockwork and watched the sea. Ships passed in the night, and the light turned and "
        "turned until the morning came grey over the water.")
ASK = ("<|im_start|>user\nRepeat this text exactly, word for word:\n\n" + TEXT +
       "<|im_end|>\n<|im_start|>assistant\n")
GRAMMAR = 'root ::= "The keeper " [a-z ,.]+'


class Loop:
    def __init__(self, served: ServedModel) -> None:
        self.loop = asyncio.new_event_loop()
        self.served = served
        served.engine.start(self.loop)

    def run(self, prompt: list[int], params: SamplingParams, rid: str = "r") -> list[Delta]:
        async def drain(gen: AsyncIterator[Delta]) -> list[Delta]:
            return [d async for d in gen]
        return self.loop.run_until_complete(drain(self.served.engine.generate(
            rid, prompt, params, use_cache=False)))

    def close(self) -> None:
        self.served.engine.stop()
        self.loop.close()


@pytest.fixture(scope="module")
def lp() -> Iterator[Loop]:
    cfg = override_model(load_config().models[0], context=1024, slots=4, batch=64, threads=2,
                         draft_max=8)
    loop = Loop(load_model(cfg))
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def prompt(lp: Loop) -> list[int]:
    return lp.served.runtime.tokenize(ASK, add_special=False, parse_special=True)


def _answer(deltas: list[Delta]) -> tuple[str, list[int], list[object]]:
    return ("".join(d.text for d in deltas), [t for d in deltas for t in d.tokens],
            [d.logprob for d in deltas if d.logprob is not None])


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=96, logprobs=3),
    SamplingParams(temperature=0.7, seed=1234, max_tokens=96, logprobs=3),
    SamplingParams(temperature=0, max_tokens=48, grammar=GRAMMAR, logprobs=3),
], ids=["greedy", "seeded", "grammar"])
def test_drafts_change_nothing_in_the_output(lp: Loop, prompt: list[int],
                                             params: SamplingParams) -> None:
    same_with_and_without_drafts(lp, prompt, params)


def same_with_and_without_drafts(lp: Loop, prompt: list[int],
                                 params: SamplingParams) -> tuple[int, int]:
    """Run ``prompt`` with drafts and without: the same text, tokens, log-probabilities and
    finish, with drafts made and some accepted (reported in the timings); returns how
    many drafts were verified and accepted."""
    stats = lp.served.engine.stats
    before = (stats.draft_tokens, stats.accepted_drafts)
    spec = lp.run(prompt, params, "spec")
    drafted, accepted = stats.draft_tokens - before[0], stats.accepted_drafts - before[1]
    plain = lp.run(prompt, replace(params, speculative=False), "plain")
    assert _answer(spec) == _answer(plain)  # text, tokens and log-probabilities
    assert spec[-1].finish_reason == plain[-1].finish_reason
    assert drafted > 0 and accepted > 0  # drafts were made and some accepted
    timings = spec[-1].timings or {}
    assert timings.get("draft_n", 0) >= timings.get("draft_n_accepted", -1) > 0
    return drafted, accepted


def test_a_copying_answer_takes_fewer_steps(lp: Loop, prompt: list[int]) -> None:
    eng = lp.served.engine
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    steps = eng.stats.steps
    lp.run(prompt, params)
    with_drafts = eng.stats.steps - steps
    steps = eng.stats.steps
    lp.run(prompt, replace(params, speculative=False))
    without = eng.stats.steps - steps
    assert with_drafts < 0.7 * without, (with_drafts, without)


def test_rows_decoded_together_equal_rows_decoded_one_by_one(lp: Loop,
                                                              prompt: list[int]) -> None:
    """What makes verification exact: llama.cpp gives a sequence's rows the same logits
    whether they are decoded one per call or several in one (flash attention on)."""
    rt = lp.served.runtime
    greedy = lp.run(prompt, SamplingParams(temperature=0, max_tokens=17, ignore_eos=True))
    tokens = [t for d in greedy for t in d.tokens][:16]
    eng = lp.served.engine

    def rows(piece: int) -> list[np.ndarray]:
        out = []

        def work() -> None:
            rt.seq_rm(3, -1, -1)  # on the engine thread, which owns the context
            for i in range(0, len(prompt), 64):
                assert rt.decode([Run(3, i, prompt[i:i + 64], False)]).rc == 0
            for i in range(0, len(tokens), piece):
                seg = tokens[i:i + piece]
                decoded = rt.decode([Run(3, len(prompt) + i, seg, True, len(seg) - 1)])
                assert decoded.rc == 0
                out.extend(rt.logits_row(decoded.outputs[0] + j).copy() for j in range(len(seg)))
            rt.seq_rm(3, -1, -1)
        lp.loop.run_until_complete(eng.call(work))  # type: ignore[arg-type]
        return out

    one, eight = rows(1), rows(8)
    assert all(np.array_equal(a, b) for a, b in zip(one, eight, strict=True))
