"""The OpenAPI description of the HTTP API, served at /openapi.json."""

from __future__ import annotations

from typing import Any

from edgeinfer import __version__
from edgeinfer.api import (
    anthropic_messages,
    llama_native,
    ollama_api,
    openai_responses,
    samplers,
    stored_chats,
)

_INT = {"type": "integer"}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
_TOKENS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_STOP = {"oneOf": [_STR, {"type": "array", "items": _STR, "maxItems": 16}]}

_SAMPLING: dict[str, Any] = {
    "model": _STR,
    "max_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": 0},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "repeat_penalty": {"type": "number", "minimum": 0.01, "maximum": 10},
    "repeat_last_n": {"type": "integer", "minimum": 0, "maximum": 65536},
    "seed": _INT,
    "stop": _STOP,
    "n": {"type": "integer", "minimum": 1, "maximum": 16},
    "logit_bias": {"type": "object", "additionalProperties": {
        "type": "number", "minimum": -100, "maximum": 100}},
    "stream": _BOOL,
    "stream_options": {"type": "object", "properties": {"include_usage": _BOOL}},
    "user": _STR,
    "ignore_eos": _BOOL,
    "cache_prompt": _BOOL,
    "speculative": _BOOL,
    "deterministic": _BOOL,
    "priority": {"type": "integer", "minimum": -10, "maximum": 10},
    "metadata": {"type": "object"},
    "store": _BOOL,
    "service_tier": _STR,
    **samplers.schema(),
}

_MESSAGE = {
    "type": "object", "required": ["role"],
    "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant", "tool", "function"]},
        "content": {"oneOf": [_STR, {"type": "null"}, {"type": "array", "items": {
            "type": "object", "required": ["type", "text"],
            "properties": {"type": {"const": "text"}, "text": _STR}}}]},
        "name": _STR,
    },
}

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": _STR, "type": _STR, "param": {"type": ["string", "null"]},
                   "code": {"type": ["string", "null"]}}}}}


def _body(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "properties": props, "required": required,
        "additionalProperties": False}}}}


def _responses(desc: str, stream: bool = False) -> dict[str, Any]:
    ok: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if stream:
        ok["text/event-stream"] = {"schema": {"type": "string"}}
    err = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return {"200": {"description": desc, "content": ok},
            **{code: {"description": what, **err} for code, what in [
                ("400", "invalid request (names the field)"), ("401", "missing or wrong API key"),
                ("404", "unknown model or route"), ("413", "body too large"),
                ("429", "queue full; see Retry-After"), ("500", "internal error"),
                ("503", "model unavailable")]}}


