"""Stored chat completions, as OpenAI's API has them (``store: true`` on
/v1/chat/completions; ``service.chat_store`` keeps them):

- ``GET /v1/chat/completions``: the list, oldest first (``order`` asc, the default, or
  desc), ``limit`` 1-100 (20), ``after`` a completion id, filtered by ``model`` and
  ``metadata[KEY]=VALUE`` pairs (all must match);
- ``GET /v1/chat/completions/{id}``: one completion, with its ``metadata``;
- ``POST /v1/chat/completions/{id}`` ``{"metadata": {...}}``: its metadata replaced;
- ``DELETE /v1/chat/completions/{id}``: ``{"object": "chat.completion.deleted", ...}``;
- ``GET /v1/chat/completions/{id}/messages``: the request's messages, each with an id
  (same ``limit`` / ``order`` / ``after``).

Each is readable only with the API key that stored it (another key: 404, as if it did not
exist). What is stored: the completion as answered (a streamed one assembled whole, when
the stream ran to its end).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeinfer.api import fields
from edgeinfer.api.body import read_json
from edgeinfer.api.fields import Body
from edgeinfer.api.guard import key_owner
from edgeinfer.api.listing import input_items_page, list_body, page_query
from edgeinfer.api.respond import Save
from edgeinfer.errors import InvalidRequest, NotFound
from edgeinfer.service.chat_store import Query, chats_kept_on


def saver(request: Request, body: Any) -> Save | None:
    """What stores a chat completion's answer, when its ``body`` asks for it (``store``)."""
    if not isinstance(body, dict) or body.get("store") is not True:
        return None
    owner, meta = key_owner(request), fields.metadata(Body(body, set(body)))
    msgs = [m for m in body.get("messages", []) if isinstance(m, dict)]

    async def save(completion: dict[str, Any]) -> None:
        await chats_kept_on(request.app.state).put(owner, {**completion, "metadata": meta},
                                                   msgs)
    return save


def _query(params: Any) -> Query:
    limit, order, after = page_query(params, "asc")
    pairs = tuple((k[len("metadata["):-1], v) for k, v in params.multi_items()
                  if k.startswith("metadata[") and k.endswith("]"))
    return Query(params.get("model"), pairs, after, limit, order)


async def list_chats(request: Request) -> Response:
    page = await chats_kept_on(request.app.state).page(key_owner(request),
                                                        _query(request.query_params))
    if page is None:
        raise InvalidRequest("'after' names no stored chat completion", param="after")
    return JSONResponse(list_body(page.data, page.has_more))


def _missing(chat_id: str) -> NotFound:
    return NotFound(f"No chat completion found with id '{chat_id}'.", param="completion_id",
                    code="not_found")


async def stored_chat(request: Request) -> Response:
    """GET, POST (new metadata) or DELETE one stored chat completion."""
    cid, owner = request.path_params["completion_id"], key_owner(request)
    store = chats_kept_on(request.app.state)
    if request.method == "DELETE":
        if not await store.delete(owner, cid):
            raise _missing(cid)
        return JSONResponse({"object": "chat.completion.deleted", "id": cid, "deleted": True})
    if request.method == "POST":
        body = await read_json(request)
        b = Body(body, {"metadata"})
        if not isinstance(body, dict) or "metadata" not in body:
            raise InvalidRequest("'metadata' is required", param="metadata")
        found = await store.update(owner, cid, fields.metadata(b))
    else:
        found = await store.get(owner, cid)
    if found is None:
        raise _missing(cid)
    return JSONResponse(found)


async def stored_messages(request: Request) -> Response:
    cid = request.path_params["completion_id"]
    found = await chats_kept_on(request.app.state).messages(key_owner(request), cid)
    if found is None:
        raise _missing(cid)
    return JSONResponse(input_items_page(found, request.query_params, default_order="asc"))


ROUTES: list[Route] = [
    Route("/v1/chat/completions", list_chats, methods=["GET"]),
    Route("/v1/chat/completions/{completion_id}/messages", stored_messages, methods=["GET"]),
    Route("/v1/chat/completions/{completion_id}", stored_chat,
          methods=["GET", "POST", "DELETE"]),
]

_ID = [{"name": "completion_id", "in": "path", "required": True, "schema": {"type": "string"}}]


def _op(summary: str) -> dict[str, Any]:
    return {"summary": summary, "parameters": _ID, "responses": {
        "200": {"description": summary, "content": {"application/json": {"schema": {
            "type": "object"}}}},
        "404": {"description": "no such stored chat completion (or another API key's)"}}}


LIST_OPENAPI: dict[str, Any] = {**_op(
    "Stored chat completions (store: true): ?model, metadata[KEY], after, limit, order"),
    "parameters": []}
OPENAPI_PATHS: dict[str, Any] = {
    "/v1/chat/completions/{completion_id}": {
        "get": _op("A stored chat completion"),
        "post": {**_op("Replace a stored chat completion's metadata"), "requestBody": {
            "content": {"application/json": {"schema": {"type": "object", "properties": {
                "metadata": {"type": "object"}}, "required": ["metadata"]}}}}},
        "delete": _op("Delete a stored chat completion")},
    "/v1/chat/completions/{completion_id}/messages": {
        "get": _op("A stored chat completion's messages: ?after, limit, order")},
}
