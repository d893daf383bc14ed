"""The Starlette application: routes, error handlers, lifespan."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST
from sse_starlette.sse import EventSourceResponse, SendTimeoutError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from edgeinfer.api import body as jsonbody
from edgeinfer.api.completion import CompletionMeta, Usage, collect, merge, sse_chunks
from edgeinfer.config import ServerConfig
from edgeinfer.errors import APIError, InvalidRequest, NotFound
from edgeinfer.prompt.grammar import (
    check_gbnf,
    check_generated,
    json_object_gbnf,
    schema_to_gbnf,
    tool_calls_gbnf,
)
from edgeinfer.api.guard import Guard
from edgeinfer.api.metrics import Metrics
from edgeinfer.api.openapi import openapi_spec
from edgeinfer.models.pool import Lease, ModelPool, PoolEntry, ServedModel
from edgeinfer.api.protocol import (
    GenerationRequest,
    parse_chat,
    parse_completion,
    parse_detokenize,
    parse_embeddings,
    parse_pin,
    parse_tokenize,
)
from edgeinfer.models.routing import Features, route
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.prompt.tools import TOOL_CALL_TRIGGER

log = logging.getLogger("edgeinfer.api.app")

CHAT_PAGE = Path(__file__).resolve().parent / "static" / "chat.html"

MAX_BODY_BYTES = 8 * 1024 * 1024
THREAD_PARSE_BYTES = 64 * 1024
MAX_PIECES = 65_536  # tokens /tokenize lists with their pieces


def _error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.to_dict(), status_code=exc.status, headers=exc.headers)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return _error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        err: APIError = NotFound(f"no route for {request.method} {request.url.path}",
                                 code="not_found")
    else:
        err = APIError(str(exc.detail), status=exc.status_code,
                       code="method_not_allowed" if exc.status_code == 405 else None)
        err.type = "invalid_request_error"
    return _error_response(err)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal error on %s", request.url.path, exc_info=exc)
    return _error_response(APIError("internal server error", code="internal_error"))


async def _read_json(request: Request) -> Any:
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if ctype not in ("application/json", ""):
        raise APIError(f"the request body must be application/json, not {ctype}", status=415,
                       code="unsupported_media_type")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise APIError(f"request body exceeds {MAX_BODY_BYTES} bytes", status=413,
                       code="request_too_large")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > MAX_BODY_BYTES:
            raise APIError(f"request body exceeds {MAX_BODY_BYTES} bytes", status=413,
                           code="request_too_large")
    if len(body) > THREAD_PARSE_BYTES:  # a large body is parsed off the event loop
        return await asyncio.to_thread(jsonbody.loads, body)
    return jsonbody.loads(body)


def _pool(request: Request) -> ModelPool:
    pool: ModelPool = request.app.state.pool
    return pool


def _features(body: dict[str, Any]) -> Features:
    texts = []
    for m in body.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [p.get("text", "") for p in content if isinstance(p, dict)]
    if isinstance(body.get("prompt"), str):
        texts.append(body["prompt"])
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    return Features(bool(body.get("tools")), "\n".join(t for t in texts if isinstance(t, str)),
                    max_tokens if isinstance(max_tokens, int) else 0)


def _priority(request: Request, body: dict[str, Any]) -> int:
    raw = body.get("priority")
    if raw is None:
        header = request.headers.get("x-priority")
        if header is None:
            return 0
        raw = int(header.strip()) if re.fullmatch(r"\s*[-+]?\d{1,3}\s*", header) else header
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise InvalidRequest("'priority' must be an integer", param="priority")
    value = raw
    if not -10 <= value <= 10:
        raise InvalidRequest("'priority' must be an integer between -10 and 10",
                             param="priority")
    return value


async def _model_for(request: Request, body: Any, choices: int = 1) -> ServedModel:
    """The model that answers: the one named (or routed, for "auto"), or the first of its
    fallbacks when it is saturated or failed to load."""
    name = body.get("model") if isinstance(body, dict) else None
    if not isinstance(name, str):
        raise InvalidRequest("'model' is required and must be a string", param="model")
    pool = _pool(request)
    wait = request.headers.get("x-edgeinfer-wait", "true").lower() != "false"
    if name == "auto":
        name = route(pool.config.routing, list(pool.config.models), _features(body))
    first = pool.resolve(name)
    chain = [first, *pool.entries[first].cfg.fallback]
    last_error: APIError | None = None
    for model_id in chain:
        try:
            served = await pool.acquire(model_id, wait=wait)
            served.admit(choices)  # raises Overloaded when the queue is full
            return _hold(request, served)
        except APIError as exc:
            if exc.status not in (429, 503):
                raise
            last_error = exc
            if model_id != chain[-1]:
                log.info("model %s unavailable (%s): falling back", model_id, exc.code)
    assert last_error is not None
    raise last_error


async def _model_or_default(request: Request, name: str | None) -> ServedModel:
    pool = _pool(request)
    return _hold(request, await pool.acquire(
        name if name is not None else pool.config.models[0].id))


LEASES = "edgeinfer.leases"


def _hold(request: Request, served: ServedModel) -> ServedModel:
    """Keep ``served`` loaded until this request's response has been sent (streams too):
    the leases are given back by ``_ReleaseLeases`` once the whole exchange is over."""
    leases: list[Lease] = request.scope[LEASES]
    leases.append(served.lease())
    return served


class _ReleaseLeases:
    """ASGI middleware: gives back the model leases a request took, after its response."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        leases: list[Lease] = []
        scope[LEASES] = leases
        try:
            await self.app(scope, receive, send)
        finally:
            for lease in leases:
                lease.release()


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _choice_params(params: SamplingParams, i: int) -> SamplingParams:
    """Choice i of n: a seeded request gives each choice its own, reproducible seed."""
    if i == 0 or params.seed is None:
        return params
    return replace(params, seed=params.seed + i)


