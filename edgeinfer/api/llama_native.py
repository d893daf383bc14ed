"""llama-server's own completion endpoint: POST /completion and /completions, in its
native shape (``content``, ``stop``, ``stop_type``, ``tokens_predicted``, ...), as
llama.cpp's tools, SillyTavern's llama.cpp source and scripts written for llama-server
call it.

The body takes what /v1/completions takes (``n_predict``, llama-server's samplers and
hints, ``grammar``) plus its ``json_schema`` and ``n_probs`` (each token's top
probabilities as ``completion_probabilities``); ``model`` may be left out (the first
configured model). A prompt is a string or token ids; a list of them answers each (an
array of objects, each with its prompt's ``index``, as llama-server answers). Streamed,
each event is a ``data:`` line with a piece of ``content`` and its prompt's ``index``; a
prompt's last has ``stop: true`` and its counts (no ``[DONE]``, as llama-server streams
it). GET /props describes the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgeinfer import __version__
from edgeinfer.api import fields, samplers
from edgeinfer.api.body import read_json_any
from edgeinfer.api.fields import MAX_PROMPTS, MAX_TOKENS_LIMIT, Body
from edgeinfer.api.ollama_models import file_facts
from edgeinfer.api.openai_render import HeldLogprobs, token_entries, within
from edgeinfer.api.respond import CLIENT_GONE, pool, sse, start, unless_disconnected
from edgeinfer.config import ModelConfig
from edgeinfer.engine.logprobs import TokenLogprob
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.errors import InvalidRequest
from edgeinfer.models.modelinfo import gguf_metadata
from edgeinfer.models.pool import PoolEntry
from edgeinfer.service import events as ev
from edgeinfer.service.outcome import gather
from edgeinfer.service.request import Constraint, GenerateRequest, TextPrompts

FIELDS = {
    "model", "prompt", "stream", "max_tokens", "temperature", "top_p", "top_k", "min_p",
    "presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n", "seed", "stop",
    "logit_bias", "ignore_eos", "cache_prompt", "speculative", "deterministic", "priority",
    "grammar", "json_schema", "n_probs", "return_tokens", "response_fields", "t_max_predict_ms",
    "n_keep", "n_discard", "n_indent", "post_sampling_probs", "lora", "user",
    "min_keep", "tfs_z", "penalize_nl",  # older llama-server's, sent by SillyTavern: ignored
} | samplers.NAMES
STOP_TYPES = {"stop": "eos", "length": "limit"}


def parse(body: Any, default_model: str) -> tuple[GenerateRequest, bool, int, bool]:
    """(request, stream, n_probs, warm) from a /completion body; ``warm``: ``n_predict`` 0,
    the prompt is evaluated into the cache and no token is returned (as llama-server)."""
    b = Body(body, FIELDS)
    n = b.body.get("n_predict")
    warm = type(n) is int and n == 0
    for name, why in (("post_sampling_probs", "probabilities are given before sampling"),
                      ("return_tokens", "token ids are not returned"),
                      ("lora", "LoRA adapters are not served")):
        if b.body.get(name) not in (None, False, []):
            raise InvalidRequest(f"'{name}' is not supported: {why}", param=name)
    prompts = fields.prompts(b.body.get("prompt"), "prompt", MAX_PROMPTS)
    n_probs = int(b.integer("n_probs", 0, 20, 0) or 0)
    max_tokens = (1 if warm else samplers.n_predict(b, None) if b.present("n_predict")
                  else b.integer("max_tokens", 1, MAX_TOKENS_LIMIT, None))  # (llama-server's)
    schema = b.body.get("json_schema")
    if schema is not None and not isinstance(schema, dict):
        raise InvalidRequest("'json_schema' must be a JSON schema object", param="json_schema")
    grammar = b.string("grammar")
    if grammar is not None and schema is not None:
        raise InvalidRequest("use 'grammar' or 'json_schema', not both", param="grammar")
    req = GenerateRequest(
        b.string("model") or default_model, TextPrompts(prompts),
        samplers.sampling_params(b, max_tokens, n_probs or None),
        priority=fields.priority(b.body.get("priority"), None),
        constraint=Constraint(grammar=grammar, json_schema=schema, schema_param="json_schema"),
        cache_prompt=b.boolean("cache_prompt", True))
    return req, b.boolean("stream", False), 0 if warm else n_probs, warm


async def _warm(events: AsyncIterator[ev.Event]) -> AsyncIterator[ev.Event]:
    """``n_predict`` 0: the prompt is in the cache once its first token is sampled; that
    token is not returned (no text, no count, stopped by the limit)."""
    async with contextlib.aclosing(events) as inner:  # type: ignore[type-var]
        async for e in inner:
            if isinstance(e, ev.Finish):
                yield replace(e, reason="length", completion_tokens=0, stop_word=None,
                              stopped=False, raw="", timings=e.timings and {
                                  **e.timings, "predicted_n": 0})
            elif isinstance(e, ev.UsageReport):
                yield replace(e, completion_tokens=0)
            elif not isinstance(e, ev.TextDelta):
                yield e


def _probs(piece: Callable[[int], bytes], items: list[TokenLogprob]) -> list[dict[str, Any]]:
    """llama-server's ``completion_probabilities``: each token and its top alternatives."""
    return token_entries(piece, items, ids=True)


