"""Embeddings from a model, in a context of their own so they never block chat slots.

``Embedder`` owns a second llama context of an already loaded model (created
on first use, with embeddings on and mean pooling unless the GGUF names a
pooling type) and its batch, as ``handles.Context`` and ``handles.Batch`` in an
ExitStack that frees them in reverse order, and one worker thread, the only code
that touches them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import llama_cpp
import numpy as np

from edgeinfer.engine.batch import Run, fill_batch
from edgeinfer.engine.decode_errors import DECODE_OK
from edgeinfer.engine.handles import Batch, Context
from edgeinfer.engine.native import LlamaRuntime
from edgeinfer.errors import EngineError, InvalidRequest

log = logging.getLogger("edgeinfer.engine.embedding")


class Embedder:
    """Computes L2-normalised embeddings of token lists; see the module docstring."""

    def __init__(self, runtime: LlamaRuntime, n_ctx: int = 2048, max_seqs: int = 8) -> None:
        self.runtime = runtime
        self.n_ctx = n_ctx
        self.max_seqs = max_seqs
        self._pool = ThreadPoolExecutor(max_workers=1,
                                        thread_name_prefix=f"embed-{runtime.cfg.id}")
        self._ctx: Context | None = None
        self._batch: Batch | None = None
        self._handles = contextlib.ExitStack()  # the context, then the batch; freed newest first
        self._running: set[threading.Event] = set()  # the stop flags of requests in work
        self.n_embd = llama_cpp.llama_model_n_embd(runtime.model)

    async def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        for i, toks in enumerate(inputs):
            if not toks:
                raise InvalidRequest(f"input {i} is empty", param="input")
            if len(toks) > self.n_ctx:
                raise InvalidRequest(
                    f"input {i} has {len(toks)} tokens; the embedding context holds {self.n_ctx}",
                    param="input", code="context_length_exceeded")
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        self._running.add(stop)
        try:
            return await loop.run_in_executor(self._pool, self._embed_all, inputs, stop)
        except asyncio.CancelledError:  # the client left (or timed out): stop its work
            stop.set()
            raise
        finally:
            self._running.discard(stop)

    def cancel_all(self) -> None:
        """Stop the requests in work (at shutdown) after their current group."""
        for stop in list(self._running):
            stop.set()

    # -- worker thread -------------------------------------------------------
    def _open(self) -> tuple[Context, Batch]:
        rt = self.runtime
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = self.n_ctx
        cparams.n_batch = cparams.n_ubatch = self.n_ctx  # one input never spans two ubatches
        cparams.n_seq_max = self.max_seqs
        cparams.n_threads = cparams.n_threads_batch = rt.cfg.threads
        cparams.embeddings = True
        cparams.kv_unified = True
        arch = rt.meta("general.architecture") or ""
        own = rt.meta(f"{arch}.pooling_type")
        cparams.pooling_type = (llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED if own
                                else llama_cpp.LLAMA_POOLING_TYPE_MEAN)
        ctx = self._handles.enter_context(contextlib.closing(Context(
            rt.model, cparams, EngineError("could not create the embedding context"))))
        batch = self._handles.enter_context(contextlib.closing(Batch(self.n_ctx)))
        log.info("model %s: embedding context ready (pooling %d, %d dims)", rt.cfg.id,
                 llama_cpp.llama_pooling_type(ctx.ptr), self.n_embd)
        return ctx, batch

    def _embed_all(self, inputs: list[list[int]], stop: threading.Event) -> list[list[float]]:
        if self._ctx is None or self._batch is None:
            self._ctx, self._batch = self._open()
        ctx, batch = self._ctx, self._batch
        out: list[list[float]] = []
        group: list[list[int]] = []
        for toks in inputs:
            if stop.is_set():  # nobody waits for the rest (checked between groups)
                raise EngineError("the embedding request was cancelled")
            if group and (len(group) == self.max_seqs
                          or sum(map(len, group)) + len(toks) > self.n_ctx):
                out.extend(self._embed_group(ctx, batch, group))
                group = []
            group.append(toks)
        if group:
            out.extend(self._embed_group(ctx, batch, group))
        return out

    def _embed_group(self, context: Context, batch: Batch,
                     group: list[list[int]]) -> list[list[float]]:
        ctx = context.ptr
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        fill_batch(batch.batch, [Run(seq_id, 0, toks, True) for seq_id, toks in enumerate(group)],
                   every_output=True)
        rc = llama_cpp.llama_decode(ctx, batch.batch)
        if rc != DECODE_OK:
            raise EngineError(f"embedding failed (llama_decode returned {rc})")
        vectors: list[list[float]] = []
        for seq_id in range(len(group)):
            ptr = llama_cpp.llama_get_embeddings_seq(ctx, seq_id)
            if not ptr:
                raise EngineError("this model gives no pooled embeddings")
            v = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                      shape=(self.n_embd,)).astype(np.float64)
            norm = math.sqrt(float(v @ v)) or 1.0
            vectors.append((v / norm).tolist())
        return vectors

    def _close(self) -> None:
        self._handles.close()  # the batch, then the context
        self._ctx = self._batch = None

    def close(self) -> None:
        """Stop what is in work, free the context on its own thread, stop the thread."""
        self.cancel_all()
        self._pool.submit(self._close).result()
        self._pool.shutdown(wait=True)
