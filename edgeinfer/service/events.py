"""The one event stream the service gives every API dialect.

A generation yields, per choice, text / tool-call / reasoning deltas as the
tokens arrive, then one ``Finish``; after every choice has finished, one
``UsageReport``. A generation that fails yields one ``ErrorEvent`` and ends.
Dialects only render these into their wire shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeinfer.engine.logprobs import TokenLogprob
from edgeinfer.errors import APIError


@dataclass(frozen=True, slots=True)
class TextDelta:
    choice: int
    text: str
    logprob: TokenLogprob | None = None  # of the token that added this text, when asked for


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of tool call ``index`` of a choice: the first piece has ``id`` and
    ``name``; the arguments (JSON text) follow in fragments."""

    choice: int
    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Reasoning text, kept apart from the answer. No tool/reasoning format emits it yet
    (model-native reasoning formats are a later issue); dialects already render it."""

    choice: int
    text: str


@dataclass(frozen=True, slots=True)
class Finish:
    choice: int
    reason: str  # "stop", "length" or "tool_calls"
    completion_tokens: int
    timings: dict[str, float] | None = None
    stop_word: str | None = None  # the request's stop string that ended it, if one did
    stopped: bool = False  # a stop string ended it (the request's, or one the server added)
    raw: str = ""  # the choice's whole output as the model wrote it, before it was read
    cached_tokens: int = 0  # of its prompt, taken from the prefix cache


@dataclass(frozen=True, slots=True)
class UsageReport:
    prompt_tokens: int  # each distinct prompt counted once
    completion_tokens: int
    cached_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    error: APIError


Event = TextDelta | ToolCallDelta | ReasoningDelta | Finish | UsageReport | ErrorEvent
