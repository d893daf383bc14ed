"""Files made in the cache folder (a quantized copy, an assembled model) are written under a
name of this writer alone and renamed into place: servers sharing the folder never write
the same file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from edgeinfer.errors import ModelLoadError
from edgeinfer.models.source import _partial


def test_a_made_file_is_renamed_into_place_from_a_name_of_its_own(tmp_path: Path) -> None:
    out = tmp_path / "m.q8_0.gguf"
    stale = tmp_path / f".{out.name}.host-1-abcd.part"  # a writer that died an hour ago
    stale.write_bytes(b"half")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    other = tmp_path / f".{out.name}.host-1-efgh.part"  # one still writing (same pid: a
    other.write_bytes(b"busy")  # process of another container)
    with _partial(out) as tmp:
        assert str(os.getpid()) in tmp.name and tmp != other
        tmp.write_bytes(b"GGUF whole")
        assert not out.exists()
    assert out.read_bytes() == b"GGUF whole"
    assert not stale.exists() and other.read_bytes() == b"busy"


def test_a_failed_write_leaves_neither_file(tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    with pytest.raises(RuntimeError), _partial(out) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("quantizer failed")
    assert list(tmp_path.iterdir()) == []


def test_a_cache_folder_that_is_not_there_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="EDGEINFER_CACHE"), _partial(tmp_path / "no" / "m"):
        pass


def test_a_model_path_that_is_no_regular_file_is_named_so(tmp_path: Path) -> None:
    from dataclasses import replace

    from edgeinfer.config import load_config
    from edgeinfer.models.source import resolve_model_path
    fifo, folder = tmp_path / "pipe.gguf", tmp_path / "folder.gguf"
    os.mkfifo(fifo)
    folder.mkdir()
    base = load_config().models[0]
    for path, said in ((fifo, "not a regular file"), (folder, "not a regular file"),
                       (tmp_path / "gone.gguf", "file not found")):
        with pytest.raises(ModelLoadError, match=said):
            resolve_model_path(replace(base, path=path, source=None))
