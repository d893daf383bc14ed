"""Tool calls out of generated text as it streams, in any JSON tool-call format
(``edgeinfer.prompt.toolformat``).

The parser reads the text once, character by character inside calls: it knows where
each call's name and arguments begin and end from the JSON itself (strings, escapes,
nesting), so it announces a call as soon as its name is complete and passes its
arguments on in fragments as they arrive, with nothing held back but a partial
marker in free text. Text that is not a well-formed call stays text.
"""

from __future__ import annotations

import json
import secrets
import string
import uuid
from collections.abc import Collection
from dataclasses import dataclass

from edgeinfer.prompt.toolformat import ToolFormat

_ALNUM = string.ascii_letters + string.digits


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


def new_call_id(length: int = 0) -> str:
    """A call id: ``call_`` and 24 hex digits, or ``length`` letters and digits."""
    if length:
        return "".join(secrets.choice(_ALNUM) for _ in range(length))
    return "call_" + uuid.uuid4().hex[:24]


def cut_call_name(name: str, offered: Collection[str], followed: bool) -> str:
    """(The output ran out after a call's name, before its arguments) ``name`` when it is an
    offered tool's and whole: something ``followed`` it, or no other offered name goes on
    from it; else ""."""
    if name not in offered:
        return ""
    longer = any(n != name and n.startswith(name) for n in offered)
    return name if followed or not longer else ""


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class _Object:
    """The scan of one call object ``{"name": ..., "<args key>": ..., ...}``: where its
    name and arguments are. Only depth 1 (the object's own keys) is interpreted."""

    def __init__(self, args_key: str, name_key: str = "name", keyed: bool = False) -> None:
        self.args_key = args_key
        self.name_key = name_key
        self.keyed = keyed  # {NAME: ARGUMENTS}: the first key is the name
        self.pos = 1  # the text starts with "{"
        self.depth = 1
        self.in_string = False
        self.escape = False
        self.string_start = -1  # where the current depth-1 string began
        self.expect = "key"  # key | colon | value | next (after a value)
        self.key = ""
        self.value_start = -1
        self.name: str | None = None
        self.args_start = -1
        self.args_end = -1
        self.done = False

    def scan(self, buf: str) -> None:
        """Advance over the characters of ``buf`` not seen yet."""
        while self.pos < len(buf) and not self.done:
            self._char(buf, buf[self.pos])
            self.pos += 1

    def _char(self, buf: str, ch: str) -> None:
        if self.in_string:
            if self.escape:
                self.escape = False
            elif ch == "\\":
                self.escape = True
            elif ch == '"':
                self.in_string = False
                if self.depth == 1:
                    self._string(buf[self.string_start:self.pos + 1])
            return
        if self.depth == 1 and self.expect == "value" and ch not in " \t\n\r":
            if self.keyed and self.key == self.name and ch != "{":
                self.name = None  # Apertus: the name's value must be the arguments object
            self.value_start = self.pos
            if self.args_start < 0 and (self.key == self.name if self.keyed
                                        else self.key == self.args_key):
                self.args_start = self.pos
            self.expect = "next"
        if ch == '"':
            self.in_string = True
            if self.depth == 1:
                self.string_start = self.pos
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            if self.depth == 1 and self.args_start >= 0 and self.args_end < 0:
                self.args_end = self.pos + 1  # the arguments object (or list) closed
            if self.depth == 0:
                self._value_ends()
                self.done = True
        elif ch == ":" and self.depth == 1 and self.expect == "colon":
            self.expect = "value"
        elif ch == "," and self.depth == 1:
            self._value_ends()
            self.expect = "key"

    def _string(self, text: str) -> None:
        """A depth-1 string ended: a key, or a key's value."""
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if self.expect == "key":
            self.key, self.expect = (value if isinstance(value, str) else ""), "colon"
            if self.keyed and self.name is None and self.key:
                self.name = self.key
        elif self.key == self.name_key and isinstance(value, str) and value and (
                self.name is None):
            self.name = value

    def _value_ends(self) -> None:
        if self.args_start >= 0 and self.args_end < 0:
            self.args_end = self.pos


