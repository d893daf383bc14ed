"""Prompt-lookup drafts: what they propose, and how the draft length adapts."""

from __future__ import annotations

import pytest

from edgeinfer.engine.drafts import NgramDrafter
from edgeinfer.engine.scheduler import Scheduler, worth
from edgeinfer.engine.sequence import SamplingParams, Sequence
from edgeinfer.engine.stepcost import StepCost


def test_the_tokens_after_the_latest_earlier_occurrence_are_proposed() -> None:
    d = NgramDrafter(max_len=4, n_min=2)
    tokens = [1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3]
    assert d.propose(tokens, limit=10) == [4, 5, 6, 9]  # after the earlier 1 2 3
    assert d.propose(tokens, limit=2) == [4, 5]
    assert d.propose([7, 8, 9, 10], limit=4) == []  # nothing repeats: no draft
    tokens = [5, 6, 7, 1, 2, 8, 8, 1, 2, 3, 3, 1, 2]
    d2 = NgramDrafter(max_len=2, n_min=2)
    assert d2.propose(tokens, limit=2) == [3, 3]  # the latest "1 2" wins
    tokens += [3]  # extended: indexes only what is new, finds the longer match
    assert d2.propose(tokens, limit=2) == [3, 1]


def test_the_length_doubles_on_success_and_shrinks_on_a_miss() -> None:
    d = NgramDrafter(max_len=8, n_min=3)
    d.length = 2
    d.accepted(2, 2)
    assert d.length == 4
    d.accepted(4, 4)
    d.accepted(8, 8)
    assert d.length == 8  # capped
    d.accepted(8, 1)
    assert d.length == 2 and d.taken == 15
    d.accepted(2, 0)  # none accepted: shorter, and a pause
    assert d.length == 1
    tokens = [1, 2, 3, 4, 1, 2, 3]
    assert [d.propose(tokens, 4) for _ in range(8)] == [[]] * 8
    assert d.propose(tokens, 4) == [4]


def test_the_scheduler_adds_drafts_within_the_budget_and_max_tokens() -> None:
    sch = Scheduler(2, 32, draft_budget=5)
    seqs = []
    for rid in ("a", "b"):
        seq = Sequence(rid, [1, 2, 3, 4, 5, 6, 1, 2, 3], SamplingParams(), max_tokens=3)
        seq.drafter = NgramDrafter(max_len=8)
        sch.add(seq)
        seqs.append(seq)
    sch.admit()
    for seq in seqs:
        seq.num_computed = seq.num_prompt
        seq.tokens.append(4)  # each has generated one token, not yet computed
    chunks = sch.schedule()
    # "a" may take 1 more token before max_tokens (3): 1 draft; "b" the same
    assert [(c.tokens, c.drafts) for c in chunks] == [([4, 5], 1), ([4, 5], 1)]
    seqs[0].max_tokens = seqs[1].max_tokens = 100
    for seq in seqs:
        seq.drafter = NgramDrafter(max_len=8)
    chunks = sch.schedule()
    assert sum(c.drafts for c in chunks) == 5  # the step's draft budget


def test_the_step_cost_is_measured_and_interpolated() -> None:
    costs = StepCost()
    assert costs.seconds(1) is None
    costs.note(1, 0.005)
    costs.note(5, 0.020)
    assert costs.seconds(1) == 0.005 and costs.seconds(5) == 0.020
    assert costs.seconds(3) == pytest.approx(0.0125)  # between the measured neighbours
    assert costs.seconds(6) is None  # nothing as large measured: unknown
    costs.note(1, 0.010)  # a moving average, not the last value
    assert 0.005 < (costs.seconds(1) or 0) < 0.010


def test_drafts_are_verified_only_where_they_raise_tokens_per_second() -> None:
    linear = StepCost()  # every row costs as much as the first: a draft must be sure
    for rows in range(1, 10):
        linear.note(rows, 0.005 * rows)
    likely = [0.0, 0.8, 1.44, 1.95, 2.36]  # expected accepted of 0..4 drafts at 80 %
    assert worth(linear, 1, 1.0, likely) == 0
    assert worth(linear, 1, 1.0, [0.0, 1.0, 2.0, 3.0, 4.0]) == 0  # no better, no worse
    cheap = StepCost()  # rows after the first cost a fifth of it
    for rows in range(1, 10):
        cheap.note(rows, 0.005 + 0.001 * (rows - 1))
    assert worth(cheap, 1, 1.0, likely) == 4
    assert worth(cheap, 1, 1.0, [0.0, 0.1, 0.11, 0.111, 0.1111]) == 0  # mostly rejected
    assert worth(StepCost(), 4, 4.0, likely) == 4  # never measured: tried


def test_the_acceptance_per_position_is_learned() -> None:
    d = NgramDrafter(max_len=4)
    assert d.expected(0) == 0.0 and 4.0 > d.expected(4) > 3.0  # the prior: 90 %
    for _ in range(10):
        d.accepted(4, 0)  # the first draft token keeps missing
    assert d.expected(4) < 0.2 and d.proposed == 40 and d.rate == 0.0
    for _ in range(50):
        d.unused()  # not tried for a while: back toward trying
    assert d.expected(4) > 1.0
    for _ in range(20):
        d.accepted(4, 4)
    assert d.expected(4) > 3.9


def test_a_sequence_whose_drafts_miss_stops_drafting_when_rows_are_dear() -> None:
    sch = Scheduler(1, 32, draft_budget=8)
    seq = Sequence("a", [1, 2, 3, 4, 5, 6, 1, 2, 3, 4], SamplingParams(), max_tokens=100)
    seq.drafter = NgramDrafter(max_len=4)
    sch.add(seq)
    sch.admit()
    seq.num_computed = seq.num_prompt
    seq.tokens.append(5)
    assert sch.schedule()[0].drafts == 4  # no step measured yet: tried
    for rows in range(1, 6):
        sch.costs.note(rows, 0.005 * rows)
    for _ in range(3):
        seq.drafter.accepted(4, 1)
    assert sch.schedule()[0].drafts == 0
