"""The scheduler as a pure unit, driven by a fake decode."""

from __future__ import annotations

import zlib

import pytest

from edgeinfer.engine.scheduler import Chunk, Scheduler
from edgeinfer.engine.sequence import SamplingParams, Sequence, SequenceStatus


def make_seq(rid: str, n_prompt: int, max_tokens: int = 4) -> Sequence:
    return Sequence(rid, list(range(1, n_prompt + 1)), SamplingParams(), max_tokens)


def own_token(seq: Sequence, k: int) -> int:
    """The fake model's k-th token for a sequence: different for every sequence."""
    return 1000 * (zlib.crc32(seq.request_id.encode()) % 1000 + 1) + k


class FakeEngine:
    """Runs schedule -> fake decode -> commit -> 'sample' like the real engine; each
    sequence 'samples' its own tokens (``own_token``), and every chunk is checked to
    carry its sequence's own tokens at its own positions."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.batches: list[list[Chunk]] = []

    def step(self) -> list[Chunk]:
        self.sched.admit()
        chunks = self.sched.schedule()
        # (the budget with streams generating is checked where it matters)
        assert sum(len(c.tokens) for c in chunks) <= self.sched.prefill_budget
        for c in chunks:
            assert c.tokens == c.seq.tokens[c.start:c.end]
        self.batches.append(chunks)
        self.sched.commit(chunks)
        for c in chunks:
            if c.wants_logits:
                self.sched.append_token(c.seq, own_token(c.seq, c.seq.num_generated))
                if c.seq.num_generated >= c.seq.max_tokens:
                    self.sched.finish(c.seq, SequenceStatus.FINISHED_LENGTH)
        return chunks

    def run(self, max_steps: int = 1000) -> int:
        steps = 0
        while self.sched.has_work():
            self.step()
            steps += 1
            assert steps < max_steps
        return steps


def test_admits_in_arrival_order_and_queues_when_full() -> None:
    sched = Scheduler(num_slots=2, token_budget=64)
    seqs = [make_seq(f"r{i}", 3) for i in range(4)]
    for s in seqs:
        sched.add(s)
    assert sched.admit() == seqs[:2]
    assert [s.slot for s in seqs[:2]] == [0, 1]
    assert [s.status for s in seqs[2:]] == [SequenceStatus.WAITING] * 2
    assert sched.num_waiting == 2 and sched.num_free_slots == 0


def test_every_request_completes_with_its_own_tokens() -> None:
    sched = Scheduler(num_slots=3, token_budget=16)
    seqs = [make_seq(f"r{i}", 5 + i, max_tokens=3 + i) for i in range(7)]
    for s in seqs:
        sched.add(s)
    assert len({own_token(s, 0) for s in seqs}) == len(seqs)  # no two alike
    FakeEngine(sched).run()
    for s in seqs:
        assert s.status is SequenceStatus.FINISHED_LENGTH
        assert s.tokens[:s.num_prompt] == list(range(1, s.num_prompt + 1))
        assert s.tokens[s.num_prompt:] == [own_token(s, k) for k in range(s.max_tokens)]
        assert s.num_computed == len(s.tokens) - 1  # the last sampled token is never fed
    assert sched.num_free_slots == 3


def test_prefill_budget_chunks_a_long_prompt() -> None:
    sched = Scheduler(num_slots=2, token_budget=10)
    seq = make_seq("long", 35)
    sched.add(seq)
    eng = FakeEngine(sched)
    sizes = [sum(len(c.tokens) for c in eng.step()) for _ in range(4)]
    assert sizes == [10, 10, 10, 5]
    # only the chunk that completes the prompt asks for logits
    flags = [c.wants_logits for b in eng.batches for c in b]
    assert flags == [False, False, False, True]


def test_long_prompt_never_stalls_running_streams() -> None:
    sched = Scheduler(num_slots=4, token_budget=8)
    eng = FakeEngine(sched)
    runners = [make_seq(f"g{i}", 2, max_tokens=50) for i in range(3)]
    for s in runners:
        sched.add(s)
    eng.step()  # all three prefilled in one batch
    long = make_seq("long", 100, max_tokens=2)
    sched.add(long)
    for _ in range(10):
        before = [s.num_generated for s in runners]
        chunks = eng.step()
        # each generating slot advanced by exactly one token; the prompt took the rest
        assert [s.num_generated for s in runners] == [b + 1 for b in before]
        assert sum(len(c.tokens) for c in chunks if c.seq is long) == 8 - 3
        assert chunks[-1].seq is long  # decode tokens first, prompt chunks last


def test_decode_tokens_take_budget_before_prefill() -> None:
    sched = Scheduler(num_slots=4, token_budget=4)
    eng = FakeEngine(sched)
    gens = [make_seq(f"g{i}", 1, max_tokens=100) for i in range(3)]
    for s in gens:
        sched.add(s)
    eng.step()
    late = make_seq("late", 20)
    sched.add(late)
    chunks = eng.step()
    assert [len(c.tokens) for c in chunks] == [1, 1, 1, 1]
    assert chunks[3].seq is late


def test_oldest_prefill_goes_first() -> None:
    sched = Scheduler(num_slots=3, token_budget=6)
    a, b = make_seq("a", 10), make_seq("b", 10)
    sched.add(a)
    sched.add(b)
    chunks = FakeEngine(sched).step()
    assert [(c.seq.request_id, len(c.tokens)) for c in chunks] == [("a", 6)]


def test_a_short_prompt_goes_before_a_long_one_that_came_first() -> None:
    """A 5-token chat behind a new 5,000-token document waited for all of it (37 s)."""
    sched = Scheduler(num_slots=3, token_budget=64, prefill_budget=512)
    eng = FakeEngine(sched)
    long, short = make_seq("long", 5000), make_seq("short", 5)
    sched.add(long)
    eng.step()
    sched.add(short)
    chunks = eng.step()
    assert [(c.seq.request_id, len(c.tokens)) for c in chunks] == [("short", 5),
                                                                    ("long", 507)]
    assert short.num_generated == 1  # its first token: after one step
    # the long one is still computed beside it, in the room the short one leaves
    assert [(c.seq.request_id, len(c.tokens)) for c in eng.step()] == [("short", 1),
                                                                        ("long", 63)]


def test_a_steady_run_of_short_prompts_does_not_starve_a_long_one() -> None:
    sched = Scheduler(num_slots=6, token_budget=64, prefill_budget=512)
    eng = FakeEngine(sched)
    long = make_seq("long", 3000)
    sched.add(long)
    for step in range(120):
        for j in range(4):
            sched.add(make_seq(f"s{step}_{j}", 128, max_tokens=1))  # 4 x 128: a budget
        eng.step()
    assert not long.is_prefilling  # (short ones first took every step's budget)


def test_finish_running_frees_slot_for_waiting() -> None:
    sched = Scheduler(num_slots=1, token_budget=8)
    a, b = make_seq("a", 2, max_tokens=100), make_seq("b", 2)
    sched.add(a)
    sched.add(b)
    eng = FakeEngine(sched)
    eng.step()
    assert b.status is SequenceStatus.WAITING
    assert sched.find("a") is a
    freed = sched.finish(a, SequenceStatus.FINISHED_ABORTED)
    assert freed == 0
    eng.step()
    assert b.slot == 0 and b.status is SequenceStatus.RUNNING


def test_cancel_waiting_sequence() -> None:
    sched = Scheduler(num_slots=1, token_budget=8)
    a, b = make_seq("a", 2), make_seq("b", 2)
    sched.add(a)
    sched.add(b)
    sched.admit()
    assert sched.finish(b, SequenceStatus.FINISHED_ABORTED) is None
    assert sched.find("b") is None and sched.num_waiting == 0


def test_continuous_batching_joins_mid_flight() -> None:
    sched = Scheduler(num_slots=4, token_budget=32)
    eng = FakeEngine(sched)
    first = make_seq("first", 3, max_tokens=20)
    sched.add(first)
    for _ in range(5):
        eng.step()
    second = make_seq("second", 3, max_tokens=3)
    sched.add(second)
    chunks = eng.step()
    assert {c.seq.request_id for c in chunks} == {"first", "second"}
    eng.run()
    assert first.num_generated == 20 and second.num_generated == 3


def test_rejects_budget_smaller_than_slots() -> None:
    with pytest.raises(ValueError):
        Scheduler(num_slots=8, token_budget=4)


def test_a_sequence_waiting_on_a_shared_prefix_gets_no_prompt_chunk() -> None:
    sched = Scheduler(num_slots=2, token_budget=8)
    a, b = make_seq("a", 20), make_seq("b", 20)
    sched.add(a)
    sched.add(b)
    sched.admit()
    b.waiting_on = (a, 16)
    chunks = sched.schedule()
    assert [c.seq for c in chunks] == [a]
    b.waiting_on = None
    b.num_computed = 16  # attached from a
    sched.commit(chunks)
    chunks = sched.schedule()
    assert [(c.seq.request_id, c.start, len(c.tokens)) for c in chunks] == [("a", 8, 8)]


def test_priority_orders_admission_and_aging_prevents_starvation() -> None:
    sched = Scheduler(num_slots=1, token_budget=8)
    low, high = make_seq("low", 2), make_seq("high", 2)
    high.priority = 5
    sched.add(low, now=0.0)
    sched.add(high, now=1.0)
    assert sched.admit(now=1.0) == [high]
    sched.finish(high, SequenceStatus.FINISHED_LENGTH)
    # an old low-priority request outranks a fresh higher one after waiting long enough
    newer = make_seq("newer", 2)
    newer.priority = 2
    sched.add(newer, now=100.0)
    assert sched.admit(now=100.0) == [low]  # waited 100 s: 0 + 100/10 > 2 + 0


def test_a_lone_prompt_goes_in_large_pieces_and_streams_keep_short_steps() -> None:
    sched = Scheduler(num_slots=2, token_budget=64, prefill_budget=256)
    eng = FakeEngine(sched)
    sched.add(make_seq("alone", 600, max_tokens=50), 0.0)
    sizes = [sum(len(c.tokens) for c in eng.step()) for _ in range(3)]
    assert sizes == [256, 256, 88]  # no stream generates: prefill_budget per step
    eng.step()  # "alone" now generates one token per step
    sched.add(make_seq("late", 300), 1.0)
    steps = [eng.step() for _ in range(3)]
    # a stream is generating: the step stays within token_budget, its token included
    assert all(sum(len(c.tokens) for c in st) == 64 for st in steps)
    assert Scheduler(2, 64, prefill_budget=16).prefill_budget == 64  # never below the budget


def _prompt_chunk(n: int) -> list[Chunk]:
    return [Chunk(make_seq("measured", n), 0, list(range(n)), True)]


def test_a_step_time_target_shrinks_prompt_chunks_while_streams_generate() -> None:
    sched = Scheduler(num_slots=2, token_budget=256, step_target=0.1)
    eng = FakeEngine(sched)
    sched.add(make_seq("streaming", 8, max_tokens=100), 0.0)
    eng.step()  # its prompt
    eng.step()  # now it generates
    assert sched.streaming_budget() == 256  # nothing measured yet: the plain budget
    for _ in range(5):
        sched.note_step(_prompt_chunk(256), 1.0)  # 256 tokens/s measured
    assert sched.streaming_budget() == 2 + 32  # 25 fit in 0.1 s: the minimum chunk rules
    sched.add(make_seq("long", 500), 1.0)
    sizes = [sum(len(c.tokens) for c in eng.step()) for _ in range(3)]
    assert sizes == [34, 34, 34]  # the stream's token and 33 prompt tokens per step
    for _ in range(40):
        sched.note_step(_prompt_chunk(4000), 1.0)  # faster: 400 per 0.1 s, capped by the budget
    assert sched.streaming_budget() == 256
    assert Scheduler(2, 256).streaming_budget() == 256  # no target: the plain budget


def test_one_deterministic_sequence_runs_at_a_time() -> None:
    """Deterministic sequences share one lane (``engine.lane``): the next is admitted when
    the running one ends; other requests are admitted past it meanwhile."""
    sched = Scheduler(num_slots=4, token_budget=64)
    d1, d2, plain = make_seq("d1", 5), make_seq("d2", 5), make_seq("plain", 5)
    d1.deterministic = d2.deterministic = True
    for s in (d1, d2, plain):
        sched.add(s)
    assert sched.admit() == [d1, plain]
    assert sched.admit() == [] and list(sched.waiting) == [d2]
    sched.finish(d1, SequenceStatus.FINISHED_STOPPED)
    assert sched.admit() == [d2]


@pytest.mark.parametrize(("n_prompt", "pieces"), [
    (1829, [256] * 6 + [229, 64]),  # not 7 x 256 and 37
    (1799, [256] * 6 + [199, 64]),  # not 7 x 256 and 7
    (1856, [256] * 7 + [64]),  # a tile already
    (300, [236, 64]),
    (100, [100]),  # one piece: nothing to leave
])
def test_a_prompt_never_ends_in_a_piece_smaller_than_the_attention_tile(
        n_prompt: int, pieces: list[int]) -> None:
    sched = Scheduler(num_slots=2, token_budget=256)
    eng = FakeEngine(sched)
    sched.add(make_seq("cold", n_prompt, max_tokens=1))
    eng.run()
    assert [sum(len(c.tokens) for c in b) for b in eng.batches] == pieces


def test_a_prompt_piece_beside_streams_leaves_a_tile_too() -> None:
    sched = Scheduler(num_slots=4, token_budget=256)
    eng = FakeEngine(sched)
    for i in range(3):
        sched.add(make_seq(f"g{i}", 4, max_tokens=100))
    eng.step()  # their prompts; they generate from now on
    sched.add(make_seq("long", 290, max_tokens=1))
    first, second = eng.step(), eng.step()
    assert [len(c.tokens) for c in first] == [1, 1, 1, 226]  # not 253, leaving 37
    assert [len(c.tokens) for c in second] == [1, 1, 1, 64]
