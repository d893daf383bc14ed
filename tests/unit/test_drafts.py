"""Prompt-lookup drafts: what they propose, and how the draft length adapts."""

from __future__ import annotations

from edgeinfer.engine.drafts import NgramDrafter
from edgeinfer.engine.scheduler import Scheduler
from edgeinfer.engine.sequence import SamplingParams, Sequence


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


def test_a_lone_streams_match_into_its_output_needs_the_longest_ngram() -> None:
    """Short matches inside generated text mostly guess wrong, and a lone stream's extra
    rows cost about a step each: alone, only the prompt is copied on a short match (even
    when the latest occurrence is in the output); beside other streams, the output too."""
    prompt = [10, 11, 12, 1, 2, 3, 7, 14]
    out = [1, 2, 3, 4, 5, 6, 1, 2, 3]  # "1 2 3": latest in the output, also in the prompt
    assert NgramDrafter(max_len=2, n_min=2, n_max=4).propose(
        prompt + out, 8, len(prompt), alone=True) == [7, 14]
    assert NgramDrafter(max_len=2, n_min=2, n_max=4).propose(
        prompt + out, 8, len(prompt)) == [4, 5]
    out = [9, 8, 4, 5, 6, 9, 8]  # only in the output
    assert NgramDrafter(max_len=2, n_min=2, n_max=4).propose(
        prompt + out, 8, len(prompt), alone=True) == []
    out = [9, 8, 7, 6, 5, 9, 8, 7, 6]  # 4 tokens in common (n_max): drafted alone too
    assert NgramDrafter(max_len=2, n_min=2, n_max=4).propose(
        prompt + out, 8, len(prompt), alone=True) == [5, 9]


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
