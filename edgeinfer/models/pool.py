"""The models a server serves, by name, each with its engine."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

import psutil

from edgeinfer.config import ModelConfig, ServerConfig
from edgeinfer.errors import APIError, ConfigError, ModelLoadError, NotFound, Unavailable
from edgeinfer.models.fit import MEMORY_RESERVE, MODEL_OVERHEAD
from edgeinfer.models.modelinfo import estimate_bytes, fit_file, gguf_facts
from edgeinfer.models.offload import gpu_free_bytes
from edgeinfer.models.prefix_store import drop_runtime_pins
from edgeinfer.models.served import ServedModel, load_model
from edgeinfer.models.source import resolve_model_path
from edgeinfer.models.stamp import Loaded

log = logging.getLogger("edgeinfer.models.pool")


class ModelState(StrEnum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    FAILED = "failed"


@dataclass(slots=True)
class PoolEntry:
    """One configured model and where it stands; transitions happen in ModelPool only."""

    cfg: ModelConfig
    state: ModelState = ModelState.UNLOADED
    served: ServedModel | None = None
    error: str | None = None
    failed_at: float = 0.0  # time.monotonic() of the last failed load
    task: asyncio.Task[None] | None = None
    last_used: float = field(default_factory=time.monotonic)
    # seconds idle before unloading, set by a request (Ollama's keep_alive) for as long as
    # the model stays loaded; None: the model's ttl from models.toml
    keep_alive: float | None = None
    # when this server took the model in (Unix seconds): /v1/models' "created", loaded or not
    created: int = field(default_factory=lambda: int(time.time()))
    # the files it was loaded from, stamped (``models.stamp``)
    files: Loaded | None = None
    # preloading: the fitted models still to load at start-up, this one included; its fit
    # takes that share of the room, so that each of them fits beside the others
    fit_share: int = 1

    @property
    def ttl(self) -> float | None:
        """Seconds idle before the model is unloaded (None or inf: never)."""
        return self.keep_alive if self.keep_alive is not None else self.cfg.ttl

    def idle_for(self, now: float) -> float:
        if self.served is None or self.served.busy:
            return 0.0
        done = self.served._finished_at
        return now - max(self.last_used, done[-1] if done else 0.0)


REAP_SECONDS = 1.0
RETRY_FAILED_SECONDS = 30.0  # a request this long after a failed load tries it again


class ModelPool:
    """All configured models: loaded at start (``preload``) or on first use, unloaded when
    idle past their ``ttl`` or to make room for another within the memory budget.

    ``acquire`` resolves a request's ``model`` (id or alias) and waits for the model to
    load; a model that fails to load fails alone. A busy model is never unloaded.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.entries: dict[str, PoolEntry] = {m.id: PoolEntry(m) for m in config.models}
        self._names: dict[str, str] = {n: m.id for m in config.models for n in m.names}
        self._reaper: asyncio.Task[None] | None = None
        self.stopped = False  # (stop() until start(): nothing loads)
        self.on_load: list[Callable[[str, ServedModel], None]] = []

    # -- views ------------------------------------------------------------------------
    @property
    def models(self) -> dict[str, ServedModel]:
        """The loaded models."""
        return {mid: e.served for mid, e in self.entries.items()
                if e.state is ModelState.LOADED and e.served is not None}

    @property
    def failed(self) -> dict[str, str]:
        return {mid: e.error or "" for mid, e in self.entries.items()
                if e.state is ModelState.FAILED}

    def knows(self, name: str) -> bool:
        return name in self._names or name.removesuffix(":latest") in self._names

    def resolve(self, name: str) -> str:
        """The id of the model ``name`` (an id or alias; Ollama's ``:latest`` tag may
        follow it, as Ollama's clients write names in every dialect); 404 for none."""
        model_id = self._names.get(name)
        if model_id is None and name.endswith(":latest"):
            model_id = self._names.get(name.removesuffix(":latest"))
        if model_id is None:
            raise NotFound(f"The model '{name}' does not exist. Available: "
                           f"{', '.join(sorted(self._names))}", param="model",
                           code="model_not_found")
        return model_id

    def get(self, name: str) -> ServedModel:
        """A loaded model, now (no waiting): 503 for one that is not loaded."""
        entry = self.entries[self.resolve(name)]
        if entry.state is ModelState.LOADED and entry.served is not None:
            entry.last_used = time.monotonic()
            return entry.served
        raise self._unavailable(entry)

    async def unpin_all(self, name: str) -> str:
        """Unpin every prefix of a model (its id); one not loaded has the files of its
        run-time pins removed (a loading one: 503)."""
        entry = self.entries[self.resolve(name)]
        if entry.state is ModelState.LOADING:
            raise self._unavailable(entry)
        if entry.served is not None and entry.state is ModelState.LOADED:
            await entry.served.unpin_all()
        else:
            await asyncio.to_thread(drop_runtime_pins, entry.cfg.id)
        return entry.cfg.id

    def _unavailable(self, entry: PoolEntry) -> APIError:
        if entry.state is ModelState.FAILED:
            return Unavailable(f"the model '{entry.cfg.id}' failed to load: {entry.error}",
                               param="model", code="model_unavailable",
                               retry_after=int(RETRY_FAILED_SECONDS))
        return Unavailable(f"the model '{entry.cfg.id}' is {entry.state.value}; retry shortly",
                           param="model", code="model_loading", retry_after=2)

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        """Load the preloaded models (the first one always) and start the idle reaper."""
        self.stopped = False
        first = [e for i, e in enumerate(self.entries.values()) if e.cfg.preload or i == 0]
        fitted = [e for e in first if not {"context", "slots"} <= set(e.cfg.explicit)]
        for entry in first:
            entry.fit_share = len(fitted) - fitted.index(entry) if entry in fitted else 1
            try:
                await self._ensure(entry)
            finally:
                entry.fit_share = 1
        if not self.models and all(e.state is ModelState.FAILED for e in self.entries.values()):
            raise ModelLoadError("; ".join(self.failed.values()) or "no model configured")
        self._reaper = asyncio.ensure_future(self._reap())

    async def stop(self, wait: float = 3.0) -> None:
        """Unload every model: its requests end (an error), and it is freed once its users
        let go, waiting up to ``wait`` seconds; one still used then stays loaded (logged:
        memory is never freed under a user). Nothing loads until ``start`` again."""
        self.stopped = True
        if self._reaper is not None:
            self._reaper.cancel()
        for served in self.models.values():
            served.engine.fail_all("the server is shutting down")
        deadline = time.monotonic() + wait
        loads = [e.task for e in self.entries.values() if e.task and not e.task.done()]
        if loads:  # (one that ends later frees its model itself: ``_load``)
            await asyncio.wait(loads, timeout=wait)
        for mid in list(self.models):
            while (mid in self.models and not await self.unload(mid)
                   and time.monotonic() < deadline):
                await asyncio.sleep(0.02)
            if mid in self.models:
                log.warning("model %s is still in use: left loaded", mid)

    async def acquire(self, name: str, wait: bool = True) -> ServedModel:
        """The model named by a request, loading it first if needed (``wait``), else 503."""
        entry = self.entries[self.resolve(name)]
        if self.stopped:
            raise Unavailable("the server is shutting down", code="server_shutting_down")
        if entry.state is ModelState.FAILED and (
                time.monotonic() - entry.failed_at > RETRY_FAILED_SECONDS):
            entry.state = ModelState.UNLOADED  # its file may be back (a drive, a download)
        if entry.state is ModelState.LOADED and entry.files is not None and (
                written := await asyncio.to_thread(entry.files.written)) is not None:
            await self._reload_written(entry, written)
        for _ in range(3):  # (an unload may come between the load and this request's turn)
            if entry.state is not ModelState.LOADED and wait:
                await self._ensure(entry)
            elif entry.state is ModelState.UNLOADED:
                self._start_loading(entry)
            if not wait or entry.state is not ModelState.UNLOADED:
                break
        return self.get(name)

    async def _reload_written(self, entry: PoolEntry, written: Path) -> None:
        """Unload a model whose file (or draft model's) was written in place
        (``models.stamp``), so that it loads again from the file as it is now (a truncated
        one then fails to load: a 503 naming why); while it serves requests, 503
        ``model_reloading`` (new decodes could crash)."""
        assert entry.files is not None
        if not entry.files.reported:
            entry.files.reported = True
            log.error("model %s: its file %s was written to while loaded; loading it again "
                      "once its requests end", entry.cfg.id, written)
        if not await self.unload(entry.cfg.id):
            raise Unavailable(f"the model '{entry.cfg.id}': its file changed on disk while "
                              "loaded; it loads again once its running requests end",
                              param="model", code="model_reloading", retry_after=2)

    async def retry(self, name: str) -> ServedModel:
        """An operator's explicit load (``POST /v1/models/{id}/load``): a model that failed
        to load is tried again (its file may be in place now), then as ``acquire``."""
        entry = self.entries[self.resolve(name)]
        if entry.state is ModelState.FAILED:
            entry.state, entry.error = ModelState.UNLOADED, None
        return await self.acquire(name)

    def _start_loading(self, entry: PoolEntry) -> asyncio.Task[None]:
        if entry.task is None or entry.task.done():
            entry.task = asyncio.ensure_future(self._load(entry))
        return entry.task

    async def _ensure(self, entry: PoolEntry) -> None:
        if entry.state in (ModelState.UNLOADED, ModelState.LOADING):
            await asyncio.shield(self._start_loading(entry))

    async def _load(self, entry: PoolEntry) -> None:
        cfg = entry.cfg
        entry.state = ModelState.LOADING
        try:
            path = await asyncio.to_thread(resolve_model_path, cfg, self.configs())
            draft = await asyncio.to_thread(self._draft_file, cfg)
            cfg = await asyncio.to_thread(self._fitted, cfg, path, draft[1] if draft else None,
                                          entry.fit_share)
            # the draft model's context has the target's (fitted) cells and K/V types
            extra = estimate_bytes(replace(
                draft[0], context=cfg.context, cache_type_k=cfg.cache_type_k,
                cache_type_v=cfg.cache_type_v), draft[1]) if draft else 0
            await self._make_room(cfg, await asyncio.to_thread(estimate_bytes, cfg, path) + extra)
            entry.files = Loaded.of(path, *([draft[1]] if draft else []))
            served = await asyncio.to_thread(load_model, cfg, path, draft)
            if self.stopped:  # stopped while it loaded: nobody is to use it
                await _free(served)
                raise Unavailable("the server is shutting down", code="server_shutting_down")
        except Unavailable:
            entry.state = ModelState.UNLOADED  # no room now; a later request tries again
            raise
        except Exception as exc:  # ModelLoadError, or a source that cannot be made
            if not isinstance(exc, ModelLoadError | ConfigError):
                log.exception("model %s failed to load", cfg.id)
                exc = ModelLoadError(f"model {cfg.id!r} failed to load: {exc}")
            log.error("%s", exc)
            entry.state, entry.error = ModelState.FAILED, str(exc)
            entry.failed_at = time.monotonic()
            return
        served.engine.start(asyncio.get_running_loop())
        entry.served, entry.state, entry.error = served, ModelState.LOADED, None
        entry.last_used = time.monotonic()
        for hook in self.on_load:
            hook(cfg.id, served)
        try:  # the cache is an optimisation: the model serves without it
            pinned = tuple(served.system_prefix([{"role": "system", "content": text}])
                           for text in cfg.pinned_prompts)
            for tokens in pinned:
                n = await served.pin(tokens)
                log.info("model %s: pinned a %d-token system prompt", cfg.id, n)
            await served.restore_hot("runtime", skip=pinned)  # (POST /v1/cache/pin's)
            await served.restore_hot()
        except Exception as exc:
            log.error("model %s: restoring its prefix cache failed (%s: %s); it serves "
                      "without", cfg.id, type(exc).__name__, exc)

    async def unload(self, model_id: str) -> bool:
        """Free a loaded model (False if it is busy or not loaded): never under a user."""
        entry = self.entries[self.resolve(model_id)]
        served = entry.served
        if entry.state is not ModelState.LOADED or served is None or served.busy or (
                entry.task is not None and not entry.task.done()):  # (restoring its cache)
            return False
        entry.state, entry.served, entry.keep_alive = ModelState.UNLOADED, None, None
        await served.save_hot()
        await _free(served)
        log.info("model %s unloaded", entry.cfg.id)
        return True

    def keep(self, model_id: str, seconds: float) -> None:
        """Keep a loaded model ``seconds`` after its last request (inf: for good) instead of
        its ttl, until it is unloaded (Ollama's ``keep_alive``). The asking request counts as
        one, a load request too: the time runs from now at the earliest."""
        entry = self.entries[self.resolve(model_id)]
        if entry.state is ModelState.LOADED:
            entry.keep_alive, entry.last_used = seconds, time.monotonic()

    def configs(self) -> dict[str, ModelConfig]:
        """Every configured model by id, served or not (as served where it is)."""
        return {**{m.id: m for m in self.config.library},
                **{e.cfg.id: e.cfg for e in self.entries.values()}}

    def _draft_file(self, cfg: ModelConfig) -> tuple[ModelConfig, Path] | None:
        """The configuration and file of ``cfg``'s draft model (None: it has none)."""
        if cfg.speculative != "draft" or cfg.draft_model is None:
            return None
        configs = self.configs()
        draft = next((m for m in configs.values() if cfg.draft_model in m.names), None)
        if draft is None:
            raise ModelLoadError(f"model {cfg.id!r}: draft model {cfg.draft_model!r} is not "
                                 "configured")
        return draft, resolve_model_path(draft, configs)

    def _fitted(self, cfg: ModelConfig, path: Path, draft: Path | None = None,
                share: int = 1) -> ModelConfig:
        """``cfg`` with the context and slots models.toml left out chosen to fit the memory
        free now (a ``share``-th of it: ``PoolEntry.fit_share``), with its draft model's
        (its file at ``draft``) at the same context, idle models counted as free
        (``models.fit``; blocking)."""
        if {"context", "slots"} <= set(cfg.explicit):
            return cfg
        try:
            facts = gguf_facts(path)
            drafted = (draft.stat().st_size, gguf_facts(draft)) if draft else None
        except (ValueError, OSError):  # a broken file fails to load, with its reason
            return cfg
        fitted, note = fit_file(cfg, path, facts, self._room() // max(share, 1),
                                gpu_free_bytes() if cfg.gpu_layers else None, drafted)
        log.info("%s", note)
        return fitted

    def _room(self) -> int:
        """Bytes a model being loaded may take: free RAM less the reserve, plus what idle
        models hold (they are unloaded for it), within the memory budget."""
        now = time.monotonic()
        idle = busy = 0
        for e in self.entries.values():
            if e.state is ModelState.LOADED and e.served is not None:
                held = e.served.runtime.memory_bytes() + MODEL_OVERHEAD
                if e.idle_for(now) > 0.5:
                    idle += held
                else:
                    busy += held
        room = int(psutil.virtual_memory().available) - MEMORY_RESERVE + idle
        if self.config.memory_budget_mb:
            room = min(room, (self.config.memory_budget_mb << 20) - busy)
        return max(room, 0)

    async def _make_room(self, cfg: ModelConfig, need: int) -> None:
        """Unload idle models, least recently used first, until the new one (``need``
        bytes, see ``estimate_bytes``) fits."""
        model_id = cfg.id
        budget = self.config.memory_budget_mb << 20 if self.config.memory_budget_mb else None

        def fits() -> bool:
            loaded = sum(m.runtime.memory_bytes() + MODEL_OVERHEAD for m in self.models.values())
            free = psutil.virtual_memory().available - MEMORY_RESERVE
            return need <= free and (budget is None or loaded + need <= budget)

        while not fits():
            # idle: no request holds it (requests lease a model as they pick it), however
            # recently one finished (one client switching models must not wait)
            idle = [e for e in self.entries.values() if e.state is ModelState.LOADED
                    and e.served is not None and not e.served.busy]
            if not idle:
                others = any(e.state is ModelState.LOADED for e in self.entries.values())
                limit = (f"the memory budget ({self.config.memory_budget_mb} MiB)" if budget
                         else "free memory")
                raise Unavailable(f"not enough memory to load model {model_id!r} "
                                  f"(~{need >> 20} MiB with context {cfg.context}) within "
                                  f"{limit}" + (" while the other models are busy"
                                                if others else ""),
                                  retry_after=10, code="insufficient_memory")
            victim = min(idle, key=lambda e: e.last_used)
            log.info("unloading %s to make room for %s", victim.cfg.id, model_id)
            await self.unload(victim.cfg.id)

    async def _reap(self) -> None:
        """Unload models idle past their ttl."""
        while True:
            await asyncio.sleep(REAP_SECONDS)
            now = time.monotonic()
            for entry in list(self.entries.values()):
                ttl = entry.ttl
                if ttl is not None and entry.state is ModelState.LOADED and (
                        entry.idle_for(now) > ttl):
                    log.info("model %s idle for %.0fs: unloading", entry.cfg.id, ttl)
                    try:  # (a request may have come meanwhile: the next pass sees it)
                        await self.unload(entry.cfg.id)
                    except Exception:  # the reaper goes on for the other models
                        log.exception("model %s: unloading after its ttl failed", entry.cfg.id)


async def _free(served: ServedModel) -> None:
    """Free a model's native handles: its embedder before the model, then its engine."""
    await asyncio.to_thread(served.embedder.close)
    await asyncio.to_thread(served.engine.stop)
