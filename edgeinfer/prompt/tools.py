"""Function calling: tools into the prompt, tool calls out of the generated text.

The generic format (for chat templates without tool support, such as the
default SmolLM2 one) follows the widespread Hermes convention::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Tools are described in a system message; results go back as
``<tool_response>`` user turns. Templates that speak a native format
(``edgeinfer.prompt.toolformat``) get the tools and the tool messages themselves,
and the model writes calls in its own syntax. Either way the calls are
grammar-constrained (see ``grammar.tool_calls_gbnf``), so they always parse.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Protocol

from edgeinfer.prompt import nesting
from edgeinfer.prompt.callparser import CallArgs, CallOpen, CallParser, Content, Event
from edgeinfer.prompt.harmony import HarmonyParser
from edgeinfer.prompt.namedcalls import NamedCallParser
from edgeinfer.prompt.paramtypes import parameter_schemas, parameter_types
from edgeinfer.prompt.pythoncalls import PythonCallParser, python_calls_text
from edgeinfer.prompt.toolformat import GENERIC, ToolFormat

__all__ = ["CallArgs", "CallOpen", "CallParser", "Content", "Event", "ToolCall", "ToolSpec",
           "call_parser", "parameter_schemas", "parameter_types", "parse_tool_calls",
           "prepare_messages", "tools_system_text"]

TOOL_CALL_OPEN = GENERIC.open
TOOL_CALL_CLOSE = GENERIC.close


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool = False

    def openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


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
        args = nesting.loads(fn.get("arguments") or "{}")
    except ValueError:  # (not JSON, or nested too deep to render: the text as it came)
        args = fn.get("arguments")
    body = json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def fitted_id(call_id: str, length: int) -> str:
    """A call id as a format wants it: ``length`` letters and digits (Mistral's templates
    refuse others), the same for the same id every time (so an assistant turn and its
    tool result still match, and a conversation renders the same on every turn)."""
    if not length or (len(call_id) == length and call_id.isalnum()):
        return call_id
    digest = hashlib.sha256(call_id.encode()).digest()
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return "".join(alphabet[b % len(alphabet)] for b in digest[:length])


def _native_call(call: dict[str, Any], fmt: ToolFormat) -> dict[str, Any]:
    """A past call as templates render it: arguments as an object, the id fitted."""
    fn = call.get("function", {})
    try:
        args: Any = nesting.loads(fn.get("arguments") or "{}")
    except ValueError:
        args = fn.get("arguments")
    if fmt.args == "seed" and isinstance(args, dict):  # its template writes repr(), not JSON
        args = {k: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                for k, v in args.items()}
    return {**call, "id": fitted_id(str(call.get("id", "")), fmt.id_length),
            "function": {**fn, "arguments": args}}


def _harmony_turn(m: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn as the gpt-oss template takes it: reasoning in ``thinking``
    (the template refuses both it and content beside a tool call: content wins)."""
    m = dict(m)
    thought = m.pop("reasoning_content", None)
    if thought and not (m.get("tool_calls") and m.get("content")):
        m["thinking"] = thought
    return m


def written_calls(calls: list[dict[str, Any]], fmt: ToolFormat) -> str:
    """Past calls as the model wrote them, in its format's syntax (Python or JSON), for a
    template that does not show ``tool_calls`` itself (LFM2's older ones, Granite 3.3)."""
    pairs = [(c["function"].get("name"), c["function"].get("arguments")) for c in calls]
    if fmt.syntax == "python":
        return python_calls_text(pairs, fmt)
    objs = [{n: a} if fmt.keyed else {fmt.name_key: n, fmt.args_key: a} for n, a in pairs]
    if fmt.listed:
        return fmt.open + json.dumps(objs, ensure_ascii=False) + fmt.close
    if fmt.joined:
        lines = "".join(json.dumps(o, ensure_ascii=False) + "\n" for o in objs)
        return f"{fmt.open}\n{lines}{fmt.close}"
    return "".join(fmt.open + json.dumps(o, ensure_ascii=False) + fmt.close for o in objs)


