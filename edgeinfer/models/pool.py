"""The models a server serves, by name, each with its engine."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import psutil

from edgeinfer.prompt.template import ChatTemplate
from edgeinfer.config import ModelConfig, ServerConfig
from edgeinfer.engine.embedding import Embedder
from edgeinfer.engine.delta import Delta
from edgeinfer.engine.loop import Engine
from edgeinfer.errors import (
    APIError,
    EngineError,
    InvalidRequest,
    ModelLoadError,
    NotFound,
    Overloaded,
)
from edgeinfer.prompt.markup import Markup, segments
from edgeinfer.models.modelinfo import gguf_facts
from edgeinfer.engine.native import LlamaRuntime, gpu_offload_supported
from edgeinfer.models.offload import gpu_free_bytes, plan_gpu_layers, warn_cpu_only_once
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.models.source import check_gguf, resolve_model_path
from edgeinfer.prompt.tools import ToolSpec, prepare_messages

PIN_PARAMS = SamplingParams(temperature=0, max_tokens=1)
T = TypeVar("T")
# Blocking native work of requests (tokenizing, detokenizing, grammar checks) runs here: at
# most all cores but one at a time, so a storm of large requests queues instead of taking
# every core from the event loop (and the engine threads).
_native_work = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) - 1),
                                  thread_name_prefix="edgeinfer-native")

log = logging.getLogger("edgeinfer.models.pool")


class Users:
    """How many callers are using a model's native handles right now (thread-safe).

    Taken on the event loop before any work starts and given back by whoever
    finishes last (a worker thread, for blocking native calls), so a model is
    never freed while anything can still touch it.
    """

    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def take(self) -> None:
        with self._lock:
            self._n += 1

    def give_back(self) -> None:
        with self._lock:
            assert self._n > 0, "a model's user count went below zero"
            self._n -= 1

    @property
    def count(self) -> int:
        return self._n


class Lease:
    """One use of a loaded model; ``release`` (idempotent) ends it."""

    __slots__ = ("_users",)

    def __init__(self, users: Users) -> None:
        users.take()
        self._users: Users | None = users

    def release(self) -> None:
        if self._users is not None:
            self._users.give_back()
            self._users = None


@dataclass(slots=True)
class ServedModel:
    """A loaded model: its runtime (native handles), engine thread and chat template.

    Lifetime contract: whoever uses the model's native handles holds a ``lease()``
    (a whole HTTP request holds one until its response is sent) or calls
    ``run()`` (a blocking native call in a worker thread, which keeps the model in
    use until the call returns, even if its caller is cancelled). The pool never
    unloads a model that is ``busy``.
    """

    cfg: ModelConfig
    runtime: LlamaRuntime
    engine: Engine
    template: ChatTemplate
    embedder: Embedder
    created: int = field(default_factory=lambda: int(time.time()))
    inflight: int = 0  # engine requests submitted and not finished (event-loop side)
    _finished_at: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    users: Users = field(default_factory=Users)
    markup: Markup = field(default_factory=lambda: Markup(()))

    def lease(self) -> Lease:
        return Lease(self.users)

    @property
    def busy(self) -> bool:
        return self.inflight > 0 or self.users.count > 0

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread, holding the model until it returns."""
        lease = self.lease()

        def job() -> T:
            try:
                return fn(*args)
            finally:
                lease.release()

        try:
            fut = asyncio.get_running_loop().run_in_executor(_native_work, job)
        except BaseException:
            lease.release()
            raise
        return await fut

    def admit(self, n: int) -> None:
        """Refuse ``n`` more requests with 429 when running + queued would pass the bound."""
        room = self.cfg.slots + self.cfg.max_queue - self.inflight
        if n <= room:
            return
        done = self._finished_at
        now = time.monotonic()
        rate = (len(done) - 1) / (now - done[0]) if len(done) > 1 and now > done[0] else 0.0
        queued = self.inflight - self.cfg.slots + n
        retry = math.ceil(queued / rate) if rate > 0 else 10
        raise Overloaded(f"model {self.cfg.id!r} is overloaded: {self.inflight} requests in "
                         f"flight; retry in {retry}s", retry_after=max(1, min(retry, 300)))

    async def generate(self, request_id: str, prompt: list[int], params: SamplingParams,
                       **kw: Any) -> AsyncIterator[Delta]:
        """engine.generate, counted for admission control."""
        self.inflight += 1
        try:
            async for d in self.engine.generate(request_id, prompt, params, **kw):
                yield d
        finally:
            self.inflight -= 1
            self._finished_at.append(time.monotonic())

    @property
    def n_ctx(self) -> int:
        return self.runtime.info.n_ctx

    def tokenize_chat(self, text: str) -> list[int]:
        """Tokens of a rendered chat prompt: special tokens parsed in the template's markup
        only, never in the text a request inserted (see ``edgeinfer.prompt.markup``)."""
        info = self.runtime.info
        tokens: list[int] = []
        for part, is_markup in segments(text):
            add_bos = not tokens and info.add_bos and not (
                info.bos_text and part.startswith(info.bos_text))
            tokens += self.runtime.tokenize(part, add_special=add_bos, parse_special=is_markup)
        return tokens

    def chat_prompt(self, messages: list[dict[str, Any]], tools: tuple[ToolSpec, ...] = (),
                    *, add_generation_prompt: bool = True) -> list[int]:
        """Render ``messages`` (and ``tools``) with the model's template and tokenize them,
        request text escaped so it stays text. Blocking: call it through ``run``."""
        escape = self.markup.escape
        messages = escape(messages)
        tools = tuple(replace(t, description=escape(t.description),
                              parameters=escape(t.parameters)) for t in tools)
        messages, extra = prepare_messages(messages, tools, native=self.template.takes_tools)
        text = self.template.render(messages, add_generation_prompt=add_generation_prompt,
                                    **extra)
        return self.tokenize_chat(text)

    def tokenize_text(self, text: str) -> list[int]:
        return self.runtime.tokenize(text, add_special=True, parse_special=True)

    def system_prefix(self, messages: list[dict[str, Any]]) -> list[int]:
        """Tokens of messages rendered as the start of a conversation (no generation prompt)."""
        return self.chat_prompt(messages, add_generation_prompt=False)

    async def pin(self, tokens: list[int]) -> int:
        """Compute ``tokens`` and keep their KV resident (never evicted); returns the count."""
        if not tokens:
            raise InvalidRequest("nothing to pin: the prompt is empty", param="prompt")
        self.check_fits(len(tokens), 1)
        rid = f"pin-{uuid.uuid4().hex[:12]}"
        last = None
        lease = self.lease()
        try:
            async for last in self.engine.generate(rid, tokens, PIN_PARAMS, pin=True):
                pass
        finally:
            lease.release()
        if last is None or last.finish_reason == "error":
            why = last.failure.message if last and last.failure else "no result"
            raise EngineError(f"could not pin the prefix: {why}")
        return len(tokens)

    def check_fits(self, n_prompt: int, max_tokens: int | None) -> None:
        """400 context_length_exceeded unless the prompt (plus max_tokens) fits."""
        wanted = n_prompt + (max_tokens or 1)
        if n_prompt >= self.n_ctx or wanted > self.n_ctx:
            raise InvalidRequest(
                f"This model's maximum context length is {self.n_ctx} tokens. However, you "
                f"requested {wanted} tokens ({n_prompt} in the prompt, "
                f"{max_tokens or 1} for the completion). Please reduce the prompt or max_tokens.",
                param="messages", code="context_length_exceeded",
            )


