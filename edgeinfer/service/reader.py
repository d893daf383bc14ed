"""Reading one choice's generated text as it streams: reasoning blocks apart from the
answer (``edgeinfer.prompt.reasoning``), then tool calls out of the answer
(``edgeinfer.prompt.tools``), into the service's events."""

from __future__ import annotations

from edgeinfer.engine.delta import Delta
from edgeinfer.prompt.callparser import CallArgs, CallOpen, CallParser
from edgeinfer.prompt.callparser import Event as ToolEvent
from edgeinfer.prompt.reasoning import ReasoningSplit, Thought
from edgeinfer.prompt.toolformat import ToolFormat
from edgeinfer.service.events import Event, ReasoningDelta, TextDelta, ToolCallDelta


def _tool_event(choice: int, e: ToolEvent) -> Event:
    if isinstance(e, CallOpen):
        return ToolCallDelta(choice, e.index, id=e.id, name=e.name)
    if isinstance(e, CallArgs):
        return ToolCallDelta(choice, e.index, arguments=e.text)
    return TextDelta(choice, e.text)


class ChoiceReader:
    """Turns one choice's deltas into text / reasoning / tool-call events.

    ``tools``: parse tool calls in this format out of the answer; ``reasoning``: split ``<think>``
    blocks off as reasoning (``in_thought``: the output starts inside one). With
    neither, each delta is one TextDelta carrying its token's logprob; a token's
    logprob is kept only when the token is part of the answer.
    """

    def __init__(self, choice: int, *, tools: ToolFormat | None, reasoning: bool,
                 in_thought: bool = False) -> None:
        self.choice = choice
        self.calls = CallParser(tools) if tools is not None else None
        self.split = ReasoningSplit(in_thought) if reasoning else None

    @property
    def num_calls(self) -> int:
        return self.calls.num_calls if self.calls is not None else 0

    def read(self, d: Delta) -> list[Event]:
        final = d.finish_reason is not None
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
        if self.calls is None:
            logprob = d.logprob if answering else None
            if answer or logprob:
                out.append(TextDelta(self.choice, answer, logprob))
            return out
        found = self.calls.feed(answer) if answer else []
        if final:
            found += self.calls.finish()
        return out + [_tool_event(self.choice, e) for e in found]
