"""The engine: one thread that owns one llama context and runs the step loop.

Everything else talks to it with small messages (``Submit``, ``Abort``,
``Stop``, ``Unpin``, ``FailAll``) through a thread-safe inbox, and reads results
from a per-request asyncio queue that the engine fills with ``Delta`` objects,
once per step, via ``loop.call_soon_threadsafe``. No lock is ever held around
the model.

One step: drain the inbox -> ``_schedule()`` (time limits, admission, ``prefix_wait``, the
batch plan) -> one llama_decode for all slots -> ``_postprocess()`` (sampling, ``finishing``)
-> deltas to the event loop. A DRY sampler (slow to make: ``dry``) is made before its request
is submitted, off the engine thread. What the engine reports: ``report``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable

from edgeinfer.engine import finishing, invariance, speculation
from edgeinfer.engine.batch import Run
from edgeinfer.engine.decode_errors import DECODE_OK, after_decode_error
from edgeinfer.engine.delta import Delta, Failure, FailureCode
from edgeinfer.engine.draft_model import DraftModel
from edgeinfer.engine.dry import DryCache
from edgeinfer.engine.finishing import DeltaSink, LogitsSource, Output, Sampled, overdue
from edgeinfer.engine.kv import seats
from edgeinfer.engine.lane import SEQ, Lane
from edgeinfer.engine.messages import Abort, Call, FailAll, Message, Stop, Submit, Unpin
from edgeinfer.engine.native import LlamaRuntime
from edgeinfer.engine.prefix_cache import open_cache
from edgeinfer.engine.prefix_wait import attach, resume_waiters
from edgeinfer.engine.report import EngineStats, LatencyObserver, note_token, slots_json, stats_json
from edgeinfer.engine.scheduler import Chunk, Scheduler
from edgeinfer.engine.sequence import SamplingParams, Sequence, SequenceStatus
from edgeinfer.errors import EngineError

log = logging.getLogger("edgeinfer.engine.loop")


class Engine:
    """Continuous-batching engine of one model; see the module docstring."""

    def __init__(self, runtime: LlamaRuntime, draft: DraftModel | None = None) -> None:
        self.runtime = runtime
        self.draft = draft  # the draft model (models.toml speculative = "draft"), owned
        cfg = runtime.cfg
        drafts = speculation.drafter_for(cfg, runtime.memory_kind, SamplingParams(), draft)
        self.scheduler = Scheduler(cfg.slots, cfg.batch, cfg.max_slots_per_request,
                                   cfg.prefill_batch, cfg.step_target_ms / 1000,
                                   2 * cfg.draft_max if drafts else 0,
                                   seats(cfg, runtime.memory_kind) - cfg.slots)
        self.cache = open_cache(runtime)  # (prompts go ahead in cells free of pinned ones)
        self.scheduler.free_cells = lambda: runtime.info.n_ctx - self.cache.pinned_cells()
        self.dry = DryCache(runtime.vocab, runtime.info.n_ctx)  # prototypes, by setting
        self.stats = EngineStats()
        self.observer: LatencyObserver | None = None
        self._inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._outbox: list[tuple[DeltaSink, Delta]] = []
        self._outputs: dict[Sequence, Output] = {}  # every admitted, unfinished request
        self._lane: Lane | None = None  # deterministic requests' context, on first use

    # -- event-loop side -------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._thread is None
        self._loop = loop
        self._thread = threading.Thread(
            target=self._run, name=f"engine-{self.runtime.cfg.id}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread; pending requests end with an error. Frees the context."""
        if self._thread is None:
            return self._close()
        self._inbox.put(Stop())
        self._thread.join(timeout)
        self._thread = None

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, seq: Sequence, sink: DeltaSink) -> None:
        self._inbox.put(Submit(seq, sink))

    def abort(self, request_id: str, stop: bool = False) -> None:  # stop: see _drain
        self._inbox.put(Abort(request_id, stop))

    def fail_all(self, reason: str) -> None:
        """End every running and waiting request with an error (shutdown deadline)."""
        self._inbox.put(FailAll(reason))

    def unpin_all(self) -> None:
        """Let pinned prefixes be evicted again (they stay cached until then)."""
        self._inbox.put(Unpin())

    async def call(self, fn: Callable[[], object]) -> object:
        """``fn()`` run on the engine thread, between two steps (for work on the context
        or the prefix cache, such as saving or restoring a prefix's state)."""
        if not self.is_running:
            raise EngineError("the engine is not running")
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._inbox.put(Call(fn, future))
        return await future

    async def generate(
        self, request_id: str, prompt: list[int], params: SamplingParams, *,
        use_cache: bool = True, pin: bool = False, priority: int = 0, group: str = "",
    ) -> AsyncIterator[Delta]:
        """Run one request; yields deltas until (and including) the finishing one. Closing
        or cancelling the iterator early aborts the request and frees its slot."""
        if not self.is_running:
            raise EngineError("the engine is not running")
        room = self.runtime.info.n_ctx - len(prompt)
        assert room > 0, "the HTTP layer rejects prompts that do not fit"
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        if params.dry_multiplier > 0.0 and not self.dry.ready(params):  # made off the engine
            await asyncio.to_thread(self.dry.prepare, params)  # thread, cloned on it
        sink: asyncio.Queue[Delta] = asyncio.Queue()
        seq = Sequence(request_id, prompt, params, max_tokens, use_cache=use_cache,
                       pin=pin, priority=priority, group=group)
        self.submit(seq, sink)
        done = False
        try:
            while True:
                delta = await sink.get()
                done = delta.finish_reason is not None
                yield delta
                if done:
                    return
        finally:
            if not done:
                self.abort(request_id)

    def slots_snapshot(self) -> list[dict[str, object]]:
        """Each slot's state, for GET /slots (see ``report.slots_json``)."""
        return slots_json(self.scheduler)

    def stats_snapshot(self) -> dict[str, object]:
        """Counters, slots, queue and prefix cache (see ``report.stats_json``)."""
        return stats_json(self.stats, self.scheduler, self.runtime.info.n_ctx, self.cache)

    # -- engine thread: messages -------------------------------------------
    def _run(self) -> None:
        try:
            while self._drain(block=not self.scheduler.has_work()):
                if self.scheduler.has_work():
                    try:
                        self._step()
                    except Exception:  # a bug: end the running requests, keep serving
                        log.exception("engine step failed")
                        for seq in list(self.scheduler.running):
                            self._finish(seq, SequenceStatus.FINISHED_ERROR, Failure(
                                FailureCode.INTERNAL, "internal error while generating"))
                self._flush()
        except Exception:
            log.exception("engine thread crashed")
        finally:
            self._fail_all("the engine stopped")
            self._flush()
            self._refuse_calls()
            self._close()

    def _close(self) -> None:  # DRY prototypes, the lane, the draft model, the context
        for part in (p for p in (self.dry, self._lane, self.draft, self.runtime) if p is not None):
            part.close()

    def _refuse_calls(self) -> None:  # calls still in the inbox when the engine stops
        while not self._inbox.empty():
            if isinstance(msg := self._inbox.get_nowait(), Call) and self._loop is not None:
                self._loop.call_soon_threadsafe(_settle, msg.future, None,
                                                EngineError("the engine stopped"))

    def _drain(self, block: bool) -> bool:
        """Apply inbox messages; returns False on Stop."""
        if block:  # nothing to do till a message comes: save kept entries' states meanwhile
            self.cache.stash_idle(lambda: not self._inbox.empty())
        try:
            msg = self._inbox.get(block=block)
        except queue.Empty:
            return True
        while True:
            if isinstance(msg, Stop):
                return False
            if isinstance(msg, Submit):
                self._admit(msg.seq, msg.sink)
            elif isinstance(msg, FailAll):
                self._fail_all(msg.reason)
            elif isinstance(msg, Unpin):
                log.info("unpinned %d cached prefixes", self.cache.unpin_all())
            elif isinstance(msg, Call):
                self._call(msg)
            elif isinstance(msg, Abort):
                seq = self.scheduler.find(msg.request_id)
                if seq is not None:  # stop: finished early, as a stop (its last delta sent)
                    log.info("request %s %s (slot %s)", seq.request_id,
                             "ended early" if msg.stop else "aborted by client", seq.slot)
                    self._finish(seq, SequenceStatus.FINISHED_STOPPED if msg.stop
                                 else SequenceStatus.FINISHED_ABORTED)
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _call(self, msg: Call) -> None:
        assert self._loop is not None
        try:
            result, error = msg.fn(), None
        except Exception as exc:  # goes to the caller
            result, error = None, exc
        self._loop.call_soon_threadsafe(_settle, msg.future, result, error)

    def _admit(self, seq: Sequence, sink: DeltaSink) -> None:
        cfg, det = self.runtime.cfg, seq.params.deterministic
        seq.deterministic = cfg.deterministic if det is None else det
        try:
            if seq.deterministic and self._lane is None:
                self._lane = Lane(self.runtime)
            bans = self.runtime.eog_tokens() if seq.params.ignore_eos else ()
            out = finishing.open_output(seq, sink, self.runtime, bans, self.dry)
        except (ValueError, MemoryError, EngineError) as exc:
            log.warning("request %s: setup failed: %s", seq.request_id, exc)
            self._outbox.append((sink, Delta("", finish_reason="error", failure=Failure(
                FailureCode.KV_FULL if isinstance(exc, EngineError) else FailureCode.SAMPLER,
                str(exc)))))
            return
        self._outputs[seq] = out
        seq.drafter = None if seq.deterministic else speculation.drafter_for(
            cfg, self.runtime.memory_kind, seq.params, self.draft)
        self.scheduler.add(seq, time.monotonic())

    # -- engine thread: one step ---------------------------------------------
    def _step(self) -> None:
        t0 = time.perf_counter()
        chunks = self._schedule()
        if not chunks:
            return
        # one llama_decode, and one in the lane while a deterministic sequence runs
        for call in invariance.calls(chunks):
            self._decode([c for c in call if c.seq.status is SequenceStatus.RUNNING])
        self.stats.steps += 1
        self.stats.step_seconds += time.perf_counter() - t0

    def _decode(self, chunks: list[Chunk]) -> None:
        """One llama_decode of ``chunks`` (the lane's: a deterministic one's), then sampling."""
        if not chunks:
            return
        lane = self._lane if chunks[0].seq.deterministic else None
        runs = [Run(SEQ if lane else c.seq.slot, c.start, c.tokens, c.wants_logits, c.drafts)
                for c in chunks if c.seq.slot is not None]
        assert len(runs) == len(chunks), "a scheduled sequence holds a slot"
        t1 = time.perf_counter()
        decoded = (lane or self.runtime).decode(runs)
        t2 = time.perf_counter()
        if decoded.rc != DECODE_OK:
            self._on_decode_error(decoded.rc, chunks, lane)
        else:
            self._postprocess(chunks, decoded.outputs, t2, lane)
        self.scheduler.note_step(chunks if decoded.rc == DECODE_OK else [], t2 - t1, lane is None)
        self.stats.decode_seconds += t2 - t1

    def _schedule(self) -> list[Chunk]:
        """End requests past their time limit, admit waiting ones (with their cached
        prefix, or a wait for one), and plan the batch (empty: nothing to decode)."""
        self._expire()
        if not self.scheduler.has_work():
            return []
        admitted, running = self.scheduler.admit(time.monotonic()), self.scheduler.running
        if running:  # idle cached cells slow every step: none stays while requests run
            self.cache.trim_idle([s.prompt for s in running
                                  if s.is_prefilling and not s.deterministic])
        for seq in admitted:
            attach(self.cache, running, seq, self._lane)
        resume_waiters(self.cache, running)
        return self.scheduler.schedule()

    def _expire(self) -> None:
        """End requests past the time limit, waiting or running: no slot is held forever."""
        limit = self.runtime.cfg.request_timeout
        seqs = [*self.scheduler.running, *self.scheduler.waiting]
        for seq in overdue(seqs, self._outputs, time.perf_counter(), limit):
            self._finish(seq, SequenceStatus.FINISHED_ERROR, Failure(
                FailureCode.TIMEOUT, f"the request exceeded the time limit of {limit:g} s"))

    def _postprocess(self, chunks: list[Chunk], outputs: list[int], now: float,
                     lane: Lane | None) -> None:
        """The batch is in the KV cache (the lane's, with ``lane``): record it, then sample
        each chunk that wants a token (``outputs``: their batch indexes, in order)."""
        self.scheduler.commit(chunks)
        for chunk in chunks:
            assert chunk.seq.slot is not None
            if lane is not None:
                lane.committed(chunk.tokens)
            else:
                self.cache.committed(chunk.seq.slot, chunk.tokens,
                                     chunk.end in chunk.seq.checkpoints)
        indexes = iter(outputs)
        for chunk in chunks:
            seq = chunk.seq
            is_prompt = chunk.start < seq.num_prompt
            self.stats.prompt_tokens += len(chunk.tokens) if is_prompt else 0
            if not chunk.wants_logits:
                continue
            out = self._outputs[seq]
            if is_prompt:
                out.timing.prompt_done = now
            self._sample(chunk, out, next(indexes), now, lane or self.runtime)

    def _sample(self, chunk: Chunk, out: Output, index: int, now: float,
                src: LogitsSource) -> None:
        seq = chunk.seq
        try:
            if chunk.drafts:
                self._verify(chunk, out, index, now)
            else:
                self._on_token(seq, out, finishing.sample(seq, out, src, index), now)
        except Exception as exc:  # a failure of one request ends that request only
            failure = finishing.sampling_failure(seq.request_id, exc)
            if seq.status is SequenceStatus.RUNNING:
                self._finish(seq, SequenceStatus.FINISHED_ERROR, failure)

    def _verify(self, chunk: Chunk, out: Output, index: int, now: float) -> None:
        """Sample the sequence's last token and its drafts (``speculation``); keep the
        accepted drafts' cells, remove the others'."""
        seq = chunk.seq
        assert seq.slot is not None and seq.drafter is not None
        results, taken = speculation.verify(self.scheduler, seq, out, self.runtime, index,
                                            chunk.tokens[-chunk.drafts:])
        seq.num_computed = chunk.start + 1 + taken
        self.cache.rollback(seq.slot, seq.num_computed)
        seq.drafter.accepted(chunk.drafts, taken)
        self.stats.draft_tokens += chunk.drafts
        self.stats.accepted_drafts += taken
        for _, verdict in results:
            self._apply(seq, out, verdict, now)

    def _on_token(self, seq: Sequence, out: Output, sampled: Sampled, now: float) -> None:
        rt = self.runtime
        verdict = finishing.after_token(self.scheduler, seq, out, sampled,
                                        rt.piece(sampled.token), is_eog=rt.is_eog(sampled.token))
        self._apply(seq, out, verdict, now)

    def _apply(self, seq: Sequence, out: Output, verdict: finishing.Verdict, now: float) -> None:
        self.stats.generated_tokens += 1
        note_token(out.timing, now, self.observer)
        if verdict.delta is not None:
            self._outbox.append((out.sink, verdict.delta))
        if verdict.status is not None:
            self._finish(seq, verdict.status)

    def _finish(self, seq: Sequence, status: SequenceStatus,
                failure: Failure | None = None) -> None:
        was_running = seq.status is SequenceStatus.RUNNING
        slot = self.scheduler.finish(seq, status)
        if slot is not None:
            keep = status is not SequenceStatus.FINISHED_ERROR and seq.use_cache
            self.cache.release(slot, keep=keep, pinned=seq.pin)
        out = self._outputs.pop(seq, None)
        self.stats.requests_finished += 1
        delta = finishing.last_delta(seq, out, status, failure) if out is not None else None
        if out is None or delta is None:  # aborted (or already ended): nobody reads more
            return
        self._outbox.append((out.sink, delta))
        log.info("request %s finished: %s, slot %s, prompt %d (cached %d), generated %d%s",
                 seq.request_id, status.finish_reason, seq.slot if was_running else "-",
                 seq.num_prompt, seq.num_cached, seq.num_generated,
                 f", error: {failure.message}" if failure else "")

    def _on_decode_error(self, rc: int, chunks: list[Chunk], lane: Lane | None) -> None:
        self.stats.decode_errors += 1
        for end in after_decode_error(rc, chunks, self.cache, lane, self.scheduler):
            self._finish(end.seq, end.status, end.failure)

    def _fail_all(self, msg: str) -> None:
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self._finish(seq, SequenceStatus.FINISHED_ERROR, Failure(FailureCode.SHUTDOWN, msg))

    def _flush(self) -> None:
        if self._outbox and self._loop is not None:
            items, self._outbox = self._outbox, []
            try:
                self._loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # loop closed during shutdown
                pass


def _settle(future: asyncio.Future[object], result: object, error: Exception | None) -> None:
    if not future.done():
        future.set_result(result) if error is None else future.set_exception(error)


def _deliver(items: list[tuple[DeltaSink, Delta]]) -> None:
    for sink, delta in items:
        sink.put_nowait(delta)