def _constraint(served: ServedModel, req: GenerationRequest) -> tuple[str | None, tuple[str, ...]]:
    """The grammar (and lazy triggers) a request's output must follow, checked by llama.cpp.

    Blocking (schema conversion, grammar parsing): call it off the event loop.
    """
    vocab = served.runtime.vocab
    if req.grammar is not None:
        check_gbnf(vocab, req.grammar)
        return req.grammar, ()
    if req.json_schema is not None:
        gbnf = schema_to_gbnf(req.json_schema, "response_format.json_schema.schema")
    elif req.json_object:
        gbnf = json_object_gbnf()
    elif req.tool_choice != "none":
        named = [t for t in req.tools if t.name == req.tool_choice]
        chosen = named or list(req.tools)
        # parallel: at most one call per tool (a small model repeats a lone call endlessly)
        calls = min(4, len(chosen)) if req.parallel_tool_calls and not named else 1
        gbnf = tool_calls_gbnf([(t.name, t.parameters) for t in chosen], calls)
        check_generated(vocab, gbnf, "tools")
        return gbnf, ((TOOL_CALL_TRIGGER,) if req.tool_choice == "auto" else ())
    else:
        return None, ()
    check_generated(vocab, gbnf, "response_format")
    return gbnf, ()


async def _respond(
    request: Request, served: ServedModel, req: GenerationRequest, prompts: list[list[int]],
    kind: str, priority: int = 0,
) -> Response:
    """Run n choices per prompt (prompt computed once, via the prefix cache) and answer."""
    for p in prompts:
        served.check_fits(len(p), req.params.max_tokens)
    gbnf, triggers = await served.run(_constraint, served, req)
    if gbnf is not None:
        req = replace(req, params=replace(req.params, grammar=gbnf, grammar_triggers=triggers))
    meta = CompletionMeta(kind, served.cfg.id, served.runtime.piece,
                          tools=req.tool_choice != "none")
    jobs = [(pi, prompt, _choice_params(req.params, i))
            for pi, prompt in enumerate(prompts) for i in range(req.n)]
    usage = Usage([pi for pi, _, _ in jobs], [len(p) for p in prompts])
    # checked again here, right before submitting: _model_for's check (which picks a fallback)
    # ran before rendering and tokenizing, while other requests kept arriving
    served.admit(len(jobs))  # 429 with Retry-After when the queue is full
    events = merge([
        served.generate(f"{meta.id}-{k}", prompt, params, use_cache=req.cache_prompt,
                        priority=priority, group=meta.id)
        for k, (_, prompt, params) in enumerate(jobs)])
    if req.stream:
        return _Stream(sse_chunks(meta, events, usage, req.include_usage), ping=10, sep="\n",
                       send_timeout=request.app.state.send_timeout)
    work = asyncio.ensure_future(collect(meta, events, usage))
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not work.done():  # the client went away: abort the generation, free its slots
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return Response(status_code=499)
    return JSONResponse(work.result())


