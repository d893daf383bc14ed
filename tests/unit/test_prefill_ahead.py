"""Prefill ahead: requests past the slots compute their prompt and send their first token
while they wait for a slot (``engine.scheduler``), driven by a fake decode."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_scheduler import FakeEngine, make_seq, own_token

from edgeinfer.config import ModelConfig
from edgeinfer.engine.kv import seats
from edgeinfer.engine.report import EngineStats, slots_json, stats_json
from edgeinfer.engine.scheduler import Scheduler
from edgeinfer.engine.sequence import SequenceStatus
from edgeinfer.errors import ConfigError


def _ahead(slots: int = 2, ahead: int = 2, cells: int = 10_000) -> Scheduler:
    sched = Scheduler(num_slots=slots, token_budget=64, ahead=ahead)
    sched.free_cells = lambda: cells
    return sched


def test_waiting_requests_get_their_first_token_then_wait_for_a_slot() -> None:
    sched = _ahead()
    seqs = [make_seq(f"r{i}", 5, max_tokens=4) for i in range(5)]
    for s in seqs:
        sched.add(s)
    eng = FakeEngine(sched)
    eng.step()  # every prompt fits one step: two in slots, two ahead, one queued
    assert [s.num_generated for s in seqs] == [1, 1, 1, 1, 0]
    assert sched.num_ahead == 2 and sched.num_waiting == 1
    for _ in range(2):  # the two ahead wait: only the first two generate
        chunks = eng.step()
        assert {c.seq.request_id for c in chunks} == {"r0", "r1"}
    assert [s.num_generated for s in seqs] == [3, 3, 1, 1, 0]
    eng.step()  # r0 and r1 reach max_tokens: their slots go to r2 and r3, r4 goes ahead
    assert seqs[0].status is SequenceStatus.FINISHED_LENGTH
    chunks = eng.step()
    assert [c.seq.request_id for c in chunks][:2] == ["r2", "r3"]  # r2 and r3 generate on
    assert chunks[0].start == seqs[2].num_prompt  # from the token sent first: no recompute
    assert seqs[4].num_generated == 1 and sched.num_ahead == 1
    eng.run()
    for s in seqs:  # every request ends with its own tokens, in order
        assert s.tokens[s.num_prompt:] == [own_token(s, k) for k in range(s.max_tokens)]


def test_nobody_goes_ahead_whose_cells_are_not_free() -> None:
    # two running requests commit 2 x (5 + 4) cells: a third of 9 fits 27, not 26
    for cells, ahead in ((27, 1), (26, 0)):
        sched = _ahead(cells=cells)
        seqs = [make_seq(f"r{i}", 5, max_tokens=4) for i in range(4)]
        for s in seqs:
            sched.add(s)
        sched.admit()
        assert sched.num_ahead == ahead
        assert list(sched.waiting) == seqs[2 + ahead:]  # the queue keeps its order


def test_without_the_engines_free_cells_nobody_goes_ahead() -> None:
    sched = Scheduler(num_slots=2, token_budget=64, ahead=2)
    for i in range(3):
        sched.add(make_seq(f"r{i}", 5))
    assert len(sched.admit()) == 2 and sched.num_waiting == 1


def test_a_request_of_several_choices_keeps_off_the_last_slot_not_the_last_seat() -> None:
    sched = _ahead(slots=3, ahead=3)
    sched.add(make_seq("a", 5))
    choices = [make_seq("b", 5) for _ in range(2)]
    for s in choices:
        s.group = "b"
        sched.add(s)
    sched.admit()
    assert [s.request_id for s in sched.running] == ["a", "b"]  # the last slot kept
    sched.add(make_seq("c", 5))
    sched.admit()  # c takes the last slot; b's other choice then goes ahead
    assert [s.request_id for s in sched.running] == ["a", "b", "c", "b"]


def test_slots_and_stats_show_the_requests_ahead_as_waiting_for_a_slot() -> None:
    sched = _ahead()
    seqs = [make_seq(f"r{i}", 5) for i in range(3)]
    for s in seqs:
        sched.add(s)
    FakeEngine(sched).step()
    listed = slots_json(sched)
    assert [(e["id"], e["state"]) for e in listed] == [
        (0, "generating"), (1, "generating"), (2, "waiting_for_slot")]

    class NoCache:
        def snapshot(self) -> dict[str, object]:
            return {}
    stats = stats_json(EngineStats(), sched, 8192, NoCache())  # type: ignore[arg-type]
    assert (stats["slots_busy"], stats["slots_total"], stats["queued"], stats["ahead"]) == (
        2, 2, 1, 1)


def test_requests_ahead_take_freed_slots_by_priority_not_admission() -> None:
    sched = _ahead(slots=1, ahead=2)
    first, low, high = make_seq("first", 5, max_tokens=2), make_seq("low", 5), make_seq("high", 5)
    low.priority, high.priority = -5, 5
    for s in (first, low):
        sched.add(s)
    eng = FakeEngine(sched)
    eng.step()  # first in the slot, low ahead
    sched.add(high)
    eng.step()  # high ahead too; first ends
    assert first.status is SequenceStatus.FINISHED_LENGTH
    assert (low.num_generated, high.num_generated) == (1, 1)
    chunks = eng.step()  # the freed slot goes to high, low waits on
    assert [c.seq.request_id for c in chunks] == ["high"]
    assert [(e["id"], e["state"], e["request_id"]) for e in slots_json(sched)] == [
        (0, "generating", "high"), (1, "waiting_for_slot", "low")]


def test_a_freed_slot_goes_to_a_waiting_request_that_comes_before_those_ahead() -> None:
    sched = _ahead(slots=1, ahead=1)
    first, low, high = make_seq("first", 5, max_tokens=3), make_seq("low", 5), make_seq("high", 5)
    low.priority, high.priority = -5, 5
    eng = FakeEngine(sched)
    for s in (first, low, high):
        sched.add(s)
        eng.step()  # first in the slot, then low ahead, then high waits: no seat left
    assert first.status is SequenceStatus.FINISHED_LENGTH and list(sched.waiting) == [high]
    chunks = eng.step()  # the slot is high's (priority), low waits on ahead
    assert [c.seq.request_id for c in chunks] == ["high"] and high.num_computed == 5
    assert low.ahead and low.num_generated == 1
    eng.run()
    assert low.num_generated == low.max_tokens


def test_slots_freed_together_go_to_the_waiting_one_first_then_to_those_ahead() -> None:
    sched = _ahead(slots=2, ahead=2)
    eng = FakeEngine(sched)
    busy = [make_seq(f"busy{i}", 5, max_tokens=3) for i in range(2)]
    low = [make_seq(f"low{i}", 5) for i in range(3)]
    high = make_seq("high", 5)
    high.priority = 10
    for s in (*busy, *low):
        sched.add(s)
    eng.step()  # busy0 and busy1 in the slots, low0 and low1 ahead, low2 queued
    sched.add(high)
    eng.step()
    assert [s.ahead for s in low[:2]] == [True, True] and list(sched.waiting) == [low[2], high]
    eng.step()  # both busy ones end at once
    assert all(s.status is SequenceStatus.FINISHED_LENGTH for s in busy)
    eng.step()  # one slot to high (priority), the other to low0 (ahead, first in line)
    generating = {s.request_id for s in sched.running if not s.ahead}
    assert generating == {"high", "low0"}, generating
    assert low[2].ahead and low[1].ahead  # low2 went ahead in the seat high left


def test_a_request_too_large_to_go_ahead_lets_later_ones_go_and_keeps_its_turn() -> None:
    sched = _ahead(slots=1, ahead=2, cells=100)
    eng = FakeEngine(sched)
    first = make_seq("first", 5, max_tokens=3)  # commits 8 cells
    huge = make_seq("huge", 5, max_tokens=90)  # 95 more: past 100
    small = make_seq("small", 5)  # 9 more: fits
    for s in (first, huge, small):
        sched.add(s)
    eng.step()
    assert (small.ahead, huge.status, small.num_generated) == (
        True, SequenceStatus.WAITING, 1)
    eng.step()
    eng.step()  # first ends: its slot is huge's (first in line), small waits on ahead
    eng.step()
    assert not huge.ahead and huge.num_generated >= 1 and small.ahead
    eng.run()
    assert (huge.num_generated, small.num_generated) == (90, 4)


def _cfg(**kw: object) -> ModelConfig:
    return ModelConfig(id="m", path=Path("/x.gguf"), **kw)  # type: ignore[arg-type]


def test_seats_follow_prefill_ahead_within_llamas_sequences() -> None:
    assert seats(_cfg(slots=8), "kv") == 16  # by default as many as the slots
    assert seats(_cfg(slots=8, prefill_ahead=0), "kv") == 8
    assert seats(_cfg(slots=8, prefill_ahead=3), "kv") == 11
    assert seats(_cfg(slots=200, batch=256), "kv") == 223  # 255 less 32 cache entries
    assert seats(_cfg(slots=8), "checkpoint") == 8  # a state per sequence: none ahead
    with pytest.raises(ConfigError, match="prefill_ahead"):
        _cfg(slots=8, prefill_ahead=-1)
    with pytest.raises(ConfigError, match="prefill_ahead"):
        _cfg(slots=200, batch=256, prefill_ahead=30)

