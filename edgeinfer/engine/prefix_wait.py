"""The prefix policy of admission: a newly admitted request takes its longest cached
prefix, or waits for an older request that is still computing a prefix they share (so a
shared prefix is computed once), and attaches to it when that request is past it."""

from __future__ import annotations

from edgeinfer.engine.lane import Lane
from edgeinfer.engine.prefix_cache import PrefixCache
from edgeinfer.engine.prefix_index import common_prefix
from edgeinfer.engine.sequence import PrefixWait, Sequence, SequenceStatus


def attach(cache: PrefixCache, running: list[Sequence], seq: Sequence,
           lane: Lane | None = None) -> None:
    """Give a newly admitted sequence its cached prefix, or make it wait for one (a
    deterministic one: what the ``lane`` holds of its prompt)."""
    assert seq.slot is not None
    if seq.deterministic and lane is not None:
        cache.count_lookup(lane.attach(seq))
        return
    limit = seq.num_prompt - 1  # at least one prompt token is computed, for logits
    if not seq.use_cache or not cache.enabled:
        cache.count_lookup(0)
        return
    seq.num_computed = seq.num_cached = cache.attach(seq.slot, seq.prompt, limit)
    seq.checkpoints = cache.checkpoints_for(seq.num_prompt, seq.num_computed)
    cache.count_lookup(seq.num_cached)
    seq.waiting_on = _best_wait(cache, running, seq, limit)


def _best_wait(cache: PrefixCache, running: list[Sequence], seq: Sequence,
               limit: int) -> PrefixWait | None:
    """The older request computing the longest prefix ``seq`` shares (None: none)."""
    best: PrefixWait | None = None
    for other in running:
        # only older requests: waits then always point back in time, never in a cycle
        if other.arrival >= seq.arrival or not other.is_prefilling or not other.use_cache:
            continue
        if other.deterministic:  # its cells are in the lane (``engine.lane``)
            continue
        shared = min(common_prefix(other.prompt, seq.prompt), limit)
        if cache.checkpoint_every is not None:  # only a saved state is shared
            shared = max((c for c in other.checkpoints if c <= shared), default=0)
        if shared > max(seq.num_computed, other.num_computed) and (
                best is None or shared > best.length):
            best = PrefixWait(other, shared)
    return best


def resume_waiters(cache: PrefixCache, running: list[Sequence]) -> None:
    """Attach the waiting sequences whose prefix has been computed (or whose computing
    request ended). The waiters of a request that ended before its prefix (a client gone)
    wait again, oldest first: the oldest computes the prefix, the others wait for it."""
    for seq in sorted(running, key=lambda s: s.arrival):
        wait = seq.waiting_on
        if wait is None:
            continue
        source = wait.source
        if source.status is SequenceStatus.RUNNING and source.num_computed < wait.length:
            continue
        seq.waiting_on = None
        assert seq.slot is not None
        got = cache.attach(seq.slot, seq.prompt, seq.num_prompt - 1)
        if got > seq.num_computed:
            cache.stats.hit_tokens += got - seq.num_computed
            seq.num_computed = seq.num_cached = got
            seq.checkpoints = cache.checkpoints_for(seq.num_prompt, got)
        if source.num_computed < wait.length:  # (ended early)
            seq.waiting_on = _best_wait(cache, running, seq, seq.num_prompt - 1)