def _native(messages: list[dict[str, Any]], tools: tuple[ToolSpec, ...], fmt: ToolFormat,
            shows_calls: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    out = []
    named: list[tuple[str, str]] = []  # Kimi K2: the last turn's (call id, NAME:INDEX)
    for m in messages:
        if m["role"] == "assistant" and fmt.syntax == "harmony":
            m = _harmony_turn(m)
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [_native_call(c, fmt) for c in m["tool_calls"]]
            if fmt.name_prefix:  # the templates name a call by its index in its turn
                named = [(str(c.get("id")), f"{fmt.name_prefix}{c['function'].get('name')}"
                          f"{fmt.id_marker}{k}") for k, c in enumerate(calls)]
            m = {**m, "tool_calls": calls}
            # Python calls always (the LFM2.5 template's own writes lists with repr(),
            # which would undo the request-text marks of prompt.markup)
            if fmt.syntax == "python" or not shows_calls and fmt.syntax == "json":
                m = {k: v for k, v in m.items() if k != "tool_calls"}
                m["content"] = (m.get("content") or "") + written_calls(calls, fmt)
        elif m["role"] == "tool" and named:
            m = {**m, "tool_call_id": _result_name(named, str(m.get("tool_call_id")))}
        elif m["role"] == "tool" and fmt.id_length:
            m = {**m, "tool_call_id": fitted_id(str(m.get("tool_call_id", "")), fmt.id_length)}
        out.append(m)
    return out, ({"tools": [t.openai() for t in tools]} if tools else {})


def _result_name(named: list[tuple[str, str]], call_id: str) -> str:
    """The ``functions.NAME:INDEX`` of the call a result answers (and forget it): the
    first left with its id, else the first left (ids missing or repeated)."""
    k = next((i for i, (cid, _) in enumerate(named) if cid == call_id), 0)
    return named.pop(k)[1]


def native_tools_text(tools: tuple[ToolSpec, ...], fmt: ToolFormat) -> str:
    """The tools described for a model whose template renders calls in its own format
    but not the tools (DeepSeek R1 / V3.1, as their model cards write it)."""
    listed = "\n\n".join(
        f"### {t.name}\nDescription: {t.description}\n\nParameters: "
        f"{json.dumps(t.parameters, ensure_ascii=False)}" for t in tools)
    example = (f"{fmt.block_open}{fmt.call_open}tool_call_name{fmt.name_end}"
               f"tool_call_arguments{fmt.call_close}{{{{additional_tool_calls}}}}"
               f"{fmt.block_close}")
    return ("## Tools\nYou have access to the following tools:\n\n" + listed +
            "\n\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n" + example +
            "\n\nWhere:\n- `tool_call_name` must be an exact match to one of the available "
            "tools\n- `tool_call_arguments` must be valid JSON that strictly follows the "
            "tool's Parameters Schema\n- For multiple tool calls, chain them directly "
            "without separators or spaces")


def _with_system_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    out = list(messages)
    if out and out[0]["role"] == "system" and isinstance(out[0].get("content"), str):
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
    else:
        out.insert(0, {"role": "system", "content": text})
    return out


def prepare_messages(messages: list[dict[str, Any]], tools: tuple[ToolSpec, ...],
                     fmt: ToolFormat = GENERIC, *, takes_tools: bool = True,
                     shows_calls: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Messages (and extra template variables) carrying the tools and past calls.

    A native format's template takes ``tools``, assistant ``tool_calls`` (arguments as
    objects) and ``tool`` messages itself (a template that renders calls but not the
    tools, ``takes_tools=False``, gets them described in the system message); the
    generic format writes the tools into a system message, past calls in its own
    syntax and results as user turns. ``shows_calls=False``: the template drops
    ``tool_calls``, so past calls go into the content as the model writes them.
    """
    if fmt.native:
        native, extra = _native(messages, tools, fmt, shows_calls)
        if tools and not takes_tools:
            return _with_system_text(native, native_tools_text(tools, fmt)), {}
        return native, extra
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
        out = _with_system_text(out, tools_system_text(tools))
    return out, {}


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


class Parser(Protocol):
    num_calls: int

    def feed(self, text: str) -> list[Any]: ...

    def finish(self, cut: bool = False) -> list[Any]: ...


def call_parser(fmt: ToolFormat, types: dict[str, dict[str, str]] | None = None,
                schemas: dict[str, dict[str, Any]] | None = None) -> Parser:
    """A streaming parser of ``fmt``'s calls (``types``: the tools' parameter types, see
    ``parameter_types``; ``schemas``: their parameters schemas, ``parameter_schemas``).
    Its events: Content, CallOpen, CallArgs (and, for Harmony, ``reasoning.Thought``)."""
    if fmt.syntax == "named":
        return NamedCallParser(fmt, types, schemas)
    if fmt.syntax == "harmony":
        return HarmonyParser(frozenset(types or ()))
    if fmt.syntax == "python":
        return PythonCallParser(fmt)
    return CallParser(fmt)


def arguments_parse(arguments: str) -> bool:
    """Whether a call's arguments are whole JSON (not cut off, not nested past what the
    JSON reader goes)."""
    try:
        json.loads(arguments)
    except (ValueError, RecursionError):
        return False
    return True


def parse_tool_calls(text: str, fmt: ToolFormat = GENERIC,
                     types: dict[str, dict[str, str]] | None = None,
                     schemas: dict[str, dict[str, Any]] | None = None
                     ) -> tuple[str | None, list[ToolCall]]:
    """Split a whole generated text into content and tool calls (reasoning, where the
    format carries it, is left out)."""
    stream = call_parser(fmt, types, schemas)
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
    return (content.strip() or None), [c for c in calls if arguments_parse(c.arguments)]
