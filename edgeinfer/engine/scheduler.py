"""The slot scheduler: which tokens of which sequences go into the next batch.

Pure Python, no llama calls. The engine calls, once per step::

    scheduler.admit(now)               # waiting requests take free slots
    chunks = scheduler.schedule()      # plan one batch
    ...llama_decode(batch built from chunks)...
    scheduler.commit(chunks)           # those tokens are now in the KV cache
    ...sample, then scheduler.append_token(seq, tok) or scheduler.finish(seq)

The rule is one: every running sequence that is generating contributes its one
uncomputed token first; the rest of the token budget (``prefill_budget`` when no
sequence generates, so that a lone prompt goes in large pieces) goes to prompt chunks of
sequences still prefilling (chunked prefill): those with little left first (at most a
quarter of the budget each, half in all: a short chat is not held back by a long
document), then oldest first. Waiting sequences take free slots in ``admission``'s order
(priority, fairness between requests, arrival; a request's cap, the last free slot kept
for a request of one). A long prompt therefore never stalls the streams already
generating, and requests join and leave at any step.

Prefill ahead: with every slot taken, up to ``ahead`` more sequences take seats past the
slots; their prompts are computed in the step's spare budget and their first token sent,
then they wait (cells kept) and take the slots ended sequences leave, in the same order.
One goes ahead only while all running sequences' prompts and ``max_tokens``, its own with
them, fit the cells free of pinned prefixes (``free_cells``, the engine's).
"""

from __future__ import annotations

import functools
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from edgeinfer.engine.admission import pick, promote
from edgeinfer.engine.drafts import NgramDrafter, SourceDrafter
from edgeinfer.engine.sequence import Sequence, SequenceStatus
from edgeinfer.engine.step_cost import StepCost


@dataclass(slots=True)
class Chunk:
    """A run of consecutive tokens of one sequence within a batch."""

    seq: Sequence
    start: int  # position of tokens[0] in the sequence
    tokens: list[int]
    wants_logits: bool  # logits for the last token of this chunk
    drafts: int = 0  # the last ``drafts`` tokens are drafts to verify (logits for each)

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


# the smallest prompt chunk a step-time target leaves a step (below it, per-step costs
# dominate and the prompt would crawl)
MIN_CHUNK = 32
# a deterministic sequence's largest prompt piece (see ``invariance``)
DETERMINISTIC_PIECE = 62
# llama.cpp's CPU flash attention computes a step of fewer tokens than its query tile
# one row at a time, each row over the whole sequence: 1,500 tokens deep a row of such a
# step took 4.5 times what a row of a 64-token step took here (23 against 5 ms). A
# prompt's last piece is therefore never left smaller than this when the piece before
# it can give it tokens: as many tokens, as many steps, no slow step.
ATTENTION_TILE = 64


