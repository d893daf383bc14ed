"""Ollama's model listings: /api/tags, /api/ps and /api/show, from models.toml, the pool
and the GGUF headers (blocking: file headers; run these off the event loop)."""

from __future__ import annotations

import functools
import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeinfer.api.ollama_render import rfc3339
from edgeinfer.config import DerivedSource, ModelConfig
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.models.modelinfo import describe, gguf_facts, gguf_metadata
from edgeinfer.models.pool import ModelState, PoolEntry
from edgeinfer.prompt.reasoning import splits
from edgeinfer.prompt.template import CHATML

_FOUND: dict[ModelConfig, Path] = {}
_SINCE = time.time()  # the modified_at of a file not there yet: the same in every listing
FOREVER = "9999-12-31T23:59:59Z"  # expires_at of a model kept loaded for good
_ARRAYS = {"tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
           "tokenizer.ggml.scores", "general.languages", "general.tags"}


@dataclass(frozen=True, slots=True)
class FileFacts:
    path: Path | None  # None: not on disk yet (a package to install, a file made on first use)
    size: int = 0
    modified: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)  # GGUF metadata (an array: its first item)
    quant: str = ""

    @property
    def arch(self) -> str:
        return str(self.meta.get("general.architecture") or "")

    @property
    def digest(self) -> str:
        """Names this file's version (path, size, time); not a hash of its content."""
        return hashlib.sha256(f"{self.path}:{self.size}:{self.modified}".encode()).hexdigest()

    def details(self) -> dict[str, Any]:
        return {"parent_model": "", "format": "gguf", "family": self.arch,
                "families": [self.arch] if self.arch else [],
                "parameter_size": str(self.meta.get("general.size_label") or _size(
                    self.meta.get("general.parameter_count"))),
                "quantization_level": self.quant}


def _size(count: object) -> str:
    """A parameter count as Ollama writes it: 134.52M, 7.62B."""
    if not isinstance(count, int) or count <= 0:
        return ""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f}{unit}"
    return str(count)


@functools.lru_cache(maxsize=32)
def _gguf(path: Path, mtime_ns: int) -> tuple[dict[str, Any], str]:
    return gguf_metadata(path), str(gguf_facts(path)["quant"])


def file_facts(entry: PoolEntry, configs: dict[str, ModelConfig]) -> FileFacts:
    """The model's file as it is now: nothing is installed or made to find it. A copy made
    on first use from another model (``quantize``) and not made yet shows its base's
    metadata, which quantizing keeps (chat template, architecture, context length: clients
    such as Zed read its tools capability and context from /api/show), with no file."""
    if entry.served is not None:
        return _facts(entry.cfg, entry.served.runtime.path)
    facts, src = _facts(entry.cfg, _found(entry.cfg, configs)), entry.cfg.source
    if facts.path is not None or not isinstance(src, DerivedSource):
        return facts
    quant, seen = src.quantize.upper(), {entry.cfg.id}
    while isinstance(src, DerivedSource) and src.base in configs and src.base not in seen:
        base = configs[src.base]  # (a base may itself be a copy not made yet)
        seen.add(base.id)
        if (found := _facts(base, _found(base, configs))).path is not None:
            return FileFacts(None, modified=_SINCE, meta=found.meta, quant=quant)
        src = base.source
    return facts


def _found(cfg: ModelConfig, configs: dict[str, ModelConfig]) -> Path | None:
    path = _FOUND.get(cfg)
    if path is None and (row := describe(cfg, configs))["status"] == "cached":
        path = _FOUND[cfg] = Path(row["path"])
    return path


def _facts(cfg: ModelConfig, path: Path | None) -> FileFacts:
    if path is None:
        return FileFacts(None, modified=_SINCE)
    try:
        st = path.stat()
    except OSError:  # removed since it was found
        _FOUND.pop(cfg, None)
        return FileFacts(None, modified=_SINCE)
    meta, quant = _gguf(path, st.st_mtime_ns)
    return FileFacts(path, st.st_size, st.st_mtime, meta, quant)


