"""A loaded model file's stamp, to tell whether the file was written to while loaded.

llama.cpp maps a model's weights from its file: their pages are the file's. A file
truncated while loaded kills the process with SIGBUS at the next decode that reads past
its new end, and one overwritten in place (a download into the same path) makes the model
answer garbage. A file deleted, or replaced by a rename, leaves the mapped one intact.
"""

from __future__ import annotations

from pathlib import Path

Stamp = tuple[int, int, int, int]  # device, inode, size, modification time (ns)


def stamp(path: Path) -> Stamp | None:
    """``path``'s stamp (None: it cannot be read)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def written_in_place(path: Path, loaded: Stamp | None) -> bool:
    """Whether the file ``loaded`` stamped is still at ``path`` (the same device and
    inode) with another size or modification time."""
    now = stamp(path)
    return loaded is not None and now is not None and now[:2] == loaded[:2] and now != loaded
