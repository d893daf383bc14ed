"""Prompt-lookup drafts: what they propose, and how the draft length adapts."""

from __future__ import annotations

import pytest

from edgeinfer.engine.drafts import NgramDrafter
from edgeinfer.engine.scheduler import Chunk, Scheduler
from edgeinfer.engine.sequence import SamplingParams, Sequence
from edgeinfer.engine.step_cost import LONE_BAR, MIN_SAMPLES, STALE, StepCost, shared


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


def _two_streams(sch: Scheduler) -> list[Sequence]:
    """Two generating sequences whose last tokens repeat their output only (a short match,
    expected 0.4)."""
    seqs = []
    for rid in ("a", "b"):
        seq = Sequence(rid, [9, 9, 9], SamplingParams(), max_tokens=100)
        seq.drafter = NgramDrafter(max_len=4, n_min=2, n_max=4)
        sch.add(seq)
        seqs.append(seq)
    sch.admit()
    for seq in seqs:
        seq.num_computed = seq.num_prompt
        seq.tokens += [1, 2, 3, 4, 5, 6, 1, 2]  # generated, the last not yet computed
        seq.num_computed = len(seq.tokens) - 1
    return seqs


def test_the_scheduler_drafts_only_what_the_measured_step_cost_pays_for() -> None:
    """Measured rows that cost as much as a stream's token (Q4_1 here) bar a short match
    into the output; cheap rows (Q8_0 here) let it through; nothing measured: drafted."""
    for costly, drafted in ((None, 2), (True, 0), (False, 2)):
        sch = Scheduler(2, 32, draft_budget=8)
        _two_streams(sch)
        if costly is not None:
            for rows in [*range(2, 11)] * MIN_SAMPLES:
                sch.step_cost.note(rows, (2.5 * rows if costly else 5 + 0.2 * rows) / 1000)
        chunks = sch.schedule()
        assert sum(1 for c in chunks if c.drafts) == drafted, costly
        assert all(c.tokens[1:] == [3, 4, 5, 6] for c in chunks if c.drafts)


def test_a_draft_beside_streams_that_draft_nothing_must_also_pay_for_their_steps() -> None:
    """Rows at 1 ms each over 4.67 ms a step ask 0.3 of a draft when every stream drafts,
    which a short match (expected 0.4) passes. Beside a stream that drafts nothing and with
    nothing waiting, the steps go on until that one is done, so only half the step's own
    cost is saved (bar 0.46) and the draft is left out; with a request waiting, the slot a
    stream frees sooner takes it, and the draft goes in."""
    for others_draft, waiting, drafted in ((True, False, 2), (False, False, 0),
                                           (False, True, 1)):
        sch = Scheduler(2, 32, draft_budget=8)
        _, b = _two_streams(sch)
        if not others_draft:
            b.drafter = None
        if waiting:
            sch.add(Sequence("w", [1, 2], SamplingParams(), max_tokens=4))
        for rows in [*range(2, 11)] * MIN_SAMPLES:
            sch.step_cost.note(rows, (4.67 + rows) / 1000)
        assert sch.step_cost.bar(2, 2, 4) == pytest.approx(0.3, abs=0.01)
        chunks = sch.schedule()
        assert sum(1 for c in chunks if c.drafts) == drafted, (others_draft, waiting)
        assert all(c.seq.drafter is None or c.seq.drafter.proposed == c.drafts
                   for c in chunks)


def test_the_step_s_room_for_drafts_goes_to_the_surest_first() -> None:
    """A short match (expected 0.4) proposed first, beside a match into the prompt
    (expected 0.9), with room for one draft of four: the prompt match takes it."""
    sch = Scheduler(2, 32, draft_budget=4)
    a, _ = _two_streams(sch)
    b = Sequence("b2", [1, 2, 3, 4, 5, 6, 7, 8], SamplingParams(), max_tokens=100)
    b.drafter = NgramDrafter(max_len=4, n_min=2, n_max=4)
    sch.running[1] = b
    b.slot, b.status = 1, a.status
    b.tokens += [1, 2]
    b.num_computed = len(b.tokens) - 1
    for rows in [*range(2, 11)] * MIN_SAMPLES:
        sch.step_cost.note(rows, (4.67 + rows) / 1000)
    chunks = sch.schedule()
    assert [(c.seq.request_id, c.drafts) for c in chunks] == [("a", 0), ("b2", 4)]
    assert chunks[1].tokens == [2, 3, 4, 5, 6] and a.drafter is not None
    assert a.drafter.proposed == 0 and b.drafter.proposed == 4


