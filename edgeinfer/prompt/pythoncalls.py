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


def clean_text(value: Any) -> Any:
    """``value`` with the surrogate pairs that JSON's ``\\ud83d\\ude00`` escapes decode to
    joined, and lone surrogates replaced: they cannot be encoded in a response."""
    if isinstance(value, str):
        if any("\ud800" <= ch <= "\udfff" for ch in value):
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return value
    if isinstance(value, list):
        return [clean_text(v) for v in value]
    if isinstance(value, dict):
        return {clean_text(k): clean_text(v) for k, v in value.items()}
    return value


def literal_value(text: str) -> Any:
    """A JSON value from one Python (or JSON) literal's text; ValueError otherwise."""
    if len(text) > _MAX_CALL:
        raise ValueError("too long")
    try:
        tree = ast.parse(text.strip(), mode="eval")
        value = _literal(tree.body)
        json.dumps(value, allow_nan=False)
        return clean_text(value)
    except (SyntaxError, RecursionError, MemoryError) as exc:
        raise ValueError(str(exc)) from None


def _refuse(name: str) -> Any:
    raise ValueError(name)


def any_value(text: str) -> Any:
    """A value written as JSON (what the grammar forces: ``"x\\/y"``, ``true``) or as a
    Python literal (what the model was trained on: ``'x'``, ``True``); ValueError when
    it is neither, or not finite."""
    try:
        value = json.loads(text, parse_constant=_refuse)
        json.dumps(value, allow_nan=False)  # 1e999 parses as inf
        return clean_text(value)
    except (ValueError, RecursionError):
        return literal_value(text)


_KEY = re.compile(r"\s*([^\s=(),'\"\[\]{}]+)\s*=")


class _Scan:
    """Where a call's arguments end, found as they stream: the state of one left-to-right
    pass (string quotes, bracket depth) and the top-level commas seen, kept between feeds,
    so each character is looked at once."""

    def __init__(self) -> None:
        self.pos = 0
        self.depth = 0
        self.quote = ""
        self.escape = False
        self.commas: list[int] = []

    def end(self, text: str, start: int) -> int:
        """Index (from ``start``) just past the ``)`` closing the arguments that begin at
        ``text[start]`` (-1: not written yet; -2: a bracket closes that was never
        opened). Offsets (``pos``, ``commas``) count from ``start``."""
        for i in range(self.pos, min(len(text) - start, _MAX_CALL + 1)):
            ch = text[start + i]
            if self.quote:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == self.quote:
                    self.quote = ""
            elif ch in "'\"":
                self.quote = ch
            elif ch in "([{":
                self.depth += 1
            elif ch in ")]}":
                if self.depth == 0:
                    self.pos = i + 1
                    return i + 1 if ch == ")" else -2
                self.depth -= 1
            elif ch == "," and self.depth == 0:
                self.commas.append(i)
        self.pos = max(self.pos, min(len(text) - start, _MAX_CALL + 1))
        return -1


def arguments_json(args: str, commas: list[int]) -> str:
    """JSON text of a call's keyword arguments (``city='Paris', days=3``; keys as the
    grammar writes them, which need not be Python names: ``from``, ``max-results``),
    split at the top-level ``commas``; ValueError when they are not that."""
    out: dict[str, Any] = {}
    for start, end in zip([-1, *commas], [*commas, len(args)], strict=True):
        piece = args[start + 1:end]
        if not piece.strip():
            if end == len(args):
                continue  # a trailing comma, or no arguments
            raise ValueError("an empty argument")
        key = _KEY.match(piece)
        if key is None:
            raise ValueError("an argument without a name")
        out[clean_text(key.group(1))] = any_value(piece[key.end():])
    return json.dumps(out, ensure_ascii=False)


def _value_text(value: Any) -> str:
    """A value as the grammar writes it: a string as JSON (a Python literal too, which
    reads back whatever it holds; not ``repr``, which would escape the request-text marks
    of ``edgeinfer.prompt.markup``), a dict as JSON, the rest as Python."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
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
    """Incremental parser of ``syntax = "python"`` calls: ``feed`` text, then ``finish``.
    Each character of a call's arguments is scanned once, however it is split."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self.num_calls = 0
        self._buf = ""
        self._mode = "text"  # text | list | calls | close
        self._held = ""  # what this list consumed before its first call (text if none)
        self._in_list = 0  # calls of the current list
        self._scan = _Scan()

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
        self._held, self._in_list = self.fmt.open, 0
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
        self._buf, self._mode, self._scan = head[1:], "calls", _Scan()
        return True

    def _give_back(self, out: list[Event]) -> None:
        """What looked like a call list was text (after calls: the rest is text)."""
        if not self._in_list:
            self._buf = self._held + self._buf
            at = self._buf.find(self.fmt.open, len(self.fmt.open))
            cut = at if at != -1 else len(self._buf) - partial_suffix(self._buf, self.fmt.open)
            if cut > 0:
                out.append(Content(self._buf[:cut]))
                self._buf = self._buf[cut:]
        self._held, self._mode = "", "text"

    def _calls(self, out: list[Event]) -> bool:
        head = self._buf.lstrip(" \t\r\n,")
        if not head:
            return False
        if len(head) < len(self._buf):  # separators, consumed once (the scan keeps offsets)
            self._held += self._buf[:len(self._buf) - len(head)]
            self._buf = head
        if head.startswith("]"):
            if not self._in_list:
                self._give_back(out)
            else:
                self._buf, self._mode = head[1:], "close"
            return True
        name = _NAME.match(head)
        if name is None or name.end() < len(head) and head[name.end()] != "(":
            self._give_back(out)
            return True
        if name.end() == len(head):
            return False
        start = name.end() + 1
        end = self._scan.end(head, start)
        if end == -1 and len(head) - start <= _MAX_CALL:
            return False
        try:
            args = (arguments_json(head[start:start + end - 1], self._scan.commas) if end > 0
                    else None)
        except ValueError:
            args = None
        if args is None:
            self._give_back(out)
            return True
        out.append(CallOpen(self.num_calls, new_call_id(self.fmt.id_length), name.group()))
        out.append(CallArgs(self.num_calls, args))
        self.num_calls += 1
        self._in_list += 1
        self._buf, self._held, self._scan = head[start + end:], "", _Scan()
        return True

    def _close(self) -> bool:
        head = self._buf.lstrip()
        close = self.fmt.close
        if not head or close.startswith(head) and head != close:
            return False
        if head.startswith(close):
            self._buf = head[len(close):]
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
        elif self._mode in ("list", "calls") and not self._in_list and not cut:
            out.append(Content(self._held + rest))
        elif self._mode == "close" and rest.strip() and not self.fmt.close.startswith(
                rest.strip()):
            out.append(Content(rest))
        return out
