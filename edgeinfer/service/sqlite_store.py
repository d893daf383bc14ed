"""One bounded SQLite file of stored API objects (the base of ``response_store`` and
``chat_store``).

Bounds: at most ``max_rows`` rows and ``max_bytes`` of JSON, none older than ``max_age_s``;
every write removes what is past a bound, oldest first (``prune``). Failure: a corrupt or
unreadable database never fails a request. A database SQLite calls corrupt (or not a
database) is logged, moved aside (``<file>.corrupt``) and recreated empty; any other error
(locked, disk, permissions) is logged and the operation gives its default ("not found",
nothing done). The file is created readable by its owner only (it holds conversations).

Blocking: every operation awaits its SQLite work in a thread (``asyncio.to_thread``), one
at a time, each on its own short connection.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from edgeinfer.models.source import cache_dir

log = logging.getLogger("edgeinfer.service.store")

MAX_ROWS = 10_000
MAX_AGE_DAYS = 30
MAX_RECORD_BYTES = 4 << 20
MAX_STORE_BYTES = 512 << 20
_CORRUPT = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB
T = TypeVar("T")


class SqliteStore:
    """A store in ``path`` (None: ``cache_dir() / file_name``, found on first use) with the
    tables of ``schema``; ``max_rows``, ``max_age_s`` and ``max_bytes`` are the bounds
    (tests make them small)."""

    file_name = "store.sqlite3"
    schema = ""

    def __init__(self, path: Path | None = None, *, max_rows: int = MAX_ROWS,
                 max_age_s: float = MAX_AGE_DAYS * 86_400.0,
                 max_bytes: int = MAX_STORE_BYTES) -> None:
        self._path = path
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = cache_dir() / self.file_name
        return self._path

    async def _run(self, fn: Callable[..., T], *args: Any, default: T) -> T:
        return await asyncio.to_thread(self._guarded, fn, args, default)

    def _guarded(self, fn: Callable[..., T], args: tuple[Any, ...], default: T) -> T:
        """``fn(connection, *args)``; on a corrupt database, recreate it and try once more;
        on any other error, log it and give ``default``."""
        with self._lock:
            for attempt in (1, 2):
                try:
                    with self._connect() as db:
                        return fn(db, *args)
                except sqlite3.DatabaseError as exc:
                    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # the primary code
                    if attempt == 2 or code not in _CORRUPT or not self._set_aside(exc):
                        log.warning("store %s: %s", self._path, exc)
                        return default
                except (OSError, ValueError) as exc:
                    log.warning("store %s unusable: %s", self._path, exc)
                    return default
        return default

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        if not self.path.exists():
            self.path.touch(mode=0o600)  # conversations: readable by this user only
        db = sqlite3.connect(self.path, timeout=5.0)
        try:
            db.executescript(self.schema)
            with db:  # one transaction, committed on success
                yield db
        finally:
            db.close()

    def _set_aside(self, exc: Exception) -> bool:
        """Move a corrupt database aside so the next connection starts an empty one."""
        path = self.path
        log.warning("store %s is corrupt (%s): moved to %s.corrupt and recreated; "
                    "what it held is gone", path, exc, path.name)
        try:
            path.replace(path.with_name(path.name + ".corrupt"))
            path.with_name(path.name + "-journal").unlink(missing_ok=True)
        except OSError as err:
            log.warning("store %s could not be moved aside: %s", path, err)
            return False
        return True

    def oldest_kept(self) -> float:
        """The creation time (epoch seconds) of the oldest row still within ``max_age_s``."""
        return time.time() - self.max_age_s

    def prune(self, db: sqlite3.Connection, table: str, size: str) -> None:
        """Remove ``table``'s rows past the bounds, oldest first (``size``: the SQL of a
        row's bytes). ``table`` and ``size`` are this module's constants, never input."""
        db.execute(f"DELETE FROM {table} WHERE created < ?", (self.oldest_kept(),))
        db.execute(f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} "
                   "ORDER BY created DESC, rowid DESC LIMIT -1 OFFSET ?)", (self.max_rows,))
        db.execute(f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM (SELECT rowid, "
                   f"SUM({size}) OVER (ORDER BY created DESC, rowid DESC) AS total FROM "
                   f"{table}) WHERE total > ?)", (self.max_bytes,))


S = TypeVar("S", bound=SqliteStore)


def kept(state: Any, name: str, kind: type[S]) -> S:
    """The ``kind`` store kept on ``state`` (an application's state object) as ``name``,
    made on first use."""
    store = getattr(state, name, None)
    if not isinstance(store, kind):
        store = kind()
        setattr(state, name, store)
    return store
