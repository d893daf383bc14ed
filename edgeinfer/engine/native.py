"""A loaded model, its context and batch, and its vocabulary: llama.cpp for the engine.

``LlamaRuntime`` owns the native handles of one model (a ``handles.Model``, a
``handles.Context`` and a ``handles.Batch``) through an ExitStack, which frees them
in reverse order of creation in ``close()``. Only the engine thread may call
``decode`` and the ``seq_*`` methods; ``tokenize`` and ``piece`` only read the
immutable vocabulary and are safe from any thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np
import numpy.typing as npt

from edgeinfer.config import ModelConfig
from edgeinfer.engine.batch import Decoded, Run, fill_batch, logits_row
from edgeinfer.engine.handles import (
    Batch,
    Context,
    ContextPtr,
    MemoryPtr,
    Model,
    ModelPtr,
    VocabPtr,
    model_params,
)
from edgeinfer.engine.host_memory import State, host_buffer
from edgeinfer.engine.kv import KV_TYPES, flash_attn_type, kv_bytes_per_token, seats, serving_bytes
from edgeinfer.errors import ModelLoadError

log = logging.getLogger("edgeinfer.llama")

# ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continues the previous line
_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
_last_level = logging.DEBUG


# Optional extra reader of llama.cpp's log lines (quantization progress, for one).
log_listener: Callable[[str], None] | None = None


def _log_line(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    global _last_level
    lvl = _last_level if level == 5 else _LEVELS.get(level, logging.DEBUG)
    if lvl == logging.ERROR and b"grammar" in text:  # a request's grammar: its 400 says it
        lvl = logging.WARNING
    _last_level = lvl
    if log_listener is not None:
        log_listener(text.decode("utf-8", "replace"))
    if log.isEnabledFor(lvl):
        msg = text.decode("utf-8", "replace").rstrip()
        if msg:
            log.log(lvl, "%s", msg)


# the C callback; kept referenced for as long as llama.cpp may call it (the process)
_log_callback = llama_cpp.llama_log_callback(_log_line)


_backend_lock = threading.Lock()
_backend_ready = False


def init_backend() -> None:
    """Initialise llama.cpp once per process and route its logs to logging."""
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _backend_ready = True


def gpu_offload_supported() -> bool:
    return bool(llama_cpp.llama_supports_gpu_offload())


class _LoadProgress:
    """llama.cpp's load progress as a bar on a terminal (nothing when stderr is a file)."""

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        self.tty = sys.stderr.isatty()
        self.shown = -1
        # keep the ctypes callback alive while llama.cpp may call it
        self.callback = llama_cpp.llama_progress_callback(self._report)

    def _report(self, progress: float, user_data: ctypes.c_void_p) -> bool:
        pct = int(progress * 100)
        if self.tty and pct != self.shown:
            self.shown = pct
            bar = "#" * (pct * 30 // 100)
            sys.stderr.write(f"\rloading {self.model_id}: [{bar:<30}] {pct:3d}%")
            sys.stderr.flush()
        return True  # go on loading

    def done(self) -> None:
        if self.tty and self.shown >= 0:
            sys.stderr.write("\n")
            sys.stderr.flush()


@dataclass(frozen=True, slots=True)
class ModelInfo:
    n_vocab: int
    n_ctx_train: int
    n_ctx: int
    add_bos: bool
    bos_text: str
    eos_text: str
    chat_template: str | None
    description: str
    size_bytes: int


class LlamaRuntime:
    """A GGUF model with one context holding ``cfg.slots`` sequences."""

    info: ModelInfo

    def __init__(self, cfg: ModelConfig, path: Path) -> None:
        init_backend()
        self.cfg = cfg
        self.path = path
        # owns the model, the context and the batch; frees them newest first
        self._handles = contextlib.ExitStack()
        try:
            self._open()
        except BaseException:
            self._handles.close()
            raise

    def _open(self) -> None:
        cfg = self.cfg
        mparams = model_params()  # (no AMX kernels: they crash)
        mparams.n_gpu_layers = cfg.gpu_layers if isinstance(cfg.gpu_layers, int) else 0
        progress = _LoadProgress(cfg.id)
        mparams.progress_callback = progress.callback
        try:
            model = Model(self.path, mparams, ModelLoadError(
                f"model {cfg.id!r}: llama.cpp could not load {self.path}"))
        finally:
            progress.done()
        self._model = self._handles.enter_context(contextlib.closing(model))
        self._vocab: VocabPtr = llama_cpp.llama_model_get_vocab(model.ptr)
        self.memory_kind = self._memory_kind(model.ptr)
        # a purely recurrent memory (Mamba): one cell a sequence, however long
        self.recurrent = bool(llama_cpp.llama_model_is_recurrent(model.ptr)) and not bool(
            llama_cpp.llama_model_is_hybrid(model.ptr))
        self._ctx = self._handles.enter_context(contextlib.closing(Context(
            model.ptr, self.context_params(),
            ModelLoadError(f"model {cfg.id!r}: llama.cpp could not create a context"))))
        self._mem: MemoryPtr = llama_cpp.llama_get_memory(self._ctx.ptr)
        # room for the largest step: a prompt-only step takes up to prefill_batch tokens
        self._batch = self._handles.enter_context(contextlib.closing(Batch(self.max_step)))
        self.info = self._read_info()
        self._pieces: list[bytes | None] = [None] * self.info.n_vocab
        self._eog: tuple[int, ...] | None = None
        self._memory_bytes = serving_bytes(self.info.size_bytes, self._kv_bytes_per_token(),
                                           self.info.n_ctx)

    @property
    def max_step(self) -> int:
        """The most tokens one engine step may decode."""
        return max(self.cfg.batch, self.cfg.prefill_batch)

    def context_params(self) -> llama_cpp.llama_context_params:
        cfg = self.cfg
        cparams: llama_cpp.llama_context_params = llama_cpp.llama_context_default_params()
        cparams.n_ctx = cfg.context
        # cache entries hold finished prefixes in the KV cache; checkpoints live in RAM
        cparams.n_seq_max = seats(cfg, self.memory_kind) + (
            cfg.cache_entries if self.memory_kind == "kv" else 0)
        # llama.cpp asserts (aborting the process) unless a batch can hold one output per
        # sequence; the scheduler's own budget stays cfg.batch
        cparams.n_batch = cparams.n_ubatch = max(self.max_step, cparams.n_seq_max)
        cparams.n_threads = cfg.threads
        cparams.n_threads_batch = cfg.threads
        cparams.kv_unified = True
        cparams.swa_full = cfg.swa_full
        cparams.type_k = KV_TYPES[cfg.cache_type_k][0]
        cparams.type_v = KV_TYPES[cfg.cache_type_v][0]
        cparams.flash_attn_type = flash_attn_type(cfg.flash_attn)  # "auto": llama-server's
        cparams.no_perf = True
        return cparams

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text (None when absent)."""
        size = 1 << 16
        buf = ctypes.create_string_buffer(size)
        model = self._model.ptr
        n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, size)
        if n < 0:
            return None
        if n >= size:
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, n + 1)
        return buf.value.decode("utf-8", "replace")

    def _read_info(self) -> ModelInfo:
        vocab, model = self._vocab, self._model.ptr
        bos = llama_cpp.llama_vocab_bos(vocab)
        eos = llama_cpp.llama_vocab_eos(vocab)
        desc = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(model, desc, 256)
        return ModelInfo(
            n_vocab=llama_cpp.llama_vocab_n_tokens(vocab),
            n_ctx_train=llama_cpp.llama_model_n_ctx_train(model),
            n_ctx=llama_cpp.llama_n_ctx(self._ctx.ptr),
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
            bos_text=self._token_text(bos),
            eos_text=self._token_text(eos),
            chat_template=self.meta("tokenizer.chat_template"),
            description=desc.value.decode("utf-8", "replace"),
            size_bytes=llama_cpp.llama_model_size(model),
        )

    def _kv_bytes_per_token(self) -> int:
        """The KV formula (``engine.kv``) on the shapes llama.cpp loaded."""
        m = self._model.ptr
        key_length = self.meta(f"{self.meta('general.architecture')}.attention.key_length")
        return kv_bytes_per_token(
            llama_cpp.llama_model_n_layer(m), llama_cpp.llama_model_n_embd(m),
            llama_cpp.llama_model_n_head(m), llama_cpp.llama_model_n_head_kv(m),
            int(key_length) if key_length and key_length.isdigit() else 0,
            self.cfg.cache_type_k, self.cfg.cache_type_v)

    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self._render(token, special=True).decode("utf-8", "replace")

    # -- vocabulary (any thread) ----------------------------------------
    @property
    def vocab(self) -> VocabPtr:
        return self._vocab

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special,
                                     parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special,
                                         parse_special)
        if n < 0:
            raise ValueError("tokenization failed")
        return list(buf[:n])

    def control_texts(self) -> list[str]:
        """The texts that tokenizing with special-token parsing turns into control (or
        unknown) tokens: what text from a request must never be tokenized as."""
        vocab = self._vocab
        wanted = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
        out = []
        for t in range(self.info.n_vocab):
            if llama_cpp.llama_vocab_get_attr(vocab, t) & wanted:
                text = self._render(t, special=True).decode("utf-8", "replace")
                if text:
                    out.append(text)
        return out

    def _render(self, token: int, *, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
        return buf.raw[: max(n, 0)]

    def piece(self, token: int) -> bytes:
        """The bytes a generated token adds to the text (special tokens add none, except
        those ``show_markers`` named)."""
        cached = self._pieces[token]
        if cached is None:
            cached = self._pieces[token] = self._render(token, special=False)
        return cached

    def show_markers(self, texts: tuple[str, ...]) -> list[str]:
        """Make the special tokens whose text is one of ``texts`` (a tool-call or
        reasoning format's markers, such as ``[TOOL_CALLS]`` or ``<think>``) show in the
        generated text, as llama-server's preserved tokens do, so that the format's
        parser sees them. Returns the texts that are such tokens. Call before serving."""
        shown = []
        for text in texts:
            for t in self.tokenize(text, add_special=False, parse_special=True):
                if not self._render(t, special=False) and not self.is_eog(t):
                    self._pieces[t] = piece = self._render(t, special=True)
                    shown.append(piece.decode("utf-8", "replace"))
        return list(dict.fromkeys(shown))

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token of the vocabulary (listed once)."""
        if self._eog is None:
            self._eog = tuple(t for t in range(self.info.n_vocab) if self.is_eog(t))
        return self._eog

    @property
    def model(self) -> ModelPtr:
        return self._model.ptr

    def memory_bytes(self) -> int:
        """Weights plus the KV cache of the context (``engine.kv``), as loaded, plus the
        deterministic mode's once it has one (``add_kv_cache``)."""
        return self._memory_bytes

    def add_kv_cache(self) -> None:
        """Count a second KV cache of the context's size (``engine.lane``'s)."""
        self._memory_bytes += self._kv_bytes_per_token() * self.info.n_ctx

    def add_memory(self, size: int) -> None:
        """Count memory this model's engine holds besides (a draft model's)."""
        self._memory_bytes += size

    # -- context (engine thread only) -----------------------------------
    @property
    def ctx(self) -> ContextPtr:
        return self._ctx.ptr

    def decode(self, runs: list[Run]) -> Decoded:
        """One llama_decode of ``runs``: its code, and each logits-wanting run's batch index.
        It returns once computed (offloaded too), so a step's time is its whole cost."""
        batch = self._batch.batch
        out = fill_batch(batch, runs)
        assert 0 < batch.n_tokens <= self.max_step
        rc = llama_cpp.llama_decode(self._ctx.ptr, batch)
        llama_cpp.llama_synchronize(self._ctx.ptr)
        return Decoded(rc, out)

    def logits_row(self, batch_index: int) -> npt.NDArray[np.float32]:
        """The logits of one output of the last decode (a view, valid until the next)."""
        return logits_row(self._ctx.ptr, self.info.n_vocab, batch_index)

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        return bool(llama_cpp.llama_memory_seq_rm(self._mem, seq_id, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        llama_cpp.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_pos_max(self, seq_id: int) -> int:
        """The last position ``seq_id`` holds (-1: none)."""
        return int(llama_cpp.llama_memory_seq_pos_max(self._mem, seq_id))

    def seq_state(self, seq_id: int) -> State:
        """The KV state of one sequence (llama_state_seq_get_data): what ``set_seq_state``
        puts back, in this context or a fresh one of the same model and parameters."""
        data = host_buffer(self.seq_state_size(seq_id))  # written
        n = llama_cpp.llama_state_seq_get_data(  # in place (new memory is slow to touch)
            self.ctx, (ctypes.c_uint8 * len(data)).from_buffer(data), len(data), seq_id)
        return data[:n] if n < len(data) else data

    def seq_state_size(self, seq_id: int) -> int:
        """The size of ``seq_state(seq_id)`` in bytes, without copying it."""
        return int(llama_cpp.llama_state_seq_get_size(self.ctx, seq_id))

    def set_seq_state(self, seq_id: int, data: State) -> bool:
        """Load a sequence's state saved by ``seq_state`` into ``seq_id`` (which must be
        empty); False when llama.cpp refuses it (no room, or data it cannot read)."""
        array = ctypes.c_uint8 * len(data)  # read in place where the buffer allows
        buf = array.from_buffer_copy(data) if isinstance(data, bytes) else array.from_buffer(data)
        return int(llama_cpp.llama_state_seq_set_data(self.ctx, buf, len(data), seq_id)) > 0

    def _memory_kind(self, model: ModelPtr) -> str:
        """How this model's memory lets prefixes be reused: "kv" when cells can be shared
        and trimmed (seq_cp, partial seq_rm); "checkpoint" for recurrent and hybrid models
        and sliding windows without the full-size cache (models.toml ``swa_full``), whose
        state only a whole saved copy reproduces, and where models.toml asks for it."""
        swa = bool(llama_cpp.llama_model_n_swa(model)) and not self.cfg.swa_full
        rnn = llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model)
        return "checkpoint" if self.cfg.cache_mode == "checkpoint" or swa or rnn else "kv"

    @property
    def sliding_window(self) -> int:
        """The model's attention window (0: none)."""
        return int(llama_cpp.llama_model_n_swa(self._model.ptr))

    def close(self) -> None:
        """Free the batch, the context and the model (newest first); idempotent."""
        self._handles.close()
