"""Tool calls whose function name stands outside the arguments, as it streams.

The formats (``edgeinfer.prompt.toolformat``, ``syntax = "named"``) write each call as

    [block open] call_open NAME name_end ARGUMENTS call_close [block close]

for instance Mistral v11's ``[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}``,
DeepSeek V3.1's ``<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``,
Qwen3-Coder's ``<function=get_weather>`` with ``<parameter=...>`` arguments and Gemma 4's
``<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>``. The arguments are
read by an ``ArgsReader`` of the format's kind (JSON, Qwen3-Coder XML, Gemma 4), which
turns them into JSON text as they arrive. Events are the ones of
``edgeinfer.prompt.callparser``; text that is not a well-formed call stays text.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from edgeinfer.prompt.callparser import (
    CallArgs,
    CallOpen,
    Content,
    Event,
    cut_call_name,
    new_call_id,
    partial_suffix,
)
from edgeinfer.prompt.reasoning import Thought
from edgeinfer.prompt.toolformat import TAGS, ToolFormat

Read = Event | Thought  # (Muse Glimmer's messages to itself are reasoning)
_NAME = re.compile(r"[A-Za-z0-9_.:-]*")
_RECIPIENT = re.compile(r"to=[^<\s]{0,128}")  # (Muse Glimmer) a message header's recipient
_MAX_NAME = 128


class ArgsReader(Protocol):
    """Reads one call's arguments from the text after the name's end marker."""

    def feed(self, buf: str) -> tuple[str, int, bool]:
        """(JSON text produced, characters of ``buf`` consumed, whether the arguments
        ended). Raises ValueError when ``buf`` cannot be arguments."""
        ...

    def finish(self) -> str:
        """The JSON text still held back when the output ends mid-arguments."""
        ...


class JsonArgs:
    """A JSON object, passed on as written."""

    def __init__(self, fence: str = "") -> None:
        self.started = False
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.fence = fence  # text allowed before the object (``json\n`` fences)

    def feed(self, buf: str) -> tuple[str, int, bool]:
        i = 0
        if not self.started:
            head = buf.lstrip(" \t\r\n")
            skipped = len(buf) - len(head)
            if not head:
                return "", skipped, False
            if head[0] != "{":
                raise ValueError("arguments are not a JSON object")
            self.started, i = True, skipped
        start = i
        while i < len(buf):
            ch = buf[i]
            i += 1
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return buf[start:i], i, True
        return buf[start:i], i, False

    def finish(self) -> str:
        return ""


def make_args_reader(fmt: ToolFormat, name: str, types: dict[str, dict[str, str]],
                     schemas: dict[str, dict[str, Any]] | None = None) -> ArgsReader:
    """The reader of ``fmt``'s arguments for a call of ``name`` (``types``: each tool's
    parameter types, which the XML format needs to tell ``"7"`` from ``7``)."""
    from edgeinfer.prompt.xmlargs import XmlArgs
    if fmt.args in TAGS:
        return XmlArgs(types.get(name, {}), TAGS[fmt.args])
    if fmt.args == "nested":
        from edgeinfer.prompt.nestedargs import NestedArgs
        return NestedArgs(types.get(name, {}), fmt.call_close, (schemas or {}).get(name))
    if fmt.args == "gemma":
        from edgeinfer.prompt.gemmaargs import GemmaArgs
        return GemmaArgs()
    return JsonArgs()


class NamedCallParser:
    """Incremental parser for ``syntax = "named"`` formats: ``feed`` text, then
    ``finish`` at the end of the output."""

    def __init__(self, fmt: ToolFormat, types: dict[str, dict[str, str]] | None = None,
                 schemas: dict[str, dict[str, Any]] | None = None) -> None:
        self.fmt = fmt
        self.types = types or {}
        self.schemas = schemas or {}  # each tool's parameters schema (MiniMax M3 reads it)
        self.num_calls = 0
        self._buf = ""
        # text | header | between | id | name | rest | args | close (where the prompt
        # opened a call: Functionary's output starts with a name, Muse Glimmer's in a header)
        self._mode = ("header" if fmt.messages else "name") if fmt.prompt_opens else "text"
        self._pending = False  # (text_name formats) a call's name read, its "{" not yet
        self._recipient = ""  # (Muse Glimmer) of the message being read
        self._ended = False  # markup that ends a message was the last thing read
        self._held = ""  # markers consumed since the text (given back if no call follows)
        self._name = ""
        self._reader: ArgsReader | None = None
        self._openers = [m for m in (fmt.block_open, fmt.call_open) if m]
        self._after_close = False

    # -- free text ------------------------------------------------------------------
    def _said(self, text: str) -> Content | Thought:
        """Text of the message being read: reasoning in a message to ``thought_to``."""
        to = self.fmt.thought_to
        return Thought(text) if to and self._recipient == to else Content(text)

    def _text(self, out: list[Read]) -> bool:
        if self._after_close:  # line breaks right after the calls go (whole or streamed)
            self._buf = self._buf.lstrip("\n")
            if not self._buf:
                return False
            self._after_close = False
        openers = () if self._recipient in ("user", "self") else self._openers  # (markup
        # quoted in an answer or reasoning message is text)
        buf, marks = self._buf, (*openers, *self.fmt.noise, *self.fmt.messages[1:2])
        hits = [(buf.find(m), m) for m in marks if m in buf]
        if not hits:
            keep = max(partial_suffix(buf, m) for m in marks)
            if len(buf) > keep:
                out.append(self._said(buf[:len(buf) - keep]))
                self._ended = False
            self._buf = buf[len(buf) - keep:]
            return False
        at, mark = min(hits, key=lambda h: (h[0], -len(h[1])))
        if at:
            out.append(self._said(buf[:at]))
        if mark in self.fmt.noise:  # Kimi K3's tags around the answer: dropped
            self._buf, self._ended = buf[at + len(mark):], True
            return True
        if mark in self.fmt.messages:  # a message header opens (Muse Glimmer)
            self._buf, self._mode, self._recipient = buf[at + len(mark):], "header", ""
            return True
        self._buf, self._mode, self._held = buf[at:], "between", ""
        return True

    def _header(self, out: list[Read]) -> bool:
        """(Muse Glimmer) A message header: `` to=RECIPIENT<|message|>`` (or ``<|message|>``
        alone: no recipient), dropped; what does not read as one is text."""
        close = self.fmt.messages[2]
        head = self._buf.lstrip(" \t\r\n")
        found = _RECIPIENT.match(head)
        rest = head[found.end():].lstrip(" ") if found is not None else head
        if not rest or close.startswith(rest) and rest != close or (
                found is None and "to=".startswith(head)):
            return False  # more to come
        self._mode = "text"
        if rest.startswith(close):
            self._buf = rest[len(close):]
            self._recipient = found.group()[3:] if found is not None else ""
        return True

    def _between(self, out: list[Read]) -> bool:
        fmt = self.fmt
        stripped = self._buf.lstrip(" \t\r\n")
        self._held += self._buf[:len(self._buf) - len(stripped)]
        self._buf = buf = stripped
        for marker in (fmt.call_open, fmt.block_open, fmt.block_close):
            if marker and buf.startswith(marker):
                self._held += marker
                self._buf = buf[len(marker):]
                self._mode = ("id" if fmt.id_first else "name") if (
                    marker == fmt.call_open) else "between"
                self._name = ""
                if marker == fmt.block_close:
                    self._mode, self._held, self._after_close = "text", "", True
                    if not self.num_calls:
                        out.append(Content(fmt.block_open + fmt.block_close))
                return True
        if not buf or any(m.startswith(buf) for m in
                          (fmt.call_open, fmt.block_open, fmt.block_close) if m):
            return False  # more to come
        self._give_back(out)
        return True

    def _give_back(self, out: list[Read]) -> None:
        """What looked like the start of calls was text."""
        if self._held and (not self.num_calls or self.fmt.text_name):  # (Functionary's
            out.append(Content(self._held))  # held ">>>" is text, after calls too)
        self._held, self._mode = "", "text"

    def _name_end(self, buf: str) -> int:
        """Where the name in ``buf`` ends (-1: not yet known). A format without a
        ``name_end`` marker (GLM) ends it at the first character a name cannot hold."""
        if self.fmt.name_end:
            return buf.find(self.fmt.name_end)
        head = _NAME.match(buf)
        return head.end() if head is not None and head.end() < len(buf) else -1

    def _read_id(self, out: list[Read]) -> bool:
        """Solar Open: the call's id before its name (not kept: calls get fresh ids)."""
        fmt, buf = self.fmt, self._buf
        at = buf.find(fmt.id_marker)
        head = buf[:at] if at != -1 else buf[:len(buf) - partial_suffix(buf, fmt.id_marker)]
        if _NAME.fullmatch(head) is None or len(head) > _MAX_NAME:
            self._give_back(out)
            return True
        if at == -1:
            return False
        self._held += buf[:at + len(fmt.id_marker)]
        self._buf, self._mode = buf[at + len(fmt.id_marker):], "name"
        return True

    def _read_name(self, out: list[Read]) -> bool:
        fmt, buf = self.fmt, self._buf
        at = self._name_end(buf)
        name = buf[:at] if at != -1 else buf[:len(buf) - partial_suffix(buf, fmt.name_end)]
        if fmt.id_marker and not fmt.id_first:  # the id the model wrote is not kept
            name = name.split(fmt.id_marker, 1)[0]
            if at == -1:
                name = name[:len(name) - partial_suffix(name, fmt.id_marker)]
        bad_end = not fmt.name_end and at != -1 and buf[at] not in "\r\n<"
        if (_NAME.fullmatch(name.strip()) is None or bad_end
                or len(name) > _MAX_NAME + len(fmt.name_prefix)
                or fmt.text_name and not self._offered(name.strip(), at != -1)):
            self._give_back(out)  # not a call: the markers and what follows are text
            return True
        if at == -1:
            return False
        self._name = name.strip().removeprefix(fmt.name_prefix)
        if fmt.text_name and self._name == fmt.text_name:  # Functionary's "all": text
            self._buf, self._mode, self._held = buf[at + len(fmt.name_end):], "text", ""
            return True
        if not self._name:
            self._give_back(out)
            return True
        if fmt.text_name:  # (Functionary) a call only once its arguments open
            self._held += buf[:at + len(fmt.name_end)]
            self._pending = True
        else:
            out.append(CallOpen(self.num_calls, new_call_id(fmt.id_length), self._name))
        self._buf = buf[at + len(fmt.name_end):]
        self._reader = make_args_reader(fmt, self._name, self.types, self.schemas)
        self._mode = "rest" if fmt.name_rest else "args"
        self._held = self._held if self._pending else ""
        return True

    def _cut_name(self, buf: str) -> str:
        """(The output ran out while a name was read) the offered tool ``buf`` names, when
        it is whole: no other offered name goes on from it, unless a marker after it
        began. "" when there is none (Functionary's names may be text: none there)."""
        fmt = self.fmt
        if fmt.text_name:
            return ""
        held = partial_suffix(buf, fmt.name_end) if fmt.name_end else 0
        name = buf[:len(buf) - held]
        if fmt.id_marker and not fmt.id_first:
            name, *tail = name.split(fmt.id_marker, 1)
            held = held or len(tail)
        return cut_call_name(name.strip().removeprefix(fmt.name_prefix), self.types, held > 0)

    def _offered(self, name: str, whole: bool) -> bool:
        """(Formats whose free text may look like a call: Functionary's ``>>>WORD``) whether
        ``name`` is, or while ``whole`` is false may become, an offered tool's name or the
        text's recipient."""
        names = (*self.types, self.fmt.text_name)
        return name in names if whole else any(n.startswith(name) for n in names)

    def _opens(self, out: list[Read]) -> bool | None:
        """(A pending call) True: its JSON arguments open, the call is announced; False:
        they do not, the name and what follows are text; None: not known yet."""
        head = self._buf.lstrip(" \t\r\n")
        if not head:
            return None
        self._pending = False
        if head[0] == "{":
            out.append(CallOpen(self.num_calls, new_call_id(self.fmt.id_length), self._name))
            return True
        self._give_back(out)
        self._reader = None
        return False

    def _rest(self, out: list[Read]) -> bool:
        """Kimi K3: the call's header after its name (attributes), up to ``name_rest``."""
        at = self._buf.find(self.fmt.name_rest)
        if at == -1 and len(self._buf) > _MAX_NAME:  # no header: a call without arguments
            out.append(CallArgs(self.num_calls, "{}"))
            self.num_calls += 1
            self._mode, self._reader = "text", None
            return True
        if at == -1:
            return False
        self._buf, self._mode = self._buf[at + len(self.fmt.name_rest):], "args"
        return True

    def _args(self, out: list[Read]) -> bool:
        assert self._reader is not None
        if self._pending and not self._opens(out):
            return self._mode == "text"
        try:
            text, used, done = self._reader.feed(self._buf)
        except ValueError:  # not arguments: the call has none, what follows is text
            out.append(CallArgs(self.num_calls, "{}"))
            self.num_calls += 1
            self._mode, self._reader = "text", None
            return True
        if text:
            out.append(CallArgs(self.num_calls, text))
        self._buf = self._buf[used:]
        if not done:
            return False
        self.num_calls += 1
        self._reader = None
        self._mode = "close"
        return True

    def _close(self) -> bool:
        close = self.fmt.call_close.lstrip(" \t\r\n")
        if close:
            head = self._buf.lstrip(" \t\r\n")
            if not head or (close.startswith(head) and head != close):
                return False
            if head.startswith(close):
                self._buf = head[len(close):]
        self._mode, self._held = "between", ""
        return True

    # -- the public side ------------------------------------------------------------
    def feed(self, text: str) -> list[Read]:
        self._buf += text
        out: list[Read] = []
        steps = {"text": self._text, "header": self._header, "between": self._between,
                 "id": self._read_id,
                 "name": self._read_name, "rest": self._rest, "args": self._args}
        while True:
            changed = self._close() if self._mode == "close" else steps[self._mode](out)
            if not changed:
                return out

    def finish(self, cut: bool = False) -> list[Read]:
        """End of output: release what was held back. ``cut``: the output ran out
        (max_tokens), so markers, or the start of one, that opened no call yet are not
        text: the model was writing a call."""
        out: list[Read] = []
        rest, self._buf = self._buf, ""
        fmt = self.fmt
        name = self._cut_name(rest) if cut and self._mode == "name" else ""
        if name:  # cut off after a call's name, before its arguments: a call, as OpenAI
            out.append(CallOpen(self.num_calls, new_call_id(fmt.id_length), name))
            self.num_calls += 1  # (its arguments "": the output ran out before them)
        elif cut and (self._mode in ("between", "id", "name") and not self.num_calls
                    and self._held
                    or self._mode == "text" and rest and any(
                        m.startswith(rest) for m in (fmt.call_open, fmt.block_open) if m)):
            pass
        elif self._pending:  # a name, and no arguments: text unless the output ran out
            if not cut or rest.strip():
                out.append(Content(self._held + rest))
        elif self._mode in ("rest", "args") and self._reader is not None:
            tail = self._reader.finish()
            if tail:
                out.append(CallArgs(self.num_calls, tail))
            self.num_calls += 1
        elif self._mode in ("between", "id", "name") and not self.num_calls:
            out.append(Content(self._held + rest))
        elif self._mode == "text" and rest and not (fmt.messages and (cut or self._ended) and any(
                m.startswith(rest) for m in (*fmt.noise, fmt.messages[1]))):
            out.append(self._said(rest))
        return out  # (a message header, or the start of one, left unfinished is dropped)
