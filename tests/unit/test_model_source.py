"""Files made in the cache folder (a quantized copy, an assembled model) are written under a
name of this process alone and renamed into place: two servers sharing the folder never
write the same file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgeinfer.models.source import _partial


def test_a_made_file_is_renamed_into_place_from_a_name_of_this_process(tmp_path: Path) -> None:
    out = tmp_path / "m.q8_0.gguf"
    stale = tmp_path / f".{out.name}.999999999.part"  # a process that died writing
    stale.write_bytes(b"half")
    other = tmp_path / f".{out.name}.{os.getppid()}.part"  # a live one still writing
    other.write_bytes(b"busy")
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