def load_model(cfg: ModelConfig, path: Path | None = None) -> ServedModel:
    """Load one model and create its engine (blocking; run it off the event loop)."""
    path = path or resolve_model_path(cfg)
    check_gguf(path, cfg.id)
    if cfg.gpu_layers:
        supported = gpu_offload_supported()
        if not supported:
            warn_cpu_only_once(cfg.id)
        free = gpu_free_bytes() if supported and cfg.gpu_layers == "auto" else None
        n_layers = int(gguf_facts(path)["layers"]) if free else 0
        layers = plan_gpu_layers(cfg.gpu_layers, supported, n_layers, path.stat().st_size, free)
        cfg = replace(cfg, gpu_layers=layers)
    t0 = time.perf_counter()
    runtime = LlamaRuntime(cfg, path)
    info = runtime.info
    try:
        template = ChatTemplate(cfg.chat_template or info.chat_template, info.bos_text,
                                info.eos_text)
    except ValueError as exc:
        runtime.close()
        raise ModelLoadError(f"model {cfg.id!r}: {exc}") from None
    log.info("model %s loaded from %s in %.2fs (%s, ctx %d, %d slots, %d threads)",
             cfg.id, path, time.perf_counter() - t0, info.description, info.n_ctx, cfg.slots,
             cfg.threads)
    return ServedModel(cfg, runtime, Engine(runtime), template, Embedder(runtime),
                       markup=Markup(runtime.control_texts()))


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
    task: asyncio.Task[None] | None = None
    last_used: float = field(default_factory=time.monotonic)

    def idle_for(self, now: float) -> float:
        if self.served is None or self.served.busy:
            return 0.0
        done = self.served._finished_at
        return now - max(self.last_used, done[-1] if done else 0.0)


