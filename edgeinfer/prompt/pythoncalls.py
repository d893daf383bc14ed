"""Tool calls written as Python calls (LFM2 / LFM2.5, ``syntax = "python"``)::

    <|tool_call_start|>[get_weather(city='Paris', days=3), get_time()]<|tool_call_end|>

Arguments are Python literals (strings in either quote, ``True`` / ``None``, lists,
dicts); JSON's ``true`` / ``false`` / ``null`` are read too, as llama.cpp reads them. Each
call is announced once its closing parenthesis arrives, with its arguments as JSON.
Nothing is evaluated: the arguments are parsed by ``ast`` and only literals are taken.
Text that is not a well-formed call list stays text.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

from edgeinfer.prompt.callparser import (
    CallArgs,
    CallOpen,
    Content,
    Event,
    new_call_id,
    partial_suffix,
)
from edgeinfer.prompt.toolformat import ToolFormat

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,127}")
_MAX_CALL = 64_000  # characters of one call's arguments
_MAX_DEPTH = 32
_WORDS = {"true": True, "false": False, "null": None, "True": True, "False": False,
          "None": None}


def _literal(node: ast.AST, depth: int = 0) -> Any:
    """A JSON value from a Python (or JSON) literal's syntax tree; ValueError otherwise."""
    if depth > _MAX_DEPTH:
        raise ValueError("too deep")
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(
            node.value, str | int | float | bool)):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise ValueError("not a JSON number")
        return node.value
    if isinstance(node, ast.Name) and node.id in _WORDS:
        return _WORDS[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _literal(node.operand, depth + 1)
        if isinstance(inner, bool) or not isinstance(inner, int | float):
            raise ValueError("a sign before what is not a number")
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e, depth + 1) for e in node.elts]
    if isinstance(node, ast.Dict):
        keys = [_literal(k, depth + 1) if k is not None else None for k in node.keys]
        if not all(isinstance(k, str) for k in keys):
            raise ValueError("a key that is not a string")
        return {k: _literal(v, depth + 1) for k, v in zip(keys, node.values, strict=True)}
    raise ValueError("not a literal")


def literal_value(text: str) -> Any:
    """A JSON value from one Python (or JSON) literal's text; ValueError otherwise."""
    if len(text) > _MAX_CALL:
        raise ValueError("too long")
    try:
        tree = ast.parse(text.strip(), mode="eval")
        value = _literal(tree.body)
        json.dumps(value, allow_nan=False)
        return value
    except (SyntaxError, RecursionError, MemoryError) as exc:
        raise ValueError(str(exc)) from None


