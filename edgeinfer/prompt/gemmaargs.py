"""Gemma 4 call arguments turned into JSON as they stream.

Gemma 4 writes ``<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>``:
keys bare (or quoted like strings), strings between ``<|"|>`` marks, numbers, booleans,
objects and lists as in JSON. The reader starts after the opening ``{`` (the name's end
marker) and ends at its matching ``}``.
"""

from __future__ import annotations

import json

from edgeinfer.prompt.callparser import partial_suffix

QUOTE = '<|"|>'
_BARE_END = ",:}]"


_PYTHON = {"None": "null", "True": "true", "False": "false"}  # the template's Jinja writes these


def _scalar(word: str) -> str:
    """A bare value as JSON: a JSON literal or finite number as it is (Python's ``None``,
    ``True``, ``False`` as theirs), anything else a string."""
    if word in _PYTHON:
        return _PYTHON[word]
    try:
        value = json.loads(word)
        json.dumps(value, allow_nan=False)  # NaN, Infinity, 1e999: not JSON numbers
    except ValueError:
        return json.dumps(word, ensure_ascii=False)
    if isinstance(value, (dict, list, str)):
        return json.dumps(word, ensure_ascii=False)
    return word


class GemmaArgs:
    """``ArgsReader`` (``edgeinfer.prompt.namedcalls``) of Gemma 4's arguments."""

    def __init__(self) -> None:
        self.stack = ["{"]  # open containers
        self.key_next = True  # in an object, the next item is a key
        self.in_string = False
        self.string_sent = False  # a streamed string's opening quote went out
        self.started = False

    def feed(self, buf: str) -> tuple[str, int, bool]:
        out: list[str] = []
        if not self.started:
            out.append("{")
            self.started = True
        i = 0
        while i < len(buf):
            if self.in_string:
                i = self._string(buf, i, out)
                if self.in_string:
                    return "".join(out), i, False
                continue
            ch = buf[i]
            if ch in " \t\r\n":
                i += 1
            elif buf.startswith(QUOTE, i):
                out.append('"')
                self.in_string = True
                i += len(QUOTE)
            elif QUOTE.startswith(buf[i:]):
                return "".join(out), i, False  # maybe a quote mark, maybe not
            elif ch in "{[":
                self.stack.append(ch)
                self.key_next = ch == "{"
                out.append(ch)
                i += 1
            elif ch in "}]":
                if (ch == "}") != (self.stack[-1] == "{"):
                    raise ValueError("mismatched brackets")
                self.stack.pop()
                out.append(ch)
                i += 1
                if not self.stack:
                    return "".join(out), i, True
            elif ch == ",":
                self.key_next = self.stack[-1] == "{"
                out.append(ch)
                i += 1
            elif ch == ":":
                out.append(ch)
                i += 1
            else:  # a bare key or value: up to the next delimiter
                j = i
                while j < len(buf) and buf[j] not in _BARE_END and not buf.startswith(QUOTE, j):
                    j += 1
                if j == len(buf):
                    return "".join(out), i, False
                word = buf[i:j].strip()
                if self.key_next and self.stack[-1] == "{":
                    out.append(json.dumps(word, ensure_ascii=False))
                    self.key_next = False
                else:
                    out.append(_scalar(word))
                i = j
        return "".join(out), i, False

    def _string(self, buf: str, i: int, out: list[str]) -> int:
        """Pass a string's text on from ``i`` (to its closing mark, if there)."""
        at = buf.find(QUOTE, i)
        end = at if at != -1 else len(buf) - partial_suffix(buf[i:], QUOTE)
        out.append(json.dumps(buf[i:end], ensure_ascii=False)[1:-1])
        if at == -1:
            return end
        out.append('"')
        self.in_string = False
        if self.key_next and self.stack[-1] == "{":
            self.key_next = False
        return end + len(QUOTE)

    def finish(self) -> str:
        return ""
