"""The per-request finishing rules, applied to each sampled token: append it, detokenize
it (the request's TextStream holds back split characters and what may start a stop
string), end the request on end of generation, a stop string or its length, and make
the ``Delta`` that carries the text, the token and its logprobs; and the last delta.

``Output`` is the engine's side of one admitted request (its sink, sampler, text and
timing); the engine owns it from admission to finish, on its thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from edgeinfer.engine.delta import Delta, Failure, FailureCode
from edgeinfer.engine.dry import DryCache
from edgeinfer.engine.handles import ContextPtr
from edgeinfer.engine.logprobs import TokenLogprob, token_logprob
from edgeinfer.engine.native import LlamaRuntime
from edgeinfer.engine.report import Timing, timings_json
from edgeinfer.engine.sampler import GrammarDeadEnd, SamplerChain
from edgeinfer.engine.scheduler import Scheduler
from edgeinfer.engine.sequence import Sequence, SequenceStatus
from edgeinfer.engine.textstream import TextStream

log = logging.getLogger("edgeinfer.engine")


class DeltaSink(Protocol):
    """Where a request's deltas go (an asyncio.Queue, called on its event loop)."""

    def put_nowait(self, item: Delta, /) -> None: ...


@dataclass(slots=True, eq=False)
class Output:
    """One admitted request's sink, sampler chain, text so far and timing."""

    sink: DeltaSink
    sampler: SamplerChain
    text: TextStream
    timing: Timing = field(default_factory=Timing)


def open_output(seq: Sequence, sink: DeltaSink, runtime: LlamaRuntime,
                eog_bans: tuple[int, ...], dry: DryCache | None = None) -> Output:
    """A request's Output; ValueError or MemoryError if its sampler cannot be built."""
    sampler = SamplerChain(seq.params, runtime.info.n_vocab, eog_bans, runtime.vocab,
                           runtime.piece, runtime.info.n_ctx, dry)
    return Output(sink, sampler, TextStream(seq.params.stop))


class Sampled(NamedTuple):
    token: int
    logprob: TokenLogprob | None  # when the request asked for logprobs


class Verdict(NamedTuple):
    """What one sampled token does to its request."""

    delta: Delta | None  # the output it releases (None: none, as for an end-of-generation)
    status: SequenceStatus | None  # the status that ends the request now (None: it goes on)


class LogitsSource(Protocol):
    """What sampling reads: a context's last decode (the runtime's, or the lane's)."""

    @property
    def ctx(self) -> ContextPtr: ...

    def logits_row(self, batch_index: int) -> npt.NDArray[np.float32]: ...


def sample(seq: Sequence, out: Output, runtime: LogitsSource, index: int) -> Sampled:
    """Sample the request's next token from output ``index`` of the last decode, with its
    logprobs (from the raw logits) when asked for."""
    token = out.sampler.sample(runtime.ctx, index)
    k = seq.params.logprobs
    lp = None if k is None else token_logprob(runtime.logits_row(index), token, k)
    return Sampled(token, lp)


def after_token(scheduler: Scheduler, seq: Sequence, out: Output, sampled: Sampled,
                piece: bytes, *, is_eog: bool) -> Verdict:
    """Append a sampled token (whose bytes are ``piece``) and apply the finishing rules:
    end of generation, stop strings (found across token boundaries), length."""
    scheduler.append_token(seq, sampled.token)
    if is_eog and not seq.params.ignore_eos:
        return Verdict(None, SequenceStatus.FINISHED_STOPPED)
    # stop strings end text, never a tool call (or other output) a lazy grammar constrains
    text = out.text.push(piece, stops=not out.sampler.lazily_constrained)
    delta = Delta(text, (sampled.token,), logprob=sampled.logprob)
    if out.text.stopped_by is not None:
        return Verdict(delta, SequenceStatus.FINISHED_STOPPED)
    if seq.num_generated >= seq.max_tokens:
        return Verdict(delta, SequenceStatus.FINISHED_LENGTH)
    return Verdict(delta, None)


def last_delta(seq: Sequence, out: Output, status: SequenceStatus,
               failure: Failure | None) -> Delta | None:
    """Free the request's sampler; the delta that ends it: the text still held back (none
    after a failure), the finish reason, the counts and llama-server's ``timings``. None
    for an aborted request, which nobody reads."""
    out.sampler.close()
    tail = out.text.flush() if failure is None else ""
    if status is SequenceStatus.FINISHED_ABORTED:
        return None
    return Delta(
        tail, finish_reason=status.finish_reason, failure=failure,
        prompt_tokens=seq.num_prompt, completion_tokens=seq.num_generated,
        cached_tokens=seq.num_cached, timings=timings_json(seq, out.timing),
        stop_word=out.text.stopped_by,
    )


def overdue(seqs: Iterable[Sequence], outputs: Mapping[Sequence, Output], now: float,
            limit: float) -> list[Sequence]:
    """The requests, waiting or running, submitted more than ``limit`` seconds before
    ``now`` (``time.perf_counter``): they end with a time-out, so no slot is held forever."""
    return [seq for seq in seqs
            if (out := outputs.get(seq)) is not None and now - out.timing.submitted > limit]


def sampling_failure(request_id: str, exc: Exception) -> Failure:
    """The failure a request whose sampling raised ``exc`` ends with (logged): a grammar
    with no way on is the request's error, anything else a bug contained to it."""
    if isinstance(exc, GrammarDeadEnd):
        log.warning("request %s: %s", request_id, exc)
        return Failure(FailureCode.GRAMMAR, str(exc))
    log.error("request %s: sampling failed", request_id, exc_info=exc)
    return Failure(FailureCode.INTERNAL, "internal error while sampling")