def test_a_draft_left_out_leaves_its_room_to_the_others() -> None:
    """Four streams, two with a match: a short one (0.4) first, one into the prompt (0.9).
    Both pass the bar of every stream drafting (0.3); at the share of two in four (0.46) the
    short one is left out; the other, judged again at one in four (0.63), drafts, in room
    the short one did not keep."""
    sch = Scheduler(4, 32, draft_budget=4)
    outputs = {"short": ([9, 9, 9], [1, 2, 3, 4, 5, 6, 1, 2]),
               "prompt": ([1, 2, 3, 4, 5, 6], [1, 2]), "x": ([7], [8]), "y": ([7], [9])}
    for rid, (prompt, _) in outputs.items():
        seq = Sequence(rid, prompt, SamplingParams(), max_tokens=100)
        if rid in ("short", "prompt"):
            seq.drafter = NgramDrafter(max_len=4, n_min=2, n_max=4)
        sch.add(seq)
    sch.admit()
    for seq in sch.running:
        seq.tokens += outputs[seq.request_id][1]
        seq.num_computed = len(seq.tokens) - 1
    for rows in [*range(2, 11)] * MIN_SAMPLES:
        sch.step_cost.note(rows, (9.33 + rows) / 1000)
    assert sch.step_cost.bar(4, 4, 4) == pytest.approx(0.3, abs=0.01)
    chunks = sch.schedule()
    assert [(c.seq.request_id, c.drafts) for c in chunks] == [
        ("short", 0), ("prompt", 4), ("x", 0), ("y", 0)]


def test_the_shared_bar_counts_the_fixed_cost_by_the_share_of_streams_that_draft() -> None:
    assert shared(0.3, 1.0) == 0.3
    assert shared(0.3, 0.5) == pytest.approx(0.3 / (0.3 + 0.5 * 0.7))
    assert shared(0.3, 0.0) == 1.0  # nobody gets ahead: only a sure draft pays
    assert shared(0.0, 0.5) == 0.0  # costs not known yet: draft, and so measure
    assert shared(1.2, 0.5) == 1.2


def test_only_generation_steps_of_the_main_context_are_measured() -> None:
    sch = Scheduler(2, 32, draft_budget=8)
    a, _ = _two_streams(sch)
    prompt = Sequence("p", list(range(20)), SamplingParams(), max_tokens=4)
    sch.note_step([Chunk(prompt, 0, list(range(20)), True)], 0.5)  # a prompt piece
    sch.note_step([Chunk(a, 10, [2, 3, 4], True)], 0.02, main=False)  # the lane's
    assert sch.step_cost.estimate(3) is None
    sch.note_step([Chunk(a, 10, [2, 3, 4], True)], 0.02)
    assert sch.step_cost._seconds == {3: 0.02}
    sch.note_step([], 0.0001)  # a decode that failed: nothing
    assert sch.step_cost._seconds == {3: 0.02}


def test_drafts_shorter_than_the_minimum_are_not_proposed() -> None:
    """A one- or two-token draft costs a CPU step nearly as much as a long one (models.toml
    ``draft_min``): it is not proposed, and a miss shortens drafts no further."""
    tokens = [7, 5, 6, 5, 6]  # "5 6" came before, followed by two tokens only
    assert NgramDrafter(max_len=8, n_min=2).propose(tokens, limit=8) == [5, 6]
    assert NgramDrafter(max_len=8, n_min=2, min_len=3).propose(tokens, limit=8) == []
    d = NgramDrafter(max_len=8, n_min=2, min_len=3)  # (a drafter follows one sequence)
    assert d.propose([1, 2, 3, 4, 9, 1, 2], limit=8) == [3, 4, 9, 1, 2]
    assert d.propose([1, 2, 3, 4, 9, 1, 2], limit=2) == []  # no room for three
    d.accepted(8, 1)
    assert d.length == 3
    d.accepted(3, 0)
    assert d.length == 3


