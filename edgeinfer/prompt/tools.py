"""Function calling: tools into the prompt, tool calls out of the generated text.

The generic format (for chat templates without tool support, such as the
default SmolLM2 one) follows the widespread Hermes convention::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Tools are described in a system message; results go back as
``<tool_response>`` user turns. Templates that take a ``tools`` variable get
the tools and the raw tool messages instead. Either way the calls are
grammar-constrained (see ``grammar.tool_calls_gbnf``), so they always parse.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

# Lazy-grammar trigger: free text until the model opens a call, then the grammar.
TOOL_CALL_TRIGGER = TOOL_CALL_OPEN


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool = False

    def openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def tools_system_text(tools: tuple[ToolSpec, ...]) -> str:
    lines = "\n".join(json.dumps(t.openai()["function"], ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        f"within {TOOL_CALL_OPEN}{TOOL_CALL_CLOSE} XML tags:\n"
        f'{TOOL_CALL_OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n'
        f"{TOOL_CALL_CLOSE}"
    )


def _call_text(call: dict[str, Any]) -> str:
    fn = call.get("function", {})
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except ValueError:
        args = fn.get("arguments")
    body = json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def prepare_messages(messages: list[dict[str, Any]], tools: tuple[ToolSpec, ...],
                     native: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Messages (and extra template variables) carrying the tools and past calls.

    ``native``: the chat template takes ``tools`` and tool messages itself.
    """
    if native:
        extra = {"tools": [t.openai() for t in tools]} if tools else {}
        return messages, extra
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            text = "\n".join(_call_text(c) for c in m["tool_calls"])
            content = f"{m['content']}\n{text}" if m.get("content") else text
            out.append({"role": "assistant", "content": content})
        elif m["role"] == "tool":
            out.append({"role": "user",
                        "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        else:
            out.append({k: v for k, v in m.items() if k in ("role", "content", "name")})
    if tools:
        text = tools_system_text(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out, {}


_CALL_HEAD = re.compile(r'^\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def parse_tool_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """Split a whole generated text into content and tool calls."""
    stream = ToolCallStream()
    events = stream.feed(text) + stream.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    calls: list[ToolCall] = []
    for e in events:
        if isinstance(e, CallOpen):
            calls.append(ToolCall(e.id, e.name, ""))
        elif isinstance(e, CallArgs):
            calls[e.index].arguments += e.text
    # The arguments are the model's own text (as streamed); a call cut off by max_tokens,
    # whose arguments do not parse, is left out.
    complete = []
    for c in calls:
        try:
            json.loads(c.arguments)
        except ValueError:
            continue
        complete.append(c)
    return (content.strip() or None), complete


@dataclass(frozen=True, slots=True)
class Content:
    """Text outside any tool call."""

    text: str


@dataclass(frozen=True, slots=True)
class CallOpen:
    """Call ``index`` begins: its id and function name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class CallArgs:
    """A fragment of call ``index``'s arguments (JSON text)."""

    index: int
    text: str


Event = Content | CallOpen | CallArgs


class ToolCallStream:
    """Incremental parser of generated text with tool calls in the generic format.

    Content is released as it comes, except a tail that could begin
    ``<tool_call>``. Inside a call, the name is announced once it is complete
    and the arguments are released in fragments, holding back only from the
    last ``}`` on (it may be the call object's own closing brace).
    """

    def __init__(self) -> None:
        self._buf = ""
        self._in_call = False
        self._index = 0
        self._named = False
        self._args_start = 0
        self._sent = 0  # characters of the arguments already released
        self.num_calls = 0

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        events: list[Event] = []
        while True:
            if not self._in_call:
                at = self._buf.find(TOOL_CALL_OPEN)
                if at == -1:
                    keep = _partial_suffix(self._buf, TOOL_CALL_OPEN)
                    cut = len(self._buf) - keep
                    if cut:
                        events.append(Content(self._buf[:cut]))
                    self._buf = self._buf[cut:]
                    return events
                if at:
                    events.append(Content(self._buf[:at]))
                self._buf = self._buf[at + len(TOOL_CALL_OPEN):]
                self._in_call, self._named, self._sent = True, False, 0
                continue
            if not self._named:
                head = _CALL_HEAD.match(self._buf)
                if head is None:
                    return events
                name = json.loads(f'"{head.group(1)}"')
                events.append(CallOpen(self._index, new_call_id(), name))
                self._named, self._args_start = True, head.end()
                self.num_calls += 1
            if self._sent == 0:  # the arguments start at their first non-space character
                while self._args_start < len(self._buf) and self._buf[self._args_start].isspace():
                    self._args_start += 1
            end = self._buf.find(TOOL_CALL_CLOSE)
            body = self._buf[self._args_start: end if end != -1 else len(self._buf)]
            stop = body.rstrip().rfind("}") if end != -1 else body.rfind("}")
            if stop > self._sent:
                events.append(CallArgs(self._index, body[self._sent:stop]))
                self._sent = stop
            if end == -1:
                return events
            self._buf = self._buf[end + len(TOOL_CALL_CLOSE):].lstrip("\n")
            self._in_call = False
            self._index += 1

    def finish(self) -> list[Event]:
        """End of text: release what was held back."""
        rest, self._buf = self._buf, ""
        if not self._in_call:
            return [Content(rest)] if rest else []
        if self._named:  # an unfinished call: pass its arguments on as they are
            tail = rest[self._args_start + self._sent:]
            return [CallArgs(self._index, tail)] if tail else []
        return [Content(TOOL_CALL_OPEN + rest)]


def _partial_suffix(text: str, marker: str) -> int:
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
