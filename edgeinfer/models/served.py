"""A loaded model: its native runtime, engine thread, chat template and embedder, and the
leases that keep it alive while anything uses it."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

from edgeinfer.config import ModelConfig
from edgeinfer.engine.delta import Delta, FailureCode
from edgeinfer.engine.draft_model import DraftModel
from edgeinfer.engine.embedding import Embedder
from edgeinfer.engine.host_memory import State
from edgeinfer.engine.loop import Engine
from edgeinfer.engine.native import LlamaRuntime, gpu_offload_supported
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.errors import (
    Conflict,
    ContextTooLong,
    EngineError,
    InvalidRequest,
    ModelLoadError,
    Overloaded,
)
from edgeinfer.models.lease import Lease, Places, Users
from edgeinfer.models.modelinfo import gguf_facts
from edgeinfer.models.native_work import executor_for
from edgeinfer.models.offload import gpu_free_bytes, plan_gpu_layers, warn_cpu_only_once
from edgeinfer.models.prefix_store import PrefixStore, folder_of, model_identity
from edgeinfer.models.source import check_gguf, resolve_model_path
from edgeinfer.prompt.markup import Markup, segments
from edgeinfer.prompt.reasoning import reasoning_markers
from edgeinfer.prompt.template import ChatTemplate
from edgeinfer.prompt.toolformat import ToolFormat, choose
from edgeinfer.prompt.tools import ToolSpec, prepare_messages

# a pin computes its prompt in the shared context (a deterministic model's lane has no pins)
PIN_PARAMS = SamplingParams(temperature=0, max_tokens=1, deterministic=False)
T = TypeVar("T")
log = logging.getLogger("edgeinfer.models.served")
# template variables a request's chat_template_kwargs may not replace
RESERVED_VARS = frozenset({"self", "messages", "tools", "add_generation_prompt", "bos_token",
                           "eos_token", "raise_exception", "strftime_now"})


@dataclass(frozen=True, slots=True)
class RenderedChat:
    """A chat prompt's tokens, and the end of its text (whether it leaves a reasoning
    block open: ``reasoning.starts_in_thought``)."""

    tokens: list[int]
    tail: str


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
    inflight: int = 0  # engine requests submitted and not finished (event-loop side)
    reserved: int = 0  # admitted engine requests not submitted yet (see ``Places``)
    _finished_at: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    users: Users = field(default_factory=Users)
    markup: Markup = field(default_factory=lambda: Markup(()))
    prefix_store: PrefixStore | None = None  # the disk tier of pinned prefixes

    @property
    def tool_format(self) -> ToolFormat:
        """The tool-call format of this model (models.toml ``tool_format``, or detected
        from its chat template)."""
        return choose(self.cfg.tool_format, self.template.source)

    def lease(self) -> Lease:
        return Lease(self.users)

    @property
    def busy(self) -> bool:
        return self.inflight > 0 or self.users.count > 0  # held places hold a user too

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread (``native_work``: one apart for a lot of
        text), holding the model until it returns."""
        lease = self.lease()

        def job() -> T:
            try:
                return fn(*args)
            finally:
                lease.release()

        try:
            fut = asyncio.get_running_loop().run_in_executor(executor_for(fn, args), job)
        except BaseException:
            lease.release()
            raise
        return await fut

    def admit(self, n: int) -> None:
        """Refuse ``n`` more requests with 429 when running + queued would pass the bound."""
        room = self.cfg.slots + self.cfg.max_queue - self.inflight - self.reserved
        if n <= room:
            return
        if n > self.cfg.slots + self.cfg.max_queue:  # never, however long one waits
            raise InvalidRequest(
                f"{n} choices are more than model {self.cfg.id!r} takes at once "
                f"({self.cfg.slots} slots + {self.cfg.max_queue} queued)", param="n")
        done = self._finished_at
        now = time.monotonic()
        rate = (len(done) - 1) / (now - done[0]) if len(done) > 1 and now > done[0] else 0.0
        queued = self.inflight + self.reserved - self.cfg.slots + n
        retry = math.ceil(queued / rate) if rate > 0 else 10
        raise Overloaded(f"model {self.cfg.id!r} is overloaded: "
                         f"{self.inflight + self.reserved} requests in "
                         f"flight; retry in {retry}s", retry_after=max(1, min(retry, 300)))

    def reserve(self, n: int) -> Places:
        """``admit(n)``, and the ``n`` places held until their streams start (pass the
        result to ``generate``) or it is released."""
        self.admit(n)
        return Places(self, n)

    def finish_early(self, request_id: str) -> None:
        """End a running request now, as a stop: its finishing delta still comes."""
        self.engine.abort(request_id, stop=True)

    async def generate(self, request_id: str, prompt: list[int], params: SamplingParams,
                       places: Places | None = None, **kw: Any) -> AsyncIterator[Delta]:
        """engine.generate, counted for admission control (taking one of ``places``)."""
        if places is not None:
            places.take()
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
                    *, add_generation_prompt: bool = True,
                    template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """Render ``messages`` (and ``tools``) with the model's template and tokenize them,
        request text escaped so it stays text. Blocking: call it through ``run``."""
        return self.chat_render(messages, tools, add_generation_prompt=add_generation_prompt,
                                template_kwargs=template_kwargs).tokens

    def chat_render(self, messages: list[dict[str, Any]], tools: tuple[ToolSpec, ...] = (),
                    *, add_generation_prompt: bool = True,
                    template_kwargs: dict[str, Any] | None = None) -> RenderedChat:
        """``chat_prompt``, with what the rendered text says about the output to come.
        Blocking: call it through ``run``."""
        text = self.chat_text(messages, tools, add_generation_prompt=add_generation_prompt,
                              template_kwargs=template_kwargs)
        return RenderedChat(self.tokenize_chat(text), text[-64:])

    def chat_text(self, messages: list[dict[str, Any]], tools: tuple[ToolSpec, ...] = (),
                  *, add_generation_prompt: bool = True,
                  template_kwargs: dict[str, Any] | None = None) -> str:
        """The rendered prompt, request text marked (``prompt.markup``) so that it is
        tokenized as text. ``template_kwargs`` (a request's ``chat_template_kwargs``, such
        as ``enable_thinking``, true unless given) are extra template variables; they
        cannot replace the template's own (messages, tools, bos_token ...)."""
        escape = self.markup.escape
        messages = escape(messages)
        tools = tuple(replace(t, description=escape(t.description),
                              parameters=escape(t.parameters)) for t in tools)
        messages, extra = prepare_messages(messages, tools, self.tool_format,
                                           takes_tools=self.template.takes_tools,
                                           shows_calls=self.template.shows_calls)
        # request text, like the messages: escaped so it cannot become control tokens
        variables = escape({k: v for k, v in (template_kwargs or {}).items()
                            if k not in RESERVED_VARS})
        # thinking on unless the request turns it off, as llama-server renders templates
        return self.template.render(messages, add_generation_prompt=add_generation_prompt,
                                    **{"enable_thinking": True, **variables, **extra})

    def tokenize_text(self, text: str) -> list[int]:
        return self.runtime.tokenize(text, add_special=True, parse_special=True)

    def tokenize_mixed(self, parts: tuple[str | int, ...]) -> list[int]:
        """llama-server's mixed prompt: token ids as they are, texts tokenized (the BOS
        only before a text that comes first)."""
        return [t for i, part in enumerate(parts) for t in (
            [part] if isinstance(part, int) else
            self.runtime.tokenize(part, add_special=i == 0, parse_special=True))]

    def bos_head(self) -> list[int]:
        """The tokens the model puts before every prompt: [BOS], or none (an EOS it also
        adds at the end is left out)."""
        head = self.runtime.tokenize("", add_special=True, parse_special=False)
        return head[:1] if self.runtime.info.add_bos else []

    def system_prefix(self, messages: list[dict[str, Any]]) -> list[int]:
        """Tokens of messages rendered as the start of a conversation (no generation prompt)."""
        return self.chat_prompt(messages, add_generation_prompt=False)

    async def pin(self, tokens: list[int], runtime: bool = False) -> int:
        """Keep the KV of ``tokens`` resident (never evicted); returns the count. The state
        comes from the disk tier when saved there before, else it is computed and saved
        (``runtime``: pinned by a request, so pinned again at load: ``restore_hot``)."""
        if not tokens:
            raise InvalidRequest("nothing to pin: the prompt is empty", param="prompt")
        self.check_fits(len(tokens), 1)
        lease = self.lease()
        try:
            if await self._restore(tokens):  # (a models.toml pin's file: now one to restore)
                if runtime and (store := self.prefix_store) and not await asyncio.to_thread(
                        store.flagged, tokens, "runtime"):
                    await self._save(tokens, runtime)
                return len(tokens)
            await self._compute_pinned(tokens)
            await self._save(tokens, runtime)
        finally:
            lease.release()
        return len(tokens)

    async def _compute_pinned(self, tokens: list[int]) -> None:
        last = None
        async for delta in self.engine.generate(f"pin-{uuid.uuid4().hex[:12]}", tokens,
                                                PIN_PARAMS, pin=True):
            last = delta
        if last is None or last.finish_reason == "error":
            failure = last.failure if last else None
            if failure is not None and failure.code is FailureCode.KV_FULL:
                raise Conflict("could not pin the prefix: the KV cache has no room for it "
                               "(unpin others, DELETE /v1/cache/pins, or give the model a "
                               "larger context)", code="kv_cache_full")
            why = failure.message if failure else "no result"
            raise EngineError(f"could not pin the prefix: {why}")

    async def _restore(self, tokens: list[int]) -> bool:
        store = self.prefix_store
        if store is None:
            return False
        t0 = time.perf_counter()
        data = await asyncio.to_thread(store.load, tokens)
        if data is None:
            return False
        cache = self.engine.cache
        if not await self.engine.call(lambda: cache.restore(tokens, data, pinned=True)):
            store.reject(store.path_for(tokens), "llama.cpp could not load the state")
            return False
        log.info("model %s: a pinned %d-token prefix restored from disk (%.1f MiB) in %.2fs",
                 self.cfg.id, len(tokens), len(data) / 2**20, time.perf_counter() - t0)
        return True

    async def _save(self, tokens: list[int], runtime: bool = False) -> None:
        if (store := self.prefix_store) is None:
            return
        data = await self.engine.call(functools.partial(self.engine.cache.state_of, tokens))
        if isinstance(data, State) and await asyncio.to_thread(store.save, tokens, data,
                                                               False, runtime):
            log.info("model %s: a pinned %d-token prefix saved to disk (%.1f MiB)",
                     self.cfg.id, len(tokens), len(data) / 2**20)

    async def save_hot(self) -> None:
        """Write the most used unpinned prefixes to the disk tier (models.toml
        ``cache_disk_hot``; before the model unloads). Errors are logged, not raised."""
        store, n = self.prefix_store, self.cfg.cache_disk_hot
        if store is None or not n or not self.engine.is_running:
            return
        try:
            hot = await self.engine.call(functools.partial(self.engine.cache.hottest, n))
        except EngineError:
            return
        assert isinstance(hot, list)
        saved = [t for t, data in hot if await asyncio.to_thread(store.save, t, data, True)]
        await asyncio.to_thread(store.drop_hot, saved)
        log.info("model %s: %d hot prefixes saved to disk", self.cfg.id, len(saved))

    async def restore_hot(self, kind: str = "hot", skip: tuple[list[int], ...] = ()) -> int:
        """Put back the hot prefixes ``save_hot`` saved (at load); with ``kind`` "runtime",
        pin again those pinned by requests (but ``skip``'s). ``unpin_all`` drops those."""
        store = self.prefix_store
        if store is None or kind == "hot" and not self.cfg.cache_disk_hot:
            return 0
        cache, n = self.engine.cache, 0
        for tokens, data in await asyncio.to_thread(store.load_hot, kind):
            if tokens not in skip:
                n += bool(await self.engine.call(functools.partial(
                    cache.restore, tokens, data, pinned=kind == "runtime")))
        if n:
            log.info("model %s: %d %s prefixes restored from disk", self.cfg.id, n,
                     "pinned" if kind == "runtime" else "hot")
        return n

    async def unpin_all(self) -> None:
        self.engine.unpin_all()
        if (store := self.prefix_store) is not None:
            await asyncio.to_thread(store.drop_hot, [], "runtime")

    def check_fits(self, n_prompt: int, max_tokens: int | None, param: str = "messages"
                   ) -> None:
        """400 context_length_exceeded (on ``param``) unless the prompt (plus max_tokens)
        fits."""
        wanted = n_prompt + (max_tokens or 1)
        if n_prompt >= self.n_ctx or wanted > self.n_ctx:
            raise ContextTooLong(
                f"This model's maximum context length is {self.n_ctx} tokens. However, you "
                f"requested {wanted} tokens ({n_prompt} in the prompt, "
                f"{max_tokens or 1} for the completion). Please reduce the prompt or max_tokens.",
                prompt_tokens=n_prompt, max_tokens=max_tokens or 1, n_ctx=self.n_ctx,
                param=param)