async def chat_completions(request: Request) -> Response:
    body = await _read_json(request)
    priority = _priority(request, body) if isinstance(body, dict) else 0
    served = await _model_for(request, body, _choices(body))
    req = parse_chat(body, served.runtime.info.n_vocab)
    assert req.messages is not None
    tools = req.tools if req.tool_choice != "none" else ()
    # rendering (time-budgeted) and tokenizing run off the event loop
    prompt = await served.run(served.chat_prompt, [dict(m) for m in req.messages], tools)
    return await _respond(request, served, req, [prompt], "chat", priority)


async def completions(request: Request) -> Response:
    body = await _read_json(request)
    priority = _priority(request, body) if isinstance(body, dict) else 0
    served = await _model_for(request, body, _choices(body))
    req = parse_completion(body, served.runtime.info.n_vocab)
    prompts = []
    for p in req.prompts:
        tokens = await served.run(served.tokenize_text, p) if isinstance(p, str) else p
        if not tokens:
            raise InvalidRequest("'prompt' is empty", param="prompt")
        prompts.append(tokens)
    return await _respond(request, served, req, prompts, "text", priority)


def _choices(body: Any) -> int:
    if not isinstance(body, dict):
        return 1
    n = body.get("n", 1)
    prompts = body.get("prompt")
    many = len(prompts) if isinstance(prompts, list) and prompts and not isinstance(
        prompts[0], int) else 1
    return (n if isinstance(n, int) and 0 < n <= 16 else 1) * min(many, 16)


def _model_card(entry: PoolEntry) -> dict[str, Any]:
    cfg, served = entry.cfg, entry.served
    card: dict[str, Any] = {
        "id": cfg.id, "object": "model", "created": served.created if served else 0,
        "owned_by": "edgeinfer", "aliases": list(cfg.aliases), "tags": list(cfg.tags),
        "state": entry.state.value, "runs_on": "gpu" if cfg.gpu_layers else "cpu",
    }
    if entry.error:
        card["error"] = entry.error
    if served is not None:
        info = served.runtime.info
        card["meta"] = {"description": info.description, "n_ctx": info.n_ctx,
                        "n_ctx_train": info.n_ctx_train, "n_vocab": info.n_vocab,
                        "slots": cfg.slots, "size_bytes": info.size_bytes,
                        "memory_bytes": served.runtime.memory_bytes()}
    return card


async def list_models(request: Request) -> Response:
    pool = _pool(request)
    return JSONResponse({"object": "list",
                         "data": [_model_card(e) for e in pool.entries.values()]})


async def get_model(request: Request) -> Response:
    pool = _pool(request)
    return JSONResponse(_model_card(pool.entries[pool.resolve(request.path_params["model_id"])]))


async def load_model_route(request: Request) -> Response:
    """POST /v1/models/{id}/load: load now (waits until loaded or failed)."""
    pool = _pool(request)
    model_id = pool.resolve(request.path_params["model_id"])
    await pool.acquire(model_id)
    return JSONResponse(_model_card(pool.entries[model_id]))


