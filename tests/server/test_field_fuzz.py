"""Every field of every endpoint, given hostile values, against a real server: never a 5xx,
always an OpenAI-shaped error, and the server serves a normal request afterwards."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from serverproc import ServerProcess

MARK = "__HOSTILE__"
# raw JSON text put where a field's value goes
HOSTILE = ['"\\ud800"', '"a\\udfffb"', "NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1.9",
           str(10**30), "-1", "true", "null", "[]", "{}", '""', json.dumps("x" * 100_000)]

TOOL = {"type": "function", "function": {
    "name": "f", "description": "d", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "maxLength": 5}}}}}
CHAT = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
ENDPOINTS: dict[str, tuple[dict[str, Any], list[str]]] = {
    # temperature 0: a field fuzzed to null (max_tokens: no limit) still ends soon, with the
    # greedy answer's end of turn (sampled, it once ran past the client's 120 s)
    "/v1/chat/completions": ({**CHAT, "tools": [TOOL], "tool_choice": "none",
                              "stop": ["zz"], "logit_bias": {"5": 1}, "temperature": 0}, [
        "model", "messages", "messages.0", "messages.0.content", "messages.0.role",
        "tools.0.function.description", "tools.0.function.parameters",
        "tools.0.function.parameters.properties.x.maxLength", "tool_choice", "stop.0",
        "logit_bias.5", "priority", "seed", "n", "temperature", "top_p", "max_tokens",
        "top_k", "grammar", "response_format", "stream"]),
    "/v1/completions": ({"model": "default", "prompt": "hi", "max_tokens": 1}, [
        "prompt", "max_tokens", "n", "logprobs", "priority", "seed"]),
    "/v1/embeddings": ({"model": "default", "input": "hi"}, ["input", "encoding_format"]),
    "/tokenize": ({"content": "hi"}, ["content", "with_pieces", "model"]),
    "/detokenize": ({"tokens": [1, 2]}, ["tokens", "tokens.0"]),
    "/v1/cache/pin": ({"model": "default", "prompt": "hi"}, ["prompt", "model"]),
    "/apply-template": ({**CHAT, "chat_template_kwargs": {"a": "b"}}, [
        "messages.0.content", "chat_template_kwargs", "chat_template_kwargs.a"]),
    "/v1/responses": ({"model": "default", "input": [{"role": "user", "content": "hi"}],
                       "max_output_tokens": 1, "tools": [{"type": "function", "name": "f",
                                                          "parameters": {"type": "object"}}],
                       "text": {"format": {"type": "text"}}, "reasoning": {"effort": "low"}}, [
        "input", "input.0", "input.0.content", "input.0.role", "tools.0", "tools.0.parameters",
        "text", "text.format", "reasoning", "reasoning.effort",
        "previous_response_id", "store", "stream", "metadata"]),  # (max_output_tokens: null
    # is no limit, a long answer; test_responses.py checks its hostile values)
    "/v1/responses/input_tokens": ({"model": "default", "input": "hi"}, ["input", "model"]),
}
SCHEMA_CHAT = {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
    "name": "x", "schema": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "exclusiveMaximum": 9},
        "b": {"type": "array", "items": {"type": "string"}, "minItems": 1}}}}}}
SCHEMA_PATHS = ["response_format.json_schema.schema.properties.a.minimum",
                "response_format.json_schema.schema.properties.a.exclusiveMaximum",
                "response_format.json_schema.schema.properties.b.minItems"]


def _with(body: dict[str, Any], path: str, raw: str) -> bytes:
    """``body`` as JSON text with the value at ``path`` (dotted, list indexes as digits)
    replaced by the raw JSON text ``raw``."""
    doc = json.loads(json.dumps(body))
    *parents, last = path.split(".")
    node: Any = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(last)] = MARK
    else:
        node[last] = MARK
    return json.dumps(doc).replace(json.dumps(MARK), raw).encode()


def assert_error_shape(endpoint: str, body: Any) -> None:
    """Each dialect's own error shape."""
    if endpoint.startswith("/v1/messages"):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    elif endpoint.startswith("/api/"):
        assert set(body) == {"error"} and isinstance(body["error"], str)
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}


def _post(server: ServerProcess, path: str, payload: bytes) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", content=payload, timeout=120,
                      headers={"content-type": "application/json"})


def _cases() -> list[tuple[str, dict[str, Any], str]]:
    cases = [(ep, body, field) for ep, (body, paths) in ENDPOINTS.items() for field in paths]
    cases += [("/v1/chat/completions", SCHEMA_CHAT, p) for p in SCHEMA_PATHS]
    return cases


@pytest.mark.parametrize(("endpoint", "body", "field"), _cases(),
                         ids=[f"{c[0]}:{c[2]}" for c in _cases()])
def test_hostile_values_in_every_field_never_give_a_5xx(server: ServerProcess, endpoint: str,
                                                        body: dict[str, Any],
                                                        field: str) -> None:
    for raw in HOSTILE:
        r = _post(server, endpoint, _with(body, field, raw))
        assert r.status_code < 500, (endpoint, field, raw[:40], r.status_code, r.text[:300])
        if r.status_code >= 400:
            assert_error_shape(endpoint, r.json())
    assert server.proc.poll() is None


@pytest.mark.parametrize(("endpoint", "body", "field", "raw"), [
    ("/v1/chat/completions", CHAT, "messages.0.content", '"\\ud800"'),
    ("/v1/chat/completions", {**CHAT, "tools": [TOOL]}, "tools.0.function.description",
     '"\\ud800"'),
    ("/v1/chat/completions", {**CHAT, "grammar": "root ::= \"a\""}, "grammar", '"\\ud800"'),
    ("/tokenize", {"content": "x"}, "content", '"\\ud800"'),
    ("/v1/embeddings", {"model": "default", "input": "x"}, "input", '"\\ud800"'),
    ("/v1/completions", {"model": "default", "prompt": "x"}, "prompt", '"\\ud800"'),
    ("/v1/chat/completions", {**CHAT, "priority": 1}, "priority", "Infinity"),
    ("/v1/chat/completions", {**CHAT, "priority": 1}, "priority", "-Infinity"),
    ("/v1/chat/completions", {**CHAT, "priority": 1}, "priority", "1.9"),
    *[("/v1/chat/completions", SCHEMA_CHAT, p, inf) for p in SCHEMA_PATHS
      for inf in ("Infinity", "-Infinity")],
])
def test_the_reported_500s_are_400s(server: ServerProcess, endpoint: str,
                                    body: dict[str, Any], field: str, raw: str) -> None:
    r = _post(server, endpoint, _with(body, field, raw))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    ok = httpx.post(f"{server.base_url}/v1/chat/completions", json=CHAT, timeout=60)
    assert ok.status_code == 200
