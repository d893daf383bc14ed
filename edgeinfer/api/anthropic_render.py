"""Anthropic Messages bodies and server-sent events from the service's events.

The whole body: ``{"id": "msg_...", "type": "message", "role": "assistant", "model",
"content", "stop_reason", "stop_sequence", "usage"}``; its content blocks, in order: a
``thinking`` block (the model's reasoning, ``signature`` "": nothing is signed here;
left out when the request said ``thinking: {"type": "disabled"}``), a ``text`` block when
the answer has text that is not only whitespace,
then the ``tool_use`` blocks (``id`` "toolu_...", ``input`` the parsed arguments: always an
object, the tool grammar makes one).

The stream, as Anthropic sends it: ``message_start`` (content empty), then per block
``content_block_start`` / ``content_block_delta`` (``thinking_delta``, ``text_delta`` or
``input_json_delta``) / ``content_block_stop``, with one ``ping`` after the first block
starts (and one every 10 s while nothing else is sent: ``ping_event``), then
``message_delta`` (stop reason and stop sequence, the final usage) and ``message_stop``.
Whitespace-only text is held back until text follows (it is dropped if a
tool call or the end comes first, as in the whole body: an answer of blanks alone has no
block at all, as Anthropic's empty answers, since it refuses such a block sent back). A
failure mid-stream is one ``error`` event in Anthropic's error shape
(``api.errors.shape``), and the stream ends.

Stop reasons: finish "tool_calls" -> ``tool_use``; "length" -> ``max_tokens``; "stop" with
the request's stop string that matched (``Finish.stop_word``) -> ``stop_sequence`` and that
string in ``stop_sequence``; any other "stop" (end of generation) -> ``end_turn``.

Usage as the SDK documents it (the total input is input_tokens +
cache_creation_input_tokens + cache_read_input_tokens): ``input_tokens`` = prompt tokens not
read from the prefix cache, ``cache_read_input_tokens`` = the cached ones,
``cache_creation_input_tokens`` = 0. ``message_start`` gives the whole prompt as
``input_tokens`` and the cache fields 0 (how much was cached is known only at the end);
``message_delta`` gives the final counts, which the SDK's stream helper writes over those.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sse_starlette import ServerSentEvent

from edgeinfer.api.errors import shape
from edgeinfer.service.events import (
    ErrorEvent,
    Event,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UsageReport,
)
from edgeinfer.service.outcome import gather

STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


@dataclass(slots=True)
class MessageMeta:
    """What one response repeats, and what the request asked of its rendering."""

    model: str = ""
    show_thinking: bool = True  # False: the request disabled thinking
    id: str = field(default_factory=lambda: "msg_" + uuid.uuid4().hex[:24])


def stop_reason(finish: str, stop_word: str | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finish reason and the stop string that ended it."""
    if finish in STOP_REASONS:
        return STOP_REASONS[finish], None
    if stop_word is not None:
        return "stop_sequence", stop_word
    return "end_turn", None


def tool_use_id(call_id: str | None) -> str:
    """Anthropic's id of a tool call (``toolu_...``) from the service's (``call_...``)."""
    return "toolu_" + (call_id or uuid.uuid4().hex[:24]).removeprefix("call_")


