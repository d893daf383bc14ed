"""The engine: one thread that owns one llama context and runs the step loop.

Everything else talks to it with small messages (``Submit``, ``Abort``,
``Stop``) through a thread-safe inbox, and reads results from a per-request
asyncio queue that the engine fills with ``Delta`` objects, once per step,
via ``loop.call_soon_threadsafe``. No lock is ever held around the model.

One step: drain the inbox -> scheduler.schedule() -> one llama_decode for
all slots -> sample each slot that needs a token -> detokenize, check stop
strings / EOG / length -> deliver deltas to the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from edgeinfer.engine import native
from edgeinfer.engine.delta import Delta, Failure, FailureCode
from edgeinfer.engine.logprobs import TokenLogprob, token_logprob
from edgeinfer.engine.native import LlamaRuntime
from edgeinfer.engine.prefix_cache import PrefixCache
from edgeinfer.engine.prefix_index import common_prefix
from edgeinfer.engine.sampler import SamplerChain
from edgeinfer.engine.scheduler import Chunk, Scheduler
from edgeinfer.engine.sequence import SamplingParams, Sequence, SequenceStatus
from edgeinfer.engine.textstream import TextStream
from edgeinfer.errors import EngineError

log = logging.getLogger("edgeinfer.engine.loop")


@dataclass(frozen=True, slots=True)
class Submit:
    seq: Sequence


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class Stop:
    pass


@dataclass(frozen=True, slots=True)
class Unpin:
    pass


@dataclass(frozen=True, slots=True)
class FailAll:
    reason: str


Message = Submit | Abort | Stop | Unpin | FailAll


@dataclass(slots=True)
class EngineStats:
    """Counters written by the engine thread; read them for monitoring only."""

    steps: int = 0
    step_seconds: float = 0.0
    decode_seconds: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    requests_finished: int = 0
    decode_errors: int = 0

    def snapshot(self) -> dict[str, float]:
        share = self.decode_seconds / self.step_seconds if self.step_seconds else 0.0
        return {
            "steps": self.steps, "step_seconds": round(self.step_seconds, 4),
            "decode_seconds": round(self.decode_seconds, 4), "decode_share": round(share, 4),
            "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
            "requests_finished": self.requests_finished, "decode_errors": self.decode_errors,
        }


@dataclass(slots=True)
class _Timing:
    submitted: float = field(default_factory=time.perf_counter)
    first_token: float = 0.0
    last_token: float = 0.0
    prompt_done: float = 0.0


class LatencyObserver(Protocol):
    """Receives latencies from the engine thread (must be thread-safe and quick)."""

    def ttft(self, seconds: float) -> None: ...

    def itl(self, seconds: float) -> None: ...


class Engine:
    """Continuous-batching engine of one model; see the module docstring."""

    def __init__(self, runtime: LlamaRuntime) -> None:
        self.runtime = runtime
        cfg = runtime.cfg
        self.scheduler = Scheduler(cfg.slots, cfg.batch, cfg.max_slots_per_request)
        sharing = runtime.supports_prefix_sharing
        if cfg.prefix_cache and not sharing:
            log.warning("model %s: its KV memory (sliding-window or recurrent) cannot share "
                        "prefixes; prefix caching is off for it", cfg.id)
        self.cache = PrefixCache(runtime, cfg.slots, cfg.cache_entries,
                                 enabled=cfg.prefix_cache and sharing)
        self.stats = EngineStats()
        self._inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._outbox: list[tuple[Sequence, Delta]] = []
        self._eog_tokens: tuple[int, ...] | None = None
        self._timing: dict[str, _Timing] = {}
        self.observer: LatencyObserver | None = None

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
            self.runtime.close()
            return
        self._inbox.put(Stop())
        self._thread.join(timeout)
        self._thread = None

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, seq: Sequence) -> None:
        self._inbox.put(Submit(seq))

    def abort(self, request_id: str) -> None:
        self._inbox.put(Abort(request_id))

    def fail_all(self, reason: str) -> None:
        """End every running and waiting request with an error (shutdown deadline)."""
        self._inbox.put(FailAll(reason))

    def unpin_all(self) -> None:
        """Let pinned prefixes be evicted again (they stay cached until then)."""
        self._inbox.put(Unpin())

    async def generate(
        self, request_id: str, prompt: list[int], params: SamplingParams, *,
        use_cache: bool = True, pin: bool = False, priority: int = 0, group: str = "",
    ) -> AsyncIterator[Delta]:
        """Run one request; yields deltas until (and including) the finishing one.

        Closing or cancelling the iterator early aborts the request and frees
        its slot at the engine's next step.
        """
        if not self.is_running:
            raise EngineError("the engine is not running")
        n_ctx = self.runtime.info.n_ctx
        room = n_ctx - len(prompt)
        assert room > 0, "the HTTP layer rejects prompts that do not fit"
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        sink: asyncio.Queue[Delta] = asyncio.Queue()
        seq = Sequence(request_id, prompt, params, max_tokens, sink=sink, use_cache=use_cache,
                       pin=pin, priority=priority, group=group)
        self.submit(seq)
        done = False
        try:
            while True:
                delta = await sink.get()
                if delta.finish_reason is not None:
                    done = True
                yield delta
                if done:
                    return
        finally:
            if not done:
                self.abort(request_id)

    def _deliver(self, items: list[tuple[Sequence, Delta]]) -> None:
        for seq, delta in items:
            seq.sink.put_nowait(delta)

    # -- engine thread -----------------------------------------------------
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
            self.runtime.close()

    def _drain(self, block: bool) -> bool:
        """Apply inbox messages; returns False on Stop."""
        try:
            msg = self._inbox.get(block=block)
        except queue.Empty:
            return True
        while True:
            if isinstance(msg, Stop):
                return False
            if isinstance(msg, Submit):
                self._admit(msg.seq)
            elif isinstance(msg, FailAll):
                self._fail_all(msg.reason)
            elif isinstance(msg, Unpin):
                log.info("unpinned %d cached prefixes", self.cache.unpin_all())
            elif isinstance(msg, Abort):
                seq = self.scheduler.find(msg.request_id)
                if seq is not None:
                    log.info("request %s aborted by client (slot %s)", seq.request_id, seq.slot)
                    self._finish(seq, SequenceStatus.FINISHED_ABORTED)
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _admit(self, seq: Sequence) -> None:
        try:
            bans = self._eog() if seq.params.ignore_eos else ()
            seq.sampler = SamplerChain(seq.params, self.runtime.info.n_vocab, bans,
                                       self.runtime.vocab, self.runtime.piece)
        except (ValueError, MemoryError) as exc:
            log.warning("request %s: sampler setup failed: %s", seq.request_id, exc)
            self._outbox.append((seq, Delta("", finish_reason="error", failure=Failure(
                FailureCode.SAMPLER, str(exc)))))
            return
        seq.text = TextStream(seq.params.stop)
        self._timing[seq.request_id] = _Timing()
        self.scheduler.add(seq, time.monotonic())

    def _eog(self) -> tuple[int, ...]:
        if self._eog_tokens is None:
            rt = self.runtime
            self._eog_tokens = tuple(t for t in range(rt.info.n_vocab) if rt.is_eog(t))
        return self._eog_tokens

    def _attach(self, seq: Sequence) -> None:
        """Give a newly admitted sequence its cached prefix, or make it wait for one."""
        assert seq.slot is not None
        limit = seq.num_prompt - 1  # at least one prompt token is computed, for logits
        if not seq.use_cache or not self.cache.enabled:
            self.cache.count_lookup(0)
            return
        seq.num_computed = seq.num_cached = self.cache.attach(seq.slot, seq.prompt, limit)
        self.cache.count_lookup(seq.num_cached)
        # A request still prefilling a prefix we share: wait and attach, not compute twice.
        best: tuple[Sequence, int] | None = None
        for other in self.scheduler.running:
            # only older requests: waits then always point back in time, never in a cycle
            if other.arrival >= seq.arrival or not other.is_prefilling or not other.use_cache:
                continue
            shared = min(common_prefix(other.prompt, seq.prompt), limit)
            if shared > max(seq.num_computed, other.num_computed) and (
                    best is None or shared > best[1]):
                best = (other, shared)
        seq.waiting_on = best

    def _resume_waiters(self) -> None:
        for seq in self.scheduler.running:
            if seq.waiting_on is None:
                continue
            other, shared = seq.waiting_on
            if other.status is SequenceStatus.RUNNING and other.num_computed < shared:
                continue
            seq.waiting_on = None
            assert seq.slot is not None
            got = self.cache.attach(seq.slot, seq.prompt, seq.num_prompt - 1)
            if got > seq.num_computed:
                self.cache.stats.hit_tokens += got - seq.num_computed
                seq.num_computed = seq.num_cached = got

    def _expire(self) -> None:
        """End requests past the time limit, waiting or running: no slot is held forever."""
        limit = self.runtime.cfg.request_timeout
        now = time.perf_counter()
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            timing = self._timing.get(seq.request_id)
            if timing is not None and now - timing.submitted > limit:
                self._finish(seq, SequenceStatus.FINISHED_ERROR, Failure(
                    FailureCode.TIMEOUT, f"the request exceeded the time limit of {limit:g} s"))

    def _step(self) -> None:
        t0 = time.perf_counter()
        self._expire()
        if not self.scheduler.has_work():
            return
        for seq in self.scheduler.admit(time.monotonic()):
            self._attach(seq)
        self._resume_waiters()
        chunks = self.scheduler.schedule()
        if not chunks:
            return
        entries = [(c.seq.slot, c.start, c.tokens, c.wants_logits) for c in chunks]
        t1 = time.perf_counter()
        rc, out_index = self.runtime.decode(entries)  # type: ignore[arg-type]
        t2 = time.perf_counter()
        if rc != native.DECODE_OK:
            self._on_decode_error(rc, chunks)
        else:
            self.scheduler.commit(chunks)
            for chunk in chunks:
                assert chunk.seq.slot is not None
                self.cache.committed(chunk.seq.slot, chunk.tokens)
            ctx = self.runtime.ctx
            k = 0
            for chunk in chunks:
                seq = chunk.seq
                is_prompt = chunk.start < seq.num_prompt
                if is_prompt:
                    self.stats.prompt_tokens += len(chunk.tokens)
                if not chunk.wants_logits:
                    continue
                if is_prompt:
                    self._timing[seq.request_id].prompt_done = t2
                index = out_index[k]
                k += 1
                try:
                    token = seq.sampler.sample(ctx, index)
                    lp = None
                    if seq.params.logprobs is not None:
                        row = self.runtime.logits_row(index)
                        lp = token_logprob(row, token, seq.params.logprobs)
                    self._on_token(seq, token, t2, lp)
                except Exception:  # a failure of one request ends that request only
                    log.exception("request %s: sampling failed", seq.request_id)
                    if seq.status is SequenceStatus.RUNNING:
                        self._finish(seq, SequenceStatus.FINISHED_ERROR, Failure(
                            FailureCode.INTERNAL, "internal error while sampling"))
        t3 = time.perf_counter()
        st = self.stats
        st.steps += 1
        st.decode_seconds += t2 - t1
        st.step_seconds += t3 - t0

    def _on_token(
        self, seq: Sequence, token: int, now: float, lp: TokenLogprob | None = None
    ) -> None:
        self.scheduler.append_token(seq, token)
        self.stats.generated_tokens += 1
        timing = self._timing[seq.request_id]
        if not timing.first_token:
            timing.first_token = now
            if self.observer is not None:
                self.observer.ttft(now - timing.submitted)
        elif self.observer is not None:
            self.observer.itl(now - timing.last_token)
        timing.last_token = now
        rt = self.runtime
        if rt.is_eog(token) and not seq.params.ignore_eos:
            self._finish(seq, SequenceStatus.FINISHED_STOPPED)
            return
        text = seq.text.push(rt.piece(token))
        if seq.text.stopped_by is not None:
            self._emit(seq, text, token, lp)
            self._finish(seq, SequenceStatus.FINISHED_STOPPED)
        elif seq.num_generated >= seq.max_tokens:
            self._emit(seq, text, token, lp)
            self._finish(seq, SequenceStatus.FINISHED_LENGTH)
        else:
            self._emit(seq, text, token, lp)

    def _emit(self, seq: Sequence, text: str, token: int, lp: TokenLogprob | None) -> None:
        self._outbox.append((seq, Delta(text, (token,), logprob=lp)))

    def _finish(self, seq: Sequence, status: SequenceStatus,
                failure: Failure | None = None) -> None:
        was_running = seq.status is SequenceStatus.RUNNING
        slot = self.scheduler.finish(seq, status)
        if slot is not None:
            keep = status is not SequenceStatus.FINISHED_ERROR and seq.use_cache
            self.cache.release(slot, keep=keep, pinned=seq.pin)
        if seq.sampler is not None:
            seq.sampler.close()
            seq.sampler = None
        tail = seq.text.flush() if seq.text is not None and failure is None else ""
        timing = self._timing.pop(seq.request_id, None)
        self.stats.requests_finished += 1
        if status is SequenceStatus.FINISHED_ABORTED:
            return
        timings = _timings(seq, timing) if timing else None
        self._outbox.append((seq, Delta(
            tail, finish_reason=status.finish_reason, failure=failure,
            prompt_tokens=seq.num_prompt, completion_tokens=seq.num_generated,
            cached_tokens=seq.num_cached, timings=timings,
        )))
        log.info(
            "request %s finished: %s, slot %s, prompt %d, generated %d%s",
            seq.request_id, status.finish_reason, seq.slot if was_running else "-",
            seq.num_prompt, seq.num_generated,
            f", error: {failure.message}" if failure else "",
        )

    def _on_decode_error(self, rc: int, chunks: list[Chunk]) -> None:
        self.stats.decode_errors += 1
        msg = native.describe_decode_error(rc)
        for chunk in chunks:  # undo whatever part of the batch reached the cache
            if chunk.seq.slot is not None:
                self.cache.rollback(chunk.seq.slot, chunk.start)
        if rc == native.DECODE_NO_KV_SLOT and self.cache.evict_one():
            log.info("KV cache full: evicted cached prefixes, retrying")
            return
        if rc == native.DECODE_NO_KV_SLOT and len(self.scheduler.running) > 1:
            # Out of KV cells: stop only the newest request, the others go on.
            victim = max((c.seq for c in chunks), key=lambda s: s.arrival)
            log.warning("KV cache full: stopping request %s", victim.request_id)
            if victim.num_generated:
                self._finish(victim, SequenceStatus.FINISHED_LENGTH)
            else:
                self._finish(victim, SequenceStatus.FINISHED_ERROR, Failure(
                    FailureCode.KV_FULL,
                    "the KV cache is full; retry when fewer requests are running"))
            return
        log.error("llama_decode failed (rc=%d): %s", rc, msg)
        for seq in {id(c.seq): c.seq for c in chunks}.values():
            self._finish(seq, SequenceStatus.FINISHED_ERROR, Failure(FailureCode.DECODE, msg))

    def _fail_all(self, msg: str) -> None:
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self._finish(seq, SequenceStatus.FINISHED_ERROR, Failure(FailureCode.SHUTDOWN, msg))

    def _flush(self) -> None:
        if self._outbox and self._loop is not None:
            items, self._outbox = self._outbox, []
            try:
                self._loop.call_soon_threadsafe(self._deliver, items)
            except RuntimeError:  # loop closed during shutdown
                pass

    def slots_snapshot(self) -> list[dict[str, object]]:
        """Each slot's state, for GET /slots (read off the engine thread: a snapshot)."""
        busy = {seq.slot: seq for seq in list(self.scheduler.running)}
        out: list[dict[str, object]] = []
        for slot in range(self.scheduler.num_slots):
            seq = busy.get(slot)
            if seq is None:
                out.append({"id": slot, "state": "idle"})
                continue
            state = ("waiting_for_prefix" if seq.waiting_on is not None
                     else "prefilling" if seq.is_prefilling else "generating")
            out.append({"id": slot, "state": state, "request_id": seq.request_id,
                        "prompt_tokens": seq.num_prompt, "cached_tokens": seq.num_cached,
                        "computed_tokens": seq.num_computed, "generated_tokens": seq.num_generated,
                        "max_tokens": seq.max_tokens})
        return out

    def stats_snapshot(self) -> dict[str, object]:
        s: dict[str, object] = dict(self.stats.snapshot())
        s["slots_busy"] = len(self.scheduler.running)
        s["slots_total"] = self.scheduler.num_slots
        s["queued"] = self.scheduler.num_waiting
        s["n_ctx"] = self.runtime.info.n_ctx
        s["prefix_cache"] = self.cache.snapshot()
        return s


def _timings(seq: Sequence, t: _Timing) -> dict[str, float]:
    end = time.perf_counter()
    prompt_s = max(t.prompt_done - t.submitted, 1e-9) if t.prompt_done else 0.0
    gen_s = max(end - t.first_token, 1e-9) if t.first_token else 0.0
    n_gen = max(seq.num_generated - 1, 0)
    return {
        "prompt_n": seq.num_prompt - seq.num_cached,
        "cache_n": seq.num_cached,
        "prompt_ms": round(prompt_s * 1000, 3),
        "prompt_per_second": round((seq.num_prompt - seq.num_cached) / prompt_s, 2)
        if prompt_s else 0.0,
        "predicted_n": seq.num_generated,
        "predicted_ms": round(gen_s * 1000, 3),
        "predicted_per_second": round(n_gen / gen_s, 2) if gen_s and n_gen else 0.0,
        "ttft_ms": round((t.first_token - t.submitted) * 1000, 3) if t.first_token else 0.0,
    }

