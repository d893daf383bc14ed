"""The Responses API's wire shapes from the service's events: the response object, its
output items and the streamed event sequence.

One ``OutputBuilder`` turns events into output items for both forms, so a streamed and a
whole response hold the same items. Streamed, every event has ``type`` and a
``sequence_number`` counting up from 0:

    response.created, response.in_progress,
    per output item: response.output_item.added,
      message: response.content_part.added, response.output_text.delta ...,
               response.output_text.done, response.content_part.done
      function call: response.function_call_arguments.delta ..., ...arguments.done
    response.output_item.done; then response.completed or response.incomplete
    (finish "length": incomplete_details.reason "max_output_tokens").

A generation error is an ``error`` event, then ``response.failed``. Whitespace before a
tool call is dropped (no message item for it); a response with no item at all gets one
empty message. Reasoning deltas are not rendered (no reasoning output yet).
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.api.errors import shape
from edgeinfer.api.openai_render import HeldLogprobs, token_entries
from edgeinfer.engine.logprobs import TokenLogprob
from edgeinfer.errors import APIError, Overloaded
from edgeinfer.service.events import (
    ErrorEvent,
    Event,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UsageReport,
)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(slots=True)
class ResponseMeta:
    """What every rendering of one response repeats: its id, time, model and the request
    fields a response object echoes (instructions, tools, text, ...)."""

    model: str
    echo: dict[str, Any]
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    piece: Callable[[int], bytes] | None = None  # set: the output text's logprobs are asked

    @property
    def namespaces(self) -> dict[str, str]:
        """The namespace of each function of a ``namespace`` tool, by the function's name."""
        return {f["name"]: t["name"] for t in self.echo.get("tools") or ()
                if t["type"] == "namespace" for f in t["tools"]}


def usage_body(u: UsageReport) -> dict[str, Any]:
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.total_tokens}


def response_body(meta: ResponseMeta, status: str, output: list[dict[str, Any]],
                  usage: UsageReport | None = None, *, error: APIError | None = None,
                  incomplete: str | None = None) -> dict[str, Any]:
    """The response object (``status``: in_progress, completed, incomplete or failed)."""
    return {
        "id": meta.id, "object": "response", "created_at": meta.created_at, "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "model": meta.model, "output": output,
        "error": None if error is None else {
            "code": "rate_limit_exceeded" if isinstance(error, Overloaded) else "server_error",
            "message": error.message},
        "incomplete_details": None if incomplete is None else {"reason": incomplete},
        "usage": None if usage is None else usage_body(usage),
        **meta.echo,
    }


def _part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