class CallParser:
    """Incremental parser: ``feed`` text, then ``finish`` at the end of the output."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self.num_calls = 0
        self._buf = ""
        self._mode = "text"  # text | calls | object
        self._at_start = True  # nothing but blanks seen yet (for bare calls)
        self._opened = ""  # the marker that opened the current calls
        self._calls_before = 0  # calls parsed before that marker
        self._declined = False  # (Command R+) the marker's calls were the decline alone
        self._obj: _Object | None = None
        self._sent = 0  # arguments characters of the current call already released
        self._announced = False
        self._after_close = False  # line breaks right after the calls' closing marker go

    @property
    def _none_yet(self) -> bool:
        """The marker that opened the current calls opened none yet (nor a decline)."""
        return self.num_calls == self._calls_before and not self._declined

    # -- free text ------------------------------------------------------------------
    def _text(self, out: list[Event]) -> bool:
        """Release text up to a call; True when a call starts (the mode changed)."""
        if self._after_close:  # (streamed or whole alike: they may come later)
            self._buf = self._buf.lstrip("\n")
            if not self._buf:
                return False
            self._after_close = False
        fmt, buf = self.fmt, self._buf
        if self._at_start and fmt.bare:
            head = buf.lstrip()
            if not head:
                return False
            self._at_start = False
            if head.startswith("{"):
                self._buf, self._mode, self._opened = head, "calls", ""
                self._calls_before, self._declined = self.num_calls, False
                return True
        at = buf.find(fmt.open) if fmt.open else -1
        if at == -1:
            cut = len(buf) - (partial_suffix(buf, fmt.open) if fmt.open else 0)
            if cut:
                out.append(Content(buf[:cut]))
            self._buf = buf[cut:]
            return False
        if at:
            out.append(Content(buf[:at]))
        self._buf, self._mode, self._opened = buf[at + len(fmt.open):], "calls", fmt.open
        self._calls_before, self._declined = self.num_calls, False
        return True

    # -- between calls --------------------------------------------------------------
    def _between(self, out: list[Event]) -> bool:
        """Skip what separates calls; True when the mode changed."""
        fmt = self.fmt
        buf = self._buf.lstrip(" \t\n\r,;")
        if fmt.listed and buf.startswith("["):
            buf = buf[1:].lstrip()
        if buf.startswith("{"):
            if self.num_calls == self._calls_before:  # kept, should this not be a call
                self._opened += self._buf[:len(self._buf) - len(buf)]
            self._obj = _Object(fmt.args_key, fmt.name_key, fmt.keyed)
            self._buf, self._mode = buf, "object"
            self._sent, self._announced = 0, False
            return True
        if fmt.listed and buf.startswith("]"):  # then the closing marker, where there is one
            rest = buf[1:]
            head = rest.lstrip()
            if fmt.close and (not head or fmt.close.startswith(head) and head != fmt.close):
                return False  # more to come (maybe the closing marker)
            if fmt.close and head.startswith(fmt.close):
                rest = head[len(fmt.close):]
            self._buf, self._mode = rest, "text"
            return True
        if fmt.close and buf.startswith(fmt.close):
            rest = buf[len(fmt.close):]
            if self._none_yet:  # an empty pair: text, as written
                out.append(Content(self._opened + self._buf[:len(self._buf) - len(buf)]
                                   + fmt.close))
            else:
                self._after_close = True
            self._buf, self._mode = rest, "text"
            return True
        if not buf or fmt.close.startswith(buf) or buf == "[":
            return False  # more to come (maybe the closing marker)
        if self._none_yet:  # the marker opened no call: it was text
            out.append(Content(self._opened + self._buf[:len(self._buf) - len(buf)]))
        self._buf, self._mode = buf, "text"
        return True

    def _object(self, out: list[Event]) -> bool:
        """Scan the current call; emit its opening and arguments; True when it ended."""
        o = self._obj
        assert o is not None
        o.scan(self._buf)
        if o.name is not None and o.name == self.fmt.decline:  # (Command R+) no call
            if o.done:
                self._buf, self._mode, self._obj = self._buf[o.pos:], "calls", None
                self._declined = True
            return o.done
        if o.name is not None and not self._announced and (o.args_start >= 0 or o.done):
            out.append(CallOpen(self.num_calls, new_call_id(self.fmt.id_length), o.name))
            self._announced = True
        if self._announced and o.args_start >= 0:
            end = o.args_end if o.args_end >= 0 else o.pos
            value = self._buf[o.args_start:end]
            if o.args_end >= 0:
                value = value.rstrip()
            if len(value) > self._sent:
                out.append(CallArgs(self.num_calls, value[self._sent:]))
                self._sent = len(value)
        if not o.done:
            return False
        rest = self._buf[o.pos:]
        self._obj = None
        if not self._announced:  # no name: not a call, and what follows is text
            out.append(Content(self._opened + self._buf[:o.pos]))
            self._buf, self._mode = rest, "text"
            return True
        if o.args_start < 0:
            out.append(CallArgs(self.num_calls, "{}"))
        self.num_calls += 1
        self._buf, self._mode = rest, "calls"
        return True

    # -- the public side ------------------------------------------------------------
    def feed(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while True:
            if self._mode == "text":
                changed = self._text(out)
            elif self._mode == "calls":
                changed = self._between(out)
            else:
                changed = self._object(out)
            if not changed:
                return out

    def _tail(self, rest: str) -> str:
        """What is left after calls, without a listed format's closing ``]``."""
        tail = rest.strip()
        return tail[1:].lstrip() if self.fmt.listed and tail.startswith("]") else tail

    def finish(self, cut: bool = False) -> list[Event]:
        """End of output: release what was held back (an unfinished call's arguments
        go on as they are; its JSON will not parse). ``cut``: the output ran out
        (max_tokens), so a marker, or the start of one, that opened no call yet is not
        text: the model was writing a call."""
        out: list[Event] = []
        rest, self._buf = self._buf, ""
        o = self._obj
        if cut and (self._mode == "calls" and self._none_yet
                    or self._mode == "text" and self.fmt.open.startswith(rest)):
            pass
        elif (self._mode == "text" and self.fmt.message_end and rest.strip()
              and rest.startswith(self.fmt.message_end) and self.fmt.open.startswith(rest)):
            pass  # the end of the model's message (GigaChat's), not text
        elif self._mode == "object" and o is not None and self._announced:
            if o.args_start >= 0 and len(rest) - o.args_start > self._sent:
                out.append(CallArgs(self.num_calls, rest[o.args_start + self._sent:]))
            self.num_calls += 1
        elif (self._mode == "object" and o is not None and cut and o.name is not None
              and o.name != self.fmt.decline):  # cut off after its name: a call, as OpenAI
            out.append(CallOpen(self.num_calls, new_call_id(self.fmt.id_length), o.name))
            self.num_calls += 1  # (its arguments "": the output ran out before them)
        elif self._mode == "object" and self._opened:
            pass  # a call cut off before its name: not text (the output ran out in it)
        elif self._mode != "text" and self._none_yet:
            out.append(Content(self._opened + rest))
        elif self._mode == "calls" and self.fmt.close.startswith(self._tail(rest)):
            pass  # after calls, the start of the closing marker (the output ran out in it)
        elif rest.strip() or (self._mode == "text" and rest):
            out.append(Content(rest))
        return out
