"""DRY samplers made off the engine thread, then cloned on it.

llama.cpp's DRY ("don't repeat yourself") sampler scans the whole vocabulary for each
sequence breaker when it is made: 7 ms for llama-server's default breakers on SmolLM2's
49k-token vocabulary, 160 ms for eight 16-character ones. Made on the engine thread, that
would stall every running stream once per request. ``Engine.generate`` makes one per
distinct DRY setting in a worker thread (``prepare``) before it submits the request, and
the engine thread clones it (``make``: about 0.07 ms). Clones share nothing with their
prototype. A setting not prepared (or evicted since) is made on the spot.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict

import llama_cpp

from edgeinfer.engine.handles import SamplerPtr, VocabPtr
from edgeinfer.engine.sequence import SamplingParams

MAX_BREAKER_BYTES = 40  # llama.cpp's own cut for a DRY sequence breaker
MAX_PROTOTYPES = 32

Key = tuple[float, float, int, int, tuple[bytes, ...]]


class DryCache:
    """Prototype DRY samplers by setting (at most ``size``, least recently used evicted);
    thread-safe. ``n_ctx``: the penalty window of a setting whose window is -1."""

    def __init__(self, vocab: VocabPtr, n_ctx: int, size: int = MAX_PROTOTYPES) -> None:
        self._vocab, self._n_ctx, self._size = vocab, n_ctx, size
        self._protos: OrderedDict[Key, SamplerPtr] = OrderedDict()
        self._lock = threading.Condition()
        self._building: set[Key] = set()  # prototypes being made in worker threads
        self._closed = False
        self.made = 0  # DRY samplers built from the vocabulary (not cloned)

    def key(self, p: SamplingParams) -> Key:
        last_n = self._n_ctx if p.dry_penalty_last_n < 0 else p.dry_penalty_last_n
        return (p.dry_multiplier, p.dry_base, p.dry_allowed_length, last_n,
                tuple(b.encode()[:MAX_BREAKER_BYTES] for b in p.dry_sequence_breakers))

    def ready(self, p: SamplingParams) -> bool:
        """Whether ``prepare(p)`` has nothing to do (its prototype is there, or none is kept)."""
        with self._lock:
            return not self._size or self._closed or self.key(p) in self._protos

    def prepare(self, p: SamplingParams) -> None:
        """Make ``p``'s prototype unless it is there (or being made: then wait for it).
        Blocking: call it in a worker thread. ``close`` waits for a build under way, so the
        vocabulary is never read after the model is freed."""
        key = self.key(p)
        with self._lock:
            while key in self._building:
                self._lock.wait()
            if key in self._protos:
                self._protos.move_to_end(key)
            if key in self._protos or not self._size or self._closed:
                return
            self._building.add(key)
        proto: SamplerPtr | None = None
        try:
            proto = self._build(key)  # outside the lock: the engine thread never waits for it
        finally:
            with self._lock:
                self._building.discard(key)
                self._lock.notify_all()
                if proto and (key in self._protos or self._closed):
                    llama_cpp.llama_sampler_free(proto)
                elif proto:
                    self._protos[key] = proto
                    while len(self._protos) > self._size:
                        llama_cpp.llama_sampler_free(self._protos.popitem(last=False)[1])

    def make(self, p: SamplingParams) -> SamplerPtr | None:
        """A DRY sampler for ``p``, owned by the caller (None if llama.cpp made none)."""
        key = self.key(p)
        with self._lock:
            proto = self._protos.get(key)
            if proto is not None:
                self._protos.move_to_end(key)
                clone: SamplerPtr | None = llama_cpp.llama_sampler_clone(proto)
                return clone
        return self._build(key)

    def close(self) -> None:
        """Free the prototypes, once the builds under way have ended (before the model is
        freed); later ``prepare`` calls do nothing."""
        with self._lock:
            self._closed = True
            while self._building:
                self._lock.wait()
            for proto in self._protos.values():
                llama_cpp.llama_sampler_free(proto)
            self._protos.clear()

    def _build(self, key: Key) -> SamplerPtr | None:
        multiplier, base, allowed, last_n, breakers = key
        arr = (ctypes.c_char_p * max(1, len(breakers)))(*breakers)
        self.made += 1
        smpl: SamplerPtr | None = llama_cpp.llama_sampler_init_dry(
            self._vocab, multiplier, base, allowed, last_n, arr, len(breakers))
        return smpl
