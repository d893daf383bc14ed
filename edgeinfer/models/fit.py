"""The fit step: a model's context and slots, when models.toml leaves them out, chosen to
fit the memory that is free when it loads (as llama-server's ``--fit``). Pure: tested
without loading anything.

- context: the model's training context (at most ``AUTO_CONTEXT_MAX``), lowered in steps
  of 256 cells until its weights, its KV cache (in the configured K/V types) and
  ``MODEL_OVERHEAD`` (and its draft model's, whose KV cache has as many cells) fit the free
  RAM, and, for the layers on a GPU, their share of the
  weights and KV fits the GPU's free memory; never below ``MIN_CONTEXT`` (a model that
  does not fit even then is tried with that and the note says so; the pool's memory check
  then decides);
- slots: the configured count (8 by default), fewer when the context would give a slot
  less than ``MIN_CELLS_PER_SLOT`` cells.

A value models.toml (or ``--context`` / ``--slots``) sets is kept as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from edgeinfer.config import ModelConfig

AUTO_CONTEXT_MAX = 32768
MIN_CONTEXT = 2048
STEP = 256
MIN_CELLS_PER_SLOT = 512
MODEL_OVERHEAD = 64 << 20  # compute buffers and the rest, besides weights + KV
MEMORY_RESERVE = 512 << 20  # RAM left free for the OS and the server itself


@dataclass(frozen=True, slots=True)
class Memory:
    """What the fit step knows of a model file and of the machine."""

    file_bytes: int
    kv_bytes_per_token: int  # in the configured cache types
    n_layers: int
    context_train: int | None
    ram_free: int  # bytes this model may take (free RAM less a reserve, or the budget)
    vram_free: int | None = None  # the GPU's free bytes, when layers are offloaded
    # a draft model's file and KV bytes a token (0: none): its context is the target's
    draft_file_bytes: int = 0
    draft_kv_bytes_per_token: int = 0


def _needs(cfg: ModelConfig, m: Memory, ctx: int) -> tuple[int, int]:
    """(RAM, VRAM) bytes the model takes with ``ctx`` cells: its layers' share on the GPU,
    and its draft model's, which goes to the GPU whole when the target has any layer there
    (``engine.draft_model``); each with ``MODEL_OVERHEAD`` of buffers in RAM."""
    layers = cfg.gpu_layers if isinstance(cfg.gpu_layers, int) else 0
    on_gpu = min(layers, m.n_layers + 1) / (m.n_layers + 1) if m.n_layers > 0 else 0.0
    own = m.file_bytes + m.kv_bytes_per_token * ctx
    draft = m.draft_file_bytes + m.draft_kv_bytes_per_token * ctx if m.draft_file_bytes else 0
    vram = round(own * on_gpu) + (draft if layers > 0 else 0)
    buffers = MODEL_OVERHEAD * (2 if draft else 1)
    return own + draft + buffers - vram, vram


def _fits(cfg: ModelConfig, m: Memory, ctx: int) -> bool:
    ram, vram = _needs(cfg, m, ctx)
    return ram <= m.ram_free and (not vram or m.vram_free is None or vram <= m.vram_free)


def fit(cfg: ModelConfig, m: Memory) -> tuple[ModelConfig, str]:
    """The config with its unset context and slots chosen, and a line saying what was
    chosen and why (empty when models.toml set both)."""
    auto = [k for k in ("context", "slots") if k not in cfg.explicit]
    if not auto:
        return cfg, ""
    ctx, why = cfg.context, ""
    if "context" in auto:
        target = min(m.context_train or cfg.context, AUTO_CONTEXT_MAX)
        target = max(STEP, target // STEP * STEP)
        ctx = target
        while ctx > MIN_CONTEXT and not _fits(cfg, m, ctx):
            ctx = max(MIN_CONTEXT, ctx - STEP)
        if ctx < target:
            why = f", lowered from {target} to fit"
        elif m.context_train and m.context_train > AUTO_CONTEXT_MAX:
            why = f" (trained for {m.context_train}; set context for more)"
        if not _fits(cfg, m, ctx):
            why += "; it does not fit even so"
    slots = cfg.slots
    if "slots" in auto:
        slots = max(1, min(cfg.slots, ctx // MIN_CELLS_PER_SLOT))
    ram, vram = _needs(cfg, m, ctx)
    gpu = f", {vram >> 20} MiB of {m.vram_free >> 20} MiB free GPU memory" if (
        vram and m.vram_free is not None) else ""
    note = (f"model {cfg.id}: fit: context {ctx}{why}, {slots} slots ({', '.join(auto)} "
            f"chosen): ~{ram >> 20} MiB (weights, KV cache, ~{MODEL_OVERHEAD >> 20} MiB of "
            f"buffers) of {m.ram_free >> 20} MiB free RAM{gpu}")
    return replace(cfg, context=ctx, slots=slots, batch=max(cfg.batch, slots)), note
