"""Prometheus metrics (prometheus_client), one registry per app.

Counters and gauges that the engines already keep (tokens, queue, slots, KV
cells, prefix-cache hits) are read at scrape time by a collector, so nothing
is counted twice; latencies are histograms the engines observe as tokens come.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class EngineCollector:
    """Reads each engine's counters when Prometheus scrapes."""

    def __init__(self, snapshots: Callable[[], dict[str, dict[str, Any]]]) -> None:
        self._snapshots = snapshots

    def collect(self) -> Iterator[Metric]:
        snaps = self._snapshots()

        def family(kind: type, name: str, doc: str, key: Callable[[dict[str, Any]], float]
                   ) -> Metric:
            fam = kind(name, doc, labels=["model"])
            for model, s in snaps.items():
                fam.add_metric([model], float(key(s)))
            return cast(Metric, fam)

        yield family(CounterMetricFamily, "edgeinfer_prompt_tokens",
                     "Prompt tokens computed (cache hits excluded)", lambda s: s["prompt_tokens"])
        yield family(CounterMetricFamily, "edgeinfer_generated_tokens", "Tokens generated",
                     lambda s: s["generated_tokens"])
        yield family(CounterMetricFamily, "edgeinfer_engine_steps", "Engine steps",
                     lambda s: s["steps"])
        yield family(CounterMetricFamily, "edgeinfer_decode_seconds",
                     "Seconds spent inside llama_decode", lambda s: s["decode_seconds"])
        yield family(CounterMetricFamily, "edgeinfer_draft_tokens",
                     "Draft tokens verified (speculative decoding)", lambda s: s["draft_tokens"])
        yield family(CounterMetricFamily, "edgeinfer_draft_tokens_accepted",
                     "Draft tokens accepted", lambda s: s["accepted_drafts"])
        yield family(GaugeMetricFamily, "edgeinfer_queue_depth", "Requests waiting for a slot",
                     lambda s: s["queued"])
        yield family(GaugeMetricFamily, "edgeinfer_slots_busy", "Slots running a request",
                     lambda s: s["slots_busy"])
        yield family(GaugeMetricFamily, "edgeinfer_slots_total", "Slots",
                     lambda s: s["slots_total"])
        yield family(GaugeMetricFamily, "edgeinfer_kv_cells_used",
                     "KV cells holding tokens (running and cached)",
                     lambda s: s["prefix_cache"]["cells_used"])
        yield family(GaugeMetricFamily, "edgeinfer_kv_cells_total", "KV cells of the context",
                     lambda s: s["n_ctx"])
        yield family(CounterMetricFamily, "edgeinfer_prefix_cache_hits",
                     "Requests that reused a cached prefix", lambda s: s["prefix_cache"]["hits"])
        yield family(CounterMetricFamily, "edgeinfer_prefix_cache_hit_tokens",
                     "Prompt tokens reused from the cache",
                     lambda s: s["prefix_cache"]["hit_tokens"])
        yield family(CounterMetricFamily, "edgeinfer_prefix_cache_evictions",
                     "Cached prefixes evicted", lambda s: s["prefix_cache"]["evictions"])
        yield family(CounterMetricFamily, "edgeinfer_prefix_cache_time_saved_seconds",
                     "Prompt computation the cache saved, all tiers (estimated from the "
                     "measured prompt rate)", lambda s: s["prefix_cache"]["time_saved_s"])
        yield family(CounterMetricFamily, "edgeinfer_prefix_cache_checkpoints",
                     "States saved part-way through prompts (recurrent / hybrid models)",
                     lambda s: s["prefix_cache"]["checkpoints"])
        for kind, name, doc, tier, key in _TIERS:
            yield family(kind, f"edgeinfer_cache_{tier}_{name}", doc, _tier_value(tier, key))