def _post(summary: str, body: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    return {"post": {"summary": summary, "requestBody": body,
                     "responses": _responses(summary, stream)}}


def _get(summary: str) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": _responses(summary)}}


def _chat_fields() -> dict[str, Any]:
    """The body fields of /v1/chat/completions."""
    return {**_SAMPLING, "messages": {"type": "array", "items": _MESSAGE, "minItems": 1},
            "max_completion_tokens": {"type": "integer", "minimum": -2},
            "logprobs": _BOOL, "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
            "response_format": {"type": "object"}, "tools": {"type": "array"},
            "tool_choice": {}, "parallel_tool_calls": _BOOL, "grammar": _STR,
            "json_schema": {"type": "object", "description": "llama-server's: a JSON schema "
                            "the answer follows (as response_format json_schema)"},
            "reasoning_format": {"enum": ["auto", "deepseek", "none"]},
            "chat_template_kwargs": {"type": "object"},
            "reasoning_budget": {"type": "integer", "minimum": 0},
            "reasoning_effort": {"enum": ["none", "minimal", "low", "medium", "high", "xhigh"]},
            # deprecated by OpenAI, still accepted (tools underneath)
            "functions": {"type": "array", "deprecated": True},
            "function_call": {"deprecated": True},
            # OpenAI's, accepted and ignored
            "prompt_cache_key": _STR, "prompt_cache_retention": _STR, "safety_identifier": _STR,
            "verbosity": _STR, "modalities": {"type": "array", "items": {"const": "text"}},
            "prompt_cache_options": {"type": "object"},
            "prediction": {"type": "object", "description": "drafts the answer (speculative "
                           "decoding); the answer is the same without it"}}


def _model_action(summary: str) -> dict[str, Any]:
    return {"post": {"summary": summary, "parameters": [
        {"name": "model_id", "in": "path", "required": True, "schema": _STR}],
        "responses": _responses(summary)}}


# llama-server's paths: the same operations without /v1 (and /completions: /completion's)
ALIASES = {"/models": "/v1/models", "/chat/completions": "/v1/chat/completions",
           "/responses": "/v1/responses", "/responses/input_tokens": "/v1/responses/input_tokens",
           "/completions": "/completion", "/v1/health": "/health"}


def openapi_spec() -> dict[str, Any]:
    """The OpenAPI description of every route (``test_openapi_covers_every_route``)."""
    spec = _spec()
    spec["paths"].update({
        "/v1/models/{model_id}/load": _model_action("Load a model now (else on first use)"),
        "/v1/models/{model_id}/unload": _model_action("Unload a model (409 while busy)"),
        "/metrics": _get("Prometheus metrics"), "/slots": _get("What each model's slots do")})
    spec["paths"].update({alias: {m: op for m, op in spec["paths"][path].items()
                                  if m in ("get", "post")}
                          for alias, path in ALIASES.items()})
    spec["paths"]["/chat/completions"].pop("get")  # (stored chats: /v1 only)
    spec["paths"]["/infill"] = _infill(spec["paths"]["/completion"])
    return spec


def _infill(completion: dict[str, Any]) -> dict[str, Any]:
    """/infill: /completion's fields, with a text ``prompt`` and the code around it."""
    body = completion["post"]["requestBody"]["content"]["application/json"]["schema"]
    fields = {**body["properties"], "prompt": _STR, "input_prefix": _STR,
              "input_suffix": _STR, "input_extra": {"type": "array", "items": {
                  "type": "object", "properties": {"filename": _STR, "text": _STR},
                  "required": ["text"]}}}
    return _post("llama-server's fill-in-the-middle (the model's FIM tokens)",
                 _body(fields, ["input_prefix", "input_suffix"]), stream=True)


def _spec() -> dict[str, Any]:
    chat = _chat_fields()
    completion = {**_SAMPLING, "prompt": {"oneOf": [
        _STR, _TOKENS, {"type": "array", "items": {"oneOf": [_STR, _TOKENS]}, "minItems": 1}]},
        "logprobs": {"type": "integer", "minimum": 0, "maximum": 20}, "echo": _BOOL,
        "best_of": {"type": "integer", "minimum": 1, "maximum": 1}, "suffix": _STR,
        "grammar": _STR}
    native = {**{k: v for k, v in _SAMPLING.items() if k in llama_native.FIELDS},
              "prompt": {"oneOf": [_STR, _TOKENS]}, "grammar": _STR,
              "n_probs": {"type": "integer", "minimum": 0, "maximum": 20},
              "json_schema": {"type": "object"}}
    embed = {"model": _STR, "input": {"oneOf": [_STR, _TOKENS, {"type": "array", "items": {
        "oneOf": [_STR, _TOKENS]}, "minItems": 1}]},
        "encoding_format": {"enum": ["float", "base64"]}, "dimensions": _INT, "user": _STR}
    return {
        "openapi": "3.1.0",
        "info": {"title": "edgeinfer", "version": __version__,
                 "description": "OpenAI-style API of a local llama.cpp server."},
        "paths": {
            "/v1/chat/completions": {"get": stored_chats.LIST_OPENAPI, **_post(
                "Chat completion", _body(chat, ["model", "messages"]), stream=True)},
            **stored_chats.OPENAPI_PATHS,
            "/v1/completions": _post("Text completion", _body(completion, ["model", "prompt"]),
                                     stream=True),
            "/v1/embeddings": _post("Embeddings", _body(embed, ["model", "input"])),
            "/completion": _post("llama-server's own completion (also /completions)", _body(
                native, ["prompt"]), stream=True),
            "/v1/models": _get("List the models"),
            "/props": _get("llama-server's description of a model (?model=, else the first)"),
            "/v1/models/{model_id}": {"get": {
                "summary": "One model", "parameters": [{"name": "model_id", "in": "path",
                                                        "required": True, "schema": _STR}],
                "responses": _responses("One model")}},
            "/tokenize": _post("Text to token ids", _body({
                "model": _STR, "content": _STR, "add_special": _BOOL, "parse_special": _BOOL,
                "with_pieces": _BOOL}, ["content"])),
            "/detokenize": _post("Token ids to text", _body({
                "model": _STR, "tokens": {"type": "array", "items": {
                    "type": "integer", "minimum": 0}}}, ["tokens"])),
            "/apply-template": _post("The prompt a chat request renders to",
                                     _body(chat, ["model", "messages"])),
            "/v1/cache": _get("Prefix cache statistics"),
            "/v1/cache/pin": _post("Keep a prefix resident", _body({
                "model": _STR, "messages": {"type": "array", "items": _MESSAGE},
                "prompt": _STR}, ["model"])),
            "/v1/cache/pins": {"delete": {
                "summary": "Unpin a model's prefixes",
                "parameters": [{"name": "model", "in": "query", "required": True,
                                "schema": _STR}],
                "responses": _responses("Unpinned")}},
            "/health": _get("Liveness and engine counters (200 while loading and draining)"),
            "/ready": _get("Readiness: 200 when the server should get requests, 503 with the "
                           "reasons while loading, draining or after a failed start-up load"),
            **openai_responses.OPENAPI_PATHS,
            **anthropic_messages.OPENAPI_PATHS,
            **ollama_api.OPENAPI_PATHS,
        },
        "components": {"schemas": {"Error": _ERROR}},
    }
