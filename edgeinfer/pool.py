"""The models a server serves, by name, each with its engine."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.chat import ChatTemplate
from edgeinfer.config import ModelConfig, ServerConfig
from edgeinfer.embedding import Embedder
from edgeinfer.engine import Delta, Engine
from edgeinfer.errors import (
    APIError,
    EngineError,
    InvalidRequest,
    ModelLoadError,
    NotFound,
    Overloaded,
)
from edgeinfer.native import LlamaRuntime, gpu_offload_supported
from edgeinfer.sequence import SamplingParams
from edgeinfer.source import check_gguf, resolve_model_path

PIN_PARAMS = SamplingParams(temperature=0, max_tokens=1)

log = logging.getLogger("edgeinfer.pool")


@dataclass(slots=True)
class ServedModel:
    """A loaded model: its runtime (native handles), engine thread and chat template."""

    cfg: ModelConfig
    runtime: LlamaRuntime
    engine: Engine
    template: ChatTemplate
    embedder: Embedder
    created: int = field(default_factory=lambda: int(time.time()))
    inflight: int = 0  # engine requests submitted and not finished (event-loop side)
    _finished_at: deque[float] = field(default_factory=lambda: deque(maxlen=64))

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
        info = self.runtime.info
        add_bos = info.add_bos and not (info.bos_text and text.startswith(info.bos_text))
        return self.runtime.tokenize(text, add_special=add_bos, parse_special=True)

    def tokenize_text(self, text: str) -> list[int]:
        return self.runtime.tokenize(text, add_special=True, parse_special=True)

    def system_prefix(self, messages: list[dict[str, Any]]) -> list[int]:
        """Tokens of messages rendered as the start of a conversation (no generation prompt)."""
        return self.tokenize_chat(self.template.render(messages, add_generation_prompt=False))

    async def pin(self, tokens: list[int]) -> int:
        """Compute ``tokens`` and keep their KV resident (never evicted); returns the count."""
        if not tokens:
            raise InvalidRequest("nothing to pin: the prompt is empty", param="prompt")
        self.check_fits(len(tokens), 1)
        rid = f"pin-{uuid.uuid4().hex[:12]}"
        last = None
        async for last in self.engine.generate(rid, tokens, PIN_PARAMS, pin=True):
            pass
        if last is None or last.finish_reason == "error":
            raise EngineError(f"could not pin the prefix: {last.error if last else 'no result'}")
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


def load_model(cfg: ModelConfig) -> ServedModel:
    """Load one model and create its engine (blocking; run it off the event loop)."""
    path = resolve_model_path(cfg)
    check_gguf(path, cfg.id)
    if cfg.gpu_layers and not gpu_offload_supported():
        log.warning("model %s: this llama-cpp-python build has no GPU support; running on the CPU",
                    cfg.id)
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
    return ServedModel(cfg, runtime, Engine(runtime), template, Embedder(runtime))


class ModelPool:
    """All configured models; ``get`` resolves a request's ``model`` field."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.models: dict[str, ServedModel] = {}
        self.failed: dict[str, str] = {}
        self._names: dict[str, str] = {n: m.id for m in config.models for n in m.names}

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for cfg in self.config.models:
            try:
                served = await asyncio.to_thread(load_model, cfg)
            except ModelLoadError as exc:
                log.error("%s", exc)
                self.failed[cfg.id] = str(exc)
                continue
            served.engine.start(loop)
            self.models[cfg.id] = served
            for text in cfg.pinned_prompts:
                n = await served.pin(served.system_prefix([{"role": "system", "content": text}]))
                log.info("model %s: pinned a %d-token system prompt", cfg.id, n)
        if not self.models:
            raise ModelLoadError("; ".join(self.failed.values()) or "no model configured")

    async def stop(self) -> None:
        for served in self.models.values():
            await asyncio.to_thread(served.embedder.close)  # before the model is freed
            await asyncio.to_thread(served.engine.stop)
        self.models.clear()

    def get(self, name: str) -> ServedModel:
        model_id = self._names.get(name)
        if model_id is None:
            raise NotFound(f"The model '{name}' does not exist. Available: "
                           f"{', '.join(sorted(self._names))}", param="model",
                           code="model_not_found")
        served = self.models.get(model_id)
        if served is None:
            raise APIError(f"the model '{name}' failed to load: {self.failed.get(model_id)}",
                           param="model", code="model_unavailable", status=503)
        return served
