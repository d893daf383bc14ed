"""The model list in Anthropic's shape, for clients that send ``anthropic-version``.

``GET /v1/models`` and ``GET /v1/models/{id}`` serve both dialects: the ``anthropic``
SDK's ``models.list()`` / ``models.retrieve()`` send the ``anthropic-version`` header and
get ``{"type": "model", "id", "display_name", "created_at", "lifecycle"}`` objects in a page of
``{"data", "has_more", "first_id", "last_id"}`` (``limit`` 1-1000, default 20;
``after_id`` / ``before_id``), and errors in Anthropic's shape; every other client gets
OpenAI's.
"""

from __future__ import annotations

import datetime
from typing import Any

from starlette.requests import Request

from edgeinfer.errors import InvalidRequest
from edgeinfer.models.pool import PoolEntry

HEADER = "anthropic-version"


def wanted(request: Request) -> bool:
    """Whether the client speaks Anthropic's API (its SDK sends ``anthropic-version``)."""
    return HEADER in request.headers


def model_object(entry: PoolEntry) -> dict[str, Any]:
    """One model: ``lifecycle`` is required by the SDK's type; ``max_input_tokens`` (the
    context's cells) is known once the model is loaded."""
    out: dict[str, Any] = {
        "type": "model", "id": entry.cfg.id, "display_name": entry.cfg.id,
        "created_at": datetime.datetime.fromtimestamp(entry.created, datetime.UTC)
        .strftime("%Y-%m-%dT%H:%M:%SZ"), "lifecycle": "active"}
    if entry.served is not None:
        out["max_input_tokens"] = entry.served.runtime.info.n_ctx
    return out


def models_page(entries: list[PoolEntry], query: Any) -> dict[str, Any]:
    """One page of models, as Anthropic's ``GET /v1/models`` lists them."""
    limit = query.get("limit", "20")
    if not (limit.isascii() and limit.isdigit()) or not 1 <= int(limit) <= 1000:
        raise InvalidRequest("'limit' must be an integer between 1 and 1000", param="limit")
    ids = [e.cfg.id for e in entries]
    start, end = 0, len(entries)
    for name in ("after_id", "before_id"):
        if (at := query.get(name)) is not None and at not in ids:
            raise InvalidRequest(f"'{name}' names no model: {at!r}", param=name)
    if "before_id" in query:
        end = ids.index(query["before_id"])
        start = max(0, end - int(limit))
    elif "after_id" in query:
        start = ids.index(query["after_id"]) + 1
    page = [model_object(e) for e in entries[start:end][:int(limit)]]
    more = start > 0 if "before_id" in query else start + len(page) < len(entries)
    return {"data": page, "has_more": more, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None}
