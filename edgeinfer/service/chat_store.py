"""Stored chat completions (``store: true`` on /v1/chat/completions): one bounded SQLite file.

Where: ``<cache dir>/chat_completions.sqlite3`` (``edgeinfer.models.source.cache_dir()``,
which honours ``$EDGEINFER_CACHE``).

What one row keeps: the completion as it was answered (a streamed one assembled whole),
with its ``metadata`` (also apart, for the list's filter); the request's messages, each with
an id (``<completion id>-<i>``); its model and creation time, for the list; and its owner,
the SHA-256 of the API key that created it ("" without one). Another owner finds nothing, as
if the row did not exist. A deleted completion loses all but its id and time, kept (until
pruned) as the cursor of a list whose page ended with it.

Bounds, failure and blocking as ``response_store`` (``sqlite_store``): 10 000 rows, 512 MiB
of JSON, 30 days; a completion whose JSON is over 4 MiB is not stored (logged).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from edgeinfer.service.sqlite_store import MAX_RECORD_BYTES, SqliteStore, kept

log = logging.getLogger("edgeinfer.service.chat_store")


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a list: the items and whether more follow."""

    data: list[dict[str, Any]]
    has_more: bool


@dataclass(frozen=True, slots=True)
class Query:
    """The list's filters and cursor: ``model`` and every ``metadata`` pair must match;
    ``after``: the id of the last item of the page before; ``order``: by creation."""

    model: str | None = None
    metadata: tuple[tuple[str, str], ...] = ()
    after: str | None = None
    limit: int = 20
    order: str = "asc"


class ChatStore(SqliteStore):
    """The stored chat completions (see the module docstring)."""

    file_name = "chat_completions.sqlite3"
    schema = """
CREATE TABLE IF NOT EXISTS completions (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL, model TEXT NOT NULL,
    metadata TEXT NOT NULL, completion TEXT NOT NULL, messages TEXT NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS completions_created ON completions (created);
"""

    async def put(self, owner: str, completion: dict[str, Any],
                  messages: list[dict[str, Any]]) -> bool:
        """Store ``completion`` (its ``id``, ``model`` and ``metadata`` inside) and the
        request's ``messages`` for ``owner``; False if it was not stored."""
        return await self._run(self._put, owner, completion, messages, default=False)

    async def get(self, owner: str, chat_id: str) -> dict[str, Any] | None:
        return await self._run(self._get, owner, chat_id, "completion", default=None)

    async def messages(self, owner: str, chat_id: str) -> list[dict[str, Any]] | None:
        return await self._run(self._get, owner, chat_id, "messages", default=None)

    async def update(self, owner: str, chat_id: str, metadata: dict[str, str]
                     ) -> dict[str, Any] | None:
        """The completion with ``metadata`` in place of its own (None: not found)."""
        return await self._run(self._update, owner, chat_id, metadata, default=None)

    async def delete(self, owner: str, chat_id: str) -> bool:
        return await self._run(self._delete, owner, chat_id, default=False)

    async def page(self, owner: str, query: Query) -> Page | None:
        """One page of ``owner``'s completions (None: ``query.after`` names none of them)."""
        return await self._run(self._list, owner, query, default=Page([], False))

    def _put(self, db: sqlite3.Connection, owner: str, completion: dict[str, Any],
             messages: list[dict[str, Any]]) -> bool:
        cid = str(completion["id"])
        numbered = [{"id": f"{cid}-{i}", **m} for i, m in enumerate(messages)]
        fields = [json.dumps(v, ensure_ascii=False) for v in (completion, numbered)]
        size = sum(len(f) for f in fields)
        if size > MAX_RECORD_BYTES:
            log.warning("chat completion %s not stored: %d bytes of JSON (limit %d)", cid,
                        size, MAX_RECORD_BYTES)
            return False
        created = completion.get("created")  # listed in the order they were created
        created = float(created) if isinstance(created, int | float) else time.time()
        db.execute("INSERT OR REPLACE INTO completions VALUES (?, ?, ?, ?, ?, ?, ?, 0)",
                   (cid, owner, created, str(completion.get("model", "")),
                    json.dumps(completion.get("metadata") or {}, ensure_ascii=False), *fields))
        self.prune(db, "completions", "length(completion) + length(messages)")
        return True

    def _get(self, db: sqlite3.Connection, owner: str, chat_id: str, column: str) -> Any:
        assert column in ("completion", "messages")
        row = db.execute(f"SELECT {column} FROM completions WHERE id = ? AND owner = ? AND "
                         "created >= ? AND NOT deleted", (chat_id, owner, self.oldest_kept())
                         ).fetchone()
        return None if row is None else json.loads(row[0])

    def _update(self, db: sqlite3.Connection, owner: str, chat_id: str,
                metadata: dict[str, str]) -> dict[str, Any] | None:
        found = self._get(db, owner, chat_id, "completion")
        if found is None:
            return None
        found = {**found, "metadata": metadata}
        db.execute("UPDATE completions SET completion = ?, metadata = ? WHERE id = ? AND owner = ?",
                   (json.dumps(found, ensure_ascii=False),
                    json.dumps(metadata, ensure_ascii=False), chat_id, owner))
        return dict(found)

    def _delete(self, db: sqlite3.Connection, owner: str, chat_id: str) -> bool:
        """Its content goes; its id and time stay (until pruned) as the cursor of a list
        whose page ended with it (a client deleting what it lists, page by page)."""
        return db.execute("UPDATE completions SET deleted = 1, completion = '{}', messages = '[]', "
                          "metadata = '{}' WHERE id = ? AND owner = ? AND NOT deleted",
                          (chat_id, owner)).rowcount > 0

    def _list(self, db: sqlite3.Connection, owner: str, q: Query) -> Page | None:
        desc = q.order == "desc"
        where, args = "owner = ? AND created >= ?", [owner, self.oldest_kept()]
        if q.model is not None:
            where, args = where + " AND model = ?", [*args, q.model]
        if q.after is not None:
            cursor = db.execute(f"SELECT created, rowid FROM completions WHERE {where} AND id = ?",
                                (*args, q.after)).fetchone()
            if cursor is None:
                return None
            where += f" AND (created, rowid) {'<' if desc else '>'} (?, ?)"
            args = [*args, *cursor]
        way = "DESC" if desc else "ASC"
        rows = db.execute(f"SELECT rowid, metadata FROM completions WHERE {where} AND NOT deleted "
                          f"ORDER BY created {way}, rowid {way}", args)
        found: list[int] = []
        for rowid, text in rows:  # metadata pairs matched here, row by row, in order
            meta = json.loads(text)
            if all(meta.get(k) == v for k, v in q.metadata):
                found.append(rowid)
                if len(found) > q.limit:
                    break
        page = found[:q.limit]
        marks = ",".join("?" * len(page))
        by_row = dict(db.execute(f"SELECT rowid, completion FROM completions WHERE rowid IN "
                                 f"({marks})", page).fetchall()) if page else {}
        return Page([json.loads(by_row[r]) for r in page], len(found) > q.limit)


def chats_kept_on(state: Any) -> ChatStore:
    """The chat store kept on ``state`` (an application's state object), made on first use."""
    return kept(state, "chat_store", ChatStore)