class OutputBuilder:
    """Output items from the events of one generation (one choice), and the stream events
    that build them (dicts with ``type``, without ``sequence_number``)."""

    def __init__(self, piece: Callable[[int], bytes] | None = None,
                 namespaces: dict[str, str] | None = None) -> None:
        self.items: list[dict[str, Any]] = []
        self.namespaces = namespaces or {}  # a call's item names its function's namespace
        self.open: dict[str, Any] | None = None  # the item being written
        self.pending = ""  # whitespace not yet given to a message
        self.text: list[str] = []  # the open message's text so far
        # set: token logprobs go with the text they wrote
        self.held = HeldLogprobs(piece) if piece is not None else None
        self.lps: list[dict[str, Any]] = []  # the open message's (or pending text's)
        self.finish = ""
        self.usage: UsageReport | None = None

    @property
    def index(self) -> int:
        return len(self.items) - 1

    def feed(self, e: Event) -> list[dict[str, Any]]:
        if isinstance(e, TextDelta):
            return self._text(e.text, e.logprob)
        if isinstance(e, ReasoningDelta):
            return self._reasoning(e.text)
        if isinstance(e, ToolCallDelta):
            return self._call(e)
        if isinstance(e, Finish):
            self.finish = e.reason
            out = self._last_logprobs(e.stopped) + self._close()
            if not self.items:
                out = self._open_message() + self._text(self.pending, None) + self._close()
            return out
        if isinstance(e, UsageReport):
            self.usage = e
        return []

    def _open_message(self) -> list[dict[str, Any]]:
        item = {"id": new_id("msg"), "type": "message", "role": "assistant",
                "status": "in_progress", "content": []}
        self.items.append(item)
        self.open, self.text = item, []
        return [{"type": "response.output_item.added", "output_index": self.index,
                 "item": copy.deepcopy(item)},
                {"type": "response.content_part.added", "item_id": item["id"],
                 "output_index": self.index, "content_index": 0,
                 "part": _part("", [] if self.held else None)},
                ]

    def _text(self, text: str, logprob: TokenLogprob | None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.open is not None and self.open["type"] != "message":
            out += self._close()
        lps = ([] if self.held is None
               else token_entries(self.held.piece, self.held.add(text, logprob)))
        if self.open is None:
            if not text.strip():
                self.pending += text
                self.lps += lps
                return out
            out += self._open_message()
            text, self.pending, lps, self.lps = self.pending + text, "", self.lps + lps, []
        assert self.open is not None
        self.text.append(text)
        self.lps += lps
        if text or lps:
            out.append({"type": "response.output_text.delta", "item_id": self.open["id"],
                        "output_index": self.index, "content_index": 0, "delta": text,
                        "logprobs": lps})
        return out

    def _last_logprobs(self, stopped: bool) -> list[dict[str, Any]]:
        """The tokens of text released at the end (none of a stop string's)."""
        if self.held is None:
            return []
        lps = token_entries(self.held.piece, self.held.finish(stopped))
        if not lps or self.open is None or self.open["type"] != "message":
            self.lps += lps  # (before any message: go with the pending text)
            return []
        self.lps += lps
        return [{"type": "response.output_text.delta", "item_id": self.open["id"],
                 "output_index": self.index, "content_index": 0, "delta": "", "logprobs": lps}]

    def _reasoning(self, text: str) -> list[dict[str, Any]]:
        """Reasoning text: a ``reasoning`` item with ``reasoning_text`` content."""
        out: list[dict[str, Any]] = []
        if self.open is not None and self.open["type"] != "reasoning":
            out += self._close()
        if self.open is None:
            item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": [],
                    "status": "in_progress"}
            self.items.append(item)
            self.open, self.text = item, []
            out.append({"type": "response.output_item.added", "output_index": self.index,
                        "item": copy.deepcopy(item)})
        self.text.append(text)
        out.append({"type": "response.reasoning_text.delta", "item_id": self.open["id"],
                    "output_index": self.index, "content_index": 0, "delta": text})
        return out

    def _call(self, e: ToolCallDelta) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if e.name is not None:
            out += self._close()
            self.pending, self.lps = "", []
            item = {"id": new_id("fc"), "type": "function_call", "call_id": e.id or new_id("call"),
                    "name": e.name, "arguments": "", "status": "in_progress"}
            if ns := self.namespaces.get(e.name):
                item["namespace"] = ns
            self.items.append(item)
            self.open = item
            out.append({"type": "response.output_item.added", "output_index": self.index,
                        "item": copy.deepcopy(item)})
        if e.arguments and self.open is not None and self.open["type"] == "function_call":
            self.open["arguments"] += e.arguments
            out.append({"type": "response.function_call_arguments.delta",
                        "item_id": self.open["id"], "output_index": self.index,
                        "delta": e.arguments})
        return out

    def cut(self) -> list[dict[str, Any]]:
        """The items so far, the open one ended "incomplete" with what it holds (the
        output of a response that failed mid-way, as its stream has shown it)."""
        self.finish = "length"
        self._close()
        return self.items

    def _close(self) -> list[dict[str, Any]]:
        item, self.open = self.open, None
        if item is None:
            return []
        status = "incomplete" if self.finish == "length" else "completed"
        where = {"item_id": item["id"], "output_index": self.index}
        if item["type"] == "reasoning":
            text = "".join(self.text)
            item.update(status=status, content=[{"type": "reasoning_text", "text": text}])
            out = [{"type": "response.reasoning_text.done", **where, "content_index": 0,
                    "text": text}]
        elif item["type"] == "message":
            text, lps = "".join(self.text), (self.lps if self.held else None)
            self.lps = []
            item.update(status=status, content=[_part(text, lps)])
            out = [{"type": "response.output_text.done", **where, "content_index": 0,
                    "text": text, "logprobs": lps or []},
                   {"type": "response.content_part.done", **where, "content_index": 0,
                    "part": _part(text, lps)}]
        else:
            item["status"] = status if _parses(item["arguments"]) else "incomplete"
            out = [{"type": "response.function_call_arguments.done", **where,
                    "arguments": item["arguments"]}]
        return out + [{"type": "response.output_item.done", "output_index": self.index,
                       "item": copy.deepcopy(item)}]

    def body(self, meta: ResponseMeta) -> dict[str, Any]:
        """The finished response object."""
        if self.finish == "length":
            return response_body(meta, "incomplete", self.items, self.usage,
                                 incomplete="max_output_tokens")
        return response_body(meta, "completed", self.items, self.usage)


