"""Call arguments written as tagged parameters, turned into JSON as they stream.

Qwen3-Coder / Qwen3.5 (``args = "xml"``)::

    <parameter=city>
    Paris
    </parameter>

Seed-OSS (``"seed"``) the same without the line breaks inside; GLM 4.5-4.7, Laguna, Ling
and Spark (``"glm"``) ``<arg_key>city</arg_key><arg_value>Paris</arg_value>``; MiniMax M2
(``"minimax"``) ``<parameter name="city">Paris</parameter>``; DeepSeek V3.2 / V4
(``"dsml"``) MiniMax's in ``｜DSML｜`` tags with ``string="true"`` (or ``"false"``) after
the name; MiniCPM5 (``"minicpm5"``) ``<param name="city">Paris</param>``, a value with
``<``, ``&`` or a line break in ``<![CDATA[ ... ]]>``. Each becomes
``{"city": "Paris"}``. A value is a string when its parameter is typed ``string``
(streamed as it arrives); otherwise it is read whole and taken as JSON when it parses
(the templates write objects and lists with ``tojson``), as a string when not.
"""

from __future__ import annotations

import json
from typing import Any

from edgeinfer.prompt.callparser import partial_suffix
from edgeinfer.prompt.pythoncalls import any_value
from edgeinfer.prompt.toolformat import TAGS, Tags


def json_value(text: str, kind: str | None) -> str:
    """A whole parameter value as JSON text, by its parameter's type: a string as written
    (a ``"quoted"`` one without the JSON quotes the grammar wrote), otherwise JSON when it
    parses as finite JSON or a Python literal (Seed-OSS's template writes ``repr``), else
    the text as a string."""
    if kind == "string":
        return json.dumps(text, ensure_ascii=False)
    if kind == "boolean" and text.strip().lower() in ("true", "false"):
        return text.strip().lower()
    value = _parsed(text)
    if kind == "quoted" and not isinstance(value, str):
        value = text
    return json.dumps(text if value is _NOTHING else value, ensure_ascii=False)


_NOTHING = object()
CDATA = "<![CDATA["


def _parsed(text: str) -> Any:
    """``text`` as a finite JSON value, else as a Python literal, else ``_NOTHING``."""
    try:
        return any_value(text)
    except ValueError:
        return _NOTHING


