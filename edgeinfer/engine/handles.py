"""Owners of llama.cpp's native handles: one small object per handle, freed by ``close()``.

Each object frees its handle exactly once (``close()`` is idempotent). Whoever creates
several enters them into a ``contextlib.ExitStack`` in the order of creation, so the
stack frees them in reverse order (a batch before its context, a context before its
model), as llama-cpp-python's own ``_internals`` does; nothing orders frees by hand.
A constructor that gets a null handle from llama.cpp raises the error it is given.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import TypeAlias

import llama_cpp

log = logging.getLogger("edgeinfer.llama")

# The binding's functions are untyped; these name what they hand back.
ModelPtr: TypeAlias = llama_cpp.llama_model_p
ContextPtr: TypeAlias = llama_cpp.llama_context_p
VocabPtr: TypeAlias = llama_cpp.llama_vocab_p
MemoryPtr: TypeAlias = llama_cpp.llama_memory_t
SamplerPtr: TypeAlias = "llama_cpp.llama_sampler_p"


@functools.cache
def amx_build() -> bool:
    """True when llama.cpp was built with Intel AMX (a native build on a CPU that has it).
    Its AMX matrix kernels crash the process on the first decode of some models on such
    CPUs (SmolLM2's Q4_1 here; llama.cpp issue #20824, unfixed), so ``model_params``
    keeps the weights out of that buffer type. Logged once."""
    amx = b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()
    if amx:
        log.warning("llama.cpp was built with Intel AMX, whose kernels can crash (llama.cpp "
                    "#20824): weights stay in ordinary CPU buffers (no AMX, no repacking)")
    return amx


def model_params() -> llama_cpp.llama_model_params:
    """llama.cpp's default model parameters, without its extra CPU buffer types (AMX,
    weight repacking) on an AMX build (``amx_build``): the ordinary CPU kernels instead."""
    params: llama_cpp.llama_model_params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = not amx_build()
    return params


class Model:
    """A model loaded from a GGUF file (``llama_model_free`` on close)."""

    def __init__(self, path: Path, params: llama_cpp.llama_model_params,
                 error: Exception) -> None:
        ptr: ModelPtr | None = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not ptr:
            raise error
        self._ptr: ModelPtr | None = ptr

    @property
    def ptr(self) -> ModelPtr:
        if self._ptr is None:
            raise RuntimeError("the model is closed")
        return self._ptr

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            llama_cpp.llama_model_free(ptr)


class Context:
    """A llama context on a model (``llama_free`` on close; close it before the model)."""

    def __init__(self, model: ModelPtr, params: llama_cpp.llama_context_params,
                 error: Exception) -> None:
        ptr: ContextPtr | None = llama_cpp.llama_init_from_model(model, params)
        if not ptr:
            raise error
        self._ptr: ContextPtr | None = ptr

    @property
    def ptr(self) -> ContextPtr:
        if self._ptr is None:
            raise RuntimeError("the context is closed")
        return self._ptr

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            llama_cpp.llama_free(ptr)


class Batch:
    """A llama_batch of up to ``n_tokens`` token ids, one sequence id each
    (``llama_batch_free`` on close)."""

    def __init__(self, n_tokens: int) -> None:
        self.capacity = n_tokens
        self._batch: llama_cpp.llama_batch | None = llama_cpp.llama_batch_init(n_tokens, 0, 1)

    @property
    def batch(self) -> llama_cpp.llama_batch:
        if self._batch is None:
            raise RuntimeError("the batch is closed")
        return self._batch

    def close(self) -> None:
        batch, self._batch = self._batch, None
        if batch is not None:
            llama_cpp.llama_batch_free(batch)


class Sampler:
    """A llama_sampler (a chain, or a grammar outside any chain): ``llama_sampler_free``
    on close. A sampler added to a chain belongs to the chain and has no owner here."""

    def __init__(self, ptr: SamplerPtr | None, error: Exception) -> None:
        if not ptr:
            raise error
        self._ptr: SamplerPtr | None = ptr

    @property
    def ptr(self) -> SamplerPtr:
        if self._ptr is None:
            raise RuntimeError("the sampler is closed")
        return self._ptr

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            llama_cpp.llama_sampler_free(ptr)
