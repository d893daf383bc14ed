"""The files a loaded model was mapped from, to tell whether one was written to since.

llama.cpp maps a model's weights from its file (and a draft model's from its own): their
pages are the file's. A file truncated while loaded kills the process with SIGBUS at the
next decode that reads past its new end, and one overwritten in place (a download into the
same path) makes the model answer garbage. A file deleted, or replaced by a rename, leaves
the mapped one intact.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

Stamp = tuple[int, int, int, int]  # device, inode, size, modification time (ns)


def stamp(path: Path) -> Stamp | None:
    """``path``'s stamp (None: it cannot be read)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


@dataclass(slots=True)
class Loaded:
    """A loaded model's files, each with its stamp when the load began."""

    files: tuple[tuple[Path, Stamp | None], ...]
    reported: bool = False  # a change was found and logged

    @classmethod
    def of(cls, *paths: Path) -> Loaded:
        return cls(tuple((p, stamp(p)) for p in paths))

    def written(self) -> Path | None:
        """The first file still at its path (the same device and inode) with another size
        or modification time (None: none). Blocking: a stat of each."""
        for path, then in self.files:
            now = stamp(path)
            if then is not None and now is not None and now[:2] == then[:2] and now != then:
                return path
        return None