def _final(model: str, fin: ev.Finish, prompt_tokens: int, content: str,
           settings: dict[str, Any]) -> dict[str, Any]:
    """The last object of prompt ``fin.choice``'s answer (``stop: true``, the counts)."""
    word = fin.stop_word
    return {"index": fin.choice, "content": content, "tokens": [], "id_slot": -1, "stop": True,
            "model": model, "tokens_predicted": fin.completion_tokens,
            "tokens_evaluated": prompt_tokens, "generation_settings": settings,
            "prompt": "", "has_new_line": "\n" in content, "truncated": False,
            "stop_type": "word" if word else STOP_TYPES.get(fin.reason, "none"),
            "stopping_word": word or "", "tokens_cached": fin.cached_tokens,
            "timings": fin.timings or {}}


async def _stream(model: str, piece: Callable[[int], bytes], events: AsyncIterator[ev.Event],
                  prompt_lengths: tuple[int, ...], n_probs: int, settings: dict[str, Any]
                  ) -> AsyncIterator[dict[str, str]]:
    """Each prompt's pieces (``index``: which prompt), then its last object, as each ends."""
    held = [HeldLogprobs(piece) for _ in prompt_lengths]
    made = [0] * len(prompt_lengths)

    def piece_of(i: int, text: str, probs: list[TokenLogprob] | None) -> dict[str, str]:
        out: dict[str, Any] = {
            "index": i, "content": text, "tokens": [], "stop": False, "id_slot": -1,
            "tokens_predicted": made[i], "tokens_evaluated": prompt_lengths[i]}
        if probs is not None:
            out["completion_probabilities"] = _probs(piece, probs)
        return {"data": json.dumps(out, ensure_ascii=False)}

    try:
        async for e in events:
            if isinstance(e, ev.ErrorEvent):
                yield {"data": json.dumps(e.error.to_dict())}
                return
            if isinstance(e, ev.TextDelta):
                made[e.choice] += 1 if e.logprob is not None or e.text else 0
                yield piece_of(e.choice, e.text, held[e.choice].add(e.text, e.logprob)
                               if n_probs else None)
            elif isinstance(e, ev.Finish):
                rest = held[e.choice].finish(e.stopped)
                if n_probs and rest:  # the tokens of text released at the end
                    yield piece_of(e.choice, "", rest)
                yield {"data": json.dumps(_final(model, e, prompt_lengths[e.choice], "",
                                                 settings), ensure_ascii=False)}
    finally:
        await events.aclose()  # type: ignore[attr-defined]


async def completion(request: Request) -> Response:
    """One prompt: one object (streamed: its pieces); several: an array of them, in the
    prompts' order (streamed: the pieces of all, each with its prompt's ``index``)."""
    return await answer(request, await read_json_any(request))


