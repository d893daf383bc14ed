"""Qwen3-Coder / Qwen3.5 call arguments, XML parameters turned into JSON as they stream::

    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>

becomes ``{"city": "Paris", "days": 3}``. A value is a string when its parameter is typed
``string`` (streamed as it arrives); otherwise it is read whole and taken as JSON when it
parses (the templates write objects and lists with ``tojson``), as a string when not.
"""

from __future__ import annotations

import json

from edgeinfer.prompt.callparser import partial_suffix

PARAM_OPEN = "<parameter="
PARAM_CLOSE = "</parameter>"
FUNCTION_CLOSE = "</function>"
_VALUE_END = "\n" + PARAM_CLOSE


def json_value(text: str, kind: str | None) -> str:
    """A whole parameter value as JSON text, by its parameter's type."""
    if kind == "string":
        return json.dumps(text, ensure_ascii=False)
    if kind == "boolean" and text.strip().lower() in ("true", "false"):
        return text.strip().lower()
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        return json.dumps(text, ensure_ascii=False)


class XmlArgs:
    """``ArgsReader`` (``edgeinfer.prompt.namedcalls``) of Qwen3-Coder's parameters."""

    def __init__(self, types: dict[str, str]) -> None:
        self.types = types
        self.state = "between"  # between | key | value
        self.key = ""
        self.emitted = False  # the opening brace went out
        self.value_sent = 0  # characters of a streamed string value already sent
        self.value_start = True  # the value's leading newline may still be skipped

    def _open(self) -> str:
        text = ", " if self.emitted else "{"
        self.emitted = True
        return text + json.dumps(self.key, ensure_ascii=False) + ": "

    def feed(self, buf: str) -> tuple[str, int, bool]:
        out: list[str] = []
        i = 0
        while True:
            step = {"between": self._between, "key": self._key, "value": self._value}
            i, more, done = step[self.state](buf, i, out)
            if not more:
                return "".join(out), i, done

    def _between(self, buf: str, i: int, out: list[str]) -> tuple[int, bool, bool]:
        """Between parameters: the next one, or the end of the call. (position, go on,
        the arguments ended)."""
        rest = buf[i:]
        head = rest.lstrip(" \t\r\n")
        i += len(rest) - len(head)
        if head.startswith(PARAM_OPEN):
            self.state, self.key = "key", ""
            return i + len(PARAM_OPEN), True, False
        if head.startswith(FUNCTION_CLOSE):
            out.append("}" if self.emitted else "{}")
            return i, False, True
        if not head or PARAM_OPEN.startswith(head) or FUNCTION_CLOSE.startswith(head):
            return i, False, False
        if not self.emitted:
            raise ValueError("not a parameter")
        out.append("}")  # malformed after some parameters: close what we have
        return i, False, True

    def _key(self, buf: str, i: int, out: list[str]) -> tuple[int, bool, bool]:
        rest = buf[i:]
        at = rest.find(">")
        if at == -1:
            if "<" in rest or "\n" in rest:
                raise ValueError("bad parameter name")
            return i, False, False
        self.key = rest[:at].strip()
        self.state, self.value_sent, self.value_start = "value", 0, True
        out.append(self._open())
        return i + at + 1, True, False

    def _value(self, buf: str, i: int, out: list[str]) -> tuple[int, bool, bool]:
        rest = buf[i:]
        if self.value_start:
            if not rest:
                return i, False, False
            if rest.startswith("\n"):
                i, rest = i + 1, rest[1:]
            self.value_start = False
        streamed = self.types.get(self.key) == "string"
        at = rest.find(PARAM_CLOSE)
        if at == -1:
            if streamed:
                keep = max(partial_suffix(rest, _VALUE_END), partial_suffix(rest, PARAM_CLOSE))
                piece = rest[:len(rest) - keep]
                if piece:
                    text = json.dumps(piece, ensure_ascii=False)[:-1]
                    out.append(text[1:] if self.value_sent else text)
                    self.value_sent += len(piece)
                    i += len(piece)
            return i, False, False
        value = rest[:at]
        if value.endswith("\n"):
            value = value[:-1]
        if streamed:
            text = json.dumps(value, ensure_ascii=False)
            out.append(text[1:] if self.value_sent else text)
        else:
            out.append(json_value(value, self.types.get(self.key)))
        self.state = "between"
        return i + at + len(PARAM_CLOSE), True, False

    def finish(self) -> str:
        """The output ended after whole parameters without ``</function>``: close the
        object. Cut inside a parameter: nothing (the arguments stay unfinished JSON)."""
        return "}" if self.state == "between" and self.emitted else ""