class XmlArgs:
    """``ArgsReader`` (``edgeinfer.prompt.namedcalls``) of tagged parameters."""

    def __init__(self, types: dict[str, str], tags: Tags = TAGS["xml"]) -> None:
        self.types = types
        self.tags = tags
        self.state = "between"  # between | key | open | value
        self.key = ""
        self.emitted = False  # the opening brace went out
        self.value_sent = 0  # characters of a streamed string value already sent
        self.value_start = True  # the value's leading newline may still be skipped
        self.marked: str | None = None  # DSML: "string" or "other", from the marker
        self.close = tags.value_close  # what ends the current value (after a CDATA: "]]>" too)

    def _open(self) -> str:
        text = ", " if self.emitted else "{"
        self.emitted = True
        return text + json.dumps(self.key, ensure_ascii=False) + ": "

    def feed(self, buf: str) -> tuple[str, int, bool]:
        out: list[str] = []
        i = 0
        while True:
            step = {"between": self._between, "key": self._key, "open": self._value_open,
                    "value": self._value}
            i, more, done = step[self.state](buf, i, out)
            if not more:
                return "".join(out), i, done

    def _between(self, buf: str, i: int, out: list[str]) -> tuple[int, bool, bool]:
        """Between parameters: the next one, or the end of the call. (position, go on,
        the arguments ended)."""
        tags = self.tags
        rest = buf[i:]
        head = rest.lstrip(" \t\r\n")
        i += len(rest) - len(head)
        if head.startswith(tags.key_open):
            self.state, self.key = "key", ""
            return i, True, False  # the name is read after the marker
        if head.startswith(tags.end):
            out.append("}" if self.emitted else "{}")
            return i, False, True
        if not head or tags.key_open.startswith(head) or tags.end.startswith(head):
            return i, False, False
        if not self.emitted:
            raise ValueError("not a parameter")
        out.append("}")  # malformed after some parameters: close what we have
        return i, False, True

    def _key(self, buf: str, i: int, out: list[str]) -> tuple[int, bool, bool]:
        """A parameter's name (``i``: at its opening marker). A bad one after good
        parameters ends the arguments there (what follows is text); before any, the
        call has none (ValueError)."""
        start = i + len(self.tags.key_open)
        rest = buf[start:]
        found = [(at, close) for close in self.tags.key_closes if (at := rest.find(close)) != -1]
        at, close = min(found) if found else (-1, "")
        name = rest[:at] if at != -1 else rest[:len(rest) - max(
            partial_suffix(rest, c) for c in self.tags.key_closes)]
        if "<" in name or "\n" in name or len(name) > 256 or at != -1 and not name.strip():
            if not self.emitted:
                raise ValueError("bad parameter name")
            out.append("}")
            self.state = "between"
            return i, False, True
        if at == -1:
            return i, False, False
        self.key = name.strip()
        # DSML's string="true" / "false": the model's own word on the value's type
        self.marked = ("string" if close == self.tags.key_close else "other") if (
            self.tags.key_close_others) else None
        self.state, self.value_sent, self.value_start = "open", 0, True
        self.close = self.tags.value_close
        out.append(self._open())
        return start + at + len(close), True, False

    def _value_open(self, buf: str, i: int, out: list[str]) -> tuple[int, bool, bool]:
        marker = self.tags.value_open
        if marker:
            rest = buf[i:]
            head = rest.lstrip(" \t\r\n")
            if not head or marker.startswith(head) and head != marker:
                return i, False, False
            if head.startswith(marker):
                i += len(rest) - len(head) + len(marker)
        self.state = "value"
        return i, True, False

    def _value(self, buf: str, i: int, out: list[str]) -> tuple[int, bool, bool]:
        tags = self.tags
        rest = buf[i:]
        if self.value_start and tags.newlines:
            if not rest:
                return i, False, False
            if rest.startswith("\n"):
                i, rest = i + 1, rest[1:]
        if self.value_start and tags.cdata:
            if CDATA.startswith(rest):
                return i, False, False  # perhaps a CDATA section: wait for more
            if rest.startswith(CDATA):  # text (the template writes CDATA for strings only)
                i, rest, self.close = i + len(CDATA), rest[len(CDATA):], "]]>" + tags.value_close
                self.marked = "string"
        self.value_start = False
        streamed = self._kind() == "string"
        close = self.close
        at = rest.find(close)
        if at == -1:
            if streamed:
                ends = [close] + (["\n" + close] if tags.newlines else [])
                keep = max(partial_suffix(rest, e) for e in ends)
                piece = rest[:len(rest) - keep]
                if piece:
                    text = json.dumps(piece, ensure_ascii=False)[:-1]
                    out.append(text[1:] if self.value_sent else text)
                    self.value_sent += len(piece)
                    i += len(piece)
            return i, False, False
        value = rest[:at]
        if tags.newlines and value.endswith("\n"):
            value = value[:-1]
        if streamed:
            text = json.dumps(value, ensure_ascii=False)
            out.append(text[1:] if self.value_sent else text)
        else:
            out.append(json_value(value, self._kind()))
        self.state = "between"
        return i + at + len(close), True, False

    def _kind(self) -> str | None:
        """The current value's type: its parameter's, else what DSML's marker says."""
        kind = self.types.get(self.key)
        if self.marked == "string" and kind in (None, "quoted"):  # (Kimi K3 writes every
            return "string"  # string raw, type="string": a pattern's too)
        return kind

    def finish(self) -> str:
        """The output ended after whole parameters without the call's end: close the
        object. Cut inside a parameter: nothing (the arguments stay unfinished JSON)."""
        return "}" if self.state == "between" and self.emitted else ""
