"""Which sequence takes a slot next: the order of ``Scheduler``'s queue (pure Python).

Waiting sequences take free slots, and sequences computed ahead (``Scheduler``'s seats
past the slots) the slots that ended ones leave, in the same order: effective priority,
then the request with the fewest running sequences, then arrival. Effective priority =
priority + seconds waited / AGING_SECONDS, capped at the highest priority waiting: a
low-priority request gains a level every AGING_SECONDS and is never starved by a stream of
higher-priority ones, but waiting longer never outranks fairness among requests of the top
level. One request never holds more than ``max_per_request`` slots, and a request of
several choices never takes the last free slot (several such requests together would fill
every slot: it is kept for a request of one, an interactive chat).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from edgeinfer.engine.sequence import Sequence

AGING_SECONDS = 10.0


def pick(pool: Iterable[Sequence], now: float, running: Counter[str], *, lane_busy: bool,
         max_per_request: int, last_slot: bool) -> Sequence | None:
    """The sequence of ``pool`` to take a slot next (see the module docstring); None when
    every request of it is at its cap, or is deterministic while one deterministic
    sequence runs (``lane_busy``: ``engine.lane``). ``running``: each request's running
    sequences; ``last_slot``: one slot is free and requests of several choices keep off it."""
    pool = list(pool)
    top = max(s.priority for s in pool)
    best: Sequence | None = None
    best_key: tuple[float, int, int] | None = None
    waiting = Counter(s.group for s in pool) if last_slot else Counter()
    for s in pool:
        held = running[s.group]
        if held >= max_per_request or (s.deterministic and lane_busy) or (
                last_slot and held + waiting[s.group] > 1):
            continue
        key = (min(s.priority + (now - s.queued_at) / AGING_SECONDS, top), -held, -s.arrival)
        if best_key is None or key > best_key:
            best, best_key = s, key
    return best


def promote(running: list[Sequence], waiting: Iterable[Sequence], now: float, *,
            num_slots: int, max_per_request: int) -> None:
    """Sequences computed ahead (``Sequence.ahead``) take the slots ended ones left, in
    ``pick``'s order among them and the ``waiting`` ones that may be admitted now: where a
    waiting one comes first, a slot is left to it (the scheduler admits it next) and the
    others are given on."""
    ahead = [s for s in running if s.ahead]
    generating = Counter(s.group for s in running if not s.ahead)
    lane_busy = any(s.deterministic for s in running)  # (a waiting one cannot join it)
    rivals = [s for s in waiting if not (s.deterministic and lane_busy)]
    while ahead and (free := num_slots - generating.total()) > 0:
        best = pick(ahead + rivals, now, generating, lane_busy=False,
                    max_per_request=max_per_request,
                    last_slot=free == 1 and max_per_request < num_slots)
        if best is None:
            return
        (ahead if best.ahead else rivals).remove(best)
        best.ahead = False  # (a waiting one's: already)
        generating[best.group] += 1
