"""The one KV-cache size formula: K and V for every layer and KV head, in the cache types
models.toml asks for (``cache_type_k`` / ``cache_type_v``; f16 by default).

The engine sizes a loaded model with it (``LlamaRuntime.memory_bytes``), the model
listing and the pool size a GGUF file with it (``models.modelinfo.gguf_facts``), from
the same shapes and the same defaults for shapes a file leaves out.
"""

from __future__ import annotations

F16_BYTES = 2
# ggml type ids (ggml.h) and bytes per element of the KV cache types (quantized types are
# stored in blocks of 32: q8_0 34 bytes, q4_0 18 bytes a block)
KV_TYPES: dict[str, tuple[int, float]] = {
    "f32": (0, 4.0), "f16": (1, 2.0), "bf16": (30, 2.0), "q8_0": (8, 34 / 32),
    "q4_0": (2, 18 / 32)}


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