class Scheduler:
    """Assigns slots and per-step token counts.

    Not thread-safe: owned by the engine thread.
    """

    def __init__(self, num_slots: int, token_budget: int,
                 max_per_request: int | None = None, prefill_budget: int = 0,
                 step_target: float = 0.0, draft_budget: int = 0, ahead: int = 0) -> None:
        if num_slots < 1:
            raise ValueError("num_slots must be >= 1")
        if token_budget < num_slots:
            raise ValueError("token_budget must be at least num_slots")
        self.num_slots = num_slots
        self.token_budget = token_budget
        # a step in which no sequence generates (prompts only) may take this many tokens:
        # a lone prompt goes in large pieces, while generating streams keep short steps
        self.prefill_budget = max(prefill_budget, token_budget)
        # while streams generate, a step should take about this many seconds (0: no
        # target): prompt chunks shrink to what the measured rate computes in that time
        self.step_target = step_target
        self._rate = 0.0  # tokens per second of recent steps (a moving average)
        # draft tokens one step may verify, all sequences together (speculative decoding),
        # each sequence's only when they are expected to pay at the measured step cost
        self.draft_budget = draft_budget
        self.step_cost = StepCost()
        # by default one request leaves at least one slot to everybody else
        self.max_per_request = max_per_request or max(1, num_slots - 1)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self.ahead = ahead  # seats past the slots, for prompts computed ahead (see above)
        self.free_cells: Callable[[], int] = lambda: 0  # (the engine's; 0: none goes ahead)
        self._free_slots: list[int] = list(range(num_slots + ahead))

    # -- queries ---------------------------------------------------------
    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_generating(self) -> int:  # running sequences in slots (not ahead)
        return sum(not s.ahead for s in self.running)

    @property
    def num_ahead(self) -> int:  # running sequences ahead of a slot (see above)
        return len(self.running) - self.num_generating

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def find(self, request_id: str) -> Sequence | None:
        for seq in self.running:
            if seq.request_id == request_id:
                return seq
        for seq in self.waiting:
            if seq.request_id == request_id:
                return seq
        return None

    # -- transitions -----------------------------------------------------
    def add(self, seq: Sequence, now: float = 0.0) -> None:
        assert seq.status is SequenceStatus.WAITING
        seq.queued_at = now
        self.waiting.append(seq)

    def _next(self, now: float, running: Counter[str], lane_busy: bool) -> Sequence | None:
        """The waiting sequence to admit next (``admission.pick``; None: none may be now)."""
        if self._blocked():
            return None
        last = self.num_generating == self.num_slots - 1 and self.max_per_request < self.num_slots
        best = pick(self.waiting, now, running, lane_busy=lane_busy,
                    max_per_request=self.max_per_request, last_slot=last)
        if best is not None:
            self.waiting.remove(best)
        return best

    def _blocked(self) -> bool:
        """Cells are short: nobody joins before a prompt sent back to wait is computed."""
        return any(s.held for s in self.waiting) or any(
            s.preempted and s.is_prefilling for s in self.running)

    def _put_back(self, seq: Sequence) -> None:  # (taken by ``_next``: back in its place)
        self.waiting.insert(next((i for i, s in enumerate(self.waiting)
                                  if s.arrival > seq.arrival), len(self.waiting)), seq)

    def admit(self, now: float = 0.0) -> list[Sequence]:
        """Move waiting sequences into free slots (see ``_next`` for the order), and past
        the slots into seats ahead while ``free_cells()`` (the context's cells less pinned
        prefixes': the engine's) holds all running sequences' prompts and ``max_tokens``."""
        if self.ahead and any(s.ahead for s in self.running):
            promote(self.running, self.waiting if self._free_slots and not self._blocked()
                    else (), now, num_slots=self.num_slots, max_per_request=self.max_per_request)
        admitted = []
        running = Counter(s.group for s in self.running)
        lane_busy = any(s.deterministic for s in self.running)
        committed, cap = 0, None  # (the running's cells and the free ones: when needed)
        too_large: list[Sequence] = []  # to go ahead now: they wait on in the queue
        while self.waiting and self._free_slots:
            seq = self._next(now, running, lane_busy)
            if seq is None:
                break
            if ahead := self.num_generating >= self.num_slots:
                if cap is None:
                    committed = sum(s.num_prompt + s.max_tokens for s in self.running)
                    cap = self.free_cells()
                if committed + seq.num_prompt + seq.max_tokens > cap:
                    too_large.append(seq)
                    continue
                committed += seq.num_prompt + seq.max_tokens
            seq.ahead = ahead
            lane_busy |= seq.deterministic
            running[seq.group] += 1
            seq.slot = self._free_slots.pop(0)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            admitted.append(seq)
        for seq in too_large:
            self._put_back(seq)
        if self.ahead and self.num_generating < self.num_slots:  # (left to one not admitted)
            promote(self.running, (), now, num_slots=self.num_slots,
                    max_per_request=self.max_per_request)
        return admitted

    def schedule(self) -> list[Chunk]:
        """Plan the next batch from the running sequences (call admit() first).

        A sequence whose ``waiting_on`` is set gets no prompt chunk: another
        request is computing the prefix it will share.
        """
        chunks: list[Chunk] = []
        for seq in self.running:  # (those ahead wait: see above)
            if not seq.ahead and not seq.is_prefilling and seq.num_uncomputed > 0:
                assert seq.num_uncomputed == 1, "a generating sequence feeds one token per step"
                chunks.append(Chunk(seq, seq.num_computed, [seq.tokens[-1]], True))
        budget = (self.streaming_budget() if chunks else self.prefill_budget) - len(chunks)
        budget -= self._add_drafts(chunks, min(budget, self.draft_budget))
        for seq in self._prefill_order(budget):
            if budget <= 0:
                break
            n = min(budget, seq.prefill_stop - seq.num_computed)
            if seq.deterministic:  # pieces that keep its calls small (``invariance``)
                n = min(n, DETERMINISTIC_PIECE)
            else:
                n = _leaving_a_tile(n, seq.prefill_stop - seq.num_computed)
            start = seq.num_computed
            done = start + n == seq.num_prompt
            chunks.append(Chunk(seq, start, seq.tokens[start : start + n], done))
            budget -= n
        return chunks

    def _prefill_order(self, budget: int) -> list[Sequence]:
        """The prompts to compute (not waiting on a shared prefix), in the order they take
        the step's budget: those whose rest takes at most a quarter of it first, up to half
        of it in all (a short chat's first token is not held back by a long document that
        came before it: it comes after one step), then the others oldest first."""
        ready = sorted((s for s in self.running if s.is_prefilling and s.waiting_on is None),
                       key=lambda s: s.ahead)  # (those in slots first)
        quick: list[Sequence] = []
        room = budget // 2  # the others keep at least half: a steady run of short prompts
        for s in ready:  # does not starve a long one
            rest = s.prefill_stop - s.num_computed
            if rest <= min(budget // 4, room):
                quick.append(s)
                room -= rest
        return quick + [s for s in ready if s not in quick]

    def _add_drafts(self, chunks: list[Chunk], spare: int) -> int:
        """Append draft tokens to generating sequences' chunks, up to ``spare`` in all
        and never past a sequence's max_tokens; returns how many were added. Prompt-lookup
        drafters propose one by one, each against the bar of what its rows would add to
        the step (``step_cost``), then face the bar again with the share of the step's
        streams that draft (``_beside``); sequences with a draft model are drafted
        together, in one call of their source (their rows are reserved first)."""
        cost = self.step_cost  # the streams of the main context (not the lane's)
        streams = sum(1 for c in chunks if not c.seq.deterministic)
        reserved = offered = 0
        proposed: list[tuple[Chunk, list[int]]] = []
        together: list[tuple[Chunk, int]] = []
        for chunk in chunks:
            seq = chunk.seq
            room = min(spare - reserved, seq.max_tokens - seq.num_generated - 1)
            if seq.drafter is None or room <= 0:
                continue
            if isinstance(seq.drafter, NgramDrafter):
                if draft := seq.drafter.propose(seq.tokens, room, seq.num_prompt,
                                                functools.partial(cost.bar, streams,
                                                                  streams + reserved + offered)):
                    proposed.append((chunk, draft))
                    offered += len(draft)
            elif (k := seq.drafter.wants(room)) > 0:
                together.append((chunk, k))
                reserved += k  # what the source does not draft is given back
        kept = self._beside(proposed, streams, reserved, len(together))
        kept.sort(key=_expectation, reverse=True)  # the surest first
        added = reserved
        for chunk, draft in kept:  # in the budget left, none shorter than its minimum
            n = min(len(draft), spare - added)
            assert chunk.seq.drafter is not None
            if n > 0 and n >= chunk.seq.drafter.min_len:
                added += _extend(chunk, draft[:n])
        if together:
            first = together[0][0].seq.drafter
            assert isinstance(first, SourceDrafter)
            drafts = first.source.draft([(c.seq.slot or 0, c.seq.tokens, k)
                                         for c, k in together])
            for (chunk, k), draft in zip(together, drafts, strict=True):
                added += _extend(chunk, draft[:k]) - k
        return added

    def _beside(self, proposed: list[tuple[Chunk, list[int]]], streams: int, reserved: int,
                others: int) -> list[tuple[Chunk, list[int]]]:
        """The proposed prompt-lookup drafts that pay beside the streams that draft
        nothing (``step_cost.shared``: with no request waiting for a slot, the step's own
        cost is saved only where every stream gets ahead). ``others`` sequences drafted by
        a draft model, with ``reserved`` rows, draft too. Each draft left out lowers the
        share, so the rest are judged again until none is left out."""
        waiting = bool(self.waiting) and self.num_generating >= self.num_slots or self.num_ahead
        kept = proposed
        while True:
            share = 1.0 if waiting or not streams else (len(kept) + others) / streams
            rows, passing = streams + reserved, []
            for chunk, draft in kept:
                if share < 1.0 and _expectation((chunk, draft)) <= self.step_cost.bar(
                        streams, rows, len(draft), share):
                    continue
                passing.append((chunk, draft))
                rows += len(draft)
            if len(passing) == len(kept):
                return list(kept)
            kept = passing

    def streaming_budget(self) -> int:
        """The token budget of a step while streams generate: ``token_budget``, or less
        when a step-time target is set and the measured rate says it would take longer
        (never below ``MIN_CHUNK`` prompt tokens plus the streams' own)."""
        if not self.step_target or not self._rate:
            return self.token_budget
        fits = int(self._rate * self.step_target)
        return max(self.num_slots + MIN_CHUNK, min(self.token_budget, fits))

    @property
    def rate(self) -> float:
        """Tokens per second of recent steps of at least ``MIN_CHUNK`` tokens (mostly
        prompt chunks; 0.0 before the first)."""
        return self._rate

    def note_step(self, chunks: list[Chunk], seconds: float, main: bool = True) -> None:
        """A decode of ``chunks`` took ``seconds``: update the measured rate, and (``main``:
        in the model's own context) the cost of a generation step of its rows."""
        tokens = sum(len(c.tokens) for c in chunks)
        if main and chunks and all(c.start >= c.seq.num_prompt for c in chunks):
            self.step_cost.note(tokens, seconds)
        if tokens >= MIN_CHUNK and seconds > 0:
            rate = tokens / seconds
            self._rate = rate if not self._rate else 0.8 * self._rate + 0.2 * rate

    def commit(self, chunks: list[Chunk]) -> None:
        """Record that the chunks' tokens were decoded into the KV cache."""
        for chunk in chunks:
            assert chunk.seq.num_computed == chunk.start
            chunk.seq.num_computed = chunk.end

    def append_token(self, seq: Sequence, token: int) -> None:
        assert seq.status is SequenceStatus.RUNNING and not seq.is_prefilling
        seq.tokens.append(token)

    def preempt(self, seq: Sequence) -> int:
        """Send a running sequence that has generated nothing back to the front of the
        queue (the KV cache had no room for its prompt); returns the slot it freed, whose
        cells the caller drops. It is held there, and no waiting sequence is admitted,
        until a running sequence ends; then its prompt is computed again, and nobody else
        is admitted before that is done."""
        assert seq.status is SequenceStatus.RUNNING and not seq.num_generated
        slot = self._free(seq)
        seq.slot, seq.status, seq.held, seq.ahead = None, SequenceStatus.WAITING, True, False
        seq.preempted += 1
        seq.num_computed = seq.num_cached = 0
        seq.waiting_on, seq.checkpoints = None, ()
        self.waiting.appendleft(seq)
        return slot

    def _free(self, seq: Sequence) -> int:
        self.running.remove(seq)
        assert seq.slot is not None
        self._free_slots.append(seq.slot)
        self._free_slots.sort()
        return seq.slot

    def finish(self, seq: Sequence, status: SequenceStatus) -> int | None:
        """End a sequence (running or waiting); returns the slot it freed, if any. A
        running one's end lets the sequences ``preempt`` held be admitted again."""
        assert status.is_finished
        freed = None
        if seq.status is SequenceStatus.RUNNING:
            freed = self._free(seq)
            for other in self.waiting:
                other.held = False
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = status
        return freed


def _leaving_a_tile(n: int, remaining: int) -> int:
    """A prompt piece of ``n`` of the ``remaining`` tokens, shortened where it would leave
    fewer than ``ATTENTION_TILE`` tokens for the next one (and both stay a tile or more)."""
    if 0 < remaining - n < ATTENTION_TILE and remaining - ATTENTION_TILE >= ATTENTION_TILE:
        return remaining - ATTENTION_TILE
    return n


def _expectation(proposal: tuple[Chunk, list[int]]) -> float:
    drafter = proposal[0].seq.drafter
    assert isinstance(drafter, NgramDrafter)
    return drafter.expected


def _extend(chunk: Chunk, draft: list[int]) -> int:
    """Put draft tokens after a generating chunk's token; returns how many."""
    chunk.tokens.extend(draft)
    chunk.drafts = len(draft)
    assert chunk.seq.drafter is not None
    chunk.seq.drafter.proposed += len(draft)
    return len(draft)
