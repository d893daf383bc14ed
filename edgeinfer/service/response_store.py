"""Stored responses of the Responses API (``store: true``): one bounded SQLite file.

Where: ``<cache dir>/responses.sqlite3`` (``edgeinfer.models.source.cache_dir()``, which
honours ``$EDGEINFER_CACHE``).

What one row keeps: the response JSON, its input items (normalised, with ids), the whole
conversation (OpenAI-shaped chat messages, instructions left out) needed to continue it
with ``previous_response_id``, and its owner: the SHA-256 of the API key that created it
("" without one). A read or delete with another owner finds nothing, as if the row did
not exist. A second table maps the ids of its input and output items to it, for
``item_reference`` input items; those rows go with the response.

Bounds: at most ``MAX_ROWS`` (10 000) rows and ``MAX_STORE_BYTES`` (512 MiB) of JSON,
none older than ``MAX_AGE_DAYS`` (30 days); every write removes what is past a bound, oldest
first (a client repeating 2 MB conversations cannot fill the disk). A row whose JSON is over
``MAX_RECORD_BYTES`` (4 MiB) is not stored (logged), and the response is then not found.
Failure and blocking: see ``sqlite_store``.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from edgeinfer.service.sqlite_store import MAX_RECORD_BYTES, SqliteStore, kept

log = logging.getLogger("edgeinfer.service.responses")


@dataclass(frozen=True, slots=True)
class StoredResponse:
    id: str
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    conversation: list[dict[str, Any]]  # OpenAI chat messages, this response's output included


class ResponseStore(SqliteStore):
    """The stored responses (see the module docstring)."""

    file_name = "responses.sqlite3"
    schema = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL,
    response TEXT NOT NULL, input_items TEXT NOT NULL, conversation TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS responses_created ON responses (created);
CREATE TABLE IF NOT EXISTS response_items (
    owner TEXT NOT NULL, id TEXT NOT NULL, response_id TEXT NOT NULL,
    PRIMARY KEY (owner, id, response_id));
CREATE INDEX IF NOT EXISTS response_items_response ON response_items (response_id);
"""

    async def put(self, owner: str, record: StoredResponse) -> bool:
        """Store ``record`` for ``owner`` (replacing a row with its id); False if not stored."""
        return await self._run(self._put, owner, record, default=False)

    async def get(self, owner: str, response_id: str) -> StoredResponse | None:
        return await self._run(self._get, owner, response_id, default=None)

    async def item(self, owner: str, item_id: str) -> dict[str, Any] | None:
        """``owner``'s input or output item ``item_id`` of a stored response (the latest
        that holds it), for an ``item_reference``; None when no stored response has it."""
        return await self._run(self._item, owner, item_id, default=None)

    async def delete(self, owner: str, response_id: str) -> bool:
        """True if ``owner``'s response ``response_id`` existed and is now gone."""
        return await self._run(self._delete, owner, response_id, default=False)

    def _put(self, db: sqlite3.Connection, owner: str, r: StoredResponse) -> bool:
        fields = [json.dumps(v, ensure_ascii=False)
                  for v in (r.response, r.input_items, r.conversation)]
        size = sum(len(f) for f in fields)
        if size > MAX_RECORD_BYTES:
            log.warning("response %s not stored: %d bytes of JSON (limit %d)", r.id, size,
                        MAX_RECORD_BYTES)
            return False
        db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)",
                   (r.id, owner, time.time(), *fields))
        db.execute("DELETE FROM response_items WHERE response_id = ?", (r.id,))
        items = [*r.input_items, *r.response.get("output", [])]
        db.executemany("INSERT OR REPLACE INTO response_items VALUES (?, ?, ?)",
                       [(owner, it["id"], r.id) for it in items
                        if isinstance(it, dict) and isinstance(it.get("id"), str)])
        before = db.total_changes
        self.prune(db, "responses", "length(response) + length(input_items) + "
                   "length(conversation)")
        if db.total_changes != before:  # responses went: so do their items
            db.execute("DELETE FROM response_items WHERE response_id NOT IN "
                       "(SELECT id FROM responses)")
        return True

    def _item(self, db: sqlite3.Connection, owner: str, item_id: str
              ) -> dict[str, Any] | None:
        row = db.execute(  # the latest stored response that holds it
            "SELECT r.id FROM response_items i JOIN responses r ON r.id = i.response_id "
            "AND r.owner = i.owner WHERE i.owner = ? AND i.id = ? ORDER BY r.created DESC "
            "LIMIT 1", (owner, item_id)).fetchone()
        found = self._get(db, owner, row[0]) if row else None
        if found is None:
            return None
        items = [*found.input_items, *found.response.get("output", [])]
        return next((it for it in items if it.get("id") == item_id), None)

    def _get(self, db: sqlite3.Connection, owner: str, response_id: str
             ) -> StoredResponse | None:
        row = db.execute("SELECT response, input_items, conversation FROM responses "
                         "WHERE id = ? AND owner = ? AND created >= ?",
                         (response_id, owner, self.oldest_kept())).fetchone()
        if row is None:
            return None
        response, items, conversation = (json.loads(v) for v in row)
        return StoredResponse(response_id, response, items, conversation)

    def _delete(self, db: sqlite3.Connection, owner: str, response_id: str) -> bool:
        cur = db.execute("DELETE FROM responses WHERE id = ? AND owner = ?",
                         (response_id, owner))
        db.execute("DELETE FROM response_items WHERE response_id = ? AND owner = ?",
                   (response_id, owner))
        return cur.rowcount > 0


def kept_on(state: Any) -> ResponseStore:
    """The store kept on ``state`` (an application's state object), made on first use."""
    return kept(state, "response_store", ResponseStore)
