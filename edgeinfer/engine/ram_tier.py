"""The host-RAM tier of the prefix cache: evicted entries' KV state, restored on a hit.

When the KV cache evicts a finished request's prefix for room, its state
(``llama_state_seq_get_data``) is kept here under a byte budget (least recently used
first out). A later request whose prompt starts with that prefix gets it put back
into the KV cache (``llama_state_seq_set_data``) instead of computing it again. Pure
Python: the prefix cache reads and writes the states; this keeps them and says which
one covers most of a prompt.

For memories that cannot share or trim part of a sequence (recurrent, hybrid), the
states kept here are the prefix cache's checkpoints: only a whole state whose tokens
begin the prompt is reused (``whole_prefix``), and it stays here when it is (``get``).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edgeinfer.engine.host_memory import State as State  # (the cache's name for it)
from edgeinfer.engine.prefix_index import PrefixIndex

# where Linux says how much memory this process's control group may use (v2, then v1)
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def machine_memory() -> int:
    """The bytes of memory this process may have: the machine's, or its control group's
    limit where that is smaller (a container's)."""
    import psutil

    total = int(psutil.virtual_memory().total)
    for path in CGROUP_LIMITS:
        with contextlib.suppress(OSError, ValueError):
            total = min(total, int(Path(path).read_text().strip()))  # ("max": no limit)
    return total


def default_mb(setting: int | None) -> int:
    """The RAM tier's size in MiB: models.toml's ``cache_ram_mb``, else 1/16 of
    ``machine_memory`` from 256 MiB to 8 GiB (llama-server's ``--cache-ram``: 8 GiB; a
    coding agent's 20k-token prompt is about 350 MiB of KV state on Gemma 3 270M)."""
    if setting is not None:
        return setting
    return max(256, min(8192, machine_memory() >> 24))


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
        self._states: OrderedDict[int, tuple[list[int], State]] = OrderedDict()
        self._next = 0
        self._pinned: set[int] = set()
        self.bytes = 0
        self.stats = RamStats()

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    @property
    def free(self) -> int:
        """Bytes the tier takes without pushing a kept state out."""
        return self.budget - self.bytes

    def fits(self, size: int) -> bool:
        """Whether a state of ``size`` bytes can be kept (beside the pinned states)."""
        return size <= self.budget - sum(len(self._states[h][1]) for h in self._pinned)

    def put(self, tokens: list[int], data: State, pinned: bool = False) -> bool:
        """Keep ``data``, the state of ``tokens`` (False: it does not fit the budget
        beside the pinned states). A pinned state is never pushed out."""
        if not tokens or not self.fits(len(data)):
            return False
        if self._insert(tokens, data, pinned):
            self.stats.saved += 1
        return True

    def has(self, tokens: Sequence[int]) -> bool:
        """Whether a state of exactly ``tokens`` is kept."""
        return self._exact(tokens) is not None

    def touch(self, tokens: Sequence[int]) -> bool:
        """Make the state of exactly ``tokens`` the most recently used (False: none)."""
        hid = self._exact(tokens)
        if hid is not None:
            self._states.move_to_end(hid)
        return hid is not None

    def _exact(self, tokens: Sequence[int]) -> int | None:
        n, hid = self.index.match(tokens)
        if n == len(tokens) and hid is not None and self.index.length(hid) == n:
            return hid
        return None

    def _insert(self, tokens: list[int], data: State, pinned: bool = False) -> bool:
        """Keep a state that fits the budget (False: the same prefix is already kept)."""
        same = self._exact(tokens)
        if same is not None:
            if pinned:
                self._pinned.add(same)
            return False
        while self.bytes + len(data) > self.budget:
            self._drop(next(h for h in self._states if h not in self._pinned))
            self.stats.dropped += 1
        hid, self._next = self._next, self._next + 1
        self._states[hid] = (list(tokens), data)
        self.index.extend(hid, tokens)
        self.bytes += len(data)
        if pinned:
            self._pinned.add(hid)
        return True

    def whole_prefix(self, tokens: Sequence[int], limit: int) -> tuple[int, int | None]:
        """(length, id) of the longest kept state whose tokens are all of
        ``tokens[:limit]``'s first ones (0, None: none)."""
        best, found = 0, None
        for hid, (kept, _) in self._states.items():
            n = len(kept)
            if best < n <= limit and list(tokens[:n]) == kept:
                best, found = n, hid
        return best, found

    def get(self, hid: int) -> State:
        """A kept state, left in place (and made the most recently used)."""
        self._states.move_to_end(hid)
        return self._states[hid][1]

    def state(self, tokens: Sequence[int]) -> State | None:
        """The kept state of exactly ``tokens`` (None: none)."""
        hid = self._exact(tokens)
        return None if hid is None else self._states[hid][1]

    def recent(self, n: int) -> list[tuple[list[int], State]]:
        """The ``n`` most recently used unpinned states, newest first."""
        out = [(list(t), d) for h, (t, d) in reversed(self._states.items())
               if h not in self._pinned]
        return out[:n]

    def unpin_all(self) -> int:
        n = len(self._pinned)
        self._pinned.clear()
        return n

    def match(self, tokens: Sequence[int]) -> tuple[int, int | None]:
        """(tokens of ``tokens`` a kept state covers, its id)."""
        return self.index.match(tokens)

    def take(self, hid: int) -> tuple[list[int], State]:
        """Remove and return a kept state (to put it back into the KV cache: say
        ``restored`` once it is there, ``give_back`` if it could not be)."""
        tokens, data = self._states[hid]
        self._drop(hid)
        return tokens, data

    def restored(self, tokens: list[int]) -> None:
        self.stats.restored += 1
        self.stats.restored_tokens += len(tokens)

    def give_back(self, tokens: list[int], data: State) -> None:
        """A state that could not be restored after ``take`` (no room): keep it again."""
        self._insert(tokens, data)

    def _drop(self, hid: int) -> None:
        _, data = self._states.pop(hid)
        self._pinned.discard(hid)
        self.index.remove(hid)
        self.bytes -= len(data)

    def snapshot(self) -> dict[str, int]:
        s = self.stats
        return {"entries": len(self._states), "bytes": self.bytes, "budget_bytes": self.budget,
                "pinned": len(self._pinned),
                "saved": s.saved, "restored": s.restored, "restored_tokens": s.restored_tokens,
                "dropped": s.dropped}
