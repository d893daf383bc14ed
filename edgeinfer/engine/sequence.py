"""One generation request as the engine sees it: tokens, counters, lifecycle.

A Sequence is created on the event loop, handed to the engine thread by a
``Submit`` message, and from then on touched only by the engine thread.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

from edgeinfer.engine.drafts import Drafter


class SequenceStatus(IntEnum):
    """Lifecycle of a sequence. Every status after ``RUNNING`` is final."""

    WAITING = 0
    RUNNING = 1
    FINISHED_STOPPED = 2
    FINISHED_LENGTH = 3
    FINISHED_ABORTED = 4
    FINISHED_ERROR = 5

    @property
    def is_finished(self) -> bool:
        return self > SequenceStatus.RUNNING

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
    SequenceStatus.FINISHED_ERROR: "error",
}


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling settings. Defaults follow llama-server's."""

    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    # llama-server's further samplers (off at these values), in its chain order
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1  # -1: the whole context
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", "\"", "*")
    top_n_sigma: float = -1.0
    typical_p: float = 1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    mirostat: int = 0  # 1 or 2: Mirostat (v1 / v2) in place of top-k .. temperature
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None  # None: off; k: the sampled token's and the top k
    grammar: str | None = None  # GBNF constraining the output (root rule "root")
    speculative: bool = True  # drafts may be verified for this request (the model's setting)
    # the output expected (OpenAI's Predicted Outputs), drafted from where the output is
    prediction: tuple[int, ...] = ()
    # the output does not depend on other requests (``invariance``); None: the model's setting
    deterministic: bool | None = None
    # lazy grammar: free text until one of these words appears, the grammar from there on
    grammar_triggers: tuple[str, ...] = ()
    # the output starts inside a reasoning block: after this many tokens, close it by
    # forcing ``reasoning_close`` (the tokens of its closing marker)
    reasoning_budget: int | None = None
    reasoning_close: tuple[int, ...] = ()
    # an end of generation inside the block closes it instead (a forced call or a schema
    # answer waits after the block: the output must not end before it)
    reasoning_end_closes: bool = False

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0


_arrivals = itertools.count()


class PrefixWait(NamedTuple):
    """A sequence holds off its prefill until ``source`` has computed ``length`` tokens
    of the prefix they share."""

    source: Sequence
    length: int


@dataclass(eq=False, slots=True)
class Sequence:
    """Engine-side state of one request.

    ``tokens`` holds the prompt followed by every generated token;
    ``num_computed`` counts the leading tokens whose KV is in the context.
    The tokens from ``num_computed`` on still have to be fed to the model.
    """

    request_id: str
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    tokens: list[int] = field(default_factory=list)
    num_computed: int = 0
    slot: int | None = None
    status: SequenceStatus = SequenceStatus.WAITING
    arrival: int = field(default_factory=lambda: next(_arrivals))
    num_cached: int = 0  # prompt tokens taken from the prefix cache
    priority: int = 0  # higher is admitted to a slot first (see Scheduler.admit)
    group: str = ""  # the HTTP request this is one choice of ("": its own request_id)
    queued_at: float = 0.0  # when it started waiting (scheduler clock)
    pin: bool = False  # keep this prompt resident in the cache when done
    use_cache: bool = True  # reuse cached prefixes for this prompt
    # do not prefill: another request is computing our prefix
    waiting_on: PrefixWait | None = None
    # prompt positions where the prefill pauses so that the state there is saved (the
    # prefix cache's checkpoints; empty for memories whose cells are shared instead)
    checkpoints: tuple[int, ...] = ()
    drafter: Drafter | None = None  # speculative decoding (None: off for this one)
    deterministic: bool = False  # computed in calls of its own (``invariance``)
    # sent back to wait when the KV cache had no room for its prompt: not admitted again
    # until a running sequence ends (``Scheduler.preempt``); how many times it was
    held: bool = False
    preempted: int = 0
    ahead: bool = False  # in a seat past the slots: its prompt computed, it waits (Scheduler)

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt)
        if not self.group:
            self.group = self.request_id

    @property
    def num_prompt(self) -> int:
        return len(self.prompt)

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - len(self.prompt)

    @property
    def num_uncomputed(self) -> int:
        return len(self.tokens) - self.num_computed

    @property
    def prefill_stop(self) -> int:
        """Where the next prompt chunk ends at the latest: the next checkpoint, or the
        prompt's end."""
        return next((c for c in self.checkpoints if c > self.num_computed), len(self.prompt))

    @property
    def is_prefilling(self) -> bool:
        """True while prompt tokens remain to be computed."""
        return self.num_computed < len(self.prompt)