def usage_body(u: UsageReport) -> dict[str, int]:
    cached = max(0, min(u.cached_tokens, u.prompt_tokens))
    return {"input_tokens": u.prompt_tokens - cached, "output_tokens": u.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def message_body(meta: MessageMeta, content: list[dict[str, Any]],
                 stop: tuple[str | None, str | None], usage: dict[str, int]) -> dict[str, Any]:
    return {"id": meta.id, "type": "message", "role": "assistant", "model": meta.model,
            "content": content, "stop_reason": stop[0], "stop_sequence": stop[1],
            "usage": usage}


def _input(arguments: str) -> dict[str, Any]:
    """A call's ``input``: {} for one cut off by max_tokens (as the stream ends it)."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):  # (cut inside a thousand open brackets)
        return {}
    return value if isinstance(value, dict) else {}


async def collect(meta: MessageMeta, events: AsyncIterator[Event]) -> dict[str, Any]:
    """The whole (non-streamed) message; raises the APIError of an ErrorEvent."""
    out = await gather(events, 1)
    c = out.choices[0]
    content: list[dict[str, Any]] = []
    if c.reasoning and meta.show_thinking:
        content.append({"type": "thinking", "thinking": c.reasoning, "signature": ""})
    if c.text.strip():  # (none, or only blanks: no block, as Anthropic, which refuses
        content.append({"type": "text", "text": c.text})  # such a block sent back)
    content += [{"type": "tool_use", "id": tool_use_id(k.id), "name": k.name,
                 "input": _input(k.arguments)} for k in c.calls]
    return message_body(meta, content, stop_reason(c.finish, c.stop_word),
                        usage_body(out.usage))


def ping_event() -> ServerSentEvent:
    """The keep-alive every 10 s of an idle stream (a long prompt being computed), as
    Anthropic's: a ``ping`` event (the other dialects' keep-alive is a comment)."""
    return ServerSentEvent(event="ping", data=json.dumps({"type": "ping"}), sep="\n")


def sse(kind: str, data: dict[str, Any]) -> dict[str, str]:
    """One server-sent event: ``event: kind`` and its JSON (which repeats the kind)."""
    return {"event": kind, "data": json.dumps({"type": kind, **data}, ensure_ascii=False)}


class Blocks:
    """The content blocks of a streamed message, opened and closed as the events come."""

    def __init__(self) -> None:
        self.index = -1  # of the block now open, or of the last one
        self.open: str | None = None  # the type of the block now open
        self.held = ""  # whitespace not sent yet
        self.pinged = False

    def _start(self, block: dict[str, Any]) -> list[dict[str, str]]:
        out = self.close()
        self.index += 1
        self.open = block["type"]
        out.append(sse("content_block_start", {"index": self.index, "content_block": block}))
        if not self.pinged:
            self.pinged = True
            out.append(sse("ping", {}))
        return out

    def close(self) -> list[dict[str, str]]:
        if self.open is None:
            return []
        self.open = None
        return [sse("content_block_stop", {"index": self.index})]

    def _delta(self, delta: dict[str, Any]) -> dict[str, str]:
        return sse("content_block_delta", {"index": self.index, "delta": delta})

    def thinking(self, text: str) -> list[dict[str, str]]:
        out = [] if self.open == "thinking" else self._start(
            {"type": "thinking", "thinking": "", "signature": ""})
        return out + [self._delta({"type": "thinking_delta", "thinking": text})]

    def text(self, text: str) -> list[dict[str, str]]:
        if self.open == "text":
            return [self._delta({"type": "text_delta", "text": text})] if text else []
        held = self.held + text
        if not held.strip():
            self.held = held
            return []
        self.held = ""
        return self._start({"type": "text", "text": ""}) + [
            self._delta({"type": "text_delta", "text": held})]

    def call(self, e: ToolCallDelta) -> list[dict[str, str]]:
        out = []
        if e.name is not None:
            self.held = ""
            out = self._start({"type": "tool_use", "id": tool_use_id(e.id), "name": e.name,
                               "input": {}})
        if e.arguments:
            out.append(self._delta({"type": "input_json_delta", "partial_json": e.arguments}))
        return out

    def finish(self) -> list[dict[str, str]]:
        """Close the last block. Text of blanks alone gets no block (Anthropic refuses an
        empty or blank text block sent back), so a message may have none."""
        return self.close()

    def feed(self, e: Event, meta: MessageMeta) -> list[dict[str, str]]:
        """The events of one text, reasoning or tool-call delta (nothing for the others)."""
        if isinstance(e, TextDelta):
            return self.text(e.text)
        if isinstance(e, ToolCallDelta):
            return self.call(e)
        if isinstance(e, ReasoningDelta) and e.text and meta.show_thinking:
            return self.thinking(e.text)
        return []


async def sse_events(meta: MessageMeta, events: AsyncIterator[Event], prompt_tokens: int,
                     path: str) -> AsyncIterator[dict[str, str]]:
    """The events of a streamed message, ``message_start`` to ``message_stop`` (or to an
    ``error`` event). Closing it closes ``events``, which aborts the generation."""
    blocks = Blocks()
    stop: tuple[str, str | None] = ("end_turn", None)
    yield sse("message_start", {"message": message_body(
        meta, [], (None, None), {"input_tokens": prompt_tokens, "cache_creation_input_tokens": 0,
                                 "cache_read_input_tokens": 0, "output_tokens": 0})})
    try:
        async for e in events:
            if isinstance(e, ErrorEvent):
                yield {"event": "error", "data": json.dumps(shape(e.error, path))}
                return
            if isinstance(e, Finish):
                out, stop = blocks.finish(), stop_reason(e.reason, e.stop_word)
            elif isinstance(e, UsageReport):
                out = [sse("message_delta", {"delta": {"stop_reason": stop[0],
                                                       "stop_sequence": stop[1]},
                                             "usage": usage_body(e)}),
                       sse("message_stop", {})]
            else:
                out = blocks.feed(e, meta)
            for item in out:
                yield item
    finally:
        await events.aclose()  # type: ignore[attr-defined]


_STR = {"type": "string"}
_OBJ = {"type": "object"}
_PROPS: dict[str, Any] = {
    "model": _STR, "max_tokens": {"type": "integer", "minimum": 1}, "stream": {"type": "boolean"},
    "messages": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["role", "content"], "additionalProperties": False,
        "properties": {"role": {"enum": ["user", "assistant"]},
                       "content": {"oneOf": [_STR, {"type": "array", "items": _OBJ}]}}}},
    "system": {"oneOf": [_STR, {"type": "array", "items": _OBJ}]},
    "temperature": {"type": "number", "minimum": 0, "maximum": 1},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": 0},
    "stop_sequences": {"type": "array", "items": _STR, "maxItems": 16},
    "tools": {"type": "array", "items": _OBJ}, "tool_choice": _OBJ, "metadata": _OBJ,
    "thinking": _OBJ, "output_config": _OBJ, "cache_control": _OBJ, "service_tier": _STR,
}
_ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"],
                                          "properties": {"type": _STR, "message": _STR}}}}


def _op(summary: str, body_fields: set[str], required: list[str],
        stream: bool = False) -> dict[str, Any]:
    ok: dict[str, Any] = {"application/json": {"schema": _OBJ}}
    if stream:
        ok["text/event-stream"] = {"schema": _STR}
    err = {"content": {"application/json": {"schema": _ERROR}}}
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": required, "additionalProperties": False,
            "properties": {k: _PROPS.get(k, {}) for k in sorted(body_fields)}}}}},
        "responses": {"200": {"description": summary, "content": ok},
                      **{code: {"description": what, **err} for code, what in [
                          ("400", "invalid request"), ("401", "missing or wrong API key"),
                          ("404", "unknown model"), ("429", "queue full; see Retry-After"),
                          ("529", "model unavailable (overloaded_error)")]}}}}


def openapi_paths(create_fields: set[str], token_fields: set[str]) -> dict[str, Any]:
    """The OpenAPI paths of the Messages routes, given the fields each body takes."""
    return {
        "/v1/messages": _op("Create a message (Anthropic Messages API)", create_fields,
                            ["model", "max_tokens", "messages"], stream=True),
        "/v1/messages/count_tokens": _op("Count a message's input tokens", token_fields,
                                         ["model", "messages"]),
    }
