"""Draft tokens for speculative decoding: prompt lookup (``NgramDrafter``), or a draft
model's guesses (``SourceDrafter`` over ``engine.draft_model``).

A sequence's next tokens are guessed from its own tokens (the prompt and the output so
far): when its last ``n`` tokens appeared before, the tokens that followed them then are
the draft (the longest ``n`` that matches, down to ``n_min``). Text that copies from its
prompt (a rewrite, an extraction, code edits, JSON repeating input fields) is guessed
well; other text rarely matches, and then nothing is drafted and nothing is spent.

A draft is proposed only when it is expected to pay: the share of its tokens expected to
be accepted must pass the bar the step's measured cost sets (``step_cost``: what its rows
add to the step against what a token costs without them). The expectation is kept per kind
of match, each sequence's own record over a prior (``PRIOR``, measured on SmolLM2): a match
into the prompt (90 % accepted), a match of all ``n_max`` tokens into the output, a
shorter one into the output (38 %), and the request's prediction. A short match whose
latest occurrence is in the output but that also occurs in the prompt copies the prompt; a
refused match gives way to a shorter one; each refusal fades the kind's record, so early
misses do not rule a kind out for the rest of the request. Where a copy of the prompt
left off (a word changed, added or left out), it is picked up again as soon as the
output's last one or two tokens are found just past that point (a resync, ``_resync``),
without waiting for ``n_min`` tokens to match.

The engine decodes the drafts after the sequence's last token in the same batch as the
other slots, samples the target at every drafted position in order, and keeps drafts
while they equal what was sampled (see ``speculation``). How many tokens a sequence
drafts follows how many it had accepted: all accepted doubles it (up to ``max_len``),
a miss shrinks it to one more than were accepted, and a draft of which none was
accepted halves it and pauses drafting for ``COOLDOWN`` tokens (on a CPU a verified row
costs about a third of a decode step: drafts that miss are a loss). Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

COOLDOWN = 8  # tokens without drafts after a draft of which none was accepted
# the share of a kind of draft expected to be accepted before a sequence has its own record
PRIOR = {"prompt": 0.9, "predicted": 0.9, "resync": 0.7, "long": 0.6, "short": 0.4}
PRIOR_WEIGHT = 8.0  # the prior counts as this many proposed tokens
FORGET = 0.9  # what a kind's record keeps of itself each time a draft of it is refused
# prompt tokens past where a copy left off that a resync looks through for the output's
# last two tokens, and for its last one (a lone token matches by chance further on)
WINDOW = {2: 24, 1: 4}
RESYNC_TOKENS = 8  # output tokens after a copy left off within which it may resync


def _free(k: int) -> float:  # no bar: every draft is proposed
    return 0.0


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
        self.length = max_len  # the current draft length (adapts, see ``accepted``)
        self._pause = 0  # proposals left to skip (see COOLDOWN)
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
            self._pause = COOLDOWN
        elif proposed:
            self.length = max(self.min_len, taken + 1)

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
        self._in_prompt: dict[tuple[int, ...], int] = {}  # the same, inside the prompt
        self._indexed = 0  # n-grams ending before this position are in ``_seen``
        self.prediction = Prediction(prediction, n_max) if prediction else None
        # kind -> [tokens proposed, tokens accepted], faded by refusals (``FORGET``)
        self._record: dict[str, list[float]] = {kind: [0.0, 0.0] for kind in PRIOR}
        self._kind = "short"  # of the last draft proposed
        self._from: int | None = None  # where in the prompt the last draft was taken from
        self._length = 0  # the sequence's length when the last draft was proposed
        # where a copy of the prompt left off and the sequence's length then (``_resync``)
        self._cursor: tuple[int, int] | None = None

    def expect(self, kind: str) -> float:
        """The share of a ``kind`` draft's tokens expected to be accepted."""
        proposed, taken = self._record[kind]
        return (taken + PRIOR_WEIGHT * PRIOR[kind]) / (proposed + PRIOR_WEIGHT)

    @property
    def expected(self) -> float:
        """The share of the last proposed draft's tokens expected to be accepted."""
        return self.expect(self._kind)

    def accepted(self, proposed: int, taken: int) -> None:
        super().accepted(proposed, taken)
        record = self._record[self._kind]
        record[0] += proposed
        record[1] += taken
        if proposed:
            self._follow(taken)

    def _follow(self, taken: int) -> None:
        """Where a copy of the prompt left off after a draft taken from it (``_resync``):
        where the draft was first wrong, if any of it was right or the copy has been going
        well (then drafting does not pause either: ``COOLDOWN``); else the copy is lost."""
        if self._from is None:
            return
        record = self._record[self._kind]  # (some of it accepted before: not the prior alone)
        going = record[1] > 0 and self.expect(self._kind) >= PRIOR["resync"]
        if taken or (going and self._kind == "prompt"):
            self._cursor = (self._from + taken, self._length + taken + 1)
            if going:
                self._pause = 0
        else:
            self._cursor = None

    def _offer(self, kind: str, draft: list[int], bar: Callable[[int], float],
               start: int | None = None, length: int = 0) -> list[int]:
        """``draft`` (taken from the prompt at ``start``, if it was, after ``length``
        tokens) if its kind is expected to pass the bar; a refusal fades the kind's record
        a little (``FORGET``), so that a kind ruled out by early misses is tried again some
        steps later."""
        if not draft:
            return []
        if self.expect(kind) <= bar(len(draft)):
            record = self._record[kind]
            record[0], record[1] = record[0] * FORGET, record[1] * FORGET
            return []
        self._kind, self._from, self._length = kind, start, length
        return draft

    def _index(self, tokens: Sequence[int], prompt_len: int) -> None:
        """Index the n-grams that end before the last token (the last one is what is
        looked up, so its own occurrence must not be found)."""
        end = len(tokens) - 1
        for pos in range(max(self._indexed, self.n_min), end + 1):
            for n in range(self.n_min, self.n_max + 1):
                if pos - n < 0:
                    break
                gram = tuple(tokens[pos - n:pos])
                self._seen[gram] = pos
                if pos < prompt_len:
                    self._in_prompt[gram] = pos
        self._indexed = max(self._indexed, end + 1)

    def propose(self, tokens: Sequence[int], limit: int, prompt_len: int | None = None,
                bar: Callable[[int], float] = _free) -> list[int]:
        """Up to ``min(length, limit)`` tokens that may follow ``tokens``, whose first
        ``prompt_len`` are the prompt (None: all of them; empty: no guess), if the share of
        them expected to be accepted passes ``bar(number of tokens)``."""
        k = self.wants(limit)
        if k > 0 and self.prediction is not None and prompt_len is not None:
            guess = self._offer("predicted", self.prediction.follow(tokens[prompt_len:], k),
                                bar)
            if guess:
                return guess
        if k <= 0 or len(tokens) <= self.n_min:
            return []
        prompt_len = len(tokens) if prompt_len is None else prompt_len
        self._index(tokens, prompt_len)
        for n in range(min(self.n_max, len(tokens) - 1), self.n_min - 1, -1):
            gram = tuple(tokens[-n:])
            pos = self._seen.get(gram)
            if pos is None or len(tokens) - pos < self.min_len:
                continue
            kind = "prompt" if pos < prompt_len else "long" if n == self.n_max else "short"
            copied = self._in_prompt.get(gram)
            if kind != "prompt" and copied is not None and \
                    self.expect("prompt") > self.expect(kind):
                pos, kind = copied, "prompt"
            start = pos if kind == "prompt" else None
            if draft := self._offer(kind, list(tokens[pos:pos + k]), bar, start, len(tokens)):
                return draft  # else a shorter match, perhaps of another kind
        return self._resync(tokens, k, prompt_len, bar)

    def _resync(self, tokens: Sequence[int], k: int, prompt_len: int,
                bar: Callable[[int], float]) -> list[int]:
        """Where a copy of the prompt left off (the first draft token that was not
        accepted: a word changed, added or left out), the copy goes on as soon as the
        output's last two tokens, or its last one, are found in the next ``WINDOW[n]``
        prompt tokens from there (the nearest place first), long before ``n_min`` tokens
        match again: the draft is what follows them."""
        if self._cursor is None or len(tokens) <= prompt_len:
            return []
        cursor, since = self._cursor
        if len(tokens) - since > RESYNC_TOKENS:  # the output went its own way
            self._cursor = None
            return []
        last = prompt_len - 1
        grams = [(n, width, list(tokens[-n:])) for n, width in WINDOW.items()]
        for at in range(cursor, min(cursor + max(WINDOW.values()), last)):  # nearest first
            for n, width, gram in grams:  # ``at``: where the gram's last token is
                if at - cursor < width and at >= n - 1 and \
                        list(tokens[at - n + 1:at + 1]) == gram:
                    draft = list(tokens[at + 1:min(at + 1 + k, last + 1)])
                    if len(draft) < self.min_len:  # the prompt ends: too short to pay
                        return []
                    return self._offer("resync", draft, bar, at + 1, len(tokens))
        return []