def tagged(name: str) -> str:
    """A name as Ollama lists it, with its tag (``:latest`` unless it has one): clients
    match a model they ask for against the list so (LangChain.js's ChatOllama pulls a
    model it does not find there); a request may name it either way."""
    return name if ":" in name else f"{name}:latest"


def tags_body(entries: list[PoolEntry], configs: dict[str, ModelConfig]) -> dict[str, Any]:
    """Every configured model, once under each of its names (as Ollama lists copies),
    tagged."""
    out = []
    for e in entries:
        f = file_facts(e, configs)
        card = {"modified_at": rfc3339(f.modified), "size": f.size, "digest": f.digest,
                "details": f.details()}
        out += [{"name": tagged(name), "model": tagged(name), **card} for name in e.cfg.names]
    return {"models": out}


def ps_body(entries: list[PoolEntry], configs: dict[str, ModelConfig]) -> dict[str, Any]:
    """The loaded models: memory, the share of it on the GPU (by layers offloaded, an
    estimate; 0 on CPU), and when the ttl unloads them if they stay idle."""
    out, now, mono = [], time.time(), time.monotonic()
    for e in entries:
        served = e.served
        if e.state is not ModelState.LOADED or served is None:
            continue
        f = file_facts(e, configs)
        size = served.runtime.memory_bytes()
        layers = int(f.meta.get(f"{f.arch}.block_count") or 0)
        gpu = served.cfg.gpu_layers if isinstance(served.cfg.gpu_layers, int) else 0
        ttl = e.ttl
        out.append({"name": tagged(e.cfg.id), "model": tagged(e.cfg.id), "size": size,
                    "size_vram": size * min(gpu, layers) // layers if layers else 0,
                    "digest": f.digest, "details": f.details(), "context_length": served.n_ctx,
                    "expires_at": FOREVER if ttl is None or math.isinf(ttl) else rfc3339(
                        now + max(ttl - e.idle_for(mono), 0.0))})
    return {"models": out}


def _model_info(f: FileFacts) -> dict[str, Any]:
    """GGUF metadata: general facts, the architecture's, the tokenizer's kind (no token
    lists; an array shows its first item)."""
    prefixes = (f"{f.arch}.", "general.", "tokenizer.ggml.")
    return {k: v for k, v in f.meta.items() if k.startswith(prefixes) and k not in _ARRAYS
            and not (isinstance(v, float) and not math.isfinite(v))}


def show_body(entry: PoolEntry, configs: dict[str, ModelConfig]) -> dict[str, Any]:
    """/api/show: Ollama's fields from models.toml and the GGUF header. ``template`` is the
    Jinja chat template; ``modelfile`` only describes (there is no /api/create)."""
    f, cfg, d = file_facts(entry, configs), entry.cfg, SamplingParams()
    own = cfg.chat_template or f.meta.get("tokenizer.chat_template")
    template = entry.served.template.source if entry.served else (own or CHATML)
    params: dict[str, Any] = {"num_ctx": cfg.context, "temperature": d.temperature,
                              "top_k": d.top_k, "top_p": d.top_p, "min_p": d.min_p}
    if cfg.max_tokens is not None:
        params["num_predict"] = cfg.max_tokens
    caps = ["completion"] + (["tools"] if own else []) + (
        ["thinking"] if splits(cfg.reasoning_format, template) else [])
    return {
        "modelfile": f"# {cfg.id}, served by edgeinfer from models.toml\nFROM {f.path or '?'}\n"
                     f'TEMPLATE """{template}"""\n'
                     + "".join(f"PARAMETER {k} {v}\n" for k, v in params.items()),
        "parameters": "\n".join(f"{k:<30} {v}" for k, v in params.items()),
        "template": template, "details": f.details(), "model_info": _model_info(f),
        "capabilities": caps, "modified_at": rfc3339(f.modified or None)}