MEMORY_RESERVE = 512 << 20  # left free for the OS and the server itself
REAP_SECONDS = 1.0


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

    def resolve(self, name: str) -> str:
        model_id = self._names.get(name)
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

    def _unavailable(self, entry: PoolEntry) -> APIError:
        if entry.state is ModelState.FAILED:
            return APIError(f"the model '{entry.cfg.id}' failed to load: {entry.error}",
                            param="model", code="model_unavailable", status=503)
        return APIError(f"the model '{entry.cfg.id}' is {entry.state.value}; retry shortly",
                        param="model", code="model_loading", status=503,
                        headers={"Retry-After": "2"})

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        """Load the preloaded models (the first one always) and start the idle reaper."""
        for i, cfg in enumerate(self.config.models):
            if cfg.preload or i == 0:
                await self._ensure(self.entries[cfg.id])
        if not self.models and all(e.state is ModelState.FAILED for e in self.entries.values()):
            raise ModelLoadError("; ".join(self.failed.values()) or "no model configured")
        self._reaper = asyncio.ensure_future(self._reap())

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for mid in list(self.models):
            await self.unload(mid)

    async def acquire(self, name: str, wait: bool = True) -> ServedModel:
        """The model named by a request, loading it first if needed (``wait``), else 503."""
        entry = self.entries[self.resolve(name)]
        if entry.state is not ModelState.LOADED and wait:
            await self._ensure(entry)
        elif entry.state is ModelState.UNLOADED:
            self._start_loading(entry)
        return self.get(name)

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
            path = await asyncio.to_thread(resolve_model_path, cfg, self._configs())
            await self._make_room(cfg.id, path.stat().st_size)
            served = await asyncio.to_thread(load_model, cfg, path)
        except Overloaded:
            entry.state = ModelState.UNLOADED  # no room now; a later request tries again
            raise
        except ModelLoadError as exc:
            log.error("%s", exc)
            entry.state, entry.error = ModelState.FAILED, str(exc)
            return
        served.engine.start(asyncio.get_running_loop())
        entry.served, entry.state, entry.error = served, ModelState.LOADED, None
        entry.last_used = time.monotonic()
        for hook in self.on_load:
            hook(cfg.id, served)
        for text in cfg.pinned_prompts:
            n = await served.pin(served.system_prefix([{"role": "system", "content": text}]))
            log.info("model %s: pinned a %d-token system prompt", cfg.id, n)

    async def unload(self, model_id: str) -> bool:
        """Free a loaded model (False if it is busy or not loaded): never under a user."""
        entry = self.entries[self.resolve(model_id)]
        served = entry.served
        if entry.state is not ModelState.LOADED or served is None or served.busy:
            return False
        entry.state, entry.served = ModelState.UNLOADED, None
        await asyncio.to_thread(served.embedder.close)  # before the model is freed
        await asyncio.to_thread(served.engine.stop)
        log.info("model %s unloaded", entry.cfg.id)
        return True

    def _configs(self) -> dict[str, ModelConfig]:
        return {e.cfg.id: e.cfg for e in self.entries.values()}

    async def _make_room(self, model_id: str, file_size: int) -> None:
        """Unload idle models, least recently used first, until the new one fits."""
        need = int(file_size * 1.3) + (64 << 20)
        budget = self.config.memory_budget_mb << 20 if self.config.memory_budget_mb else None

        def fits() -> bool:
            loaded = sum(m.runtime.memory_bytes() for m in self.models.values())
            free = psutil.virtual_memory().available - MEMORY_RESERVE
            return need <= free and (budget is None or loaded + need <= budget)

        while not fits():
            now = time.monotonic()
            idle = [e for e in self.entries.values()
                    if e.state is ModelState.LOADED and e.idle_for(now) > 0.5]
            if not idle:
                raise Overloaded(f"not enough memory to load model {model_id!r} "
                                 f"(~{need >> 20} MiB) while the other models are busy",
                                 retry_after=10, status=503, code="insufficient_memory")
            victim = min(idle, key=lambda e: e.last_used)
            log.info("unloading %s to make room for %s", victim.cfg.id, model_id)
            await self.unload(victim.cfg.id)

    async def _reap(self) -> None:
        """Unload models idle past their ttl."""
        while True:
            await asyncio.sleep(REAP_SECONDS)
            now = time.monotonic()
            for entry in list(self.entries.values()):
                ttl = entry.cfg.ttl
                if ttl is not None and entry.state is ModelState.LOADED and (
                        entry.idle_for(now) > ttl):
                    log.info("model %s idle for %.0fs: unloading", entry.cfg.id, ttl)
                    await self.unload(entry.cfg.id)