async def unload_model_route(request: Request) -> Response:
    """POST /v1/models/{id}/unload: free it (409 while it serves requests)."""
    pool = _pool(request)
    model_id = pool.resolve(request.path_params["model_id"])
    entry = pool.entries[model_id]
    if entry.served is not None and entry.served.busy:
        raise APIError(f"the model '{model_id}' is serving requests", status=409,
                       code="model_busy")
    if entry.served is not None and not await pool.unload(model_id):
        raise APIError(f"the model '{model_id}' is serving requests", status=409,
                       code="model_busy")
    return JSONResponse(_model_card(entry))


async def health(request: Request) -> Response:
    pool = _pool(request)
    models = {mid: m.engine.stats_snapshot() for mid, m in pool.models.items()}
    ok = bool(models) and all(m.engine.is_running for m in pool.models.values())
    return JSONResponse({"status": "ok" if ok else "error", "models": models},
                        status_code=200 if ok else 503)


async def pin_prefix(request: Request) -> Response:
    """Keep a system prompt (messages) or a raw prompt resident in the prefix cache."""
    body = await _read_json(request)
    name, messages, prompt = parse_pin(body)
    served = _hold(request, await _pool(request).acquire(name))
    if messages is not None:
        tokens = await served.run(served.system_prefix, [dict(m) for m in messages])
    else:
        assert prompt is not None
        tokens = await served.run(served.tokenize_text, prompt)
    n = await served.pin(tokens)
    return JSONResponse({"object": "cache.pin", "model": served.cfg.id, "tokens": n})


async def unpin_prefixes(request: Request) -> Response:
    served = _pool(request).get(request.query_params.get("model", ""))
    served.engine.unpin_all()
    return JSONResponse({"object": "cache.unpin", "model": served.cfg.id})


async def cache_stats(request: Request) -> Response:
    pool = _pool(request)
    return JSONResponse({"object": "list", "data": [
        {"model": mid, **m.engine.cache.snapshot()} for mid, m in pool.models.items()]})


async def embeddings(request: Request) -> Response:
    body = await _read_json(request)
    served = await _model_for(request, body)
    req = parse_embeddings(body, served.runtime.info.n_vocab)
    inputs = [await served.run(served.tokenize_text, x) if isinstance(x, str) else x
              for x in req.inputs]
    vectors = await served.embedder.embed(inputs)
    data = []
    for i, v in enumerate(vectors):
        emb: object = v
        if req.base64:
            emb = base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii")
        data.append({"object": "embedding", "index": i, "embedding": emb})
    n = sum(len(t) for t in inputs)
    return JSONResponse({"object": "list", "data": data, "model": served.cfg.id,
                         "usage": {"prompt_tokens": n, "total_tokens": n}})


async def tokenize(request: Request) -> Response:
    """Count tokens before sending a prompt (llama-server's /tokenize shape)."""
    body = await _read_json(request)
    name, content, add_special, parse_special, with_pieces = parse_tokenize(body)
    served = await _model_or_default(request, name)
    rt = served.runtime

    def work() -> bytes:  # tokenizing, the pieces and the JSON all off the event loop
        tokens = rt.tokenize(content, add_special=add_special, parse_special=parse_special)
        if not with_pieces:
            return _json_bytes({"tokens": tokens, "model": served.cfg.id})
        if len(tokens) > MAX_PIECES:
            raise InvalidRequest(f"'with_pieces' is allowed for at most {MAX_PIECES} tokens; "
                                 f"this text has {len(tokens)}", param="with_pieces")
        pieces = [{"id": t, "piece": rt.piece(t).decode("utf-8", "replace")} for t in tokens]
        return _json_bytes({"tokens": pieces, "model": served.cfg.id})

    return Response(await served.run(work), media_type="application/json")


