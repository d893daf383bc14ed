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

from edgeinfer.config import ServerConfig, load_config, override_model
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.errors import EngineError
from edgeinfer.models.pool import ModelPool
from edgeinfer.models.served import ServedModel


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

        ``sampling``: any SamplingParams field (temperature, max_tokens, top_p,
        stop, seed, ...). Breaking out of the loop cancels the generation.
        """
        return self._opened(self._chat(model, messages, sampling))

    def complete(self, model: str, prompt: str, **sampling: Any) -> AsyncGenerator[str, None]:
        """Stream a plain text completion of ``prompt``."""
        return self._opened(self._complete(model, prompt, sampling))

    async def _chat(self, model: str, messages: list[dict[str, Any]],
                    sampling: dict[str, Any]) -> AsyncGenerator[str, None]:
        served = await self.pool.acquire(model)
        lease = served.lease()  # the model stays loaded until this generator ends
        try:
            tokens = await served.run(served.chat_prompt, messages)
            async for piece in self._generate(served, tokens, sampling):
                yield piece
        finally:
            lease.release()

    async def _complete(self, model: str, prompt: str,
                        sampling: dict[str, Any]) -> AsyncGenerator[str, None]:
        served = await self.pool.acquire(model)
        lease = served.lease()
        try:
            tokens = await served.run(served.tokenize_text, prompt)
            async for piece in self._generate(served, tokens, sampling):
                yield piece
        finally:
            lease.release()

    async def _generate(self, served: ServedModel, tokens: list[int],
                        sampling: dict[str, Any]) -> AsyncIterator[str]:
        params = SamplingParams(**sampling)
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
