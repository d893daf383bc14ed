"""What the engine reports, computed outside its step loop: counters, latencies to an
observer, llama-server's ``timings`` of a finished request, the state of each slot
(GET /slots) and the engine's stats."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from edgeinfer.engine.prefix_cache import PrefixCache
from edgeinfer.engine.scheduler import Scheduler
from edgeinfer.engine.sequence import Sequence


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
    draft_tokens: int = 0  # draft tokens verified (speculative decoding)
    accepted_drafts: int = 0  # of those, the ones accepted

    def snapshot(self) -> dict[str, float]:
        share = self.decode_seconds / self.step_seconds if self.step_seconds else 0.0
        return {
            "steps": self.steps, "step_seconds": round(self.step_seconds, 4),
            "decode_seconds": round(self.decode_seconds, 4), "decode_share": round(share, 4),
            "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
            "requests_finished": self.requests_finished, "decode_errors": self.decode_errors,
            "draft_tokens": self.draft_tokens, "accepted_drafts": self.accepted_drafts,
        }


@dataclass(slots=True)
class Timing:
    """When a request was submitted, computed its prompt and produced tokens."""

    submitted: float = field(default_factory=time.perf_counter)
    first_token: float = 0.0
    last_token: float = 0.0
    prompt_done: float = 0.0


class LatencyObserver(Protocol):
    """Receives latencies from the engine thread (must be thread-safe and quick)."""

    def ttft(self, seconds: float) -> None: ...

    def itl(self, seconds: float) -> None: ...


def note_token(t: Timing, now: float, observer: LatencyObserver | None) -> None:
    """Record that a request produced a token at ``now``: its time to first token, or
    the time since its last token, goes to the observer."""
    if not t.first_token:
        t.first_token = now
        if observer is not None:
            observer.ttft(now - t.submitted)
    elif observer is not None:
        observer.itl(now - t.last_token)
    t.last_token = now


def timings_json(seq: Sequence, t: Timing) -> dict[str, float]:
    """llama-server's ``timings`` object of a finished request."""
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
        **({"draft_n": seq.drafter.proposed, "draft_n_accepted": seq.drafter.taken}
           if seq.drafter is not None and seq.drafter.proposed else {}),
    }


def slots_json(scheduler: Scheduler) -> list[dict[str, object]]:
    """Each slot's state, for GET /slots (read off the engine thread: a snapshot): the
    slots, by position (idle ones after the busy), then the requests ahead of a slot
    (``scheduler``: their prompts computed, then ``waiting_for_slot``)."""
    running = list(scheduler.running)
    inside = [s for s in running if not s.ahead]
    listed = inside + [None] * (scheduler.num_slots - len(inside)) + [
        s for s in running if s.ahead]
    out: list[dict[str, object]] = []
    for n, seq in enumerate(listed):
        if seq is None:
            out.append({"id": n, "state": "idle"})
            continue
        state = ("waiting_for_prefix" if seq.waiting_on is not None
                 else "prefilling" if seq.is_prefilling
                 else "waiting_for_slot" if seq.ahead else "generating")
        out.append({"id": n, "state": state, "request_id": seq.request_id,
                    "prompt_tokens": seq.num_prompt, "cached_tokens": seq.num_cached,
                    "computed_tokens": seq.num_computed, "generated_tokens": seq.num_generated,
                    "max_tokens": seq.max_tokens})
    return out


def stats_json(stats: EngineStats, scheduler: Scheduler, n_ctx: int,
               cache: PrefixCache) -> dict[str, object]:
    """The engine's counters, slots, queue and prefix cache (read off the engine thread)."""
    s: dict[str, object] = dict(stats.snapshot())
    running = list(scheduler.running)  # (one copy: the counts agree)
    ahead = sum(seq.ahead for seq in running)
    s["slots_busy"] = len(running) - ahead
    s["slots_total"] = scheduler.num_slots
    s["queued"] = scheduler.num_waiting + ahead  # (still waiting for a slot)
    s["ahead"] = ahead  # of them, prompts computed ahead (``scheduler``)
    s["n_ctx"] = n_ctx
    s["prefix_cache"] = with_time_saved(cache.snapshot(), scheduler.rate)
    return s


def with_time_saved(snapshot: dict[str, object], rate: float) -> dict[str, object]:
    """Add ``time_saved_s`` to the cache's snapshot and its RAM tier's: the prompt tokens
    they gave requests, at the measured prompt rate (an estimate of the seconds of
    computation the cache saved; 0 until a rate is measured)."""
    def saved(tokens: object) -> float:
        return round(float(tokens) / rate, 2) if rate and isinstance(tokens, int) else 0.0
    ram = snapshot.get("ram")
    if isinstance(ram, dict):
        snapshot["ram"] = {**ram, "time_saved_s": saved(ram.get("restored_tokens"))}
    snapshot["time_saved_s"] = saved(snapshot.get("hit_tokens"))
    return snapshot
