"""What a GGUF file is (from its metadata, with the gguf package) and re-quantizing it."""

from __future__ import annotations

import logging
import math
import mmap
import re
import struct
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import llama_cpp
import psutil
from gguf import LlamaFileType

from edgeinfer.config import QUANT_TYPES, DerivedSource, ModelConfig, PackageSource
from edgeinfer.engine import native
from edgeinfer.engine.kv import kv_bytes_per_token, kv_scale, serving_bytes
from edgeinfer.engine.ram_tier import default_mb
from edgeinfer.errors import ConfigError, EdgeInferError, ModelLoadError
from edgeinfer.models.fit import MEMORY_RESERVE, MODEL_OVERHEAD, Memory, fit
from edgeinfer.models.source import cache_dir, check_gguf, resolve_model_path
from edgeinfer.prompt.reasoning import splits
from edgeinfer.prompt.template import CHATML
from edgeinfer.prompt.toolformat import choose

log = logging.getLogger("edgeinfer.models")

FTYPES = {name: getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name.upper()}") for name in QUANT_TYPES}


# GGUF value types (gguf.GGUFValueType): fixed-size scalars, string, array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def gguf_metadata(path: Path, token_ids: Collection[int] = ()) -> dict[str, Any]:
    """A GGUF file's metadata, read from its header alone (the tensors are never
    touched): each key's value, the first item for an array (None for an empty one).
    Fast on any file, unlike gguf.GGUFReader, which parses the whole tokenizer
    (seconds). With ``token_ids``, ``tokenizer.ggml.tokens`` is instead the texts of
    those tokens, by id (a walk over the vocabulary: tens of milliseconds). ValueError for
    a file that is not a little-endian GGUF v2 or v3."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        try:
            magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", m, 0)
            if magic != b"GGUF" or version not in (2, 3):
                raise ValueError(f"{path} is not a GGUF v2/v3 file")
            out: dict[str, Any] = {}
            pos = 24
            for _ in range(n_kv):
                key, pos = _gguf_string(m, pos)
                (vtype,) = struct.unpack_from("<I", m, pos)
                if key == "tokenizer.ggml.tokens" and token_ids and vtype == _ARRAY:
                    out[key], pos = _token_texts(m, pos + 4, set(token_ids))
                else:
                    out[key], pos = _gguf_value(m, pos + 4, vtype)
            if "general.parameter_count" not in out:  # the tensors' sizes, from their infos
                out["general.parameter_count"] = _parameters(m, pos, n_tensors)
            return out
        except (struct.error, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: broken GGUF metadata ({exc})") from None


def _parameters(m: mmap.mmap, pos: int, n_tensors: int) -> int:
    """The number of weights in the tensor infos at ``pos``."""
    total = 0
    for _ in range(n_tensors):
        _, pos = _gguf_string(m, pos)
        (n_dims,) = struct.unpack_from("<I", m, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", m, pos + 4)
        total += math.prod(dims)
        pos += 4 + 8 * n_dims + 4 + 8  # dims, then the type and the offset
    return total


def _gguf_string(m: mmap.mmap, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", m, pos)
    if pos + 8 + n > len(m):
        raise ValueError("a GGUF string runs past the end of the file")
    return m[pos + 8 : pos + 8 + n].decode("utf-8", "replace"), pos + 8 + n


def _token_texts(m: mmap.mmap, pos: int, ids: set[int]) -> tuple[dict[int, str], int]:
    """The texts of the tokens ``ids`` in the array of strings at ``pos``, and the position
    after it."""
    itype, count = struct.unpack_from("<IQ", m, pos)
    if itype != _STRING:
        raise ValueError("tokenizer.ggml.tokens is not an array of strings")
    found: dict[int, str] = {}
    pos += 12
    for i in range(count):
        text, pos = _gguf_string(m, pos)
        if i in ids:
            found[i] = text
    return found, pos


def _gguf_value(m: mmap.mmap, pos: int, vtype: int) -> tuple[Any, int]:
    """The value at ``pos`` (an array's first item) and the position after it."""
    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        return struct.unpack_from(fmt, m, pos)[0], pos + struct.calcsize(fmt)
    if vtype == _STRING:
        return _gguf_string(m, pos)
    if vtype != _ARRAY:
        raise ValueError(f"unknown GGUF value type {vtype}")
    itype, count = struct.unpack_from("<IQ", m, pos)
    pos += 12
    if itype in _SCALARS:  # skip the rest at once
        size = struct.calcsize(_SCALARS[itype])
        if pos + count * size > len(m):
            raise ValueError("a GGUF array runs past the end of the file")
        first = struct.unpack_from(_SCALARS[itype], m, pos)[0] if count else None
        return first, pos + count * size
    if count * 8 > len(m) - pos:  # every string or array item takes at least 8 bytes
        raise ValueError("a GGUF array runs past the end of the file")
    first = None
    for i in range(count):
        item, pos = _gguf_value(m, pos, itype)
        first = item if i == 0 else first
    return first, pos


def gguf_facts(path: Path) -> dict[str, Any]:
    """Architecture, quantization and the shapes that size the KV cache (with the one
    KV formula, ``engine.kv``), from the file's header; ValueError for a broken file."""
    meta = gguf_metadata(path)
    arch = meta.get("general.architecture") or "?"
    ftype = meta.get("general.file_type")
    try:
        quant = LlamaFileType(ftype).name.removeprefix("MOSTLY_") if ftype is not None else "?"
    except ValueError:
        quant = f"type {ftype}"
    n_layer = meta.get(f"{arch}.block_count") or 0
    kv_per_token = kv_bytes_per_token(
        n_layer, meta.get(f"{arch}.embedding_length") or 0,
        meta.get(f"{arch}.attention.head_count") or 1,
        meta.get(f"{arch}.attention.head_count_kv") or 0,
        meta.get(f"{arch}.attention.key_length") or 0)
    return {"arch": arch, "quant": quant, "layers": n_layer,
            "context_train": meta.get(f"{arch}.context_length"),
            "kv_bytes_per_token": kv_per_token,
            "name": meta.get("general.name"),
            "recurrent": any(k.startswith((f"{arch}.ssm.", f"{arch}.shortconv.",
                                           f"{arch}.wkv.")) for k in meta),
            "sliding_window": meta.get(f"{arch}.attention.sliding_window") or 0,
            "chat_template": meta.get("tokenizer.chat_template")}


def kv_per_token(cfg: ModelConfig, facts: dict[str, Any]) -> int:
    """Bytes of KV cache one token takes in ``cfg``'s cache types (``facts``: gguf_facts)."""
    return round(int(facts["kv_bytes_per_token"]) * kv_scale(cfg.cache_type_k, cfg.cache_type_v))


def estimate_bytes(cfg: ModelConfig, path: Path) -> int:
    """Memory a model will take once loaded: weights, its KV cache (the one formula,
    ``engine.kv``, from the GGUF's shapes) and MODEL_OVERHEAD. Blocking (reads the file's
    header)."""
    try:
        per_token = kv_per_token(cfg, gguf_facts(path))
    except Exception:  # a broken file fails to load later, with its reason
        per_token = 0
    return path.stat().st_size + per_token * cfg.context + MODEL_OVERHEAD


def fit_file(cfg: ModelConfig, path: Path, facts: dict[str, Any], room: int,
             vram_free: int | None = None, draft: tuple[int, dict[str, Any]] | None = None
             ) -> tuple[ModelConfig, str]:
    """The fit step (``models.fit``) for the GGUF at ``path`` in ``room`` bytes of RAM, with
    its draft model's file size and facts (``_draft_facts``), whose cache grows with the
    context chosen."""
    return fit(cfg, Memory(path.stat().st_size, kv_per_token(cfg, facts), int(facts["layers"]),
                           facts["context_train"], room, vram_free,
                           draft[0] if draft else 0, kv_per_token(cfg, draft[1]) if draft else 0))


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
    draft = _draft_facts(cfg, models)  # its size and facts, or its error
    if isinstance(draft, str):
        return {**row, "status": "unavailable", "error": draft}

    def draft_bytes() -> int:  # its weights and KV cache (the target's cells and K/V types)
        return serving_bytes(draft[0], kv_per_token(cfg, draft[1]), cfg.context) if draft else 0

    if not {"context", "slots"} <= set(cfg.explicit):  # what the fit step would choose now
        cfg, _ = fit_file(cfg, path, facts, psutil.virtual_memory().available - MEMORY_RESERVE,
                          draft=draft)
        row.update(slots=cfg.slots, context=cfg.context, fit=True)
    per_token = kv_per_token(cfg, facts)
    kv, drafted = per_token * cfg.context, draft_bytes()  # at the fitted context
    memory = serving_bytes(size, per_token, cfg.context) + drafted
    if draft:
        row["draft_mib"] = round(drafted / 2**20, 1)
    source = cfg.chat_template or facts["chat_template"] or CHATML
    return {**row, "status": "cached", "path": str(path), "arch": facts["arch"],
            "quant": facts["quant"], "size_mib": round(size / 2**20, 1),
            "tool_format": choose(cfg.tool_format, source).name,
            "reasoning": "split" if splits(cfg.reasoning_format, source) else "none",
            "kv_mib": round(kv / 2**20, 1), "memory_mib": round(memory / 2**20, 1),
            "gpu_layers": cfg.gpu_layers, "flash_attn": cfg.flash_attn,
            "cache": cache_tiers(cfg, facts)}


def _draft_facts(cfg: ModelConfig, models: dict[str, ModelConfig] | None
                  ) -> tuple[int, dict[str, Any]] | str | None:
    """The file size and facts of ``cfg``'s draft model (None: it has none; a string: why
    it cannot be read)."""
    if cfg.speculative != "draft" or cfg.draft_model is None:
        return None
    found = [m for m in (models or {}).values() if cfg.draft_model in m.names]
    if not found:
        return f"draft model {cfg.draft_model!r} is not configured"
    try:
        path = resolve_model_path(found[0], models)
        return path.stat().st_size, gguf_facts(path)
    except (ModelLoadError, ValueError, OSError) as exc:
        return f"draft model {cfg.draft_model!r}: {exc}"


def cache_mode(cfg: ModelConfig, facts: dict[str, Any]) -> str:
    """How the engine will reuse prefixes (as ``LlamaRuntime.memory_kind`` decides once
    loaded): "checkpoint" for recurrent / hybrid models and sliding windows without
    swa_full, else "kv"."""
    if cfg.cache_mode == "checkpoint" or facts.get("recurrent"):
        return "checkpoint"
    return "checkpoint" if facts.get("sliding_window") and not cfg.swa_full else "kv"


def cache_tiers(cfg: ModelConfig, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """The prefix cache's tiers of a model: budgets, and what the disk tier holds now."""
    folder = cache_dir() / "prefixes" / cfg.id.replace("/", "_")
    files = list(folder.glob("*.kv")) if folder.is_dir() else []
    return {"mode": cache_mode(cfg, facts or {}), "kv": cfg.prefix_cache,
            "ram_mb": default_mb(cfg.cache_ram_mb) if cfg.prefix_cache else 0,
            "disk_mb": cfg.cache_disk_mb if cfg.prefix_cache else 0, "disk_files": len(files),
            "disk_mib": round(sum(f.stat().st_size for f in files) / 2**20, 1)}


def _cache_text(c: dict[str, Any]) -> str:
    if not c["kv"]:
        return "off"
    mode = "ckpt " if c.get("mode") == "checkpoint" else ""
    return f"{mode}ram {c['ram_mb']}M disk {c['disk_files']}f/{c['disk_mib']:g}M"


def render_table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'id':<28} {'arch':<10} {'quant':<8} {'disk MiB':>9} {'serve MiB':>10} "
            f"{'tools':<12} {'reasoning':<9} {'cache tiers':<22}  file")
    lines = [head, "-" * len(head)]
    for r in rows:
        if r["status"] != "cached":
            lines.append(f"{r['id']:<28} {'-':<10} {'-':<8} {'-':>9} {'-':>10} {'-':<12} "
                         f"{'-':<9} {'-':<22}  {r['error']}")
            continue
        lines.append(f"{r['id']:<28} {r['arch']:<10} {r['quant']:<8} {r['size_mib']:>9} "
                     f"{r['memory_mib']:>10} {r['tool_format']:<12} {r['reasoning']:<9} "
                     f"{_cache_text(r['cache']):<22}  {r['path']}")
    lines.append("serve MiB: weights plus the KV cache (in its configured types) for the "
                 "configured context, a draft model's included; tools: "
                 "the tool-call format; reasoning: reasoning blocks split from the answer; "
                 "cache tiers: the RAM budget, and the pinned prefixes saved on disk (files / "
                 "MiB); ckpt: prefixes reused from whole saved states (recurrent, hybrid)")
    return "\n".join(lines)


_PROGRESS = re.compile(r"\[\s*(\d+)/\s*(\d+)\]")


def quantize_file(src: Path, dst: Path, kind: str, threads: int = 0) -> None:
    """Write ``dst``: ``src`` quantized to ``kind`` (llama.cpp's quantizer), with progress."""
    ftype = FTYPES.get(kind.lower())
    if ftype is None:
        raise ConfigError(f"unknown type {kind!r}; choose one of {', '.join(FTYPES)}")
    check_gguf(src, src.name)
    if not dst.parent.is_dir():
        raise ConfigError(f"cannot write {dst}: its folder does not exist")
    native.init_backend()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    params.allow_requantize = True
    t0, tty = time.monotonic(), sys.stderr.isatty()  # (a bar in a log: 300 updates)

    def progress(line: str) -> None:
        m = _PROGRESS.search(line)
        if m and (tty or m.group(1) == m.group(2)):  # (else the last alone: a log's line)
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
        raise EdgeInferError(f"quantization failed (llama_model_quantize returned {rc})" if rc
                             else f"quantization failed: {dst} is gone")
    log.info("wrote %s (%.1f MiB, %s) in %.1fs", dst, dst.stat().st_size / 2**20, kind,
             time.monotonic() - t0)
