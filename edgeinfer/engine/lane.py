"""Deterministic mode's lane: a llama context of its own for deterministic sequences.

A deterministic sequence's numbers must not depend on what else the engine runs
(``invariance``). In the shared context they also depend on where its KV cells lie:
flash attention sums a row's cells in cell order, and llama.cpp puts a new token in the
lowest free cell from its head, so cells that other requests free below a sequence's own
take its later tokens and change the rounding. The lane is a second context of the same
model that holds one sequence at a time, always at cells equal to its positions: a new
deterministic request keeps what it shares with the previous one (a prefix, already at
cells 0..k-1), the rest is removed, and its own tokens go to cells k, k+1, ... in order.

Its calls follow ``invariance``: prompt pieces under 64 rows and a pad row beside a lone
token, so that every cell is computed by flash attention's plain path, row by row, and
a prefix kept from an earlier request equals the same tokens computed afresh. One
deterministic request runs at a time (the scheduler admits the next when the lane is
free). Created on the first deterministic request: its KV cache takes as much memory
again as the model's context (counted in the model's ``memory_bytes`` from then on).
Owned by the engine thread.
"""

from __future__ import annotations

import contextlib
import logging

import llama_cpp
import numpy as np
import numpy.typing as npt

from edgeinfer.engine.batch import Decoded, Run, fill_batch, logits_row
from edgeinfer.engine.handles import Batch, Context, ContextPtr, MemoryPtr
from edgeinfer.engine.invariance import MAX_ROWS, pad
from edgeinfer.engine.native import LlamaRuntime
from edgeinfer.engine.prefix_index import common_prefix
from edgeinfer.engine.sequence import Sequence
from edgeinfer.errors import EngineError

log = logging.getLogger("edgeinfer.engine.lane")

SEQ = 0  # the lane's sequence
SCRATCH = 1  # the pad row's sequence (removed after each call)


class Lane:
    """See the module docstring. ``held``: the tokens at cells 0..len-1."""

    def __init__(self, runtime: LlamaRuntime) -> None:
        self.n_vocab = runtime.info.n_vocab
        self.held: list[int] = []
        # a prefix is kept only where the memory can drop part of a sequence exactly (a
        # sliding window without the full-size cache has pruned what lies before its end)
        self._partial = runtime.memory_kind == "kv"
        self._reuse = runtime.cfg.prefix_cache
        self._handles = contextlib.ExitStack()  # the context, then the batch
        cparams = runtime.context_params()
        cparams.n_seq_max = 2
        cparams.n_batch = cparams.n_ubatch = MAX_ROWS + 1
        # flash attention's plain path keeps rows apart (whatever the shared context uses)
        cparams.flash_attn_type = 1
        try:
            self._ctx = self._handles.enter_context(contextlib.closing(Context(
                runtime.model, cparams,
                EngineError("could not create the deterministic mode's context"))))
            self._batch = self._handles.enter_context(contextlib.closing(Batch(MAX_ROWS + 1)))
        except BaseException:
            self._handles.close()
            raise
        self._mem: MemoryPtr = llama_cpp.llama_get_memory(self._ctx.ptr)
        runtime.add_kv_cache()
        log.info("model %s: a context of %d tokens for deterministic requests", runtime.cfg.id,
                 cparams.n_ctx)

    @property
    def ctx(self) -> ContextPtr:
        return self._ctx.ptr

    def attach(self, seq: Sequence) -> int:
        """Give an admitted deterministic sequence the lane: keep what it holds of the
        prompt (all but its last token, and nothing for a request that opted out of the
        cache), remove the rest; returns how many tokens are kept (it computes from
        there)."""
        limit = seq.num_prompt - 1 if seq.use_cache and self._reuse else 0
        self.rollback(common_prefix(self.held, seq.prompt[:limit]))
        seq.num_computed = seq.num_cached = len(self.held)
        return len(self.held)

    def committed(self, tokens: list[int]) -> None:
        """``tokens`` are in the lane now, after what it held."""
        self.held.extend(tokens)

    def rollback(self, length: int) -> None:
        """Keep the first ``length`` tokens only, and no cell after them (all is cleared
        where the memory cannot drop part of a sequence)."""
        length = min(length, len(self.held))
        if not self._partial and length < len(self.held):
            length = 0
        if not llama_cpp.llama_memory_seq_rm(self._mem, SEQ, length, -1):
            llama_cpp.llama_memory_seq_rm(self._mem, SEQ, -1, -1)
            length = 0
        del self.held[length:]

    def decode(self, runs: list[Run]) -> Decoded:
        """One call of the lane's sequence (its runs name ``SEQ``); a lone row past the
        first 256 positions gets a pad row (``invariance.pad``), removed right after."""
        padded = pad(runs, SCRATCH)
        batch = self._batch.batch
        out = fill_batch(batch, runs)
        assert 0 < batch.n_tokens <= MAX_ROWS + 1
        rc = llama_cpp.llama_decode(self._ctx.ptr, batch)
        if padded:
            llama_cpp.llama_memory_seq_rm(self._mem, SCRATCH, -1, -1)
        return Decoded(rc, out)

    def logits_row(self, batch_index: int) -> npt.NDArray[np.float32]:
        """The logits of one output of the last decode (a view, valid until the next)."""
        return logits_row(self._ctx.ptr, self.n_vocab, batch_index)

    def close(self) -> None:
        self._handles.close()