def _tier_value(tier: str, key: str) -> Callable[[dict[str, Any]], float]:
    """A cache tier's counter in an engine snapshot (the disk tier may be off: 0)."""
    if tier == "ram":
        return lambda s: float(s["prefix_cache"]["ram"][key])
    return lambda s: float((s.get("disk") or {}).get(key, 0))


_G, _C = GaugeMetricFamily, CounterMetricFamily
_TIERS = [  # (kind, name, help, tier, snapshot key)
    (_G, "bytes", "Evicted prefixes' KV state kept in host RAM, bytes", "ram", "bytes"),
    (_G, "entries", "Evicted prefixes kept in host RAM", "ram", "entries"),
    (_C, "restores", "Prefixes restored from host RAM", "ram", "restored"),
    (_C, "restored_tokens", "Prompt tokens restored from host RAM", "ram", "restored_tokens"),
    (_C, "time_saved_seconds", "Prompt computation the RAM tier saved (estimated from the "
     "measured prompt rate), seconds", "ram", "time_saved_s"),
    (_G, "bytes", "Pinned prefixes' KV state on disk, bytes", "disk", "bytes"),
    (_G, "files", "Pinned prefixes saved on disk", "disk", "files"),
    (_C, "restores", "Pinned prefixes restored from disk", "disk", "restores"),
    (_C, "rejected", "Disk cache files refused (truncated, corrupt, foreign)", "disk", "rejected"),
]


def kv_usage(snapshot: dict[str, Any]) -> float:
    """The fraction (0-1) of a model's KV cells it cannot free for new work: those of
    running requests and pinned prefixes (other cached prefixes are evicted on demand)."""
    total = float(snapshot["n_ctx"]) or 1.0
    return min(1.0, float(snapshot["prefix_cache"].get("cells_in_use", 0)) / total)


class LoadCollector:
    """The load figures an inference gateway's endpoint picker reads (the Gateway API
    Inference Extension's model server protocol): requests waiting and running, KV-cache
    utilisation 0-1. The pod-level series carry no label, so a metric name alone selects
    one value; ``edgeinfer_model_kv_cache_usage_ratio`` has one series per model.
    No LoRA metric: edgeinfer serves no adapters."""

    def __init__(self, snapshots: Callable[[], dict[str, dict[str, Any]]]) -> None:
        self._snapshots = snapshots

    def collect(self) -> Iterator[Metric]:
        snaps = self._snapshots()
        yield GaugeMetricFamily(
            "edgeinfer_requests_waiting", "Requests waiting for a slot, all models",
            value=float(sum(s["queued"] for s in snaps.values())))
        yield GaugeMetricFamily(
            "edgeinfer_requests_running", "Requests (choices) running in a slot, all models",
            value=float(sum(s["slots_busy"] for s in snaps.values())))
        usage = {model: kv_usage(s) for model, s in snaps.items()}
        yield GaugeMetricFamily(
            "edgeinfer_kv_cache_usage_ratio", "KV-cache utilisation 0-1 of the fullest "
            "loaded model: cells of running requests and pinned prefixes over all cells",
            value=max(usage.values(), default=0.0))
        per_model = GaugeMetricFamily(
            "edgeinfer_model_kv_cache_usage_ratio", "KV-cache utilisation 0-1 per model: "
            "cells of running requests and pinned prefixes over all cells", labels=["model"])
        for model, ratio in usage.items():
            per_model.add_metric([model], ratio)
        yield per_model


class Metrics:
    """The app's registry: HTTP requests by status, latency histograms, engine counters."""

    def __init__(self, snapshots: Callable[[], dict[str, dict[str, Any]]]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("edgeinfer_http_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=self.registry)
        self.ttft = Histogram("edgeinfer_time_to_first_token_seconds",
                              "Time from submission to the first generated token", ["model"],
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram("edgeinfer_inter_token_latency_seconds",
                             "Time between two generated tokens of a request", ["model"],
                             buckets=LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(EngineCollector(snapshots))
        self.registry.register(LoadCollector(snapshots))

    def render(self) -> bytes:
        return generate_latest(self.registry)
