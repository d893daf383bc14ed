"""The host-RAM tier of the prefix cache: evicted entries' KV state, restored on a hit.

When the KV cache evicts a finished request's prefix for room, its state
(``llama_state_seq_get_data``) is kept here under a byte budget (least recently used
first out). A later request whose prompt starts with that prefix gets it put back
into the KV cache (``llama_state_seq_set_data``) instead of computing it again. Pure
Python: the prefix cache reads and writes the states; this keeps them and says which
one covers most of a prompt.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from edgeinfer.engine.prefix_index import PrefixIndex


@dataclass(slots=True)
class RamStats:
    saved: int = 0
    restored: int = 0
    dropped: int = 0  # states pushed out by the budget
    restored_tokens: int = 0


class RamTier:
    """Saved states by their tokens, under ``budget`` bytes (0: off)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.index = PrefixIndex()
        self._states: OrderedDict[int, tuple[list[int], bytes]] = OrderedDict()
        self._next = 0
        self.bytes = 0
        self.stats = RamStats()

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def put(self, tokens: list[int], data: bytes) -> bool:
        """Keep ``data``, the state of ``tokens`` (False: it is larger than the budget)."""
        if not tokens or len(data) > self.budget:
            return False
        if self._insert(tokens, data):
            self.stats.saved += 1
        return True

    def _insert(self, tokens: list[int], data: bytes) -> bool:
        """Keep a state that fits the budget (False: the same prefix is already kept)."""
        n, hid = self.index.match(tokens)
        if n == len(tokens) and hid is not None and self.index.length(hid) == n:
            return False
        while self.bytes + len(data) > self.budget:
            self._drop(next(iter(self._states)))
            self.stats.dropped += 1
        hid, self._next = self._next, self._next + 1
        self._states[hid] = (list(tokens), data)
        self.index.extend(hid, tokens)
        self.bytes += len(data)
        return True

    def match(self, tokens: Sequence[int]) -> tuple[int, int | None]:
        """(tokens of ``tokens`` a kept state covers, its id)."""
        return self.index.match(tokens)

    def take(self, hid: int) -> tuple[list[int], bytes]:
        """Remove and return a kept state (to put it back into the KV cache: say
        ``restored`` once it is there, ``give_back`` if it could not be)."""
        tokens, data = self._states[hid]
        self._drop(hid)
        return tokens, data

    def restored(self, tokens: list[int]) -> None:
        self.stats.restored += 1
        self.stats.restored_tokens += len(tokens)

    def give_back(self, tokens: list[int], data: bytes) -> None:
        """A state that could not be restored after ``take`` (no room): keep it again."""
        self._insert(tokens, data)

    def _drop(self, hid: int) -> None:
        _, data = self._states.pop(hid)
        self.index.remove(hid)
        self.bytes -= len(data)

    def snapshot(self) -> dict[str, int]:
        s = self.stats
        return {"entries": len(self._states), "bytes": self.bytes, "budget_bytes": self.budget,
                "saved": s.saved, "restored": s.restored, "restored_tokens": s.restored_tokens,
                "dropped": s.dropped}
