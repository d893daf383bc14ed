"""Partial files: what a writer writes before renaming it into place.

One rule for every file written beside others in a shared cache folder (the disk tier's
prefix states, quantized and assembled models): each writer names its partial file by host,
process and a random part, because servers share a folder from other containers too, where
process ids repeat (one name for all let one writer truncate what another was writing, and
a process-id check took a live writer in another container for a dead one); and a partial
file untouched for ``STALE_SECONDS`` was left by a writer that died (``kill -9``, power
loss) and is removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from pathlib import Path

log = logging.getLogger("edgeinfer.models")

STALE_SECONDS = 3600.0  # a partial file untouched this long: its writer is gone


def partial_name(final: Path, suffix: str) -> Path:
    """The partial file of this writer alone for ``final``: ``.NAME.HOST-PID-RANDOM.SUFFIX``
    beside it (hidden, so listings and globs of finished files pass it over)."""
    tag = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return final.with_name(f".{final.name}.{tag}.{suffix}")


def remove_stale(folder: Path, pattern: str, max_age: float = STALE_SECONDS) -> int:
    """Remove the files of ``folder`` matching ``pattern`` untouched for ``max_age``
    seconds (their writers died); the number removed. A folder that is not there, or a
    file another writer renames or removes meanwhile, is no error."""
    removed = 0
    now = time.time()
    for old in folder.glob(pattern) if folder.is_dir() else []:
        with contextlib.suppress(OSError):
            if now - old.stat().st_mtime > max_age:
                old.unlink()
                removed += 1
                log.info("removed %s, a partial file left by a writer that stopped", old.name)
    return removed