async def answer(request: Request, body: Any) -> Response:
    """The answer to a /completion ``body`` (also /infill's, its prompt made of tokens)."""
    req, stream, n_probs, warm = parse(body, pool(request).config.models[0].id)
    fields = _response_fields(body)  # (a whole answer's: a stream's are all sent)
    gen = await start(request, req, f"cmpl-{uuid.uuid4().hex[:24]}")
    if warm:
        gen.events = _warm(gen.events)
    settings = {"n_predict": 0 if warm else req.params.max_tokens or -1,
                "temperature": req.params.temperature,
                "top_k": req.params.top_k, "top_p": req.params.top_p,
                "min_p": req.params.min_p,
                "seed": -1 if req.params.seed is None else req.params.seed,
                "stop": list(req.params.stop), "n_probs": n_probs}
    if stream:
        return sse(request, _stream(gen.model, gen.piece, gen.events, gen.prompt_lengths,
                                    n_probs, settings))
    out = await unless_disconnected(request, gather(gen.events, gen.num_choices))
    if out is None:
        return Response(status_code=CLIENT_GONE)
    bodies = []
    for i, c in enumerate(out.choices):
        fin = ev.Finish(i, c.finish, c.completion_tokens, c.timings, c.stop_word, c.stopped,
                        cached_tokens=c.cached_tokens)
        body = _final(gen.model, fin, gen.prompt_lengths[i], c.text, settings)
        if n_probs:
            kept = within(gen.piece, c.logprobs, c.text) if c.stopped else c.logprobs
            body["completion_probabilities"] = _probs(gen.piece, kept)
        bodies.append(_only(fields, body))
    return JSONResponse(bodies[0] if len(bodies) == 1 else bodies)


def _response_fields(body: dict[str, Any]) -> list[str] | None:
    fields = body.get("response_fields")
    if fields is not None and (not isinstance(fields, list) or len(fields) > 64 or not all(
            isinstance(f, str) for f in fields)):
        raise InvalidRequest("'response_fields' must be a list of field names",
                             param="response_fields")
    return fields or None


def _only(fields: list[str] | None, body: dict[str, Any]) -> dict[str, Any]:
    """llama-server's ``response_fields``: only those (``a/b``: ``b`` of ``a``, under the
    key "a/b"); a field the answer lacks is left out."""
    if fields is None:
        return body
    out = {}
    for name in fields:
        value: Any = body
        for key in name.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[name] = value
    return out


async def props(request: Request) -> Response:
    """GET /props: llama-server's description of a model (``?model=`` picks one, else the
    first configured), as the llama.cpp web UI and tools read it; from the model when it
    is loaded, else from models.toml and the GGUF header (nothing is loaded for it)."""
    p = pool(request)
    entry = p.entries[p.resolve(request.query_params.get("model") or p.config.models[0].id)]
    return JSONResponse(await asyncio.to_thread(_props, entry, p.configs()))


def _props(entry: PoolEntry, configs: dict[str, ModelConfig]) -> dict[str, Any]:
    d, cfg, served = SamplingParams(), entry.cfg, entry.served
    facts = file_facts(entry, configs)
    meta = facts.meta
    source: str | None
    if served is not None:
        n_ctx, source = served.n_ctx, served.template.source
        bos, eos = served.template.bos_token, served.template.eos_token
    else:
        n_ctx = cfg.context or meta.get(f"{facts.arch}.context_length") or 0
        source = cfg.chat_template or meta.get("tokenizer.chat_template")
        bos, eos = _special_texts(facts.path, meta)
    params = {"n_predict": cfg.max_tokens or -1, "temperature": d.temperature,
              "top_k": d.top_k, "top_p": d.top_p, "min_p": d.min_p, "seed": -1}
    return {
        "default_generation_settings": {"n_ctx": n_ctx, "params": params},
        "total_slots": (served.cfg if served else cfg).slots, "model_alias": cfg.id,
        "model_path": str(facts.path or ""), "loaded": served is not None,
        "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": True, "endpoint_props": False, "endpoint_metrics": True,
        "chat_template": source or "", "bos_token": bos, "eos_token": eos,
        "build_info": f"edgeinfer {__version__}", "is_sleeping": served is None}


def _special_texts(path: Path | None, meta: dict[str, Any]) -> tuple[str, str]:
    """The BOS and EOS tokens' texts, from the GGUF header of a model not loaded ("" for
    one the file does not name, or a file that cannot be read)."""
    ids = [meta.get(f"tokenizer.ggml.{name}_token_id") for name in ("bos", "eos")]
    if path is None:
        return "", ""
    try:
        texts = gguf_metadata(path, [i for i in ids if isinstance(i, int)])
    except (OSError, ValueError):
        return "", ""
    found = texts.get("tokenizer.ggml.tokens")
    bos, eos = (found.get(i, "") if isinstance(found, dict) and isinstance(i, int) else ""
                for i in ids)
    return bos, eos
