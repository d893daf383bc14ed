"""What a failed llama_decode does to the requests of its batch.

Whatever part of the batch reached the KV cache is undone. Out of KV cells, the
engine first evicts cached prefixes and retries, then retries without draft tokens.
Failing that, the newest request of the batch that has generated nothing waits again
(its cells freed, ``Scheduler.preempt``) while other requests hold cells, whose ends free
them; its client sees only a later first token. At most ``MAX_PREEMPTIONS`` times a
request: a prompt that never fits beside the others fails as before. With none such, the
newest request of the batch stops (the others go on): as if it reached its length when it
has generated tokens (alone, it reached the end of the cache), else, alone, with a "KV
cache full" error (503 and Retry-After to the client). Any other failure ends every
request of the batch with an error.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from edgeinfer.engine.delta import Failure, FailureCode
from edgeinfer.engine.lane import Lane
from edgeinfer.engine.prefix_cache import PrefixCache
from edgeinfer.engine.scheduler import Chunk, Scheduler
from edgeinfer.engine.sequence import Sequence, SequenceStatus

log = logging.getLogger("edgeinfer.engine.loop")  # the step loop's own log

# llama_decode return codes (llama.h)
DECODE_OK = 0
DECODE_NO_KV_SLOT = 1
DECODE_ABORTED = 2
DECODE_INVALID_BATCH = -1

MAX_PREEMPTIONS = 2  # times one request's prompt is sent back to wait for KV cells


def describe_decode_error(rc: int) -> str:
    if rc == DECODE_NO_KV_SLOT:
        return "the KV cache has no room for this batch"
    if rc == DECODE_ABORTED:
        return "decoding was aborted"
    if rc == DECODE_INVALID_BATCH:
        return "llama.cpp rejected the batch as invalid"
    return f"llama.cpp failed to compute the batch (llama_decode returned {rc})"


class Ending(NamedTuple):
    """A request a failed decode ends, and how."""

    seq: Sequence
    status: SequenceStatus
    failure: Failure | None


def after_decode_error(rc: int, chunks: list[Chunk], cache: PrefixCache,
                       lane: Lane | None = None,
                       scheduler: Scheduler | None = None) -> list[Ending]:
    """Undo the batch in the cache; the requests to end (none: retry the step). A prompt
    sent back to wait is taken out of the ``scheduler``'s running sequences here. A call
    in the ``lane`` (one deterministic sequence) is undone there, and ends its request."""
    if lane is not None:
        lane.rollback(chunks[0].start)
        if rc == DECODE_NO_KV_SLOT and chunks[0].seq.num_generated:
            return [Ending(chunks[0].seq, SequenceStatus.FINISHED_LENGTH, None)]
        return [Ending(chunks[0].seq, SequenceStatus.FINISHED_ERROR,
                       Failure(FailureCode.DECODE, f"llama_decode failed ({rc})"))]
    for chunk in chunks:
        if chunk.seq.slot is not None:
            cache.rollback(chunk.seq.slot, chunk.start)
    if rc == DECODE_NO_KV_SLOT:
        return _out_of_cells(chunks, cache, scheduler)
    msg = describe_decode_error(rc)
    log.error("llama_decode failed (rc=%d): %s", rc, msg)
    return [Ending(seq, SequenceStatus.FINISHED_ERROR, Failure(FailureCode.DECODE, msg))
            for seq in {id(c.seq): c.seq for c in chunks}.values()]


def _out_of_cells(chunks: list[Chunk], cache: PrefixCache,
                  scheduler: Scheduler | None) -> list[Ending]:
    """No KV cells for the batch: evict a cached prefix, else drop the drafts, and retry;
    failing both, send the newest prompt back to wait while others run, else stop the
    newest request of the batch."""
    if cache.evict_one():
        log.info("KV cache full: evicted cached prefixes, retrying")
        return []
    drafted = [c.seq for c in chunks if c.drafts and c.seq.drafter is not None]
    if drafted:
        for seq in drafted:  # near the end of the cache: their tokens one at a time
            seq.drafter = None
        log.info("KV cache full: retrying without draft tokens")
        return []
    fresh = [c.seq for c in chunks if not c.seq.num_generated]
    if fresh and scheduler is not None:
        victim = max(fresh, key=lambda s: s.arrival)
        if victim.preempted < MAX_PREEMPTIONS and _others_hold_cells(victim, scheduler,
                                                                      cache):
            log.info("KV cache full: request %s waits for a running request to end",
                     victim.request_id)
            cache.release(scheduler.preempt(victim), keep=False)
            return []
    victim = max((c.seq for c in chunks), key=lambda s: s.arrival)
    log.warning("KV cache full: stopping request %s", victim.request_id)
    if victim.num_generated:  # as if it reached its length (alone: the context's end)
        return [Ending(victim, SequenceStatus.FINISHED_LENGTH, None)]
    return [Ending(victim, SequenceStatus.FINISHED_ERROR, Failure(
        FailureCode.KV_FULL, "the KV cache is full; retry when fewer requests are running "
        "(or fewer prefixes are pinned)"))]


def _others_hold_cells(victim: Sequence, scheduler: Scheduler, cache: PrefixCache) -> bool:
    """Whether a running request other than ``victim`` holds cells of the context, whose
    end will free them (not one in the deterministic lane, nor one waiting for the
    victim's prefix)."""
    return any(s is not victim and not s.deterministic and s.slot is not None
               and (s.waiting_on is None or s.waiting_on.source is not victim)
               and cache.index.length(s.slot) > 0 for s in scheduler.running)