def load_model(cfg: ModelConfig, path: Path | None = None,
               draft: tuple[ModelConfig, Path] | None = None) -> ServedModel:
    """Load one model (and its draft model: its configuration and file) and create its
    engine (blocking; run it off the event loop)."""
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
    fmt = choose(cfg.tool_format, template.source)
    shown = runtime.show_markers(fmt.markers + reasoning_markers(template.source))
    if shown:
        log.info("model %s: special tokens shown in its output: %s", cfg.id, " ".join(shown))
    log.info("model %s loaded from %s in %.2fs (%s, ctx %d, %d slots, %d threads)",
             cfg.id, path, time.perf_counter() - t0, info.description, info.n_ctx, cfg.slots,
             cfg.threads)
    engine = Engine(runtime, _draft_model(runtime, draft))
    return ServedModel(cfg, runtime, engine, template, Embedder(runtime),
                       markup=Markup(runtime.control_texts()),
                       prefix_store=_prefix_store(cfg, path) if engine.cache.enabled else None)


def _draft_model(runtime: LlamaRuntime,
                 draft: tuple[ModelConfig, Path] | None) -> DraftModel | None:
    """The target's draft model, counted in its memory (None: it has none)."""
    if draft is None:
        return None
    try:
        model = DraftModel(runtime, *draft)
    except BaseException:
        runtime.close()
        raise
    runtime.add_memory(model.memory_bytes())
    return model


def _prefix_store(cfg: ModelConfig, path: Path) -> PrefixStore | None:
    """The disk tier of pinned prefixes (None: cache_disk_mb = 0), keyed by what shapes a state."""
    if not cfg.cache_disk_mb:
        return None
    params = {"llama_cpp": version("llama-cpp-python"), "context": cfg.context,
              "slots": cfg.slots, "cache_entries": cfg.cache_entries, "batch": cfg.batch,
              "gpu_layers": cfg.gpu_layers, "cache_types": (cfg.cache_type_k, cfg.cache_type_v),
              "flash_attn": cfg.flash_attn}
    return PrefixStore(folder_of(cfg.id), model_identity(path, params), cfg.cache_disk_mb << 20)
