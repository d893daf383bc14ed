"""The Starlette application: the route table, middleware, error handlers, lifespan.

Each dialect module owns its routes' handlers (``openai_chat``,
``openai_completions``, ``openai_responses``, ``anthropic_messages``, ``ollama_api``,
``embeddings``, ``tokens``, ``models_routes``, ``cache_routes``, ``ops``); this module
only wires them together.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import Route

from edgeinfer.api import (
    anthropic_messages,
    cache_routes,
    infill,
    llama_native,
    models_routes,
    ollama_api,
    openai_responses,
    ops,
    stored_chats,
    tokens,
    unread,
)
from edgeinfer.api.apply_template import apply_template
from edgeinfer.api.embeddings import embeddings
from edgeinfer.api.errors import on_api_error, on_http_error, on_internal_error
from edgeinfer.api.guard import OPEN_PATHS, ApiKeyGuard, CorsGuard, HostGuard, served_hosts
from edgeinfer.api.lifecycle import Lifecycle, Phase
from edgeinfer.api.metrics import Metrics
from edgeinfer.api.middleware import CountRequests, ReleaseLeases, RequestIds
from edgeinfer.api.openai_chat import chat_completions
from edgeinfer.api.openai_completions import completions
from edgeinfer.config import ServerConfig
from edgeinfer.errors import APIError
from edgeinfer.models.pool import ModelPool
from edgeinfer.models.served import ServedModel

log = logging.getLogger("edgeinfer")

ROUTES = [
    Route("/", ops.chat_page, methods=["GET"]),
    Route("/metrics", ops.metrics, methods=["GET"]),
    Route("/slots", ops.slots, methods=["GET"]),
    Route("/health", ops.health, methods=["GET"]),
    Route("/ready", ops.ready, methods=["GET"]),
    Route("/openapi.json", ops.openapi, methods=["GET"]),
    Route("/v1/models", models_routes.list_models, methods=["GET"]),
    Route("/v1/models/{model_id:path}/load", models_routes.load_model, methods=["POST"]),
    Route("/v1/models/{model_id:path}/unload", models_routes.unload_model, methods=["POST"]),
    Route("/v1/models/{model_id:path}", models_routes.get_model, methods=["GET"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    # llama-server's paths without /v1: OpenAI's chat and models, and its own completion
    Route("/models", models_routes.list_models, methods=["GET"]),
    Route("/chat/completions", chat_completions, methods=["POST"]),
    Route("/responses", openai_responses.create_response, methods=["POST"]),
    Route("/responses/input_tokens", openai_responses.count_input_tokens, methods=["POST"]),
    Route("/v1/health", ops.health, methods=["GET"]),
    Route("/completion", llama_native.completion, methods=["POST"]),
    Route("/completions", llama_native.completion, methods=["POST"]),
    Route("/infill", infill.infill, methods=["POST"]),
    Route("/props", llama_native.props, methods=["GET"]),
    Route("/tokenize", tokens.tokenize, methods=["POST"]),
    Route("/detokenize", tokens.detokenize, methods=["POST"]),
    Route("/apply-template", apply_template, methods=["POST"]),
    Route("/v1/cache", cache_routes.cache_stats, methods=["GET"]),
    Route("/v1/cache/pin", cache_routes.pin_prefix, methods=["POST"]),
    Route("/v1/cache/pins", cache_routes.unpin_prefixes, methods=["DELETE"]),
    *openai_responses.ROUTES,
    *stored_chats.ROUTES,
    *anthropic_messages.ROUTES,
    *ollama_api.ROUTES,
]


class _Latency:
    """Feeds one model's latencies into the app's histograms (engine thread)."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self._ttft = metrics.ttft.labels(model)
        self._itl = metrics.itl.labels(model)

    def ttft(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def itl(self, seconds: float) -> None:
        self._itl.observe(seconds)


def create_app(config: ServerConfig, pool: ModelPool | None = None) -> Starlette:
    """The ASGI app serving ``config``'s models.

    Without ``pool`` the app owns one: models load in its lifespan and are freed
    at shutdown. With a started ``pool`` (see ``edgeinfer.inprocess``), the app only
    serves it, so it can be mounted inside another app whose lifespan it cannot use.
    """
    own = pool is None
    the_pool = pool if pool is not None else ModelPool(config)
    unread.install()  # (uvicorn's error for a stream closed unread is not logged)
    app_metrics = Metrics(lambda: {mid: {
        **m.engine.stats_snapshot(),
        "disk": m.prefix_store.snapshot() if m.prefix_store is not None else None}
        for mid, m in list(the_pool.models.items())})

    def observe(model_id: str, served: ServedModel) -> None:
        served.engine.observer = _Latency(app_metrics, model_id)

    the_pool.on_load.append(observe)
    for mid, loaded in the_pool.models.items():  # a pool started before the app
        observe(mid, loaded)

    life = Lifecycle() if own else Lifecycle(Phase.SERVING)  # a started pool serves now
    lifespan = _lifespan(the_pool if own else None, config.serve_while_loading, life)
    handlers: dict[Any, Any] = {APIError: on_api_error, HTTPException: on_http_error,
                                Exception: on_internal_error}
    middleware = [
        Middleware(RequestIds),
        Middleware(CountRequests, metrics=app_metrics,
                   routes={r.path for r in ROUTES if "{" not in r.path}),
        Middleware(HostGuard, allowed_hosts=(*config.allowed_hosts, *served_hosts(config.host))),
        Middleware(CorsGuard, cors_origins=config.cors_origins),
        Middleware(ApiKeyGuard, api_keys=config.api_keys,
                   open_paths=OPEN_PATHS | ({"/metrics"} if config.open_metrics else set())),
        Middleware(ReleaseLeases),
    ]
    app = Starlette(routes=ROUTES, exception_handlers=handlers, lifespan=lifespan,
                    middleware=middleware)
    app.state.pool = the_pool
    app.state.send_timeout = config.send_timeout
    app.state.metrics = app_metrics
    app.state.lifecycle = life
    return app


def _lifespan(pool: ModelPool | None, in_background: bool, life: Lifecycle
              ) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    """The app's lifespan: start ``pool`` (None: a pool started by its owner) before
    serving, or while serving (``in_background``); stop it at shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        starting = None
        if pool is not None and in_background:  # answer (/ready: 503) while models load
            starting = asyncio.ensure_future(_start_in_background(pool, life))
        elif pool is not None:
            await pool.start()
        if starting is None:
            life.serving()
        # what exists now lives as long as the server: keep the garbage collector from
        # walking it again and again (long collections stall the event loop)
        gc.freeze()
        try:
            yield
        finally:
            life.drain()
            if starting is not None and not starting.done():
                starting.cancel()  # no further start-up loads; one under way ends alone
            if pool is not None:
                await pool.stop()

    return lifespan


async def _start_in_background(pool: ModelPool, life: Lifecycle) -> None:
    """The pool's start-up loading while the server already answers; the lifecycle
    says when it is over (serving) or failed for every model (failed: /health 503)."""
    try:
        await pool.start()
    except Exception as exc:  # every model failed, or no memory for one (ModelLoadError, ...)
        log.error("start-up failed: %s", exc)
        life.failed(str(exc) or type(exc).__name__)
        return
    life.serving()
    gc.freeze()
    log.info("start-up models loaded: %s", ", ".join(pool.models) or "none")