def arguments_json(args: str) -> str:
    """JSON text of a call's keyword arguments (``city='Paris', days=3``)."""
    try:
        tree = ast.parse(f"f({args})", mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ValueError(str(exc)) from None
    call = tree.body
    if not isinstance(call, ast.Call) or call.args or any(k.arg is None for k in call.keywords):
        raise ValueError("arguments are not keywords")
    try:
        return json.dumps({k.arg: _literal(k.value) for k in call.keywords},
                          ensure_ascii=False)
    except RecursionError:
        raise ValueError("too deep") from None


def _call_end(text: str) -> int:
    """Index just past the ``)`` closing a call whose arguments start ``text`` (-1: not
    yet written)."""
    depth, quote, escape = 0, "", False
    for i, ch in enumerate(text):
        if quote:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return i + 1 if ch == ")" else -2
            depth -= 1
    return -1


def _value_text(value: Any) -> str:
    """A value as the LFM2.5 template writes it: a string in single quotes as it is, a
    dict as JSON, the rest as Python (not ``repr`` of strings: it would escape the
    request-text marks of ``edgeinfer.prompt.markup``)."""
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    return repr(value)


def python_calls_text(calls: list[tuple[str, Any]], fmt: ToolFormat) -> str:
    """Past calls (name, arguments) in the format's own syntax, for templates that do not
    render ``tool_calls`` themselves (LFM2's older ones)."""
    written = []
    for name, args in calls:
        pairs = args.items() if isinstance(args, dict) else []
        written.append(f"{name}(" + ", ".join(f"{k}={_value_text(v)}" for k, v in pairs)
                       + ")")
    return f"{fmt.open}[{', '.join(written)}]{fmt.close}"


class PythonCallParser:
    """Incremental parser of ``syntax = "python"`` calls: ``feed`` text, then ``finish``."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self.num_calls = 0
        self._buf = ""
        self._mode = "text"  # text | list | calls | close
        self._held = ""  # the markers of a list that opened no call yet

    def _text(self, out: list[Event]) -> bool:
        at = self._buf.find(self.fmt.open)
        if at == -1:
            keep = partial_suffix(self._buf, self.fmt.open)
            if len(self._buf) > keep:
                out.append(Content(self._buf[:len(self._buf) - keep]))
                self._buf = self._buf[len(self._buf) - keep:]
            return False
        if at:
            out.append(Content(self._buf[:at]))
        self._held = self.fmt.open
        self._buf, self._mode = self._buf[at + len(self.fmt.open):], "list"
        return True

    def _list(self, out: list[Event]) -> bool:
        head = self._buf.lstrip()
        if not head:
            return False
        if not head.startswith("["):
            self._give_back(out)
            return True
        self._held += self._buf[:len(self._buf) - len(head) + 1]
        self._buf, self._mode = head[1:], "calls"
        return True

    def _give_back(self, out: list[Event]) -> None:
        """What looked like a call list was text."""
        if not self.num_calls:
            self._buf = self._held + self._buf
            self._held, self._mode = "", "text"
            at = self._buf.find(self.fmt.open, len(self.fmt.open))
            cut = at if at != -1 else len(self._buf) - partial_suffix(self._buf, self.fmt.open)
            if cut > 0:
                out.append(Content(self._buf[:cut]))
                self._buf = self._buf[cut:]
        else:
            self._mode, self._held = "text", ""

    def _calls(self, out: list[Event]) -> bool:
        head = self._buf.lstrip(" \t\r\n,")
        if not head:
            return False
        if head.startswith("]"):
            self._buf, self._mode = head[1:], "close"
            if not self.num_calls:
                self._give_back(out)
            return True
        name = _NAME.match(head)
        if name is None:
            self._give_back(out)
            return True
        if name.end() == len(head):
            return False
        if head[name.end()] != "(":
            self._give_back(out)
            return True
        body = head[name.end() + 1:]
        end = _call_end(body[:_MAX_CALL + 1])
        if end == -1 and len(body) <= _MAX_CALL:
            return False
        try:
            args = arguments_json(body[:end - 1]) if end > 0 else None
        except ValueError:
            args = None
        if args is None:
            self._give_back(out)
            return True
        out.append(CallOpen(self.num_calls, new_call_id(self.fmt.id_length), name.group()))
        out.append(CallArgs(self.num_calls, args))
        self.num_calls += 1
        self._buf = body[end:]
        return True

    def _close(self) -> bool:
        head = self._buf.lstrip()
        close = self.fmt.close
        if not head or close.startswith(head) and head != close:
            return False
        self._buf = head[len(close):] if head.startswith(close) else head
        self._mode = "text"
        return True

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        steps = {"text": self._text, "list": self._list, "calls": self._calls}
        while True:
            changed = self._close() if self._mode == "close" else steps[self._mode](out)
            if not changed:
                return out

    def finish(self, cut: bool = False) -> list[Event]:
        """End of output: release what was held back. ``cut`` (max_tokens ran out): an
        unfinished call is dropped, not text."""
        out: list[Event] = []
        rest, self._buf = self._buf, ""
        if self._mode == "text" and rest and not (cut and self.fmt.open.startswith(rest)):
            out.append(Content(rest))
        elif self._mode in ("list", "calls") and not self.num_calls and not cut:
            out.append(Content(self._held + rest))
        return out
