"""The engine's policies as pure units, on fakes: the prefix cache over a fake KV memory,
the prefix wait of admission, what a failed decode does, and the time limit."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from edgeinfer.engine.decode_errors import (
    DECODE_INVALID_BATCH,
    DECODE_NO_KV_SLOT,
    after_decode_error,
)
from edgeinfer.engine.delta import FailureCode
from edgeinfer.engine.drafts import NgramDrafter
from edgeinfer.engine.finishing import DeltaSink, Output, overdue
from edgeinfer.engine.native import LlamaRuntime
from edgeinfer.engine.prefix_cache import PrefixCache
from edgeinfer.engine.prefix_wait import attach, resume_waiters
from edgeinfer.engine.report import Timing
from edgeinfer.engine.sampler import SamplerChain
from edgeinfer.engine.scheduler import Chunk, Scheduler
from edgeinfer.engine.sequence import SamplingParams, Sequence, SequenceStatus
from edgeinfer.engine.textstream import TextStream


class FakeMemory:
    """The two KV-memory calls the prefix cache makes, applied to a dict of sequences."""

    info = SimpleNamespace(n_ctx=1 << 16)  # (the cells a restore may take)

    def __init__(self) -> None:
        self.cells: dict[int, dict[int, bool]] = {}  # seq id -> positions held
        self.calls: list[tuple[Any, ...]] = []

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.calls.append(("cp", src, dst, p0, p1))
        held = self.cells.get(src, {})
        lo, hi = max(p0, 0), (max(held, default=-1) + 1 if p1 < 0 else p1)
        self.cells.setdefault(dst, {}).update({p: True for p in range(lo, hi) if p in held})

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self.calls.append(("rm", seq, p0, p1))
        held = self.cells.get(seq, {})
        for p in [p for p in held if p >= max(p0, 0) and (p1 < 0 or p < p1)]:
            del held[p]

    def holds(self, seq: int) -> int:
        return len(self.cells.get(seq, {}))


def make_cache(entries: int = 2, slots: int = 2) -> tuple[PrefixCache, FakeMemory]:
    mem = FakeMemory()
    return PrefixCache(cast(LlamaRuntime, mem), slots, entries, True), mem


def fill(cache: PrefixCache, mem: FakeMemory, slot: int, tokens: list[int]) -> None:
    """What a decode of ``tokens`` into ``slot`` does."""
    start = cache.index.length(slot)
    mem.cells.setdefault(slot, {}).update({start + i: True for i in range(len(tokens))})
    cache.committed(slot, tokens)


def seq(rid: str, prompt: list[int], **kw: Any) -> Sequence:
    return Sequence(rid, prompt, SamplingParams(), 8, **kw)


# -- PrefixCache ------------------------------------------------------------------

def test_a_finished_prompt_is_kept_and_its_longest_prefix_given_to_the_next() -> None:
    cache, mem = make_cache()
    fill(cache, mem, 0, [1, 2, 3, 4, 5])
    cache.release(0, keep=True)
    assert mem.holds(0) == 0 and len(cache.entries) == 1
    (entry,) = cache.entries
    assert mem.holds(entry) == 5
    # the next request shares 3 tokens; limit 4: at most 4 could be taken
    got = cache.attach(1, [1, 2, 3, 9, 9], limit=4)
    assert got == 3 and mem.holds(1) == 3
    assert ("cp", entry, 1, 0, 3) in mem.calls
    assert cache.entries[entry].hits == 1


def test_attach_takes_no_more_than_the_limit_and_a_second_attach_only_the_extension() -> None:
    cache, mem = make_cache()
    fill(cache, mem, 0, list(range(1, 11)))
    cache.release(0, keep=True)
    (entry,) = cache.entries
    assert cache.attach(1, list(range(1, 11)), limit=4) == 4
    assert cache.attach(1, list(range(1, 11)), limit=9) == 9
    assert mem.calls[-1] == ("cp", entry, 1, 4, 9)


def test_a_prompt_already_covered_by_an_entry_is_not_kept_twice() -> None:
    cache, mem = make_cache()
    fill(cache, mem, 0, [1, 2, 3, 4])
    cache.release(0, keep=True)
    fill(cache, mem, 1, [1, 2, 3])
    cache.release(1, keep=True)
    assert len(cache.entries) == 1 and cache.stats.kept == 1
    assert mem.holds(1) == 0  # the slot itself is always cleared


def test_least_recently_used_entry_goes_first_and_pinned_ones_never() -> None:
    cache, mem = make_cache(entries=2)
    fill(cache, mem, 0, [1, 1])
    cache.release(0, keep=True, pinned=True)
    fill(cache, mem, 0, [2, 2])
    cache.release(0, keep=True)
    fill(cache, mem, 0, [3, 3])
    cache.release(0, keep=True)  # no free id: the unpinned [2, 2] makes room
    kept = sorted(cache.index.tokens_of(e) for e in cache.entries)
    assert kept == [[1, 1], [3, 3]]
    assert cache.stats.evictions == 1
    # all that remains evictable is [3, 3]; then only the pinned entry is left
    assert cache.evict_one() is True
    assert cache.evict_one() is False
    assert [cache.index.tokens_of(e) for e in cache.entries] == [[1, 1]]
    assert cache.unpin_all() == 1 and cache.evict_one() is True and not cache.entries


class StateMemory(FakeMemory):
    """FakeMemory with sequence state to host memory and back (the RAM tier's calls)."""

    def seq_state(self, seq: int) -> bytes:
        return bytes(sorted(self.cells.get(seq, {})))

    def set_seq_state(self, seq: int, data: bytes) -> bool:
        self.cells[seq] = dict.fromkeys(data, True)
        return True

    def seq_pos_max(self, seq: int) -> int:
        return max(self.cells.get(seq, {}), default=-1)

    def seq_state_size(self, seq: int) -> int:
        return len(self.seq_state(seq))


def _kept(mem: StateMemory, *entries: tuple[list[int], bool],
          ram_bytes: int = 1 << 20) -> PrefixCache:
    """A cache with the RAM tier whose entries hold ``entries`` (tokens, pinned), each
    computed in slot 0 and kept when its request ended."""
    cache = PrefixCache(cast(LlamaRuntime, mem), 2, 4, True, ram_bytes=ram_bytes)
    for tokens, pin in entries:
        fill(cache, mem, 0, tokens)
        cache.release(0, keep=True, pinned=pin)
    return cache


def test_idle_entries_wait_in_ram_while_requests_run_and_come_back_on_a_hit() -> None:
    mem = StateMemory()
    a, b, c = list(range(30)), list(range(100, 130)), list(range(200, 230))
    cache = _kept(mem, (a, False), (b, False), (c, True))
    assert len(cache.entries) == 3
    # a request on a's prefix is admitted: b's cells are idle, a is about to be used,
    # c is pinned
    assert cache.trim_idle([[*a, 99]]) == 1
    assert sorted(cache.index.tokens_of(e) for e in cache.entries) == [a, c]
    assert not any(mem.holds(e) for e in range(2, 6) if e not in cache.entries)
    assert cache.attach(1, [*a, 99], limit=30) == 30
    assert cache.trim_idle([]) == 0  # no slot released since
    # b's prompt again: its cells come back from RAM, whole
    assert cache.attach(0, [*b, 99], limit=30) == 30 and mem.holds(0) == 30
    # when the request on a ends, a's entry is idle in turn
    cache.release(1, keep=False)
    assert cache.trim_idle([]) == 1
    assert sorted(cache.index.tokens_of(e) for e in cache.entries) == [b, c]
    # a prompt that shares only a few tokens with an idle entry does not keep it
    cache.release(0, keep=False)
    assert cache.trim_idle([[*b[:5], 99]]) == 1 and len(cache.entries) == 1
    # a prompt that shares part of a state in RAM gets that part; RAM keeps the whole
    assert cache.attach(0, [*b[:20], 99], limit=21) == 20 and cache.ram.has(b)
    assert mem.holds(0) == 20 and sum(mem.holds(e) for e in cache.entries) == 20 + 30
    assert cache.stats.evictions == 3


def test_a_saved_state_comes_back_where_idle_entries_make_room_for_it() -> None:
    """A state goes back whole: idle entries move to RAM to make room for it, oldest first,
    but never the prompt's own KV hit (x, older than b) nor a pinned one (c)."""
    mem = StateMemory()
    mem.info = SimpleNamespace(n_ctx=100)
    a, b, c = list(range(40)), list(range(100, 130)), list(range(200, 230))
    cache = _kept(mem, (a[:10], False), (b, False), (c, True))
    (x,) = [e for e in cache.entries if cache.index.tokens_of(e) == a[:10]]
    cache.ram.put(a, bytes(range(40)))  # a's state waits in RAM
    fill(cache, mem, 1, list(range(300, 320)))  # a running request: 90 of 100 cells held
    assert cache.attach(0, [*a, 999], limit=41) == 40  # 40 cells made: b moved out
    assert x in cache.entries and cache.ram.has(b)
    assert sorted(cache.index.tokens_of(e) for e in cache.entries) == [a[:10], a, c]
    # no room even with every idle entry moved (60 cells held by the running request and
    # the pinned entry, 60 needed): nothing is moved, nothing tried
    cache.release(0, keep=False)
    fill(cache, mem, 1, list(range(320, 330)))
    d = list(range(500, 560))
    cache.ram.put(d, bytes(range(60)))
    entries, restores = set(cache.entries), cache.ram.stats.restored
    assert cache.attach(0, [*d, 7], limit=61) == 0
    assert set(cache.entries) == entries and cache.ram.has(d)
    assert cache.ram.stats.restored == restores


def NEVER() -> bool:  # noqa: N802 (stash_idle's "interrupted": no message comes)
    return False


class CountingMemory(StateMemory):
    def __init__(self) -> None:
        super().__init__()
        self.copies = 0

    def seq_state(self, seq: int) -> bytes:
        self.copies += 1
        return super().seq_state(seq)

    def seq_state_size(self, seq: int) -> int:  # no copy
        return len(StateMemory.seq_state(self, seq))


def test_idle_time_saves_kept_entries_so_that_trimming_them_copies_nothing() -> None:
    """stash_idle (the engine has nothing to do): unpinned entries get their RAM copy then
    and stay in the KV cache; a request that comes later only drops their cells."""
    mem = CountingMemory()
    a, b, c = list(range(30)), list(range(100, 130)), list(range(200, 230))
    cache = _kept(mem, (a, False), (b, False), (c, True))
    assert cache.stash_idle(NEVER) == 2 and mem.copies == 2  # a and b; c (pinned) stays
    assert cache.ram.has(a) and cache.ram.has(b) and not cache.ram.has(c)
    assert len(cache.entries) == 3  # still in the KV cache: a hit costs no copy
    assert cache.stash_idle(NEVER) == 0  # nothing kept since
    assert cache.hottest(2) == []  # RAM copies of KV entries are not "recently evicted"
    fill(cache, mem, 1, [7, 8])  # a request runs
    assert cache.trim_idle([]) == 2 and mem.copies == 2  # dropped, not copied again
    assert sorted(cache.index.tokens_of(e) for e in cache.entries) == [c]
    assert cache.attach(0, [*b, 99], limit=30) == 30 and mem.holds(0) == 30  # a hit


def test_idle_time_saves_only_into_free_room_of_the_ram_tier() -> None:
    """A state saved ahead of time never pushes out one the RAM tier holds (the entry is
    still in the KV cache; the state in RAM may be the only copy)."""
    mem = CountingMemory()
    a, b = list(range(30)), list(range(100, 130))
    cache = _kept(mem, (a, False), (b, False), ram_bytes=40)
    assert cache.stash_idle(NEVER) == 1 and cache.ram.has(a) and not cache.ram.has(b)
    assert cache.ram.stats.dropped == 0 and len(cache.entries) == 2


def test_a_message_interrupts_the_idle_time_saves_which_go_on_later() -> None:
    mem = CountingMemory()
    a, b = list(range(30)), list(range(100, 130))
    cache = _kept(mem, (a, False), (b, False))
    calls = iter([False, True])
    assert cache.stash_idle(lambda: next(calls)) == 1 and cache.ram.has(a)  # b: a message
    assert cache.stash_idle(NEVER) == 1 and cache.ram.has(b)  # still due, done next time


def test_a_failed_idle_time_save_leaves_the_entries_where_they_were() -> None:
    class Failing(StateMemory):
        def seq_state(self, seq: int) -> bytes:
            raise MemoryError

        def seq_state_size(self, seq: int) -> int:
            return 30
    mem = Failing()
    cache = PrefixCache(cast(LlamaRuntime, mem), 2, 4, True, ram_bytes=1 << 20)
    fill(cache, mem, 0, list(range(30)))
    cache.release(0, keep=True)
    assert cache.stash_idle(NEVER) == 0 and [mem.holds(e) for e in cache.entries] == [30]


def test_hot_prefixes_are_the_used_entries_and_states_only_in_ram() -> None:
    """RAM copies of entries still in the KV cache (``stash_idle``) do not crowd out a
    state that only the RAM tier holds."""
    mem = CountingMemory()
    cache = PrefixCache(cast(LlamaRuntime, mem), 2, 4, True, ram_bytes=1 << 20)
    x, a, b = list(range(300, 330)), list(range(30)), list(range(100, 130))
    fill(cache, mem, 0, x)
    cache.release(0, keep=True)
    fill(cache, mem, 1, [7, 8])  # a request runs: x moves to RAM
    assert cache.trim_idle([]) == 1 and cache.ram.has(x)
    cache.release(1, keep=False)
    for tokens in (a, b):
        fill(cache, mem, 0, tokens)
        cache.release(0, keep=True)
    assert cache.stash_idle(NEVER) == 2
    assert [t for t, _ in cache.hottest(2)] == [x]


def test_an_entry_too_large_for_the_ram_tier_stays_in_the_kv_cache() -> None:
    mem = StateMemory()
    small, large = list(range(30)), list(range(100, 150))
    cache = _kept(mem, (small, False), (large, False), ram_bytes=40)
    fill(cache, mem, 1, [7, 8])  # a request runs
    assert cache.trim_idle([]) == 1  # the small one moved; the large one would be lost
    assert [cache.index.tokens_of(e) for e in cache.entries] == [large]
    assert cache.ram.has(small)


def test_without_the_ram_tier_idle_entries_stay() -> None:
    cache, mem = make_cache(entries=2)
    fill(cache, mem, 0, [1, 2, 3])
    cache.release(0, keep=True)
    fill(cache, mem, 1, [7, 8])
    assert cache.trim_idle([]) == 0 and len(cache.entries) == 1


def test_rollback_forgets_a_failed_batch() -> None:
    cache, mem = make_cache()
    fill(cache, mem, 0, [1, 2, 3, 4, 5, 6])
    cache.rollback(0, 2)
    assert cache.index.length(0) == 2 and mem.holds(0) == 2


def test_a_disabled_cache_only_clears_slots() -> None:
    mem = FakeMemory()
    cache = PrefixCache(cast(LlamaRuntime, mem), 2, 4, enabled=False)
    fill(cache, mem, 0, [1, 2, 3])
    cache.release(0, keep=True)
    assert not cache.entries and mem.holds(0) == 0
    fill(cache, mem, 0, [1, 2, 3])
    assert cache.attach(1, [1, 2, 3, 4], limit=3) == 0


# -- the prefix wait of admission --------------------------------------------------

def admitted(sched: Scheduler, *seqs: Sequence) -> None:
    for s in seqs:
        sched.add(s)
    sched.admit()


def test_a_newer_request_waits_for_an_older_one_computing_their_shared_prefix() -> None:
    cache, mem = make_cache(slots=2)
    sched = Scheduler(2, 64)
    shared = list(range(100, 140))
    old, new = seq("a", shared + [1, 2]), seq("b", shared + [3, 4, 5])
    admitted(sched, old, new)
    for s in (old, new):
        attach(cache, sched.running, s)
    assert old.waiting_on is None
    assert new.waiting_on is not None and new.waiting_on.source is old
    assert new.waiting_on.length == len(shared)
    # the waiting request gets no prompt chunk; the older one computes
    chunks = sched.schedule()
    assert [c.seq for c in chunks] == [old]
    # halfway: still waiting
    sched.commit([Chunk(old, 0, old.prompt[:20], False)])
    fill(cache, mem, 0, old.prompt[:20])
    resume_waiters(cache, sched.running)
    assert new.waiting_on is not None
    # past the shared part: attached, with the prefix copied rather than recomputed
    sched.commit([Chunk(old, 20, old.prompt[20:], True)])
    fill(cache, mem, 0, old.prompt[20:])
    resume_waiters(cache, sched.running)
    assert new.waiting_on is None and new.num_computed == new.num_cached == len(shared)
    assert ("cp", 0, 1, 0, len(shared)) in mem.calls
    assert cache.stats.hit_tokens == len(shared)


def test_an_older_request_never_waits_for_a_newer_one() -> None:
    cache, _ = make_cache(slots=2)
    sched = Scheduler(2, 64)
    old, new = seq("a", list(range(50))), seq("b", list(range(50)))
    admitted(sched, old, new)
    attach(cache, sched.running, new)
    attach(cache, sched.running, old)
    assert old.waiting_on is None and new.waiting_on is not None


def test_a_waiter_whose_source_ends_early_attaches_what_there_is() -> None:
    cache, mem = make_cache(slots=2)
    sched = Scheduler(2, 64)
    old, new = seq("a", list(range(30))), seq("b", list(range(30)) + [7])
    admitted(sched, old, new)
    attach(cache, sched.running, old)
    attach(cache, sched.running, new)
    sched.commit([Chunk(old, 0, old.prompt[:10], False)])
    fill(cache, mem, 0, old.prompt[:10])
    sched.finish(old, SequenceStatus.FINISHED_ABORTED)
    cache.release(0, keep=True)
    resume_waiters(cache, sched.running)
    assert new.waiting_on is None and new.num_computed == 10


def test_the_waiters_of_a_source_that_ends_early_wait_for_the_oldest_of_them() -> None:
    """A client gone while its request computed a shared prefix: the oldest waiter
    computes it, the others wait for it (they all computed it on their own before)."""
    cache, mem = make_cache(slots=4)
    sched = Scheduler(4, 64)
    shared = list(range(100, 140))
    src, *waiters = (seq(name, shared + [i]) for i, name in enumerate("abcd"))
    admitted(sched, src, *waiters)
    for s in (src, *waiters):
        attach(cache, sched.running, s)
    assert all(w.waiting_on is not None and w.waiting_on.source is src for w in waiters)
    sched.commit([Chunk(src, 0, src.prompt[:10], False)])
    fill(cache, mem, 0, src.prompt[:10])
    sched.finish(src, SequenceStatus.FINISHED_ABORTED)
    cache.release(0, keep=True)
    resume_waiters(cache, sched.running)
    first, *rest = waiters
    assert first.waiting_on is None and first.num_computed == 10
    assert all(w.waiting_on is not None and w.waiting_on.source is first
               and w.waiting_on.length == len(shared) for w in rest)
    assert [c.seq for c in sched.schedule()] == [first]  # only the new source computes


def test_no_cache_no_wait() -> None:
    cache, _ = make_cache(slots=2)
    sched = Scheduler(2, 64)
    old, new = seq("a", list(range(30))), seq("b", list(range(30)), use_cache=False)
    admitted(sched, old, new)
    attach(cache, sched.running, old)
    attach(cache, sched.running, new)
    assert new.waiting_on is None and cache.stats.misses == 2


# -- a failed decode --------------------------------------------------------------

def running_pair(cache: PrefixCache, mem: FakeMemory) -> tuple[Scheduler, list[Chunk]]:
    sched = Scheduler(2, 64)
    a, b = seq("a", [1, 2, 3]), seq("b", [4, 5, 6])
    admitted(sched, a, b)
    for s in (a, b):
        assert s.slot is not None
        fill(cache, mem, s.slot, s.prompt[:1])
    return sched, [Chunk(a, 1, a.prompt[1:], True), Chunk(b, 1, b.prompt[1:], True)]


def test_out_of_kv_cells_evicts_a_cached_prefix_and_retries() -> None:
    cache, mem = make_cache(slots=2)
    fill(cache, mem, 0, [9, 9, 9])
    cache.release(0, keep=True)
    sched, chunks = running_pair(cache, mem)
    for c in chunks:  # the failed batch had partly reached the cache
        assert c.seq.slot is not None
        fill(cache, mem, c.seq.slot, c.tokens)
    assert after_decode_error(DECODE_NO_KV_SLOT, chunks, cache) == []
    assert not cache.entries and cache.stats.evictions == 1
    assert mem.holds(0) == mem.holds(1) == 1  # the batch undone, the prompt heads kept


def test_out_of_kv_cells_with_nothing_to_evict_stops_only_the_newest() -> None:
    cache, mem = make_cache(slots=2)
    sched, chunks = running_pair(cache, mem)
    (end,) = after_decode_error(DECODE_NO_KV_SLOT, chunks, cache)
    assert end.seq.request_id == "b" and end.status is SequenceStatus.FINISHED_ERROR
    assert end.failure is not None and end.failure.code is FailureCode.KV_FULL
    # a victim that already generated ends as if it reached its length
    chunks[1].seq.tokens.append(11)
    (end,) = after_decode_error(DECODE_NO_KV_SLOT, chunks, cache)
    assert end.status is SequenceStatus.FINISHED_LENGTH and end.failure is None


def test_out_of_kv_cells_a_prompt_waits_again_while_others_run() -> None:
    """With others running, the newest request that has generated nothing goes back to
    the front of the queue, its cells freed, and is held there (nobody is admitted) until
    a running request ends; then it is admitted first and computes its prompt again."""
    cache, mem = make_cache(slots=2)
    sched, chunks = running_pair(cache, mem)
    a, b = chunks[0].seq, chunks[1].seq
    assert after_decode_error(DECODE_NO_KV_SLOT, chunks, cache, scheduler=sched) == []
    assert sched.running == [a] and list(sched.waiting) == [b]
    assert b.status is SequenceStatus.WAITING and b.held and b.slot is None
    assert b.num_computed == 0 and mem.holds(1) == 0 and mem.holds(0) == 1
    later = seq("c", [7, 8, 9])
    sched.add(later)
    assert sched.admit() == []  # a free slot, but the held prompt goes first
    sched.finish(a, SequenceStatus.FINISHED_STOPPED)
    assert sched.admit() == [b] and not b.held and b.preempted == 1
    assert sched.admit() == []  # nobody joins before its prompt is computed again
    b.num_computed = b.num_prompt
    assert sched.admit() == [later]


def test_a_prompt_waits_again_only_while_others_hold_cells_and_twice_at_most() -> None:
    """A request whose end would free no cells (none: the other holds nothing) gives the
    prompt nothing to wait for; a prompt sent back twice fails the third time."""
    cache, mem = make_cache(slots=2)
    sched, chunks = running_pair(cache, mem)
    a, b = chunks[0].seq, chunks[1].seq
    assert a.slot is not None
    cache.rollback(a.slot, 0)
    (end,) = after_decode_error(DECODE_NO_KV_SLOT, chunks, cache, scheduler=sched)
    assert end.seq is b and end.failure is not None
    cache, mem = make_cache(slots=2)
    sched, chunks = running_pair(cache, mem)
    b = chunks[1].seq
    b.preempted = 2
    (end,) = after_decode_error(DECODE_NO_KV_SLOT, chunks, cache, scheduler=sched)
    assert end.seq is b and end.failure is not None
    assert end.failure.code is FailureCode.KV_FULL


def test_out_of_kv_cells_a_generating_request_goes_on_beside_a_prompt() -> None:
    """The prompt waits again, not the request that already generates (even if newer);
    alone, the prompt fails as before."""
    cache, mem = make_cache(slots=2)
    sched, chunks = running_pair(cache, mem)
    a, b = chunks[0].seq, chunks[1].seq
    b.tokens.append(11)
    assert after_decode_error(DECODE_NO_KV_SLOT, chunks, cache, scheduler=sched) == []
    assert sched.running == [b] and a.held
    sched.finish(b, SequenceStatus.FINISHED_STOPPED)
    assert sched.admit() == [a]
    (end,) = after_decode_error(DECODE_NO_KV_SLOT, [Chunk(a, 0, a.prompt, True)], cache,
                                scheduler=sched)
    assert end.seq is a and end.failure is not None
    assert end.failure.code is FailureCode.KV_FULL


def test_out_of_kv_cells_alone_and_any_other_failure_end_the_whole_batch() -> None:
    cache, mem = make_cache(slots=2)
    sched, chunks = running_pair(cache, mem)
    ends = after_decode_error(DECODE_NO_KV_SLOT, chunks[:1], cache)
    assert [e.seq.request_id for e in ends] == ["a"]
    assert ends[0].failure is not None
    # alone, after generating: the end of the cache is its length, not an error
    chunks[0].seq.tokens.append(11)
    (end,) = after_decode_error(DECODE_NO_KV_SLOT, chunks[:1], cache)
    assert end.status is SequenceStatus.FINISHED_LENGTH and end.failure is None
    ends = after_decode_error(DECODE_INVALID_BATCH, chunks + chunks[:1], cache)
    assert sorted(e.seq.request_id for e in ends) == ["a", "b"]  # each request once
    assert all(e.failure is not None and e.failure.code is FailureCode.DECODE for e in ends)


def test_out_of_kv_cells_with_drafts_retries_without_them() -> None:
    cache, mem = make_cache(slots=2)
    sched, chunks = running_pair(cache, mem)
    a = chunks[0].seq
    a.drafter = NgramDrafter(8)
    chunks[0].drafts = 2
    assert after_decode_error(DECODE_NO_KV_SLOT, chunks, cache) == []
    assert a.drafter is None  # its next steps feed one token at a time
    (end,) = after_decode_error(DECODE_NO_KV_SLOT, chunks, cache)
    assert end.seq.request_id == "b"  # then as without drafts


# -- the time limit -----------------------------------------------------------------

def test_requests_past_the_time_limit_are_overdue_waiting_or_running() -> None:
    sched = Scheduler(1, 64)
    running, waiting, fresh, unknown = (seq(r, [1, 2]) for r in "abcd")
    for s in (running, waiting, fresh, unknown):
        sched.add(s)
    sched.admit()
    assert sched.running == [running]

    def output(submitted: float) -> Output:
        return Output(cast(DeltaSink, None), cast(SamplerChain, None), TextStream(()),
                      Timing(submitted=submitted))

    outputs = {running: output(100.0), waiting: output(105.0), fresh: output(119.0)}
    found = overdue([*sched.running, *sched.waiting], outputs, now=120.0, limit=10.0)
    assert found == [running, waiting]  # `unknown` has no output: not the engine's yet
    assert overdue([running], outputs, now=110.0, limit=10.0) == []  # exactly at the limit