class _Stream(EventSourceResponse):
    """Server-sent events that end (aborting the generation, freeing its slot) when the
    client stops reading for ``send_timeout`` seconds."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except SendTimeoutError:
            log.warning("a stream was not read for %gs: closed", self.send_timeout)


def _json_bytes(value: Any) -> bytes:
    return JSONResponse(value).body


async def detokenize(request: Request) -> Response:
    body = await _read_json(request)
    name = body.get("model") if isinstance(body, dict) else None
    served = await _model_or_default(request, name if isinstance(name, str) else None)
    rt = served.runtime

    def work() -> bytes:
        _, tokens = parse_detokenize(body, rt.info.n_vocab)
        return _json_bytes({"content": rt.detokenize(tokens), "model": served.cfg.id})

    return Response(await served.run(work), media_type="application/json")


async def openapi(request: Request) -> Response:
    return JSONResponse(openapi_spec())


async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def slots(request: Request) -> Response:
    pool = _pool(request)
    return JSONResponse({"object": "list", "data": [
        {"model": mid, "slots": m.engine.slots_snapshot()} for mid, m in pool.models.items()]})


async def chat_page(request: Request) -> Response:
    return HTMLResponse(CHAT_PAGE.read_text(encoding="utf-8"))


class _Latency:
    """Feeds one model's latencies into the app's histograms (engine thread)."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self._ttft = metrics.ttft.labels(model)
        self._itl = metrics.itl.labels(model)

    def ttft(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def itl(self, seconds: float) -> None:
        self._itl.observe(seconds)


class _CountRequests:
    """ASGI middleware: requests by route and status, for /metrics."""

    def __init__(self, app: Any, metrics: Metrics, routes: set[str]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def wrapped(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, wrapped)
        finally:
            route = scope["path"] if scope["path"] in self.routes else "other"
            self.metrics.requests.labels(route, str(status[0])).inc()


def create_app(config: ServerConfig, pool: ModelPool | None = None) -> Starlette:
    """The ASGI app serving ``config``'s models.

    Without ``pool`` the app owns one: models load in its lifespan and are freed
    at shutdown. With a started ``pool`` (see ``edgeinfer.embed``), the app only
    serves it, so it can be mounted inside another app whose lifespan it cannot use.
    """
    own = pool is None
    the_pool = pool if pool is not None else ModelPool(config)
    app_metrics = Metrics(lambda: {mid: m.engine.stats_snapshot()
                                   for mid, m in list(the_pool.models.items())})

    def observe(model_id: str, served: ServedModel) -> None:
        served.engine.observer = _Latency(app_metrics, model_id)

    the_pool.on_load.append(observe)
    for mid, loaded in the_pool.models.items():  # a pool started before the app
        observe(mid, loaded)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if own:
            await the_pool.start()
        try:
            yield
        finally:
            if own:
                await the_pool.stop()

    routes = [
        Route("/", chat_page, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/slots", slots, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}/load", load_model_route, methods=["POST"]),
        Route("/v1/models/{model_id:path}/unload", unload_model_route, methods=["POST"]),
        Route("/v1/models/{model_id:path}", get_model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/v1/cache", cache_stats, methods=["GET"]),
        Route("/v1/cache/pin", pin_prefix, methods=["POST"]),
        Route("/v1/cache/pins", unpin_prefixes, methods=["DELETE"]),
    ]
    handlers = {APIError: _api_error, HTTPException: _http_error, Exception: _internal_error}
    guard = Middleware(Guard, api_keys=config.api_keys, cors_origins=config.cors_origins,
                       allowed_hosts=(*config.allowed_hosts, config.host))
    count = Middleware(_CountRequests, metrics=app_metrics,
                       routes={r.path for r in routes if "{" not in r.path})
    app = Starlette(routes=routes, exception_handlers=handlers,  # type: ignore[arg-type]
                    lifespan=lifespan, middleware=[count, guard, Middleware(_ReleaseLeases)])
    app.state.pool = the_pool
    app.state.send_timeout = config.send_timeout
    app.state.metrics = app_metrics
    return app
