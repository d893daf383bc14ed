"""Prompt-prefix reuse in one unified KV cache: attach, keep, evict, pin.

A context has ``slots`` sequence ids for running requests (``kv.seats``: its slots and
seats ahead) and ``entries`` more for finished ones kept as cache (the ids after them).
Sharing a prefix is ``llama_memory_seq_cp``: the cells gain another sequence
id, no tensor is copied. The ``PrefixIndex`` says which id holds what.

Engine thread only. The engine calls ``attach`` when a request takes a slot
(and again when a prefix it waited for is ready), ``committed`` after every
successful decode, ``rollback`` after a failed one, ``release`` when a
request ends, ``evict_one`` when llama_decode finds no room, and ``trim_idle``
at each step while requests run (idle entries then wait in the RAM tier).
Deterministic requests do not use it (``engine.lane``).

Checkpoint mode (``checkpoint_every`` is not None), for memories whose cells cannot
be shared or trimmed (recurrent and hybrid models, sliding windows without the
full-size cache): no prefix is kept in the KV cache. A prompt's prefill pauses at
``checkpoints_for``'s positions, and the slot's whole state there is saved in the RAM
tier (as when a request ends); a later prompt that begins with a saved state's tokens
gets that state put into its slot, a copy of the bytes a computation in the same
pieces left, so the continuation is exactly that computation's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from edgeinfer.engine.cache_entry import CacheEntry, CacheStats
from edgeinfer.engine.kv import seats
from edgeinfer.engine.native import LlamaRuntime
from edgeinfer.engine.prefix_index import PrefixIndex
from edgeinfer.engine.ram_tier import RamTier, State, default_mb

log = logging.getLogger("edgeinfer.cache")

# a state in the RAM tier is restored when it covers this many more tokens than the KV
# cache does (below that, computing them is about as quick)
MIN_RAM_GAIN = 16
# an idle entry a new prompt will use stays in the KV cache while requests run when the
# prompt uses at least this share of it (``trim_idle``)
KEEP_MATCH = 0.75


class PrefixCache:
    """See the module docstring. ``enabled=False`` keeps only plain slot cleanup."""

    def __init__(self, runtime: LlamaRuntime, first_id: int, entries: int, enabled: bool,
                 ram_bytes: int = 0, checkpoint_every: int | None = None) -> None:
        self.rt = runtime
        self.num_slots = first_id  # slots are sequence ids 0 .. first_id - 1
        self.checkpoint_every = checkpoint_every
        entries = 0 if checkpoint_every is not None else entries  # checkpoint mode: RAM only
        self.enabled = enabled and (entries > 0 or (checkpoint_every is not None and ram_bytes > 0))
        self.ram = RamTier(ram_bytes if self.enabled else 0)
        self.index = PrefixIndex()
        self.entries: dict[int, CacheEntry] = {}
        self._free_ids = list(range(first_id, first_id + entries)) if self.enabled else []
        self.stats = CacheStats()
        self._trim_due = False  # a slot was released since the last trim_idle
        self._stash_due = False  # an entry was kept since the last stash_idle

    @property
    def mode(self) -> str:
        return "kv" if self.checkpoint_every is None else "checkpoint"

    # -- admission ---------------------------------------------------------
    def attach(self, slot: int, tokens: list[int], limit: int) -> int:
        """Give ``slot`` the longest cached prefix of ``tokens[:limit]``.

        ``slot`` may already hold a prefix of tokens (a second attach after a
        wait); only the extension is copied. Returns what the slot now holds.
        """
        have = self.index.length(slot)
        if not self.enabled or limit <= have:
            return have
        if self.checkpoint_every is not None:
            return self._from_checkpoint(slot, tokens, limit) if not have else have
        n, holder = self.index.match(tokens[:limit], exclude=slot)
        if self.ram.enabled:  # (again after it: making room may have evicted ``holder``)
            self._from_ram(tokens[:limit], max(n, have), holder)
            n, holder = self.index.match(tokens[:limit], exclude=slot)
        if holder is None or n <= have:
            return have
        self.rt.seq_cp(holder, slot, have, n)
        self.index.extend(slot, tokens[have:n])
        entry = self.entries.get(holder)
        if entry is not None:
            entry.last_used = time.monotonic()
            entry.hits += 1
        return n

    def _from_ram(self, prompt: list[int], known: int, holder: int | None) -> bool:
        """Put the RAM tier's state covering most of ``prompt`` back into the KV cache as
        an entry, when it covers clearly more than ``known`` tokens (those ``holder``
        has): as much of it as ``prompt`` shares (the whole state stays in RAM when that
        is only a part)."""
        n, hid = self.ram.match(prompt)
        if hid is None or n < known + MIN_RAM_GAIN:
            return False
        tokens, data = self.ram.take(hid)  # (out first: evictions below go to the tier)
        cid = self._put_state(len(tokens), data, keep=holder)
        if cid is None:
            self.ram.give_back(tokens, data)
            return False
        if n < len(tokens):  # only the shared head stays in the view; RAM keeps the whole
            self.rt.seq_rm(cid, n, -1)
            self.ram.give_back(tokens, data)
            tokens = tokens[:n]
        self.index.extend(cid, tokens)
        self.entries[cid] = CacheEntry(cid)
        self.ram.restored(tokens)
        return True

    def _put_state(self, cells: int, data: State, keep: int | None = None) -> int | None:
        """A free entry id now holding ``data``, the state of ``cells`` tokens (None: no
        room, no id, or llama.cpp refused it). A state goes in whole, and without room
        llama.cpp refuses it after the copy, logging errors: room is made first, moving
        idle entries the RAM tier takes there (oldest first, not ``keep``: the prompt's
        KV hit), unless moving all of them would not make enough."""
        n_ctx = self.rt.info.n_ctx
        if n_ctx - self.index.num_tokens < cells:
            movable = sorted((e for e in self.entries.values() if e.seq_id != keep and
                              not e.pinned and self._movable(e)), key=lambda e: e.last_used)
            stay = set(self.index.holders()) - {e.seq_id for e in movable}
            if n_ctx - self.index.tokens_held_by(stay) < cells:
                return None
            for entry in movable:
                if n_ctx - self.index.num_tokens >= cells:
                    break
                self._evict(entry)
        cid = self._take_id()
        if cid is not None and (not self.rt.set_seq_state(cid, data)
                                or self.rt.seq_pos_max(cid) != cells - 1):
            self.rt.seq_rm(cid, -1, -1)
            self._free_ids.append(cid)
            return None
        return cid

    def _movable(self, entry: CacheEntry) -> bool:  # (evicted, its state is kept in RAM)
        return self.ram.enabled and (self.ram.has(self.index.tokens_of(entry.seq_id)) or
                                     self.ram.fits(self.rt.seq_state_size(entry.seq_id)))

    def _from_checkpoint(self, slot: int, tokens: list[int], limit: int) -> int:
        """Put the longest saved state ``tokens[:limit]`` begins with into the (empty) slot;
        returns the tokens it covers (0: none that fits beside the others, or refused)."""
        free = limit if self.rt.recurrent else self.rt.info.n_ctx - self.index.num_tokens
        n, hid = self.ram.whole_prefix(tokens, min(limit, free))
        if hid is None:
            return 0
        if not self.rt.set_seq_state(slot, self.ram.get(hid)) or self.rt.seq_pos_max(slot) != n - 1:
            log.warning("a saved state of %d tokens could not be restored; computing it", n)
            self.rt.seq_rm(slot, -1, -1)
            return 0
        self.index.extend(slot, tokens[:n])
        self.ram.restored(tokens[:n])
        return n

    def checkpoints_for(self, num_prompt: int, start: int) -> tuple[int, ...]:
        """Where a prompt of ``num_prompt`` tokens, computed from ``start``, pauses to
        save its state: every ``checkpoint_every`` tokens, and one token before its end
        (so that the same prompt again computes only its last token). Empty in KV mode."""
        every = self.checkpoint_every
        if every is None or not self.enabled:
            return ()
        stops = set(range(every, num_prompt - 1, every)) if every else set()
        stops.add(num_prompt - 1)
        return tuple(sorted(p for p in stops if p > start))

    def count_lookup(self, cached: int) -> None:
        if cached:
            self.stats.hits += 1
            self.stats.hit_tokens += cached
        else:
            self.stats.misses += 1

    # -- after decode --------------------------------------------------------
    def committed(self, slot: int, tokens: list[int], checkpoint: bool = False) -> None:
        """``tokens`` are in the slot now; with ``checkpoint`` (checkpoint mode), its
        state there is saved."""
        self.index.extend(slot, tokens)
        if checkpoint and self.checkpoint_every is not None and self.enabled:
            self._save(slot, pinned=False)
            self.stats.checkpoints += 1

    def _save(self, slot: int, pinned: bool) -> None:
        held = self.index.tokens_of(slot)
        if held and (pinned or not self.ram.has(held)):
            self.ram.put(held, self.rt.seq_state(slot), pinned=pinned)

    def rollback(self, slot: int, length: int) -> None:
        """Forget what the slot got from position ``length`` on (a failed decode)."""
        self.rt.seq_rm(slot, length, -1)
        self.index.truncate(slot, length)

    # -- end of a request ------------------------------------------------------
    def release(self, slot: int, keep: bool, pinned: bool = False) -> None:
        """Free the slot; with ``keep``, its cells stay as a cache entry if useful (in
        checkpoint mode: its state is saved)."""
        if self.enabled and keep and self.checkpoint_every is not None:
            self._save(slot, pinned)
        elif self.enabled and keep and self.index.length(slot):
            tokens = self.index.tokens_of(slot)
            covered, _ = self.index.match(tokens, exclude=slot)
            if pinned or covered < len(tokens):
                cid = self._take_id()
                if cid is not None:
                    self.rt.seq_cp(slot, cid, -1, -1)
                    self.index.rename(slot, cid)
                    self.entries[cid] = CacheEntry(cid, pinned=pinned)
                    self.stats.kept += 1
                    self._stash_due = True
        self.rt.seq_rm(slot, -1, -1)
        self.index.remove(slot)
        self._trim_due = True

    def _take_id(self) -> int | None:
        if not self._free_ids and not self._evict_lru():
            return None
        return self._free_ids.pop()

    # -- eviction --------------------------------------------------------------
    def _evict_lru(self) -> bool:
        victims = [e for e in self.entries.values() if not e.pinned]
        if not victims:
            return False
        self._evict(min(victims, key=lambda e: e.last_used))
        return True

    def _evict(self, victim: CacheEntry) -> None:
        """Drop an entry from the KV cache (kept in host RAM, where the tier is on: a later
        hit restores it)."""
        tokens = self.index.tokens_of(victim.seq_id)
        if self.ram.enabled and not self.ram.touch(tokens):  # (``stash_idle`` saved it?)
            self.ram.put(tokens, self.rt.seq_state(victim.seq_id))
        self.rt.seq_rm(victim.seq_id, -1, -1)
        self.index.remove(victim.seq_id)
        del self.entries[victim.seq_id]
        self._free_ids.append(victim.seq_id)
        self.stats.evictions += 1

    def trim_idle(self, prompts: list[list[int]]) -> int:
        """While requests run: move every unpinned entry that holds KV cells no running
        request and no pinned prefix uses to the RAM tier, least recently used first;
        returns how many moved. An entry that is the best match of one of ``prompts``
        (of requests about to attach or computing their prompt) stays when that prompt
        uses at least ``KEEP_MATCH`` of it. Called before admitted requests attach, at
        each step while requests run; does work only after a slot was released.

        Every step's attention runs over the KV view up to the highest used cell, masked
        or not, and a kept entry's cells may lie anywhere: on a 2-core CPU, 300 idle cells
        at the top of an 8,192-cell cache slowed one stream by 25 % and eight by 27 %, as
        much as 7,000 idle cells did. So, as with llama-server's RAM prompt cache, the KV
        cache holds what running requests use and the rest waits in RAM; a hit restores
        it bit for bit, into low cells in position order, with the prompt computed on top
        of it. Entries stay while the server is idle (a next hit costs no copy); pinned
        ones always stay. Off without the RAM tier
        (evicting would lose the entry) and in checkpoint mode."""
        if not self._trim_due:
            return 0
        self._trim_due = False
        if not self.enabled or not self.ram.enabled or self.checkpoint_every is not None:
            return 0
        stay = {e.seq_id for e in self.entries.values() if e.pinned}
        for prompt in prompts:
            n, holder = self.index.match(prompt)
            if holder in self.entries and n >= KEEP_MATCH * self.index.length(holder):
                stay.add(holder)
        held = set(range(self.num_slots)) | stay
        base = self.index.tokens_held_by(held)
        idle = [e for e in self.entries.values()
                if e.seq_id not in stay and self.index.tokens_held_by(held | {e.seq_id}) > base
                and self.ram.fits(self.rt.seq_state_size(e.seq_id))]  # else it would be lost
        for entry in sorted(idle, key=lambda e: e.last_used):
            self._evict(entry)
        return len(idle)

    def stash_idle(self, interrupted: Callable[[], bool]) -> int:
        """When nothing runs: save the state of each unpinned entry the RAM tier lacks
        (oldest first), into its free room (none is pushed out), so that ``trim_idle`` only
        drops its cells when requests come, and their first token does not wait for the
        copy (20-100 ms for 1,800 SmolLM2 tokens here). Stops when ``interrupted()`` (a
        message came); returns how many were saved. Work only after an entry was kept."""
        if not self._stash_due or not self.enabled or not self.ram.enabled or \
                self.checkpoint_every is not None:
            return 0
        saved = 0
        try:
            for entry in sorted(self.entries.values(), key=lambda e: e.last_used):
                if interrupted():
                    return saved  # still due
                tokens = self.index.tokens_of(entry.seq_id)
                if not entry.pinned and not self.ram.has(tokens) and \
                        self.rt.seq_state_size(entry.seq_id) <= self.ram.free:
                    saved += self.ram.put(tokens, self.rt.seq_state(entry.seq_id))
        except Exception:  # (MemoryError): the entries stay in the KV cache, as they were
            log.exception("saving idle cache entries to the RAM tier failed")
        self._stash_due = False
        return saved

    def evict_one(self) -> bool:
        """Free KV cells by evicting least recently used unpinned entries, until some cells
        were actually freed (an entry whose cells are shared frees none). Returns False
        when nothing could be freed."""
        before = self.index.num_tokens
        while self._evict_lru():
            if self.index.num_tokens < before:
                return True
        return False

    # -- the state of pinned prefixes, for the disk tier ---------------------------
    def state_of(self, tokens: list[int]) -> State | None:
        """The saved state of the cache entry holding exactly ``tokens`` (None: none)."""
        if self.checkpoint_every is not None:
            return self.ram.state(tokens)
        for cid in self.entries:
            if self.index.length(cid) == len(tokens) and self.index.tokens_of(cid) == tokens:
                return self.rt.seq_state(cid)
        return None

    def restore(self, tokens: list[int], data: State, pinned: bool) -> bool:
        """Make ``data`` (a ``state_of`` of ``tokens``, from disk) a cache entry; False
        when there is no free entry or llama.cpp refuses the data (nothing is kept)."""
        if not self.enabled:
            return False
        if self.checkpoint_every is not None:
            kept = self.ram.put(tokens, data, pinned=pinned)
            self.stats.restored += kept
            return kept
        if (cid := self._put_state(len(tokens), data)) is None:
            return False
        self.index.extend(cid, tokens)  # (a hot one stays hot until others are used more)
        self.entries[cid] = CacheEntry(cid, pinned=pinned, hits=0 if pinned else 1)
        self.stats.restored += 1
        return True

    def hottest(self, n: int) -> list[tuple[list[int], State]]:
        """The ``n`` most used unpinned prefixes, as (tokens, state): in KV mode the
        entries with the most hits, then the RAM tier's most recent states (prefixes moved
        out of the KV cache while requests ran); in checkpoint mode the most recently used
        saved states (for the disk tier's opt-in hot prefixes)."""
        if n <= 0 or not self.enabled:
            return []
        if self.checkpoint_every is not None:
            return self.ram.recent(n)
        used = sorted((e for e in self.entries.values() if e.hits and not e.pinned),
                      key=lambda e: (e.hits, e.last_used), reverse=True)[:n]
        out: list[tuple[list[int], State]] = [
            (self.index.tokens_of(e.seq_id), self.rt.seq_state(e.seq_id)) for e in used]
        # the RAM tier's copies of entries still in the KV cache (``stash_idle``) were
        # judged by their hits above
        held = {tuple(self.index.tokens_of(e.seq_id)) for e in self.entries.values()}
        out += [(t, d) for t, d in self.ram.recent(n + len(held)) if tuple(t) not in held]
        return out[:n]

    def unpin_all(self) -> int:
        pinned = [e for e in self.entries.values() if e.pinned]
        for e in pinned:
            e.pinned = False
        return self.ram.unpin_all() + len(pinned)

    def pinned_cells(self) -> int:  # (no request frees them: ``Scheduler.admit``'s room)
        return self.index.tokens_held_by({e.seq_id for e in self.entries.values() if e.pinned})

    def cells_in_use(self, entries: list[CacheEntry]) -> int:
        """KV cells the engine cannot free for new work: the slots' and pinned prefixes'
        (others are evicted on demand: free, as vLLM counts cached blocks no request uses)."""
        held = set(range(self.num_slots)) | {e.seq_id for e in entries if e.pinned}
        return self.index.tokens_held_by(held)

    def snapshot(self) -> dict[str, object]:
        """Counters for operators; safe to call from another thread."""
        s = self.stats
        entries = list(self.entries.values())  # may be read off the engine thread
        return {
            "enabled": self.enabled, "mode": self.mode, "checkpoints": s.checkpoints,
            "cells_used": self.index.num_tokens, "cells_in_use": self.cells_in_use(entries),
            "entries": len(entries), "pinned": sum(e.pinned for e in entries),
            "hits": s.hits, "hit_tokens": s.hit_tokens, "misses": s.misses,
            "evictions": s.evictions, "kept": s.kept, "restored": s.restored,
            "ram": self.ram.snapshot(),
        }


def open_cache(runtime: LlamaRuntime) -> PrefixCache:
    """The prefix cache of a model, in the mode its memory allows (see the module
    docstring), with what was chosen logged."""
    cfg = runtime.cfg
    checkpoints = runtime.memory_kind == "checkpoint"
    if cfg.prefix_cache and not checkpoints and runtime.sliding_window:
        log.info("model %s: a full-size cache for its %d-token sliding window, so that "
                 "prefixes are shared (swa_full)", cfg.id, runtime.sliding_window)
    if cfg.prefix_cache and checkpoints:
        log.info("model %s: prefixes are reused from whole saved states (checkpoints every "
                 "%d tokens, in the RAM tier%s)", cfg.id, cfg.checkpoint_every,
                 "" if cfg.cache_ram_mb != 0 else ": cache_ram_mb is 0, so none is kept")
    return PrefixCache(runtime, seats(cfg, runtime.memory_kind), cfg.cache_entries,
                       cfg.prefix_cache, default_mb(cfg.cache_ram_mb) << 20,
                       cfg.checkpoint_every if checkpoints else None)