MAX_PLACES = 256  # places of one n-gram in a prediction weighed when the output is lost


class Prediction:
    """The output a request expects (OpenAI's Predicted Outputs: a file it is editing),
    followed as the output is written: while the output repeats it, the next predicted
    tokens are the draft; where the output departs from it (an edit), the output's last
    tokens are looked up in it (the places that agree with most of the last ``n_max``, the
    first past the point reached so far, else the first) and it is followed from there.
    Its index holds one entry per token, built on the engine thread (the service caps a
    prediction's length)."""

    n_min = 3

    def __init__(self, tokens: Sequence[int], n_max: int) -> None:
        self.tokens = tuple(tokens)
        self.n_max = max(n_max, self.n_min)
        self._at: int | None = 0  # where the output goes on in ``tokens`` (None: lost)
        self._reached = 0  # the furthest point followed
        self._synced = 0  # output tokens accounted for
        self._where: dict[tuple[int, ...], list[int]] = {}  # n_min-gram -> positions after
        for end in range(self.n_min, len(self.tokens) + 1):
            self._where.setdefault(self.tokens[end - self.n_min:end], []).append(end)

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
        """Where the output's last tokens are in the prediction: the places that agree with
        the most of them (up to ``n_max``), the first past the point reached, else the
        first."""
        if len(output) < self.n_min:
            return None
        places = self._where.get(tuple(output[-self.n_min:]), [])[:MAX_PLACES]
        if not places:
            return None
        agree = {p: self._agree(p, output) for p in places}
        best = max(agree.values())
        fits = [p for p in places if agree[p] == best]
        return next((p for p in fits if p >= self._reached), fits[0])

    def _agree(self, place: int, output: Sequence[int]) -> int:
        n = self.n_min
        while n < min(self.n_max, place, len(output)) and \
                self.tokens[place - 1 - n] == output[-1 - n]:
            n += 1
        return n


class SourceDrafter(DraftLength):
    """A sequence drafted by a ``DraftSource`` together with the other sequences of the
    step (the scheduler asks ``wants``, then the source drafts them all)."""

    def __init__(self, source: DraftSource, max_len: int) -> None:
        super().__init__(max_len)
        self.source = source


Drafter = NgramDrafter | SourceDrafter