def test_a_draft_is_proposed_only_when_its_expected_acceptance_passes_the_bar() -> None:
    """A short match into the output is expected to be accepted less often than one into
    the prompt: it copies the prompt when the n-gram is there too; a draft whose kind's
    expected share does not pass the step's bar is not proposed."""
    prompt = [10, 11, 12, 1, 2, 3, 7, 14]
    out = [1, 2, 3, 4, 5, 6, 1, 2, 3]  # "1 2 3": latest in the output, also in the prompt
    assert NgramDrafter(max_len=2, n_min=2, n_max=4).propose(prompt + out, 8,
                                                             len(prompt)) == [7, 14]
    out = [9, 8, 4, 5, 6, 9, 8]  # only in the output, short: expected 0.4
    short = NgramDrafter(max_len=2, n_min=2, n_max=4)
    assert short.propose(prompt + out, 8, len(prompt), lambda k: 0.5) == []
    assert short.propose(prompt + out, 8, len(prompt), lambda k: 0.3) == [4, 5]
    out = [9, 8, 7, 6, 5, 9, 8, 7, 6]  # 4 tokens in common (n_max): expected 0.6
    assert NgramDrafter(max_len=2, n_min=2, n_max=4).propose(
        prompt + out, 8, len(prompt), lambda k: 0.5) == [5, 9]
    assert NgramDrafter(max_len=2, n_min=2, n_max=4).propose(
        prompt + out, 8, len(prompt), lambda k: 0.7) == []
    into_prompt = [1, 2, 3]  # expected 0.9: passes the bars a CPU sets
    assert NgramDrafter(max_len=2, n_min=2, n_max=4).propose(
        prompt + into_prompt, 8, len(prompt), lambda k: 0.8) == [7, 14]


def test_a_sequences_own_record_moves_its_expectation() -> None:
    prompt = [10, 11, 12, 1, 2, 3, 7, 14]
    d = NgramDrafter(max_len=2, n_min=2, n_max=4)
    assert d.propose(prompt + [1, 2, 3], 8, len(prompt), lambda k: 0.8) == [7, 14]
    for _ in range(4):
        d.accepted(2, 0)  # its prompt matches miss: 0 of 8 accepted
    assert d.expect("prompt") == (8 * 0.9) / 16
    d.length, d._pause = 2, 0  # (the misses also shortened and paused its drafts)
    assert d.propose(prompt + [1, 2, 3], 8, len(prompt), lambda k: 0.8) == []
    assert d.propose(prompt + [1, 2, 3], 8, len(prompt), lambda k: 0.4) == [7, 14]


def test_a_refused_match_gives_way_to_a_shorter_one_into_the_prompt() -> None:
    prompt = [10, 11, 12, 1, 2, 3, 7, 14]
    out = [9, 8, 1, 2, 5, 9, 8, 1, 2]  # "9 8 1 2" (n_max) and "8 1 2" only in the output
    d = NgramDrafter(max_len=2, n_min=2, n_max=4)
    assert d.propose(prompt + out, 8, len(prompt), lambda k: 0.7) == [3, 7]  # "1 2": prompt
    assert d.propose(prompt + out, 8, len(prompt), lambda k: 0.5) == [5, 9]  # the long one


def test_a_kind_ruled_out_by_early_misses_is_tried_again() -> None:
    prompt = [10, 11, 12, 1, 2, 3, 7, 14]
    d = NgramDrafter(max_len=2, n_min=2, n_max=4)
    assert d.propose(prompt + [1, 2, 3], 8, len(prompt), lambda k: 0.5) == [7, 14]
    d.accepted(2, 0)
    d.accepted(6, 0)  # 8 tokens missed: expected 7.2 / 16 = 0.45, under the bar
    tries = []
    for _ in range(6):
        d._pause, d.length = 0, 2
        tries.append(d.propose(prompt + [1, 2, 3], 8, len(prompt), lambda k: 0.5))
    assert tries[0] == [] and [7, 14] in tries  # refused at first, tried again later


