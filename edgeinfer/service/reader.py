"""Reading one choice's generated text as it streams: reasoning blocks apart from the
answer (``edgeinfer.prompt.reasoning``), then tool calls out of the answer
(``edgeinfer.prompt.tools``), into the service's events. gpt-oss's Harmony channels
carry both at once (``edgeinfer.prompt.harmony``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgeinfer.engine.delta import Delta
from edgeinfer.prompt.callparser import CallArgs, CallOpen, Content
from edgeinfer.prompt.harmony import HarmonyParser
from edgeinfer.prompt.reasoning import Markers, ReasoningSplit, Thought
from edgeinfer.prompt.repeats import RepeatFilter
from edgeinfer.prompt.toolformat import ToolFormat
from edgeinfer.prompt.tools import call_parser
from edgeinfer.service.events import Event, ReasoningDelta, TextDelta, ToolCallDelta


@dataclass(frozen=True, slots=True)
class Reading:
    """How a generation's text is read.

    ``tools``: parse tool calls in this format out of the answer (``types``: the
    offered tools' parameter types, for formats that write arguments untyped);
    ``markers``: split reasoning blocks with these markers off as reasoning
    (``in_thought``: the output starts inside one); ``harmony``: read gpt-oss's
    channels (reasoning, answer and calls; ``harmony_thoughts``: analysis as reasoning,
    else as text); ``calls_end_thought``: the call grammar starts at the format's markers
    wherever they come, so one inside an open reasoning block ends it (Kimi K2 Thinking
    may call a tool without closing its reasoning).
    """

    tools: ToolFormat | None = None
    markers: Markers | None = None
    in_thought: bool = False
    harmony: bool = False
    harmony_thoughts: bool = True
    types: dict[str, dict[str, str]] = field(default_factory=dict)
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)  # (MiniMax M3's)
    calls_end_thought: bool = False  # a call marker ends an open block (a lazy grammar's)


def _event(choice: int, e: Thought | Content | CallOpen | CallArgs, thoughts: bool) -> Event:
    if isinstance(e, CallOpen):
        return ToolCallDelta(choice, e.index, id=e.id, name=e.name)
    if isinstance(e, CallArgs):
        return ToolCallDelta(choice, e.index, arguments=e.text)
    if isinstance(e, Thought) and thoughts:
        return ReasoningDelta(choice, e.text)
    return TextDelta(choice, e.text)


class ChoiceReader:
    """Turns one choice's deltas into text / reasoning / tool-call events (see
    ``Reading``). With nothing to read, each delta is one TextDelta carrying its
    token's logprob; a token's logprob is kept only when the token is part of the
    answer."""

    def __init__(self, choice: int, reading: Reading | None = None) -> None:
        r = reading or Reading()
        self.choice = choice
        self.harmony = HarmonyParser(frozenset(r.types)) if r.harmony else None
        self.thoughts = r.harmony_thoughts
        tools = None if r.harmony else r.tools
        self.calls = call_parser(tools, r.types, r.schemas) if tools is not None else None
        self.repeats = RepeatFilter()
        exits = tools.triggers if tools is not None and r.calls_end_thought else ()
        self.split = (ReasoningSplit(r.in_thought, r.markers, exits)
                      if r.markers is not None and not r.harmony else None)

    @property
    def num_calls(self) -> int:
        if self.harmony is not None:
            return self.harmony.num_calls
        return self.repeats.num_calls

    @property
    def repeated(self) -> bool:
        """A tool call repeated an earlier one: the rest of the output is left out."""
        return self.repeats.ended

    @property
    def whole_calls(self) -> bool:
        """(At the end) the answer passed on ends with a whole call: finished by its calls
        even when the output ran on (a repeat, or the start of one, cut off)."""
        return self.repeats.whole

    def read(self, d: Delta) -> list[Event]:
        final = d.finish_reason is not None
        if self.harmony is not None:
            found = self.harmony.feed(d.text) + (
                self.harmony.finish(cut=d.finish_reason == "length") if final else [])
            return [_event(self.choice, e, self.thoughts) for e in found]
        if self.split is None and self.calls is None:
            return [TextDelta(self.choice, d.text, d.logprob)] if d.text or d.logprob else []
        if self.split is None:
            thoughts, answer, answering = [], d.text, True
        else:
            pieces = self.split.feed(d.text) + (self.split.finish() if final else [])
            thoughts = [p.text for p in pieces if isinstance(p, Thought)]
            answer = "".join(p.text for p in pieces if not isinstance(p, Thought))
            answering = bool(answer) or self.split.in_answer
        out: list[Event] = [ReasoningDelta(self.choice, t) for t in thoughts]
        if self.calls is None:  # a token whose text the split took (a marker) has none
            logprob = d.logprob if answering and (answer or not d.text) else None
            if answer or logprob:
                out.append(TextDelta(self.choice, answer, logprob))
            return out
        calls = self.calls.feed(answer) if answer else []
        if final:
            cut = d.finish_reason == "length"
            calls = self.repeats.finish(calls + self.calls.finish(cut=cut), cut)
        else:
            calls = self.repeats.feed(calls)
        return out + [_event(self.choice, e, True) for e in calls]
