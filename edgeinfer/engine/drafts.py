"""Draft tokens for speculative decoding: prompt lookup (``NgramDrafter``), or a draft
model's guesses (``SourceDrafter`` over ``engine.draft_model``).

A sequence's next tokens are guessed from its own tokens (the prompt and the output so
far): when its last ``n`` tokens appeared before, the tokens that followed them then are
the draft (the longest ``n`` that matches, down to ``n_min``). Text that copies from its
prompt (a rewrite, an extraction, code edits, JSON repeating input fields) is guessed
well; other text rarely matches, and then nothing is drafted and nothing is spent.

A match whose earlier occurrence lies in the sequence's own output (not its prompt) needs
all ``n_max`` tokens: short matches inside generated text ("of the", a list's
punctuation) mostly guess wrong, while text copied from the prompt matches at any ``n``
(measured on SmolLM2: 4-token matches into the output were 38 % accepted, into the prompt
90 %).

The engine decodes the drafts after the sequence's last token in the same batch as the
other slots, samples the target at every drafted position in order, and keeps drafts
while they equal what was sampled (see ``speculation``). How many tokens a sequence
drafts follows how many it had accepted: its first draft is half of ``max_len``, all
accepted doubles it (up to ``max_len``), a miss shrinks it to one more than were
accepted, and a draft of which none was accepted halves it and pauses drafting for
``COOLDOWN`` tokens, twice as long after each such draft in a row (up to ``MAX_PAUSE``;
on a CPU a step's extra rows cost about a decode step each for a lone stream: drafts that
miss are a loss, and text that misses once mostly misses again). Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

COOLDOWN = 8  # tokens without drafts after a draft of which none was accepted
MAX_PAUSE = 64  # the longest pause, after several such drafts in a row


class DraftSource(Protocol):
    """Drafts for several sequences at once (a draft model: ``engine.draft_model``)."""

    def draft(self, requests: list[tuple[int, Sequence[int], int]]) -> list[list[int]]:
        """For each ``(slot, tokens, k)``: up to ``k`` tokens that may follow ``tokens``
        (the slot's sequence; fewer or none when there is no guess this step)."""
        ...


class DraftLength:
    """A sequence's draft length, adapted to how many of its drafts were accepted, and its
    counts (shared by both kinds of drafter)."""

    def __init__(self, max_len: int, min_len: int = 1) -> None:
        self.max_len = max_len
        self.min_len = min(min_len, max_len)  # shorter drafts are not proposed
        # the current draft length (adapts, see ``accepted``)
        self.length = max(self.min_len, max_len // 2)
        self._pause = 0  # proposals left to skip (see COOLDOWN)
        self._misses = 0  # drafts in a row of which none was accepted
        self.proposed = 0  # counted where drafts are put in a batch (``Scheduler``)
        self.taken = 0

    def wants(self, limit: int) -> int:
        """How many tokens to draft now, at most ``limit`` (0 while paused)."""
        if self._pause:
            self._pause -= 1
            return 0
        k = min(self.length, limit)
        return k if k >= self.min_len else 0

    def accepted(self, proposed: int, taken: int) -> None:
        """``taken`` of ``proposed`` draft tokens were right: adapt the length."""
        self.taken += taken
        if proposed and taken == proposed:
            self.length = min(self.max_len, max(1, self.length) * 2)
        elif proposed and not taken:
            self.length = max(self.min_len, self.length // 2)
            self._pause = min(MAX_PAUSE, COOLDOWN << self._misses)
            self._misses += 1
        elif proposed:
            self.length = max(self.min_len, taken + 1)
        if taken:
            self._misses = 0

    @property
    def rate(self) -> float:
        """The share of proposed draft tokens that were accepted (0.0: none proposed)."""
        return self.taken / self.proposed if self.proposed else 0.0


class NgramDrafter(DraftLength):
    """Prompt-lookup drafts over one sequence's tokens, and over the output the request
    predicted (``Prediction``) when it gave one."""

    def __init__(self, max_len: int, n_max: int = 8, n_min: int = 4, min_len: int = 1,
                 prediction: Sequence[int] = ()) -> None:
        super().__init__(max_len, min_len)
        self.n_max = n_max
        self.n_min = n_min
        self._seen: dict[tuple[int, ...], int] = {}  # n-gram -> position after it, latest
        self._indexed = 0  # n-grams ending before this position are in ``_seen``
        self.prediction = Prediction(prediction, n_max) if prediction else None

    def _index(self, tokens: Sequence[int]) -> None:
        """Index the n-grams that end before the last token (the last one is what is
        looked up, so its own occurrence must not be found)."""
        end = len(tokens) - 1
        for pos in range(max(self._indexed, self.n_min), end + 1):
            for n in range(self.n_min, self.n_max + 1):
                if pos - n < 0:
                    break
                self._seen[tuple(tokens[pos - n:pos])] = pos
        self._indexed = max(self._indexed, end + 1)

    def propose(self, tokens: Sequence[int], limit: int,
                prompt_len: int | None = None) -> list[int]:
        """Up to ``min(length, limit)`` tokens that may follow ``tokens``, whose first
        ``prompt_len`` are the prompt (None: all of them; empty: no guess)."""
        k = self.wants(limit)
        if k > 0 and self.prediction is not None and prompt_len is not None:
            if guess := self.prediction.follow(tokens[prompt_len:], k):
                return guess
        if k <= 0 or len(tokens) <= self.n_min:
            return []
        self._index(tokens)
        for n in range(min(self.n_max, len(tokens) - 1), self.n_min - 1, -1):
            pos = self._seen.get(tuple(tokens[-n:]))
            if pos is None or len(tokens) - pos < self.min_len:
                continue
            if prompt_len is None or pos < prompt_len or n == self.n_max:
                return list(tokens[pos:pos + k])
        return []


class Prediction:
    """The output a request expects (OpenAI's Predicted Outputs: a file it is editing),
    followed as the output is written: while the output repeats it, the next predicted
    tokens are the draft; where the output departs from it (an edit), the output's last
    tokens are looked up in it (``n_min`` .. ``n_max`` of them, the first occurrence past
    the point reached so far, else the first) and it is followed from there."""

    n_min = 3

    def __init__(self, tokens: Sequence[int], n_max: int) -> None:
        self.tokens = tuple(tokens)
        self.n_max = max(n_max, self.n_min)
        self._at: int | None = 0  # where the output goes on in ``tokens`` (None: lost)
        self._reached = 0  # the furthest point followed
        self._synced = 0  # output tokens accounted for
        self._where: dict[tuple[int, ...], list[int]] = {}  # n-gram -> positions after it
        for end in range(self.n_min, len(self.tokens) + 1):
            for n in range(self.n_min, min(self.n_max, end) + 1):
                self._where.setdefault(self.tokens[end - n:end], []).append(end)

    def follow(self, output: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` predicted tokens that may follow ``output`` (empty: no guess)."""
        for tok in output[self._synced:]:
            if self._at is not None and self._at < len(self.tokens) \
                    and self.tokens[self._at] == tok:
                self._at += 1
                self._reached = max(self._reached, self._at)
            else:
                self._at = None
        self._synced = len(output)
        if self._at is None:
            self._at = self._find(output)
        if self._at is None:
            return []
        self._reached = max(self._reached, self._at)
        return list(self.tokens[self._at:self._at + k])

    def _find(self, output: Sequence[int]) -> int | None:
        for n in range(min(self.n_max, len(output)), self.n_min - 1, -1):
            places = self._where.get(tuple(output[-n:]))
            if places:
                return next((p for p in places if p >= self._reached), places[0])
        return None


class SourceDrafter(DraftLength):
    """A sequence drafted by a ``DraftSource`` together with the other sequences of the
    step (the scheduler asks ``wants``, then the source drafts them all)."""

    def __init__(self, source: DraftSource, max_len: int) -> None:
        super().__init__(max_len)
        self.source = source


Drafter = NgramDrafter | SourceDrafter
