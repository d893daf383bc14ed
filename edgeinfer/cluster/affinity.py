"""Where a prefix was sent, and the order in which to try replicas for a request.

Pure Python, no Ray: ``router.PrefixAffinityRouter`` feeds it Ray's replica ids and
queue lengths. The policy (``rank``):

1. Replicas whose load is within ``imbalance`` requests of the least loaded one are
   acceptable; the others are tried only when no acceptable one takes the request.
2. Among acceptable replicas, the one holding the longest run of the request's leading
   blocks wins (ties: all of them, and Ray picks the least loaded).
3. A prefix no acceptable replica holds goes to the least loaded replica, then the one
   holding the fewest blocks (new prefixes spread out), then a rendezvous hash of the
   prefix's first block (every router makes the same choice when all else is equal).
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence


class PrefixTable:
    """Per replica, the block hashes recently sent to it, least recently used first.

    It records routing decisions, not the replica's real cache: a replica that has
    since evicted a prefix costs one miss, as it would with any other routing.
    Not thread-safe: one router's event loop owns it.
    """

    def __init__(self, max_blocks_per_replica: int = 4096) -> None:
        assert max_blocks_per_replica > 0
        self.max_blocks = max_blocks_per_replica
        self._held: dict[str, OrderedDict[int, None]] = {}

    def matched(self, replica: str, blocks: Sequence[int]) -> int:
        """How many of ``blocks``' leading blocks ``replica`` was sent."""
        held = self._held.get(replica)
        if not held:
            return 0
        n = 0
        for b in blocks:
            if b not in held:
                break
            n += 1
        return n

    def record(self, replica: str, blocks: Sequence[int]) -> None:
        """``replica`` was sent a prompt beginning with ``blocks``."""
        held = self._held.setdefault(replica, OrderedDict())
        for b in blocks:
            held[b] = None
            held.move_to_end(b)
        while len(held) > self.max_blocks:
            held.popitem(last=False)

    def size(self, replica: str) -> int:
        return len(self._held.get(replica, ()))

    def forget(self, replica: str) -> None:
        """``replica`` is gone (or replaced): what it held is lost."""
        self._held.pop(replica, None)

    def replicas(self) -> list[str]:
        return list(self._held)


def rendezvous(block: int, replica: str) -> int:
    """The rendezvous (highest random weight) hash of a block on a replica, as a rank."""
    return -int.from_bytes(hashlib.blake2b(f"{block}:{replica}".encode(),
                                           digest_size=8).digest(), "big")


def rank(blocks: Sequence[int], loads: Mapping[str, float], table: PrefixTable,
         imbalance: float) -> list[list[str]]:
    """Replica ids in groups, most preferred first (see the module docstring).

    ``loads``: each candidate's ongoing requests, ``math.inf`` when unknown.
    ``blocks`` must not be empty.
    """
    assert blocks and loads
    known = [v for v in loads.values() if v != math.inf]
    least = min(known) if known else 0.0
    matched = {r: table.matched(r, blocks) for r in loads}

    def key(r: str) -> tuple[bool, int, float, int, int]:
        return (loads[r] > least + imbalance, -matched[r], loads[r], table.size(r),
                rendezvous(blocks[0], r))

    order = sorted(loads, key=key)
    top = order[0]
    first = [r for r in order if key(r)[:2] == key(top)[:2]] if matched[top] else [top]
    rest = [r for r in order if r not in first]
    return [first, rest] if rest else [first]
