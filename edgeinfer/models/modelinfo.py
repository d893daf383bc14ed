"""What a GGUF file is (from its metadata, with the gguf package) and re-quantizing it."""

from __future__ import annotations

import logging
import re
import sys
import time
from pathlib import Path
from typing import Any

import llama_cpp
from gguf import GGUFReader, GGUFValueType, LlamaFileType

from edgeinfer.config import DerivedSource, ModelConfig, PackageSource
from edgeinfer.engine import native
from edgeinfer.errors import ConfigError, EdgeInferError, ModelLoadError
from edgeinfer.models.source import cache_dir, check_gguf, resolve_model_path

log = logging.getLogger("edgeinfer.models")

FTYPES = {
    "f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16, "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
    "q4_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1, "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, "q5_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M,
    "q6_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K,
}


def _value(reader: GGUFReader, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    part = field.parts[field.data[0]]
    if field.types and field.types[0] == GGUFValueType.STRING:
        return bytes(part).decode("utf-8", "replace")
    return part.tolist()[0] if hasattr(part, "tolist") else part


def gguf_facts(path: Path) -> dict[str, Any]:
    """Architecture, quantization and the shapes that size the KV cache."""
    reader = GGUFReader(path)
    arch = _value(reader, "general.architecture") or "?"
    ftype = _value(reader, "general.file_type")
    try:
        quant = LlamaFileType(ftype).name.removeprefix("MOSTLY_") if ftype is not None else "?"
    except ValueError:
        quant = f"type {ftype}"
    n_layer = _value(reader, f"{arch}.block_count") or 0
    n_embd = _value(reader, f"{arch}.embedding_length") or 0
    n_head = _value(reader, f"{arch}.attention.head_count") or 1
    n_head_kv = _value(reader, f"{arch}.attention.head_count_kv") or n_head
    head_dim = (_value(reader, f"{arch}.attention.key_length") or n_embd // max(n_head, 1))
    return {"arch": arch, "quant": quant, "layers": n_layer,
            "context_train": _value(reader, f"{arch}.context_length"),
            "kv_bytes_per_token": 2 * n_layer * n_head_kv * head_dim * 2,
            "name": _value(reader, "general.name")}


def describe(cfg: ModelConfig, models: dict[str, ModelConfig] | None = None) -> dict[str, Any]:
    """A row of ``edgeinfer models``."""
    row: dict[str, Any] = {"id": cfg.id, "aliases": list(cfg.aliases), "slots": cfg.slots,
                           "context": cfg.context}
    src = cfg.source
    if isinstance(src, DerivedSource) or (isinstance(src, PackageSource) and src.assemble):
        made = (cache_dir() / f"{cfg.id}.{src.quantize}.gguf" if isinstance(src, DerivedSource)
                else cache_dir() / f"{cfg.id}.gguf")
        if not made.is_file():  # listing never writes files
            what = (f"a {src.quantize} copy of {src.base}" if isinstance(src, DerivedSource)
                    else f"assembled from {src.package}")
            return {**row, "status": "made on first use", "error": what}
    try:
        path = resolve_model_path(cfg, models)
        check_gguf(path, cfg.id)
        facts = gguf_facts(path)
    except (ModelLoadError, ValueError, OSError) as exc:
        return {**row, "status": "unavailable", "error": str(exc)}
    size = path.stat().st_size
    kv = facts["kv_bytes_per_token"] * cfg.context
    return {**row, "status": "cached", "path": str(path), "arch": facts["arch"],
            "quant": facts["quant"], "size_mib": round(size / 2**20, 1),
            "kv_mib": round(kv / 2**20, 1), "memory_mib": round((size + kv) / 2**20, 1),
            "gpu_layers": cfg.gpu_layers}


def render_table(rows: list[dict[str, Any]]) -> str:
    head = f"{'id':<28} {'arch':<10} {'quant':<8} {'disk MiB':>9} {'serve MiB':>10}  file"
    lines = [head, "-" * len(head)]
    for r in rows:
        if r["status"] != "cached":
            lines.append(f"{r['id']:<28} {'-':<10} {'-':<8} {'-':>9} {'-':>10}  {r['error']}")
            continue
        lines.append(f"{r['id']:<28} {r['arch']:<10} {r['quant']:<8} {r['size_mib']:>9} "
                     f"{r['memory_mib']:>10}  {r['path']}")
    lines.append("serve MiB: weights plus the f16 KV cache for the configured context")
    return "\n".join(lines)


_PROGRESS = re.compile(r"\[\s*(\d+)/\s*(\d+)\]")


def quantize_file(src: Path, dst: Path, kind: str, threads: int = 0) -> None:
    """Write ``dst``: ``src`` quantized to ``kind`` (llama.cpp's quantizer), with progress."""
    ftype = FTYPES.get(kind.lower())
    if ftype is None:
        raise ConfigError(f"unknown type {kind!r}; choose one of {', '.join(FTYPES)}")
    check_gguf(src, src.name)
    native.init_backend()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    params.allow_requantize = True
    t0 = time.monotonic()

    def progress(line: str) -> None:
        m = _PROGRESS.search(line)
        if m:
            done, total = int(m.group(1)), int(m.group(2))
            bar = "#" * (30 * done // total)
            sys.stderr.write(f"\rquantizing to {kind}: [{bar:<30}] {done}/{total} tensors")
            sys.stderr.flush()

    native.log_listener = progress
    try:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    finally:
        native.log_listener = None
        sys.stderr.write("\n")
    if rc != 0 or not dst.is_file():
        raise EdgeInferError(f"quantization failed (llama_model_quantize returned {rc})")
    log.info("wrote %s (%.1f MiB, %s) in %.1fs", dst, dst.stat().st_size / 2**20, kind,
             time.monotonic() - t0)
