"""gpt-oss's Harmony output read as it streams: reasoning, answer and tool calls.

After the generation prompt ``<|start|>assistant`` the model writes messages, each a
header and a body::

    <|channel|>analysis<|message|>Let me think.<|end|>
    <|start|>assistant<|channel|>final<|message|>It is 21 C.<|return|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json
    <|message|>{"city": "Paris"}<|call|>

(one line in the output)

(``to=functions.NAME`` may also stand before ``<|channel|>``). ``analysis`` bodies are
reasoning, ``final`` bodies (and ``commentary`` without a recipient) the answer, and a
body addressed ``to=functions.NAME`` is a call's JSON arguments. ``<|call|>`` and
``<|return|>`` end generation, so a body may also end with the output. Output that is
not Harmony at all is answer text.
"""

from __future__ import annotations

import re

from edgeinfer.prompt.callparser import (
    CallArgs,
    CallOpen,
    Content,
    cut_call_name,
    new_call_id,
    partial_suffix,
)
from edgeinfer.prompt.reasoning import Thought

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"to=functions\.([A-Za-z0-9_.:-]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_MAX_HEADER = 512

Event = Thought | Content | CallOpen | CallArgs


class HarmonyParser:
    """Incremental reader of Harmony messages: ``feed`` text, then ``finish``."""

    def __init__(self, names: frozenset[str] = frozenset()) -> None:
        self.names = names  # the offered tools' (a header cut off after one is a call)
        self.num_calls = 0
        self._buf = ""
        self._mode = "header"  # header | body | text
        self._kind = ""  # the body being read: thought | answer | call

    def _header(self, out: list[Event]) -> bool:
        buf = self._buf.lstrip(" \t\r\n")
        if not buf:
            return False
        if not (buf.startswith((START, CHANNEL, "to=")) or START.startswith(buf)
                or CHANNEL.startswith(buf) or "to=".startswith(buf)):
            self._mode = "text"  # not Harmony: plain answer text
            return True
        at = buf.find(MESSAGE)
        if at == -1:
            if len(buf) > _MAX_HEADER:
                self._mode = "text"
                return True
            return False
        header = buf[:at]
        self._buf = buf[at + len(MESSAGE):]
        recipient = _RECIPIENT.search(header)
        channel = _CHANNEL.search(header)
        name = channel.group(1) if channel else ""
        if recipient:
            out.append(CallOpen(self.num_calls, new_call_id(), recipient.group(1)))
            self._kind = "call"
        else:
            self._kind = "thought" if name == "analysis" else "answer"
        self._mode = "body"
        return True

    def _body(self, out: list[Event]) -> bool:
        buf = self._buf
        hits = [(buf.find(m), m) for m in (*ENDS, START) if m in buf]
        if hits:
            at, marker = min(hits)
            self._emit(out, buf[:at])
            self._buf = buf[at + (0 if marker == START else len(marker)):]
            self._end_body(out)
            self._mode = "header"
            return True
        keep = max(partial_suffix(buf, m) for m in (*ENDS, START))
        self._emit(out, buf[:len(buf) - keep])
        self._buf = buf[len(buf) - keep:]
        return False

    def _emit(self, out: list[Event], text: str) -> None:
        if not text:
            return
        if self._kind == "call":
            out.append(CallArgs(self.num_calls, text))
        elif self._kind == "thought":
            out.append(Thought(text))
        else:
            out.append(Content(text))

    def _end_body(self, out: list[Event]) -> None:
        if self._kind == "call":
            self.num_calls += 1
        self._kind = ""

    def _cut_name(self, header: str) -> str:
        """The offered tool an unfinished ``header`` addresses, when its name is whole
        (something follows it, or no other offered name goes on from it); else ""."""
        found = _RECIPIENT.search(header)
        return "" if found is None else cut_call_name(found.group(1), self.names,
                                                      found.end() < len(header))

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while True:
            if self._mode == "text":
                if self._buf:
                    out.append(Content(self._buf))
                    self._buf = ""
                return out
            changed = self._header(out) if self._mode == "header" else self._body(out)
            if not changed:
                return out

    def finish(self, cut: bool = False) -> list[Event]:
        """End of output (``<|call|>`` / ``<|return|>`` end generation unseen). An
        unfinished header is dropped, and so is the start of one when the output was
        ``cut`` (max_tokens)."""
        out: list[Event] = []
        rest, self._buf = self._buf, ""
        if self._mode == "body":
            self._emit(out, rest)
            self._end_body(out)
        elif cut and self._mode == "header" and (name := self._cut_name(rest)):
            out.append(CallOpen(self.num_calls, new_call_id(), name))  # arguments "":
            self.num_calls += 1  # the output ran out before them, as OpenAI's cut call
        elif rest.strip() and not rest.lstrip().startswith((START, CHANNEL, "to=")) and not (
                cut and any(m.startswith(rest.lstrip()) for m in (START, CHANNEL, "to="))):
            out.append(Content(rest))  # an unfinished header is dropped
        return out
