"""models.stamp: which of a loaded model's files (its own, its draft model's) was written
to in place since the load; a file deleted or replaced by a rename is not (the mapping
keeps the old one)."""

from __future__ import annotations

import os
from pathlib import Path

from edgeinfer.models.stamp import Loaded


def test_a_file_written_in_place_is_found_among_the_loaded_ones(tmp_path: Path) -> None:
    model, draft = tmp_path / "model.gguf", tmp_path / "draft.gguf"
    model.write_bytes(b"m" * 100)
    draft.write_bytes(b"d" * 100)
    loaded = Loaded.of(model, draft)
    assert loaded.written() is None
    with draft.open("r+b") as f:  # the draft model's file, truncated in place
        f.truncate(10)
    assert loaded.written() == draft
    again = Loaded.of(model, draft)
    os.utime(model, ns=(1, 1))  # the same size, another time: written (a same-size copy)
    assert again.written() == model


def test_a_file_deleted_or_replaced_by_a_rename_is_not_written(tmp_path: Path) -> None:
    model, new = tmp_path / "model.gguf", tmp_path / "new.gguf"
    model.write_bytes(b"m" * 100)
    loaded = Loaded.of(model)
    new.write_bytes(b"n" * 50)
    new.replace(model)  # another inode at the path: the mapped file is intact
    assert loaded.written() is None
    model.unlink()
    assert loaded.written() is None
    assert Loaded.of(tmp_path / "absent.gguf").written() is None
