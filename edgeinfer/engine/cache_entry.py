"""A prefix cache's entries (finished requests' cells kept under a sequence id of their
own) and its counters (``engine.prefix_cache``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class CacheEntry:
    seq_id: int
    pinned: bool = False
    last_used: float = field(default_factory=time.monotonic)
    hits: int = 0


@dataclass(slots=True)
class CacheStats:
    hits: int = 0
    hit_tokens: int = 0
    misses: int = 0
    evictions: int = 0
    kept: int = 0
    restored: int = 0  # entries loaded from saved state (the disk tier)
    checkpoints: int = 0  # states saved part-way through a prompt (checkpoint mode)
