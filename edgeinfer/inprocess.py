"""edgeinfer inside your own process: the same engines and batching, no separate server.

    from edgeinfer.inprocess import EdgeInfer

    async with EdgeInfer.from_config() as ei:            # the default models.toml
        async for text in ei.chat("default", [{"role": "user", "content": "Hi"}]):
            print(text, end="")
        app = ei.asgi_app()   # mount it in your Starlette / FastAPI app: the same HTTP API

Many ``chat`` / ``complete`` calls may run at once; they are batched together
exactly as HTTP requests are. ``close`` ends the generations still open (a loop left
with ``break`` included) and frees the models; ``chat`` / ``complete`` before ``start``
or after ``close`` raise RuntimeError (``start`` again to go on).
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any, Self

from starlette.applications import Starlette

from edgeinfer.api import fields, samplers
from edgeinfer.config import ServerConfig, load_config, override_model
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.errors import EngineError, InvalidRequest
from edgeinfer.models.pool import ModelPool
from edgeinfer.models.served import ServedModel
from edgeinfer.prompt.grammar import check_gbnf

# the keyword arguments of chat / complete: HTTP's sampling fields, checked as HTTP checks them
SAMPLING = frozenset({"temperature", "top_p", "top_k", "min_p", "presence_penalty",
                      "frequency_penalty", "repeat_penalty", "repeat_last_n", "seed",
                      "max_tokens", "stop", "ignore_eos", "logit_bias", "speculative",
                      "deterministic", "grammar", "dry_sequence_breakers", *samplers.RANGES})


def sampling_params(sampling: dict[str, Any]) -> SamplingParams:
    """``chat`` / ``complete``'s keyword arguments as the engine's SamplingParams, within
    the bounds an HTTP request has (InvalidRequest, naming the argument, otherwise)."""
    body: dict[str, Any] = {k: [list(i) if isinstance(i, tuple) else i for i in v]
                            if isinstance(v, tuple) else v for k, v in sampling.items()}
    if isinstance(bias := body.get("logit_bias"), dict):  # token ids as ints, as in Python
        body["logit_bias"] = {str(k): v for k, v in bias.items()}
    b = fields.Body(body, set(SAMPLING))  # (an unknown one: "unrecognized ...", named)
    max_tokens = b.integer("max_tokens", 1, fields.MAX_TOKENS_LIMIT, None)
    params = dataclasses.replace(fields.sampling_params(b, max_tokens), **samplers.params(b))
    grammar = b.body.get("grammar")
    if grammar is not None and not isinstance(grammar, str):
        raise InvalidRequest("'grammar' must be a string (GBNF)", param="grammar")
    return dataclasses.replace(params, grammar=grammar)


class EdgeInfer:
    """A started pool of models with a small async API; see the module docstring."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.pool = ModelPool(config)
        self._started = False
        self._open: weakref.WeakSet[AsyncGenerator[str, None]] = weakref.WeakSet()

    @classmethod
    def from_config(cls, path: Path | str | None = None, **overrides: Any) -> EdgeInfer:
        """From a models.toml (default: the package's); overrides apply to every model
        (slots=, context=, threads=, ...)."""
        cfg = load_config(Path(path) if path else None)
        models = tuple(override_model(m, **overrides) for m in cfg.models)
        return cls(dataclasses.replace(cfg, models=models, library=models))  # (routing, ...)

    async def start(self) -> Self:
        if not self._started:
            await self.pool.start()
            self._started = True
        return self

    async def close(self) -> None:
        if self._started:
            self._started = False
            self.pool.stopped = True  # (a generation that starts meanwhile loads nothing)
            for gen in list(self._open):  # (one another task is reading ends with the engine)
                with contextlib.suppress(RuntimeError):
                    await gen.aclose()
            await self.pool.stop()

    def _opened(self, gen: AsyncGenerator[str, None]) -> AsyncGenerator[str, None]:
        if not self._started:  # (``gen`` never ran: nothing to end)
            raise RuntimeError("EdgeInfer is not started: use `async with` or await start()")
        self._open.add(gen)
        return gen

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def chat(self, model: str, messages: list[dict[str, Any]],
             **sampling: Any) -> AsyncGenerator[str, None]:
        """Stream the assistant's reply to ``messages`` as text pieces.

        ``sampling``: the sampling fields of an HTTP request, with its bounds
        (temperature, max_tokens, top_p, stop, seed, logit_bias, grammar, the
        llama-server samplers ...: ``SAMPLING``); one out of bounds or unknown raises
        InvalidRequest naming it. Breaking out of the loop cancels the generation.
        """
        return self._opened(self._chat(model, messages, sampling_params(sampling)))

    def complete(self, model: str, prompt: str, **sampling: Any) -> AsyncGenerator[str, None]:
        """Stream a plain text completion of ``prompt`` (``sampling``: as ``chat``'s)."""
        return self._opened(self._complete(model, prompt, sampling_params(sampling)))

    async def _chat(self, model: str, messages: list[dict[str, Any]],
                    params: SamplingParams) -> AsyncGenerator[str, None]:
        served = await self.pool.acquire(model)
        lease = served.lease()  # the model stays loaded until this generator ends
        try:
            tokens = await served.run(served.chat_prompt, messages)
            async for piece in self._generate(served, tokens, params):
                yield piece
        finally:
            lease.release()

    async def _complete(self, model: str, prompt: str,
                        params: SamplingParams) -> AsyncGenerator[str, None]:
        served = await self.pool.acquire(model)
        lease = served.lease()
        try:
            tokens = await served.run(served.tokenize_text, prompt)
            async for piece in self._generate(served, tokens, params):
                yield piece
        finally:
            lease.release()

    async def _generate(self, served: ServedModel, tokens: list[int],
                        params: SamplingParams) -> AsyncIterator[str]:
        if params.grammar is not None:
            await served.run(check_gbnf, served.runtime.vocab, params.grammar)
        served.check_fits(len(tokens), params.max_tokens)
        async for d in served.generate(f"local-{uuid.uuid4().hex[:12]}", tokens, params):
            if d.finish_reason == "error":
                raise EngineError(d.failure.message if d.failure else "generation failed")
            if d.text:
                yield d.text

    def asgi_app(self) -> Starlette:
        """The HTTP API over this pool, to mount in another ASGI app (start() first)."""
        from edgeinfer.api.app import create_app

        return create_app(self.config, pool=self.pool)
