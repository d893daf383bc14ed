"""Stored responses of the Responses API (``store: true``): one SQLite file, bounded.

Where: ``<cache dir>/responses.sqlite3`` (``edgeinfer.models.source.cache_dir()``, which
honours ``$EDGEINFER_CACHE``).

What one row keeps: the response JSON, its input items (normalised, with ids), the whole
conversation (OpenAI-shaped chat messages, instructions left out) needed to continue it
with ``previous_response_id``, and its owner: the SHA-256 of the API key that created it
("" without one). A read or delete with another owner finds nothing, as if the row did
not exist.

Bounds: at most ``MAX_RESPONSES`` (10 000) rows and ``MAX_STORE_BYTES`` (512 MiB) of JSON,
none older than ``MAX_AGE_DAYS`` (30 days); every write removes what is past a bound, oldest
first (a client repeating 2 MB conversations cannot fill the disk). A row whose JSON is over
``MAX_RECORD_BYTES`` (4 MiB) is not stored (logged), and the response is then not found.

Failure: a corrupt or unreadable database never fails a request. A database SQLite calls
corrupt (or not a database) is logged, moved aside (``responses.sqlite3.corrupt``) and
recreated empty, so what it held is "not found"; any other error (locked, disk, permissions)
is logged and the operation answers "not found" / does nothing.

The file is created readable by its owner only (it holds conversations).

Blocking: every method of ``ResponseStore`` awaits its SQLite work in a thread
(``asyncio.to_thread``), one operation at a time, each on its own short connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from edgeinfer.models.source import cache_dir

log = logging.getLogger("edgeinfer.service.responses")

FILE_NAME = "responses.sqlite3"
MAX_RESPONSES = 10_000
MAX_AGE_DAYS = 30
MAX_RECORD_BYTES = 4 << 20
MAX_STORE_BYTES = 512 << 20
_CORRUPT = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB
_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL,
    response TEXT NOT NULL, input_items TEXT NOT NULL, conversation TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS responses_created ON responses (created);
"""
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    conversation: list[dict[str, Any]]  # OpenAI chat messages, this response's output included


class ResponseStore:
    """The stored responses; ``path`` None means ``cache_dir() / FILE_NAME``, found on first
    use. ``max_responses``, ``max_age_s`` and ``max_bytes`` are the bounds (tests make
    them small)."""

    def __init__(self, path: Path | None = None, *, max_responses: int = MAX_RESPONSES,
                 max_age_s: float = MAX_AGE_DAYS * 86_400.0,
                 max_bytes: int = MAX_STORE_BYTES) -> None:
        self._path = path
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._lock = threading.Lock()

    async def put(self, owner: str, record: StoredResponse) -> bool:
        """Store ``record`` for ``owner`` (replacing a row with its id); False if not stored."""
        return await self._run(self._put, owner, record, default=False)

    async def get(self, owner: str, response_id: str) -> StoredResponse | None:
        return await self._run(self._get, owner, response_id, default=None)

    async def delete(self, owner: str, response_id: str) -> bool:
        """True if ``owner``'s response ``response_id`` existed and is now gone."""
        return await self._run(self._delete, owner, response_id, default=False)

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = cache_dir() / FILE_NAME
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
                        log.warning("response store %s: %s", self._path, exc)
                        return default
                except (OSError, ValueError) as exc:
                    log.warning("response store %s unusable: %s", self._path, exc)
                    return default
        return default

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        if not self.path.exists():
            self.path.touch(mode=0o600)  # conversations: readable by this user only
        db = sqlite3.connect(self.path, timeout=5.0)
        try:
            db.executescript(_SCHEMA)
            with db:  # one transaction, committed on success
                yield db
        finally:
            db.close()

    def _set_aside(self, exc: Exception) -> bool:
        """Move a corrupt database aside so the next connection starts an empty one."""
        path = self.path
        log.warning("response store %s is corrupt (%s): moved to %s.corrupt and recreated; "
                    "the responses it held are gone", path, exc, path.name)
        try:
            path.replace(path.with_name(path.name + ".corrupt"))
            path.with_name(path.name + "-journal").unlink(missing_ok=True)
        except OSError as err:
            log.warning("response store %s could not be moved aside: %s", path, err)
            return False
        return True

    def _put(self, db: sqlite3.Connection, owner: str, r: StoredResponse) -> bool:
        fields = [json.dumps(v, ensure_ascii=False)
                  for v in (r.response, r.input_items, r.conversation)]
        size = sum(len(f) for f in fields)
        if size > MAX_RECORD_BYTES:
            log.warning("response %s not stored: %d bytes of JSON (limit %d)", r.id, size,
                        MAX_RECORD_BYTES)
            return False
        now = time.time()
        db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)",
                   (r.id, owner, now, *fields))
        db.execute("DELETE FROM responses WHERE created < ?", (now - self.max_age_s,))
        db.execute("DELETE FROM responses WHERE rowid IN (SELECT rowid FROM responses "
                   "ORDER BY created DESC, rowid DESC LIMIT -1 OFFSET ?)", (self.max_responses,))
        db.execute("DELETE FROM responses WHERE rowid IN (SELECT rowid FROM (SELECT rowid, "
                   "SUM(length(response) + length(input_items) + length(conversation)) OVER "
                   "(ORDER BY created DESC, rowid DESC) AS total FROM responses) "
                   "WHERE total > ?)", (self.max_bytes,))
        return True

    def _get(self, db: sqlite3.Connection, owner: str, response_id: str
             ) -> StoredResponse | None:
        row = db.execute("SELECT response, input_items, conversation FROM responses "
                         "WHERE id = ? AND owner = ? AND created >= ?",
                         (response_id, owner, time.time() - self.max_age_s)).fetchone()
        if row is None:
            return None
        response, items, conversation = (json.loads(v) for v in row)
        return StoredResponse(response_id, response, items, conversation)

    def _delete(self, db: sqlite3.Connection, owner: str, response_id: str) -> bool:
        cur = db.execute("DELETE FROM responses WHERE id = ? AND owner = ?",
                         (response_id, owner))
        return cur.rowcount > 0


def kept_on(state: Any) -> ResponseStore:
    """The store kept on ``state`` (an application's state object), made on first use."""
    store: ResponseStore | None = getattr(state, "response_store", None)
    if store is None:
        store = ResponseStore()
        state.response_store = store
    return store
