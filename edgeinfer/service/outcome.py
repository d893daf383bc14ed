"""A whole (non-streamed) generation, gathered from its events: for dialects that
answer with one body."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from edgeinfer.engine.logprobs import TokenLogprob
from edgeinfer.prompt.tools import arguments_parse
from edgeinfer.service.events import (
    ErrorEvent,
    Event,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UsageReport,
)


@dataclass(slots=True)
class CallOutcome:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass(slots=True)
class ChoiceOutcome:
    text: str = ""
    reasoning: str = ""
    # complete calls (and, when finish is "length", the one cut off)
    calls: list[CallOutcome] = field(default_factory=list)
    finish: str = ""  # "stop", "length" or "tool_calls"
    completion_tokens: int = 0
    stop_word: str | None = None  # the stop string that ended it, if one did
    stopped: bool = False  # a stop string ended it (the request's or the server's)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    raw: str = ""  # the output as the model wrote it (reasoning and call markup included)
    cached_tokens: int = 0  # of its prompt, from the prefix cache
    timings: dict[str, float] | None = None  # its own (llama-server's ``timings``)


@dataclass(slots=True)
class Outcome:
    choices: list[ChoiceOutcome]
    usage: UsageReport
    timings: dict[str, float] | None = None


async def gather(events: AsyncIterator[Event], num_choices: int) -> Outcome:
    """Every choice's text, reasoning, tool calls and finish, and the usage. Raises the
    APIError of an ``ErrorEvent``. A call cut off by max_tokens is kept as far as it was
    written (finish "length", as OpenAI and llama-server answer); one whose arguments do
    not parse otherwise is left out, and a choice left with no call finishes "stop", not
    "tool_calls"."""
    texts: list[list[str]] = [[] for _ in range(num_choices)]
    reasoning: list[list[str]] = [[] for _ in range(num_choices)]
    calls: list[list[CallOutcome]] = [[] for _ in range(num_choices)]
    choices = [ChoiceOutcome() for _ in range(num_choices)]
    usage: UsageReport | None = None
    timings = None
    try:
        async for e in events:
            if isinstance(e, ErrorEvent):
                raise e.error
            if isinstance(e, UsageReport):
                usage = e
            elif isinstance(e, TextDelta):
                texts[e.choice].append(e.text)
                if e.logprob:
                    choices[e.choice].logprobs.append(e.logprob)
            elif isinstance(e, ReasoningDelta):
                reasoning[e.choice].append(e.text)
            elif isinstance(e, ToolCallDelta):
                if e.name is not None:
                    calls[e.choice].append(CallOutcome(e.id or "", e.name, ""))
                calls[e.choice][e.index].arguments += e.arguments
            elif isinstance(e, Finish):
                choices[e.choice].finish = e.reason
                choices[e.choice].completion_tokens = e.completion_tokens
                choices[e.choice].stop_word = e.stop_word
                choices[e.choice].stopped = e.stopped
                choices[e.choice].raw = e.raw
                choices[e.choice].cached_tokens = e.cached_tokens
                choices[e.choice].timings = e.timings
                timings = timings or e.timings
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    assert usage is not None, "a generation ends with its usage"
    for i, c in enumerate(choices):
        c.text, c.reasoning = "".join(texts[i]), "".join(reasoning[i])
        c.calls = [k for k in calls[i] if c.finish == "length" or arguments_parse(k.arguments)]
        if c.finish == "tool_calls" and not c.calls:
            c.finish = "stop"
    return Outcome(choices, usage, timings)