def test_step_cost_bar_follows_what_rows_add() -> None:
    cost = StepCost()
    assert cost.bar(2, 2, 3) == 0.0  # nothing measured: draft, and so measure
    assert cost.bar(1, 1, 3) == LONE_BAR  # alone: fixed, whatever the timing
    q4 = ((1, 5.3), (2, 11.0), (4, 15.8), (8, 24.5), (16, 41.0))  # SmolLM2 Q4_1, here
    for rows, ms in q4:
        cost.note(rows, ms / 1000)
    assert cost.bar(2, 2, 2) == 0.0  # measured once: not yet trusted
    for _ in range(MIN_SAMPLES - 1):
        for rows, ms in q4:
            cost.note(rows, ms / 1000)
    assert cost.bar(1, 1, 3) == LONE_BAR
    assert cost.bar(2, 2, 2) == pytest.approx((15.8 - 11.0) / 2 / (11.0 / 2))  # 0.44
    assert cost.bar(8, 8, 8) == pytest.approx((41.0 - 24.5) / 8 / (24.5 / 8))  # 0.67
    assert cost.estimate(12) == pytest.approx((24.5 + 41.0) / 2000)  # interpolated
    span = (41.0 - 5.3) / 15  # extrapolated along the widest span, 1 to 16 rows
    assert cost.estimate(24) == pytest.approx((41.0 + 8 * span) / 1000)
    assert cost.bar(4, 8, 4) == pytest.approx((32.75 - 24.5) / 4 / (15.8 / 4))
    for rows, ms in ((4, 18.1), (8, 21.5), (16, 25.5)):  # Q8_0 here: rows past 4 are cheap
        for _ in range(30):
            cost.note(rows, ms / 1000)
    assert cost.bar(4, 4, 4) < 0.2 and cost.bar(8, 8, 8) < 0.3
    before = cost.estimate(16)
    assert before == pytest.approx(0.0255, rel=0.01)
    cost.note(16, 0.001)  # one fast outlier moves the average a fifth of the way
    assert cost.estimate(16) == pytest.approx(before + 0.2 * (0.001 - before))
    for _ in range(STALE):  # long unmeasured, the other row counts are measured again
        cost.note(16, 0.0255)
    assert cost.estimate(8) is None and cost.bar(4, 4, 4) == 0.0


def test_a_prediction_is_followed_through_an_edit() -> None:
    """Predicted Outputs: drafts come from the prediction where the output is in it; an
    edit loses the place, the output's last tokens find it again past what was reached."""
    prompt = [90, 91, 92]
    pred = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3, 13]
    d = NgramDrafter(max_len=4, n_min=4, min_len=1, prediction=pred)
    assert d.propose(prompt + [1], 8, len(prompt)) == [2, 3, 4, 5]
    assert d.propose(prompt + [1, 2, 3], 8, len(prompt)) == [4, 5, 6, 7]
    out = [1, 2, 3, 4, 5, 99]  # an edit: 6 became 99
    assert d.propose(prompt + out, 8, len(prompt)) == []  # lost, no n-gram to find it by
    out += [7, 8, 9]  # back on the prediction: found by "7 8 9"
    assert d.propose(prompt + out, 8, len(prompt)) == [10, 11, 12, 1]
    out += [10, 11, 12, 1, 2, 3]  # "1 2 3" also starts the prediction: the later one wins
    assert d.propose(prompt + out, 8, len(prompt)) == [13]
    plain = NgramDrafter(max_len=4, n_min=4, min_len=1)  # no prediction: prompt lookup only
    assert plain.propose(prompt + [1, 2, 3], 8, len(prompt)) == []


COPIED = list(range(20, 60))  # a prompt text the answer copies, one token a word


def _copying(max_len: int = 4) -> tuple[NgramDrafter, list[int]]:
    """A drafter whose last draft (24..27, from the prompt) was accepted up to 24: the
    output then wrote something else where the prompt has 25."""
    prompt = [1, 2, *COPIED, 3]
    d = NgramDrafter(max_len=max_len, n_min=4, n_max=8)
    out = [20, 21, 22, 23]
    assert d.propose(prompt + out, 8, len(prompt)) == [24, 25, 26, 27]
    d.accepted(4, 1)
    return d, prompt


def test_a_copy_that_left_off_resyncs_on_one_token_just_past_that_point() -> None:
    d, prompt = _copying()
    # a word changed (99 for 25), then the copy goes on: 26 is found just past 25
    assert d.propose(prompt + [20, 21, 22, 23, 24, 99, 26], 8, len(prompt)) == [27, 28]
    d, prompt = _copying()
    # a word added (99 before 25)
    assert d.propose(prompt + [20, 21, 22, 23, 24, 99, 25], 8, len(prompt)) == [26, 27]
    d, prompt = _copying()
    # nothing the prompt has there yet: no draft (four tokens would be needed without it)
    assert d.propose(prompt + [20, 21, 22, 23, 24, 99], 8, len(prompt)) == []
    plain = NgramDrafter(max_len=4, n_min=4, n_max=8)
    assert plain.propose(prompt + [20, 21, 22, 23, 24, 99, 26], 8, len(prompt)) == []


