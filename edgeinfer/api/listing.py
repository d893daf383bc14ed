"""Pages of a list (stored responses' input items, stored chat completions and their
messages), as OpenAI's list endpoints take ``limit`` / ``order`` / ``after`` and answer."""

from __future__ import annotations

from typing import Any

from edgeinfer.errors import InvalidRequest


def page_query(query: Any, default_order: str = "desc") -> tuple[int, str, str | None]:
    """A list's ``limit`` (1-100, default 20), ``order`` (asc or desc) and ``after`` (an
    item id), as OpenAI takes them."""
    limit, after = query.get("limit", "20"), query.get("after")
    order = query.get("order", default_order)
    if not (limit.isascii() and limit.isdigit()) or not 1 <= int(limit) <= 100:
        raise InvalidRequest("'limit' must be an integer between 1 and 100", param="limit")
    if order not in ("asc", "desc"):
        raise InvalidRequest("'order' must be 'asc' or 'desc'", param="order")
    return int(limit), order, after


def list_body(page: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """One page of a list, as OpenAI answers it."""
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": has_more}


def input_items_page(items: list[dict[str, Any]], query: Any,
                     default_order: str = "desc") -> dict[str, Any]:
    """One page of items (``page_query``), as OpenAI lists a response's input items (or a
    chat completion's messages)."""
    limit, order, after = page_query(query, default_order)
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [i["id"] for i in ordered]
        if after not in ids:
            raise InvalidRequest(f"'after' names no item of this list: {after!r}",
                                 param="after")
        ordered = ordered[ids.index(after) + 1:]
    page = ordered[:limit]
    return list_body(page, len(ordered) > len(page))
