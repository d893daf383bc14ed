"""The one KV-cache size formula: f16 K and V for every layer and KV head.

The engine sizes a loaded model with it (``LlamaRuntime.memory_bytes``), the model
listing and the pool size a GGUF file with it (``models.modelinfo.gguf_facts``), from
the same shapes and the same defaults for shapes a file leaves out.
"""

from __future__ import annotations

F16_BYTES = 2


def kv_bytes_per_token(n_layer: int, n_embd: int, n_head: int, n_head_kv: int = 0,
                       key_length: int = 0) -> int:
    """Bytes of KV cache one token takes: K and V, each ``n_head_kv`` heads of
    ``key_length`` f16 values, in every layer. ``n_head_kv`` defaults to ``n_head`` (no
    grouped-query attention), ``key_length`` to ``n_embd // n_head``."""
    n_head = max(n_head, 1)
    head_dim = key_length or n_embd // n_head
    return 2 * n_layer * (n_head_kv or n_head) * head_dim * F16_BYTES


def serving_bytes(weights: int, kv_per_token: int, n_ctx: int) -> int:
    """Memory a model takes to serve: its weights plus the KV cache of ``n_ctx`` tokens."""
    return weights + kv_per_token * n_ctx
