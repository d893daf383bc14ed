"""Liveness and readiness (/health, /ready) as a state machine over a pool whose models
never load, the probes through the app and its API-key guard, the load metrics an
endpoint picker reads, and the KV cells that running requests hold."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from edgeinfer.api.app import create_app
from edgeinfer.api.lifecycle import Lifecycle, Phase, liveness, readiness
from edgeinfer.api.metrics import LoadCollector, kv_usage
from edgeinfer.config import ModelConfig, ServerConfig
from edgeinfer.engine.prefix_cache import CacheEntry, PrefixCache
from edgeinfer.engine.prefix_index import PrefixIndex
from edgeinfer.engine.report import EngineStats, stats_json
from edgeinfer.engine.scheduler import Scheduler
from edgeinfer.models.pool import ModelPool, ModelState


def fake_served(running: bool = True, queued: int = 0, busy: int = 0, in_use: int = 0,
                n_ctx: int = 1000) -> Any:
    """A loaded model whose engine reports a real snapshot (``report.stats_json`` over a
    real scheduler and prefix cache): ``in_use`` cells held by slot 0, 100 cached."""
    cache = PrefixCache(None, 4, 4, enabled=True)  # type: ignore[arg-type]
    cache.index.extend(0, list(range(in_use)))
    cache.index.extend(4, list(range(10_000, 10_100)))
    cache.entries = {4: CacheEntry(4)}
    snap = {**stats_json(EngineStats(), Scheduler(4, 64), n_ctx, cache),
            "queued": queued, "slots_busy": busy}
    engine = SimpleNamespace(is_running=running, observer=None, stats_snapshot=lambda: snap)
    return SimpleNamespace(engine=engine, prefix_store=None)


def make_pool(*, second_preload: bool = True) -> ModelPool:
    models = (ModelConfig(id="first", path=Path("first.gguf"), aliases=("default",)),
              ModelConfig(id="second", path=Path("second.gguf"), preload=second_preload),
              ModelConfig(id="lazy", path=Path("lazy.gguf")))
    return ModelPool(ServerConfig(models=models))


def load(pool: ModelPool, mid: str, served: Any = None) -> None:
    entry = pool.entries[mid]
    entry.state, entry.served = ModelState.LOADED, served or fake_served()


def test_loading_then_serving_then_draining() -> None:
    pool, life = make_pool(), Lifecycle()
    pool.entries["first"].state = ModelState.LOADING
    assert readiness(life, pool) == ["model 'first' is loading", "model 'second' is loading"]
    assert liveness(life, pool) == []  # loading is alive
    load(pool, "first")
    assert readiness(life, pool) == ["model 'second' is loading"]
    load(pool, "second")
    assert readiness(life, pool) == ["start-up is not finished"]  # until the lifespan says
    life.serving()
    assert life.phase is Phase.SERVING and readiness(life, pool) == []
    pool.entries["second"].state, pool.entries["second"].served = ModelState.UNLOADED, None
    assert readiness(life, pool) == []  # unloaded when idle: a request loads it again
    life.drain()
    assert readiness(life, pool) == ["draining: the server is shutting down"]
    assert liveness(life, pool) == []
    life.serving()  # draining is final
    assert life.phase is Phase.DRAINING


def test_a_failed_start_up_model_or_a_dead_engine() -> None:
    pool, life = make_pool(), Lifecycle()
    load(pool, "first")
    pool.entries["second"].state = ModelState.FAILED
    pool.entries["second"].error = "not a GGUF file"
    life.serving()
    assert readiness(life, pool) == ["model 'second' failed to load: not a GGUF file"]
    assert liveness(life, pool) == []
    pool.entries["second"].state = ModelState.LOADED
    pool.entries["second"].served = fake_served()
    pool.entries["lazy"].state = ModelState.FAILED  # not a start-up model: still ready
    assert readiness(life, pool) == []
    load(pool, "first", fake_served(running=False))
    assert "the engine of model 'first' has stopped" in readiness(life, pool)
    assert liveness(life, pool) == ["the engine of model 'first' has stopped"]
    failed = Lifecycle()
    failed.failed("every model failed")
    assert failed.phase is Phase.FAILED
    assert liveness(failed, make_pool()) == ["start-up failed: every model failed"]
    assert readiness(failed, make_pool()) == ["start-up failed: every model failed"]


def get(app: Any, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.get(path, headers=headers or {})
    return asyncio.run(go())


@pytest.mark.parametrize("open_metrics", [False, True])
def test_probes_through_the_app_and_its_key_guard(open_metrics: bool) -> None:
    pool = make_pool(second_preload=False)
    load(pool, "first", fake_served(queued=3, busy=4, in_use=250))
    config = ServerConfig(models=pool.config.models, api_keys=("sk-k8s",),
                          open_metrics=open_metrics)
    app = create_app(config, pool=pool)  # a started pool: serving at once
    r = get(app, "/ready")
    assert r.status_code == 200 and r.json()["status"] == "ready", r.text
    assert r.json()["models"] == {"first": "loaded", "second": "unloaded", "lazy": "unloaded"}
    assert get(app, "/health").json()["status"] == "ok"
    assert get(app, "/v1/models").status_code == 401
    assert get(app, "/metrics").status_code == (200 if open_metrics else 401)
    text = get(app, "/metrics", {"authorization": "Bearer sk-k8s"}).text
    assert "edgeinfer_requests_waiting 3.0" in text and "edgeinfer_requests_running 4.0" in text
    assert "edgeinfer_kv_cache_usage_ratio 0.25" in text
    app.state.lifecycle.drain()
    r = get(app, "/ready")
    assert r.status_code == 503 and r.json()["status"] == "draining", r.text
    assert r.json()["reasons"] == ["draining: the server is shutting down"]
    r = get(app, "/health")
    assert r.status_code == 200 and r.json()["status"] == "draining"
    load(pool, "first", fake_served(running=False))
    r = get(app, "/health")
    assert r.status_code == 503 and r.json()["status"] == "error"
    assert r.json()["reasons"] == ["the engine of model 'first' has stopped"]


def families(collector: Any) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()
    registry.register(collector)
    return {f.name: [(s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(generate_latest(registry).decode())}


def test_load_metrics_for_an_endpoint_picker() -> None:
    snaps = {"a": fake_served(queued=2, busy=3, in_use=100, n_ctx=1000).engine.stats_snapshot(),
             "b": fake_served(queued=5, busy=1, in_use=4000, n_ctx=8192).engine.stats_snapshot()}
    got = families(LoadCollector(lambda: snaps))
    assert got["edgeinfer_requests_waiting"] == [({}, 7.0)]
    assert got["edgeinfer_requests_running"] == [({}, 4.0)]
    assert got["edgeinfer_kv_cache_usage_ratio"] == [({}, pytest.approx(4000 / 8192))]
    assert got["edgeinfer_model_kv_cache_usage_ratio"] == [
        ({"model": "a"}, 0.1), ({"model": "b"}, pytest.approx(4000 / 8192))]
    assert not any("lora" in name for name in got)  # no adapters: no LoRA metric
    empty = families(LoadCollector(dict))
    assert empty["edgeinfer_kv_cache_usage_ratio"] == [({}, 0.0)]
    assert empty["edgeinfer_model_kv_cache_usage_ratio"] == []
    over = fake_served(in_use=5000, n_ctx=4096).engine.stats_snapshot()
    assert kv_usage(over) == 1.0


def test_tokens_held_by_counts_shared_cells_once_and_skips_cache_only_ones() -> None:
    idx = PrefixIndex()
    system = list(range(100))
    idx.extend(0, system + [1000, 1001])  # slot 0
    idx.extend(1, system + [2000])  # slot 1 shares the system prompt's cells
    idx.extend(9, system + [3000] * 50)  # a cache entry: its own tail only it holds
    assert idx.tokens_held_by({0, 1}) == 100 + 2 + 1
    assert idx.tokens_held_by({0}) == 102
    assert idx.tokens_held_by({9}) == 150
    assert idx.tokens_held_by({0, 1, 9}) == idx.num_tokens == 100 + 2 + 1 + 50
    assert idx.tokens_held_by(set()) == 0
    idx.remove(0)
    idx.remove(1)
    assert idx.tokens_held_by({0, 1}) == 0 and idx.num_tokens == 150


def test_cells_in_use_counts_slots_and_pinned_entries() -> None:
    cache = PrefixCache(None, 2, 4, enabled=True)  # type: ignore[arg-type]
    cache.index.extend(0, list(range(10)))  # a running request in slot 0
    cache.index.extend(2, list(range(100, 130)))  # a cached prefix
    cache.index.extend(3, list(range(200, 240)))  # a pinned one
    cache.entries = {2: CacheEntry(2), 3: CacheEntry(3, pinned=True)}
    snap = cache.snapshot()
    assert snap["cells_used"] == 80 and snap["cells_in_use"] == 50


def test_a_failed_load_is_tried_again_by_a_request_after_a_while() -> None:
    """A model whose file was missing (an external drive, a download under way): a request
    within RETRY_FAILED_SECONDS gets the 503 (with Retry-After), a later one loads it."""
    import time

    from edgeinfer.errors import Unavailable
    from edgeinfer.models import pool as pool_module

    pool, tries = make_pool(), []

    async def fake_load(entry: Any) -> None:
        tries.append(entry.cfg.id)
        entry.state, entry.served = ModelState.LOADED, fake_served()

    pool._load = fake_load  # type: ignore[method-assign]
    entry = pool.entries["lazy"]
    entry.state, entry.error, entry.failed_at = ModelState.FAILED, "file not found", \
        time.monotonic()
    with pytest.raises(Unavailable) as info:
        asyncio.run(pool.acquire("lazy"))
    assert info.value.headers == {"Retry-After": str(int(pool_module.RETRY_FAILED_SECONDS))}
    assert tries == []
    entry.failed_at -= pool_module.RETRY_FAILED_SECONDS + 1
    assert asyncio.run(pool.acquire("lazy")) is entry.served and tries == ["lazy"]