def test_a_resync_takes_one_token_only_near_and_two_within_the_window() -> None:
    d, prompt = _copying()
    far = 25 + 6  # six words left out: one token so far on is a chance match
    assert d.propose(prompt + [20, 21, 22, 23, 24, 98, far], 8, len(prompt)) == []
    assert d.propose(prompt + [20, 21, 22, 23, 24, 98, far, far + 1], 8,
                     len(prompt)) == [far + 2, far + 3]
    d, prompt = _copying()
    beyond = 25 + 30  # past the window: the copy is lost
    assert d.propose(prompt + [20, 21, 22, 23, 24, 98, beyond - 1, beyond], 8,
                     len(prompt)) == []


def test_a_resync_none_of_which_is_accepted_loses_the_copy() -> None:
    d, prompt = _copying()
    out = [20, 21, 22, 23, 24, 99, 26]
    assert d.propose(prompt + out, 8, len(prompt)) == [27, 28]
    d.accepted(2, 0)
    d._pause = 0
    assert d.propose(prompt + out + [97, 28], 8, len(prompt)) == []


def test_a_copy_going_well_that_misses_resyncs_at_once() -> None:
    """A prompt draft none of whose tokens was accepted, in a copy whose record is good,
    does not pause drafting (``COOLDOWN``): the next token resyncs."""
    prompt = [1, 2, *COPIED, 3]
    d = NgramDrafter(max_len=4, n_min=4, n_max=8)
    assert d.propose(prompt + [20, 21, 22, 23], 8, len(prompt)) == [24, 25, 26, 27]
    d.accepted(4, 4)
    assert d.propose(prompt + list(range(20, 29)), 8, len(prompt)) == [29, 30, 31, 32]
    d.accepted(4, 0)  # the model wrote 99 where the prompt has 29
    assert d.propose(prompt + list(range(20, 29)) + [99, 29], 8, len(prompt)) == [30, 31]
    free = NgramDrafter(max_len=4, n_min=4, n_max=8)  # the same miss with a poor record
    assert free.propose(prompt + [20, 21, 22, 23], 8, len(prompt)) == [24, 25, 26, 27]
    for _ in range(3):
        free.accepted(4, 0)
    assert free.propose(prompt + [20, 21, 22, 23, 99, 24], 8, len(prompt)) == []  # paused


def test_a_resync_is_looked_for_only_soon_after_the_copy_left_off() -> None:
    d, prompt = _copying()
    wandered = [20, 21, 22, 23, 24, *range(90, 99)]  # nine tokens of its own since
    assert d.propose(prompt + wandered + [26], 8, len(prompt)) == []
    assert d.propose(prompt + wandered[:-1] + [26], 8, len(prompt)) == []  # lost for good
    d, prompt = _copying()
    assert d.propose(prompt + wandered[:-1] + [26], 8, len(prompt)) == [27, 28]


def test_a_first_prompt_match_none_of_which_is_right_starts_no_copy() -> None:
    """An answer that repeats a few words of its question and goes on its own way: no
    resync follows (nothing was copied)."""
    prompt = [1, 2, *COPIED, 3]
    d = NgramDrafter(max_len=4, n_min=4, n_max=8)
    assert d.propose(prompt + [20, 21, 22, 23], 8, len(prompt)) == [24, 25, 26, 27]
    d.accepted(4, 0)
    d._pause = 0
    assert d.propose(prompt + [20, 21, 22, 23, 99, 25], 8, len(prompt)) == []


def test_a_resync_at_the_end_of_the_prompt_proposes_nothing_shorter_than_the_minimum() -> None:
    prompt = [1, 2, *COPIED, 3]
    for min_len, expected in ((1, [3]), (3, [])):
        d = NgramDrafter(max_len=4, n_min=4, n_max=8, min_len=min_len)
        out = list(range(20, 57))
        assert d.propose(prompt + out, 8, len(prompt)) == [57, 58, 59, 3]
        d.accepted(4, 1)  # the model wrote 99 where the prompt has 58
        assert d.propose(prompt + out + [57, 99, 59], 8, len(prompt)) == expected


def test_a_short_first_miss_is_not_a_copy_going_well_on_the_prior_alone() -> None:
    """A first 2-token prompt draft that misses leaves the prompt kind expected at 0.72,
    over the resync prior, but nothing was ever accepted: it pauses and starts no copy."""
    prompt = [1, 2, *COPIED, 3]
    d = NgramDrafter(max_len=2, n_min=4, n_max=8, min_len=1)
    assert d.propose(prompt + [20, 21, 22, 23], 8, len(prompt)) == [24, 25]
    d.accepted(2, 0)
    assert d.expect("prompt") > 0.7 and d._pause > 0
    d._pause = 0
    assert d.propose(prompt + [20, 21, 22, 23, 99, 24], 8, len(prompt)) == []