def _parses(arguments: str) -> bool:
    try:
        json.loads(arguments)
    except (ValueError, RecursionError):
        return False
    return True


def chat_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items (normalised input items, or output items) as OpenAI chat messages: a
    function_call joins the assistant message before it (one turn), a
    function_call_output is a tool message."""
    out: list[dict[str, Any]] = []
    for it in items:
        if it["type"] in ("reasoning", "item_reference"):
            continue  # earlier reasoning is not rendered again (as the templates do)
        if it["type"] == "function_call":
            call = {"id": it["call_id"], "type": "function",
                    "function": {"name": it["name"], "arguments": it["arguments"]}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif it["type"] == "function_call_output":
            out.append({"role": "tool", "tool_call_id": it["call_id"], "content": it["output"]})
        else:
            out.append({"role": it["role"],
                        "content": "".join(p.get("text", "") for p in it["content"])})
    return out


Save = Callable[[dict[str, Any]], Awaitable[None]]


async def sse_events(meta: ResponseMeta, events: AsyncIterator[Event], save: Save,
                     path: str) -> AsyncIterator[dict[str, str]]:
    """The server-sent events of a streamed response; ``save`` gets the final response
    object before the last event is sent (so a client that has it can retrieve it)."""
    seq = 0

    def sse(payload: dict[str, Any]) -> dict[str, str]:
        nonlocal seq
        payload["sequence_number"] = seq
        seq += 1
        return {"event": payload["type"], "data": json.dumps(payload, ensure_ascii=False)}

    start = response_body(meta, "in_progress", [])
    yield sse({"type": "response.created", "response": start})
    yield sse({"type": "response.in_progress", "response": start})
    b = OutputBuilder(meta.piece, meta.namespaces)
    try:
        async for e in events:
            if isinstance(e, ErrorEvent):
                err = shape(e.error, path)["error"]
                yield sse({"type": "error", "code": err.get("code") or err.get("type"),
                           "message": err.get("message"), "param": err.get("param")})
                failed = response_body(meta, "failed", b.cut(), error=e.error)
                await save(failed)
                yield sse({"type": "response.failed", "response": failed})
                return
            for payload in b.feed(e):
                yield sse(payload)
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    final = b.body(meta)
    await save(final)
    yield sse({"type": f"response.{final['status']}", "response": final})


async def collect(meta: ResponseMeta, events: AsyncIterator[Event]) -> dict[str, Any]:
    """The whole response object; raises the APIError of an ErrorEvent."""
    b = OutputBuilder(meta.piece, meta.namespaces)
    try:
        async for e in events:
            if isinstance(e, ErrorEvent):
                raise e.error
            b.feed(e)
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    return b.body(meta)


_ID = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]


def _op(summary: str, body: set[str] | None = None, stream: bool = False) -> dict[str, Any]:
    ok: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if stream:
        ok["text/event-stream"] = {"schema": {"type": "string"}}
    op: dict[str, Any] = {"summary": summary, "responses": {
        "200": {"description": summary, "content": ok},
        "400": {"description": "invalid request (names the field)"},
        "404": {"description": "no such response (or another API key's)"}}}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["input"], "additionalProperties": False,
            "properties": {k: {} for k in sorted(body)}}}}}
    else:
        op["parameters"] = _ID
    return op


def openapi_paths(create_fields: set[str], token_fields: set[str]) -> dict[str, Any]:
    """The OpenAPI paths of the Responses routes, given the fields each body takes."""
    return {
        "/v1/responses": {"post": _op("Create a response (OpenAI Responses API)",
                                      create_fields, True)},
        "/v1/responses/input_tokens": {"post": _op("Count a response's input tokens",
                                                   token_fields)},
        "/v1/responses/{response_id}": {"get": _op("A stored response"),
                                        "delete": _op("Delete a stored response")},
        "/v1/responses/{response_id}/input_items": {"get": _op(
            "A stored response's input items")},
        "/v1/responses/{response_id}/cancel": {"post": _op("Cancel: 400, no background runs")},
    }
