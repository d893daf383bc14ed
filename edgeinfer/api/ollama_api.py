"""Ollama's native API (its docs/api.md): the requests. ``ollama_render`` answers them.

``POST /api/chat`` and ``/api/generate`` (NDJSON streams unless ``"stream": false``),
``GET /api/tags`` (every configured model, under each of its names), ``GET /api/ps``,
``POST /api/show``, ``POST /api/embed`` and the older ``/api/embeddings``, ``GET
/api/version``. ``/api/pull``, ``push``, ``create``, ``delete``, ``copy`` and ``blobs``
answer 501: models come from models.toml (``edgeinfer pull`` installs their files).

- ``options``: ``SAMPLING_OPTIONS`` map to the sampling settings (num_predict -1 / -2 / 0:
  no limit but the model's ``max_tokens`` and the context, as Ollama's runner takes 0;
  ``INTEGER_OPTIONS`` given as floats are cut to integers, as Ollama does; seed < 0: random;
  repeat_last_n -1: the whole context); absent ones take the server's defaults, not Ollama's.
  ``IGNORED_OPTIONS`` (load-time settings that models.toml fixes, and ``tfs_z``, which
  llama.cpp dropped) must be numbers or booleans and are ignored; unknown names are logged
  and ignored, as Ollama does.
- ``format``: "json" or a JSON schema (grammar-enforced). ``tools``: function tools the
  model may call; ``tool_choice`` (an edgeinfer extension: Ollama has none) forces a call
  (``toolchoice.ollama_choice``: the shapes of every dialect; others are dropped). ``think``:
  to the chat template (``enable_thinking``, ``reasoning_effort``); reasoning comes back in
  ``thinking``. ``logprobs`` (and ``top_logprobs``, 0-20): each answer token's, with its
  alternatives, in ``logprobs``.
- Messages (``ollama_messages``): system / user / assistant (``tool_calls`` with object
  arguments, ``thinking``) / tool (answers the open call named by ``tool_name``, else the
  first); ``images`` are refused: no model here sees them.
- ``keep_alive`` (seconds or "5m"-style; negative: forever): 0 unloads the model once the
  answer is sent, if nothing else uses it; another value keeps the model loaded that long
  after its last request, instead of its models.toml ``ttl``, until it is unloaded
  (``ModelPool.keep``); a request without it changes nothing. No messages / an empty prompt
  loads the model, or with keep_alive 0 unloads it (while it serves requests: once they end).
- /api/generate: ``system``; ``raw`` skips the template (and ``system`` and ``context``,
  ignored as Ollama ignores them); a non-empty ``template``, ``suffix`` or ``images`` is
  refused. ``context`` (token ids, deprecated by Ollama) comes before the rendered prompt,
  after its BOS; the last line of an answer that is not ``raw`` gives ``context``: the
  prompt's tokens (BOS left out) and the answer's, so that sending it back continues the
  conversation (from the prefix cache). A prompt longer than the context keeps its first
  ``options.num_keep`` tokens (4) and its tail, room left for the answer (``truncate``
  false: a 400); ``shift`` is ignored.
- Unknown body fields are logged and ignored, as Ollama does. A name may end in ``:latest``.
  Errors: ``{"error": "..."}`` (``api.errors``); an unknown model: 404 "model 'x' not found".
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeinfer import __version__
from edgeinfer.api import fields, ollama_models, ollama_render, samplers
from edgeinfer.api.body import read_json_any
from edgeinfer.api.embeddings import MAX_EMBED_INPUTS
from edgeinfer.api.fields import MAX_TOKENS_LIMIT, Body
from edgeinfer.api.ollama_messages import conversation
from edgeinfer.api.ollama_render import Parsed, answer, embeddings_answer, keep_alive
from edgeinfer.api.openai_chat import parse_tools
from edgeinfer.api.respond import pool
from edgeinfer.api.toolchoice import ollama_choice
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.errors import APIError, InvalidRequest, NotFound
from edgeinfer.models.pool import ModelPool
from edgeinfer.service.request import ChatPrompt, Constraint, GenerateRequest, TextPrompts

log = logging.getLogger("edgeinfer.api")

COMMON = {"model", "stream", "format", "options", "keep_alive", "think", "truncate", "shift",
          "logprobs", "top_logprobs"}
CHAT_FIELDS = COMMON | {"messages", "tools", "tool_choice"}
GENERATE_FIELDS = COMMON | {"prompt", "suffix", "system", "template", "context", "raw",
                            "images", "width", "height", "steps"}
SAMPLING_OPTIONS = {"temperature", "top_p", "top_k", "min_p", "seed", "num_predict", "stop",
                    "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty",
                    "typical_p", "mirostat", "mirostat_tau", "mirostat_eta"}
INTEGER_OPTIONS = {"top_k", "seed", "num_predict", "repeat_last_n", "mirostat"}
IGNORED_OPTIONS = {
    "num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "num_keep", "numa",
    "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mmap", "use_mlock",
    "embedding_only", "penalize_newline", "tfs_z"}


def model_name(p: ModelPool, name: str) -> str:
    """``name`` as the pool knows it (Ollama's ``:latest`` tag dropped); 404 otherwise."""
    if name.removesuffix(":latest") == "auto":
        return "auto"
    if p.knows(name):
        return name
    raise NotFound(f"model '{name}' not found", param="model", code="model_not_found")


def _options(b: Body) -> tuple[dict[str, Any], int | None]:
    """``options``' sampling settings under the names ``fields.sampling_params`` reads,
    and max_tokens (None: no limit)."""
    opts = b.body.get("options")
    opts = {} if opts is None else opts
    if not isinstance(opts, dict):
        raise InvalidRequest("'options' must be an object", param="options")
    out = {k: v for k, v in opts.items() if k in SAMPLING_OPTIONS}
    for key, value in opts.items():
        if key in IGNORED_OPTIONS and not isinstance(value, int | float | None):
            raise InvalidRequest(f"'options.{key}' must be a number or a boolean",
                                 param=f"options.{key}")
        if key not in SAMPLING_OPTIONS and key not in IGNORED_OPTIONS:
            log.warning("ignoring an unknown Ollama option: %r", key[:64])
    out |= {k: _whole(v) for k, v in out.items() if k in INTEGER_OPTIONS}
    predict = out.pop("num_predict", None)
    if predict is not None and (isinstance(predict, bool) or not isinstance(predict, int)
                                or not -2 <= predict <= MAX_TOKENS_LIMIT):
        raise InvalidRequest("'options.num_predict' must be -1, -2, 0 or a positive integer "
                             f"up to {MAX_TOKENS_LIMIT}", param="options.num_predict")
    if out.get("repeat_last_n") == -1:
        out["repeat_last_n"] = 1 << 16  # the whole context
    seed = out.get("seed")
    if isinstance(seed, int) and seed < 0:
        del out["seed"]  # Ollama's -1: a random seed
    return out, predict if predict is not None and predict > 0 else None


def _whole(value: Any) -> Any:
    """A finite float cut to an integer, as Ollama's ``FromMap`` reads an integer option;
    anything else as it is (checked where it is read)."""
    return int(value) if isinstance(value, float) and math.isfinite(value) else value


def _num_keep(b: Body) -> int:
    """``options.num_keep``: prompt tokens kept at the head when a prompt is cut (default 4,
    as Ollama's; negative: as many as the cut allows)."""
    keep = (b.body.get("options") or {}).get("num_keep")
    keep = _whole(keep)
    if not isinstance(keep, int) or isinstance(keep, bool):
        return 4
    return keep if keep >= 0 else 1 << 30


def sampling(b: Body) -> SamplingParams:
    """SamplingParams from ``options``; errors name ``options.<name>``. A temperature
    above OpenAI's 2 is taken as it is, as Ollama takes it."""
    body, max_tokens = _options(b)
    hot = body.get("temperature")
    hot = hot if isinstance(hot, int | float) and not isinstance(hot, bool) and hot > 2 else None
    if hot is not None:  # checked as OpenAI's highest, then taken as sent
        if not hot <= 1e300:  # (an int past a float's range)
            raise InvalidRequest("'options.temperature' is out of range",
                                 param="options.temperature")
        body = {**body, "temperature": 2.0}
    try:
        params = samplers.sampling_params(Body(body, SAMPLING_OPTIONS), max_tokens)
        return replace(params, temperature=float(hot)) if hot is not None else params
    except InvalidRequest as exc:
        name = exc.param or ""
        raise InvalidRequest(exc.message.replace(f"'{name}'", f"'options.{name}'"),
                             param=f"options.{name}") from None


def _format(b: Body) -> tuple[dict[str, Any] | None, bool]:
    fmt = b.body.get("format")
    if fmt is None or fmt in ("", "json") or isinstance(fmt, dict):
        return (fmt if isinstance(fmt, dict) else None), fmt == "json"
    raise InvalidRequest("'format' must be \"json\" or a JSON schema object", param="format")


def _think(b: Body) -> dict[str, Any]:
    think = b.body.get("think")
    if think is None or isinstance(think, bool):
        return {} if think is None else {"enable_thinking": think}
    if think in ("low", "medium", "high"):
        return {"enable_thinking": True, "reasoning_effort": think}
    raise InvalidRequest("'think' must be true, false, \"low\", \"medium\" or \"high\"",
                         param="think")


def _parsed(b: Body, prompt: ChatPrompt | TextPrompts | None, headers: dict[str, str],
            tools: tuple[Any, str, bool] = ((), "none", True),
            context: tuple[int, ...] = ()) -> Parsed:
    """Every field a generation body shares, checked even when ``prompt`` is None (a body
    that only loads or unloads the model)."""
    model = b.string("model", required=True)
    assert model is not None
    truncate, _ = b.boolean("truncate", True), b.boolean("shift")
    json_schema, json_object = _format(b)
    top = b.integer("top_logprobs", -(1 << 63), 1 << 63, 0) or 0
    if not 0 <= top <= 20:  # (Ollama's words; top_logprobs without logprobs: none given)
        raise InvalidRequest("top_logprobs must be between 0 and 20", param="top_logprobs")
    req = GenerateRequest(
        model, prompt or ChatPrompt(()),
        replace(sampling(b), logprobs=top if b.boolean("logprobs") else None),
        priority=fields.priority(None, headers.get("x-priority")),
        constraint=Constraint(json_schema=json_schema, json_object=json_object, tools=tools[0],
                              tool_choice=tools[1], parallel_tool_calls=tools[2]),
        template_kwargs=_think(b), max_tokens_is_cap=True,
        keep_head=_num_keep(b) if truncate else None, context=context)
    return Parsed(model, req if prompt is not None else None, b.boolean("stream", True),
                  keep_alive(b.body.get("keep_alive")), truncate)


def known(body: Any, allowed: set[str]) -> Any:
    """``body`` without the fields Ollama would ignore (unknown ones, logged)."""
    if not isinstance(body, dict):
        return body
    if extra := sorted(k for k in body if k not in allowed):
        log.info("ignored unknown Ollama fields: %s", ", ".join(map(repr, extra))[:200])
    return {k: v for k, v in body.items() if k in allowed}


def parse_chat(body: Any, headers: dict[str, str]) -> Parsed:
    """A /api/chat body; no messages: a load (or, with keep_alive 0, unload) request."""
    b = Body(known(body, CHAT_FIELDS), CHAT_FIELDS)
    raw_tools = b.body.get("tools")
    if isinstance(raw_tools, list):  # Ollama's clients may leave out "type"
        raw_tools = [{"type": "function", **t} if isinstance(t, dict) and "type" not in t
                     else t for t in raw_tools]
    choice = ollama_choice(b.body.get("tool_choice"), raw_tools)
    tools = parse_tools(Body({"tools": raw_tools, "tool_choice": choice},
                        {"tools", "tool_choice"}))
    msgs = b.body.get("messages")
    prompt = None if msgs in (None, []) else ChatPrompt(conversation(msgs))
    return _parsed(b, prompt, headers, tools)


def parse_generate(body: Any, headers: dict[str, str]) -> Parsed:
    """A /api/generate body; an empty prompt: a load (or unload) request."""
    b = Body(known(body, GENERATE_FIELDS), GENERATE_FIELDS)
    for names, why in [(("template",), "the model's chat template is used ('raw': no template)"),
                       (("suffix",), "fill-in-the-middle is not available"),
                       (("images",), "no model here sees images"),
                       (("width", "height", "steps"), "image generation is not available")]:
        for name in names:
            if b.body.get(name) not in (None, "", [], 0):
                raise InvalidRequest(f"'{name}' is not supported: {why}", param=name)
    prompt, system, raw = b.string("prompt") or "", b.string("system"), b.boolean("raw")
    context = fields.token_ids(b.body.get("context"), "context")
    if raw and (system or context):  # as Ollama: the prompt is taken as it is
        log.info("ignored with 'raw': %s", ", ".join(
            name for name, given in (("system", system), ("context", context)) if given))
        system, context = None, ()
    msgs = ({"role": "system", "content": system},) if system else ()
    shaped = TextPrompts((prompt,)) if raw else ChatPrompt(
        (*msgs, {"role": "user", "content": prompt}), plain_without_template=True)
    parsed = _parsed(b, shaped if prompt else None, headers, context=context)
    parsed.returns_context = not raw
    return parsed


# -- handlers --------------------------------------------------------------------------
async def chat(request: Request) -> Response:
    parsed = parse_chat(await read_json_any(request), dict(request.headers))
    return await answer(request, parsed, model_name(pool(request), parsed.model), chat=True)


async def generate(request: Request) -> Response:
    parsed = parse_generate(await read_json_any(request), dict(request.headers))
    return await answer(request, parsed, model_name(pool(request), parsed.model), chat=False)


async def embed(request: Request) -> Response:
    """POST /api/embed {model, input: text or texts, truncate (default true), options,
    keep_alive, dimensions (vectors shortened)}; no input: loads the model."""
    b = Body(await read_json_any(request), {"model", "input", "truncate", "options", "keep_alive",
                                        "dimensions"})
    name = str(b.string("model", required=True))
    raw = b.body.get("input")
    texts = [raw] if isinstance(raw, str) and raw else [] if raw in ("", None) else raw
    if not isinstance(texts, list) or len(texts) > MAX_EMBED_INPUTS or not all(
            isinstance(t, str) for t in texts):
        raise InvalidRequest(f"'input' must be a string or a list of at most "
                             f"{MAX_EMBED_INPUTS} strings", param="input")
    _options(b)
    return await embeddings_answer(
        request, name, model_name(pool(request), name), texts, b.boolean("truncate", True),
        b.integer("dimensions", 0, 1 << 20, None) or None, keep=keep_alive(
            b.body.get("keep_alive")))


async def embeddings(request: Request) -> Response:
    """POST /api/embeddings {model, prompt, options, keep_alive} -> {embedding} (older)."""
    b = Body(await read_json_any(request), {"model", "prompt", "options", "keep_alive"})
    name, prompt = str(b.string("model", required=True)), b.string("prompt") or ""
    _options(b)
    return await embeddings_answer(request, name, model_name(pool(request), name),
                                   [prompt] if prompt else [], True, None, legacy=True,
                                   keep=keep_alive(b.body.get("keep_alive")))


async def tags(request: Request) -> Response:
    p = pool(request)
    return JSONResponse(await asyncio.to_thread(
        ollama_models.tags_body, list(p.entries.values()), p.configs()))


async def ps(request: Request) -> Response:
    p = pool(request)
    return JSONResponse(await asyncio.to_thread(
        ollama_models.ps_body, list(p.entries.values()), p.configs()))


async def show(request: Request) -> Response:
    """POST /api/show {model (or the older "name"), verbose (ignored)}."""
    b = Body(await read_json_any(request), {"model", "name", "verbose", "options"})
    asked = b.string("model") or b.string("name")
    if not asked:
        raise InvalidRequest("'model' is required", param="model")
    p = pool(request)
    entry = p.entries[p.resolve(model_name(p, asked))]
    return JSONResponse(await asyncio.to_thread(ollama_models.show_body, entry, p.configs()))


# The Ollama release whose documented API this dialect follows. Clients gate features on
# it (VS Code's Copilot Chat refuses servers older than 0.6.4; Codex's --oss, which speaks
# the Responses API that Ollama serves from 0.13.4 and edgeinfer at /v1 too, older than
# 0.13.4), so /api/version gives it, and edgeinfer's own version beside it.
OLLAMA_API_VERSION = "0.13.5"


async def version(request: Request) -> Response:
    return JSONResponse({"version": OLLAMA_API_VERSION, "edgeinfer": __version__})


class NotHere(APIError):
    """501: what an Ollama server does that this one does not (its model store)."""

    status = 501
    type = "not_implemented"


async def model_store(request: Request) -> Response:
    raise NotHere(f"{request.url.path} is not supported by edgeinfer: its models are "
                  "configured in models.toml; run `edgeinfer pull` to install their files")


ROUTES: list[Route] = [
    Route("/api/chat", chat, methods=["POST"]),
    Route("/api/generate", generate, methods=["POST"]),
    Route("/api/embed", embed, methods=["POST"]),
    Route("/api/embeddings", embeddings, methods=["POST"]),
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/ps", ps, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/version", version, methods=["GET"]),
    *(Route(f"/api/{name}", model_store, methods=["POST"])
      for name in ("pull", "push", "create", "copy")),
    Route("/api/delete", model_store, methods=["DELETE"]),
    Route("/api/blobs/{digest}", model_store, methods=["HEAD", "POST"]),
]
OPENAPI_PATHS: dict[str, Any] = ollama_render.openapi_paths(
    ROUTES, {"/api/chat": CHAT_FIELDS, "/api/generate": GENERATE_FIELDS})
