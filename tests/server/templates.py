"""Real chat templates, from the llama.cpp source vendored in the pinned llama-cpp-python
sdist (models/templates/*.jinja): fetched with pip once, kept in the user's cache
($EDGEINFER_CACHE or ~/.cache/edgeinfer), never copied into the repository."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

SDIST_TEMPLATES = "vendor/llama.cpp/models/templates/"


def templates_dir() -> Path:
    """The folder of the real templates (downloaded and extracted on first use)."""
    pinned = version("llama-cpp-python")
    cache = Path(os.environ.get("EDGEINFER_CACHE") or Path.home() / ".cache" / "edgeinfer")
    out = cache / f"templates-{pinned}"
    if any(out.glob("*.jinja")):
        return out
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", f"llama-cpp-python=={pinned}", "-d", tmp],
                       check=True, timeout=600)
        (sdist,) = Path(tmp).glob("*.tar.gz")
        out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist) as tar:
            for m in tar.getmembers():
                at = m.name.find(SDIST_TEMPLATES)
                if at != -1 and m.isfile() and m.name.endswith(".jinja"):
                    m.name = Path(m.name).name
                    tar.extract(m, out, filter="data")
    return out


def template(name: str) -> Path:
    path = templates_dir() / name
    assert path.is_file(), f"no template {name} in the llama.cpp sources"
    return path
