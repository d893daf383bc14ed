"""The one KV-cache size formula: K and V for every layer and KV head, in the cache types
models.toml asks for (``cache_type_k`` / ``cache_type_v``; f16 by default).

The engine sizes a loaded model with it (``LlamaRuntime.memory_bytes``), the model
listing and the pool size a GGUF file with it (``models.modelinfo.gguf_facts``), from
the same shapes and the same defaults for shapes a file leaves out.
"""

from __future__ import annotations

from edgeinfer.config import ModelConfig

F16_BYTES = 2
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # llama.cpp's llama_flash_attn_type
# ggml type ids (ggml.h) and bytes per element of the KV cache types (quantized types are
# stored in blocks of 32: q8_0 34 bytes, q4_0 18 bytes a block)
KV_TYPES: dict[str, tuple[int, float]] = {
    "f32": (0, 4.0), "f16": (1, 2.0), "bf16": (30, 2.0), "q8_0": (8, 34 / 32),
    "q4_0": (2, 18 / 32)}


def flash_attn_type(flash_attn: str) -> int:
    """llama.cpp's flash-attention setting (-1 auto: on where it runs, 0 off, 1 on) for
    models.toml's ``flash_attn``.

    The trade-off on a CPU: ggml's CPU flash attention takes a step of fewer than 64
    query rows one row at a time, each over the whole context. Measured on a 2-core CPU
    with SmolLM2: one stream 1,500 tokens deep decoded at 43 ms a token with it and 23 ms
    without, a step of eight such rows took 186 ms against 56, a 28-token follow-up to a
    cached conversation 0.72 s against 0.16 s; with it, a long prompt's pieces were 7-9 %
    faster, and a sequence's rows come out bit for bit the same decoded one per call or
    several in one (below 512 cells), which speculative decoding's exact output rests on.
    Without it, a row's last bits depend on the rows beside it: drafts verified together,
    or a prompt continued from a running request's cells, give the same text only up to
    rounding (a near tie can go the other way). "auto" keeps llama.cpp's choice: on."""
    return FLASH_ATTN[flash_attn]


def kv_scale(type_k: str = "f16", type_v: str = "f16") -> float:
    """The KV cache's size in these types relative to f16 K and V."""
    return (KV_TYPES[type_k][1] + KV_TYPES[type_v][1]) / (2 * F16_BYTES)


def kv_bytes_per_token(n_layer: int, n_embd: int, n_head: int, n_head_kv: int = 0,
                       key_length: int = 0, type_k: str = "f16", type_v: str = "f16") -> int:
    """Bytes of KV cache one token takes: K and V, each ``n_head_kv`` heads of
    ``key_length`` values (of ``type_k`` / ``type_v``), in every layer. ``n_head_kv``
    defaults to ``n_head`` (no grouped-query attention), ``key_length`` to
    ``n_embd // n_head``."""
    n_head = max(n_head, 1)
    head_dim = key_length or n_embd // n_head
    f16 = 2 * n_layer * (n_head_kv or n_head) * head_dim * F16_BYTES
    return round(f16 * kv_scale(type_k, type_v))


def serving_bytes(weights: int, kv_per_token: int, n_ctx: int) -> int:
    """Memory a model takes to serve: its weights plus the KV cache of ``n_ctx`` tokens."""
    return weights + kv_per_token * n_ctx


def seats(cfg: ModelConfig, memory_kind: str) -> int:
    """The sequence ids of a context's running requests: its slots, and where cells are
    shared (``memory_kind`` "kv") seats for requests computed ahead while they wait for a
    slot (``engine.scheduler``): ``prefill_ahead``, by default as many as the slots within
    llama.cpp's 255 sequences. Cached prefixes take the ids after these."""
    if memory_kind != "kv":  # (a recurrent state or a window per sequence: memory each)
        return cfg.slots
    ahead = min(cfg.slots, 255 - cfg.slots - cfg.cache_entries) if cfg.prefill_ahead is None \
        else cfg.prefill_ahead
    return cfg.slots + max(0, ahead)
