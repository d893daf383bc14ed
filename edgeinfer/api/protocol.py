"""Request bodies of the OpenAI-style endpoints, parsed into typed objects.

Every user error is raised here, as an ``InvalidRequest`` naming the field,
before anything reaches the tokenizer or the engine.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.errors import InvalidRequest
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.prompt.tools import ToolSpec

MAX_TOKENS_LIMIT = 1 << 20
MAX_STOP = 16
MAX_STOP_LEN = 512
MAX_LOGIT_BIAS = 1024
MAX_MESSAGES = 4096
MAX_CHOICES = 16
MAX_PROMPTS = 16
MAX_TOKENIZE_CHARS = 1 << 20  # /tokenize: characters of one text
MAX_DETOKENIZE = 1 << 18  # /detokenize: token ids of one request

_COMMON = {
    "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "min_p",
    "presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n", "seed", "stop",
    "n", "logit_bias", "user", "ignore_eos", "metadata", "store", "service_tier", "cache_prompt",
    "priority",
}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "response_format", "logprobs",
                         "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "grammar"}
MAX_TOOLS = 128
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "logprobs", "best_of", "suffix", "grammar"}
ROLES = {"system", "developer", "user", "assistant", "tool"}
# what the SDK may send back from an earlier response; everything else is refused
MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal",
                "function_call", "audio", "annotations", "reasoning_content"}


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A validated chat or completion request."""

    model: str
    stream: bool
    include_usage: bool
    params: SamplingParams
    messages: tuple[dict[str, Any], ...] | None = None  # chat
    prompts: tuple[str | list[int], ...] = ()  # completions: one choice set per prompt
    n: int = 1
    # constrained output (at most one kind per request)
    grammar: str | None = None  # raw GBNF
    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    tools: tuple[ToolSpec, ...] = field(default=())
    tool_choice: str = "none"  # "none" | "auto" | "required" | a function name
    parallel_tool_calls: bool = True
    cache_prompt: bool = True  # reuse cached prompt prefixes (llama-server's field)


class _Body:
    def __init__(self, body: Any, allowed: set[str]) -> None:
        if not isinstance(body, dict):
            raise InvalidRequest("the request body must be a JSON object")
        for key in body:
            if key not in allowed:
                raise InvalidRequest(f"unrecognized request argument: {key}", param=key)
        self.body = body

    def present(self, name: str) -> bool:
        return self.body.get(name) is not None

    def number(self, name: str, lo: float, hi: float, default: float) -> float:
        v = self.body.get(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise InvalidRequest(f"'{name}' must be a number", param=name)
        if not lo <= v <= hi:
            raise InvalidRequest(f"'{name}' must be between {lo} and {hi}, got {v}", param=name)
        return float(v)

    def integer(self, name: str, lo: int, hi: int, default: int | None) -> int | None:
        v = self.body.get(name)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidRequest(f"'{name}' must be an integer", param=name)
        if not lo <= v <= hi:
            raise InvalidRequest(f"'{name}' must be between {lo} and {hi}, got {v}", param=name)
        return v

    def boolean(self, name: str, default: bool = False) -> bool:
        v = self.body.get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise InvalidRequest(f"'{name}' must be a boolean", param=name)
        return v

    def string(self, name: str, *, required: bool = False) -> str | None:
        v = self.body.get(name)
        if v is None:
            if required:
                raise InvalidRequest(f"'{name}' is required", param=name)
            return None
        if not isinstance(v, str):
            raise InvalidRequest(f"'{name}' must be a string", param=name)
        return v


def _stop(b: _Body) -> tuple[str, ...]:
    v = b.body.get("stop")
    if v is None:
        return ()
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise InvalidRequest("'stop' must be a string or a list of strings", param="stop")
    if len(items) > MAX_STOP:
        raise InvalidRequest(f"'stop' may hold at most {MAX_STOP} strings", param="stop")
    if any(len(s) > MAX_STOP_LEN for s in items):
        raise InvalidRequest(f"each stop string may be at most {MAX_STOP_LEN} characters",
                             param="stop")
    return tuple(s for s in items if s)


def _logit_bias(b: _Body, n_vocab: int) -> tuple[tuple[int, float], ...]:
    v = b.body.get("logit_bias")
    if v is None:
        return ()
    if not isinstance(v, dict) or len(v) > MAX_LOGIT_BIAS:
        raise InvalidRequest(f"'logit_bias' must be an object of at most {MAX_LOGIT_BIAS} "
                             "token ids to numbers", param="logit_bias")
    out = []
    for key, bias in v.items():
        try:
            tok = int(key)
        except (TypeError, ValueError):
            raise InvalidRequest(f"'logit_bias' key {key!r} is not a token id",
                                 param="logit_bias") from None
        if not 0 <= tok < n_vocab:
            raise InvalidRequest(f"'logit_bias' token id {tok} is outside the vocabulary "
                                 f"(0..{n_vocab - 1})", param="logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise InvalidRequest("'logit_bias' values must be numbers between -100 and 100",
                                 param="logit_bias")
        out.append((tok, float(bias)))
    return tuple(out)


def _params(b: _Body, n_vocab: int, max_tokens: int | None,
            logprobs: int | None = None) -> SamplingParams:
    seed = b.integer("seed", -(1 << 63), (1 << 63) - 1, None)
    defaults = SamplingParams()
    return SamplingParams(
        temperature=b.number("temperature", 0.0, 2.0, defaults.temperature),
        top_p=b.number("top_p", 0.0, 1.0, defaults.top_p),
        top_k=int(b.integer("top_k", 0, 1_000_000, defaults.top_k) or 0),
        min_p=b.number("min_p", 0.0, 1.0, defaults.min_p),
        presence_penalty=b.number("presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=b.number("frequency_penalty", -2.0, 2.0, 0.0),
        repeat_penalty=b.number("repeat_penalty", 0.01, 10.0, 1.0),
        repeat_last_n=int(b.integer("repeat_last_n", 0, 1 << 16, 64) or 0),
        seed=seed,
        max_tokens=max_tokens,
        stop=_stop(b),
        ignore_eos=b.boolean("ignore_eos"),
        logit_bias=_logit_bias(b, n_vocab),
        logprobs=logprobs,
    )


def _stream(b: _Body) -> tuple[bool, bool]:
    stream = b.boolean("stream")
    opts = b.body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise InvalidRequest("'stream_options' must be an object", param="stream_options")
        if not stream:
            raise InvalidRequest("'stream_options' is only allowed when 'stream' is true",
                                 param="stream_options")
        iu = opts.get("include_usage", False)
        if not isinstance(iu, bool):
            raise InvalidRequest("'stream_options.include_usage' must be a boolean",
                                 param="stream_options.include_usage")
        include_usage = iu
    return stream, include_usage


def _is_tokens(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in v)


def _texts_or_tokens(value: Any, n_vocab: int, param: str, limit: int
                     ) -> tuple[str | list[int], ...]:
    """A string, a list of token ids, or a non-empty list of either (at most ``limit``)."""
    if isinstance(value, str) or _is_tokens(value):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(
            isinstance(p, str) or _is_tokens(p) for p in value):
        items = value
    else:
        raise InvalidRequest(f"'{param}' must be a string, a list of token ids, or a non-empty "
                             "list of either", param=param)
    if len(items) > limit:
        raise InvalidRequest(f"at most {limit} items in '{param}'", param=param)
    for p in items:
        if isinstance(p, list) and not all(0 <= t < n_vocab for t in p):
            raise InvalidRequest(f"'{param}' token ids must be in 0..{n_vocab - 1}", param=param)
    return tuple(items)


def _unsupported(b: _Body, names: tuple[str, ...]) -> None:
    for name in names:
        v = b.body.get(name)
        if v not in (None, False, [], 0):
            raise InvalidRequest(f"'{name}' is not supported by this server yet", param=name)


def _content(msg: dict[str, Any], i: int) -> str:
    content = msg.get("content")
    where = f"messages[{i}].content"
    if content is None:
        if msg.get("role") == "assistant":
            return ""
        raise InvalidRequest(f"'{where}' is required", param=where)
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"'{where}' must be a string or a list of content parts", param=where)
    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                part.get("text"), str):
            raise InvalidRequest(f"'{where}[{j}]': only text content parts are supported",
                                 param=f"{where}[{j}]")
        parts.append(part["text"])
    return "".join(parts)


def _past_calls(calls: Any, i: int) -> list[dict[str, Any]]:
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise InvalidRequest(f"'{where}' must be a list", param=where)
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(
                fn.get("arguments", ""), str):
            raise InvalidRequest(f"'{where}[{j}]' must be a function call with a name and "
                                 "string arguments", param=f"{where}[{j}]")
        out.append({"id": str(c.get("id", "")), "type": "function",
                    "function": {"name": fn["name"], "arguments": fn.get("arguments", "")}})
    return out


def _tools(b: _Body) -> tuple[tuple[ToolSpec, ...], str, bool]:
    raw = b.body.get("tools")
    tools: list[ToolSpec] = []
    if raw is not None:
        if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
            raise InvalidRequest(f"'tools' must be a list of at most {MAX_TOOLS} tools",
                                 param="tools")
        for j, t in enumerate(raw):
            fn = t.get("function") if isinstance(t, dict) else None
            if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
                raise InvalidRequest(f"'tools[{j}]' must be {{'type': 'function', 'function': "
                                     "{...}}", param=f"tools[{j}]")
            name = fn.get("name")
            if not isinstance(name, str) or not _TOOL_NAME.match(name):
                raise InvalidRequest(f"'tools[{j}].function.name' must be 1-64 letters, digits, "
                                     "_ or -", param=f"tools[{j}].function.name")
            params = fn.get("parameters", {"type": "object", "properties": {}})
            if not isinstance(params, dict):
                raise InvalidRequest(f"'tools[{j}].function.parameters' must be a JSON schema "
                                     "object", param=f"tools[{j}].function.parameters")
            desc = fn.get("description", "")
            tools.append(ToolSpec(name, desc if isinstance(desc, str) else "", params,
                                  bool(fn.get("strict", False))))
        if len({t.name for t in tools}) != len(tools):
            raise InvalidRequest("tool names must be unique", param="tools")
    choice_raw = b.body.get("tool_choice")
    if choice_raw is None:
        choice = "auto" if tools else "none"
    elif choice_raw in ("none", "auto", "required"):
        choice = str(choice_raw)
    elif isinstance(choice_raw, dict) and choice_raw.get("type") == "function" and isinstance(
            choice_raw.get("function"), dict) and isinstance(
            choice_raw["function"].get("name"), str):
        choice = choice_raw["function"]["name"]
        if choice not in {t.name for t in tools}:
            raise InvalidRequest(f"'tool_choice' names {choice!r}, which is not in 'tools'",
                                 param="tool_choice")
    else:
        raise InvalidRequest("'tool_choice' must be 'none', 'auto', 'required' or "
                             "{'type': 'function', 'function': {'name': ...}}",
                             param="tool_choice")
    if choice != "none" and not tools:
        raise InvalidRequest("'tool_choice' needs 'tools'", param="tool_choice")
    return tuple(tools), choice, b.boolean("parallel_tool_calls", True)


def _response_format(b: _Body) -> tuple[dict[str, Any] | None, bool]:
    rf = b.body.get("response_format")
    if rf is None:
        return None, False
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return None, False
    if kind == "json_object":
        return None, True
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
            raise InvalidRequest("'response_format.json_schema.schema' must be a JSON schema "
                                 "object", param="response_format.json_schema.schema")
        return js["schema"], False
    raise InvalidRequest("'response_format.type' must be 'text', 'json_object' or 'json_schema'",
                         param="response_format")


def _messages(b: _Body) -> tuple[dict[str, Any], ...]:
    msgs = b.body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise InvalidRequest("'messages' must be a non-empty list", param="messages")
    if len(msgs) > MAX_MESSAGES:
        raise InvalidRequest(f"at most {MAX_MESSAGES} messages are allowed", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise InvalidRequest(f"'messages[{i}]' must be an object", param=f"messages[{i}]")
        for key in m:
            if key not in MESSAGE_KEYS:
                raise InvalidRequest(f"unrecognized message field: {key}",
                                     param=f"messages[{i}].{key}")
        role = m.get("role")
        if role not in ROLES:
            raise InvalidRequest(f"'messages[{i}].role' must be one of {sorted(ROLES)}",
                                 param=f"messages[{i}].role")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                               "content": _content(m, i)}
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        if role == "assistant" and m.get("tool_calls") is not None:
            msg["tool_calls"] = _past_calls(m["tool_calls"], i)
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise InvalidRequest(f"'messages[{i}].tool_call_id' is required for tool messages",
                                     param=f"messages[{i}].tool_call_id")
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return tuple(out)


def parse_pin(body: Any) -> tuple[str, tuple[dict[str, Any], ...] | None, str | None]:
    """POST /v1/cache/pin: (model, messages, prompt), exactly one of the last two."""
    b = _Body(body, {"model", "messages", "prompt"})
    model = b.string("model", required=True)
    assert model is not None
    if b.present("messages") == b.present("prompt"):
        raise InvalidRequest("give exactly one of 'messages' or 'prompt'", param="messages")
    if b.present("messages"):
        return model, _messages(b), None
    return model, None, b.string("prompt")


def parse_chat(body: Any, n_vocab: int) -> GenerationRequest:
    b = _Body(body, CHAT_FIELDS)
    model = b.string("model", required=True)
    messages = _messages(b)
    logprobs = None
    if b.boolean("logprobs"):
        logprobs = b.integer("top_logprobs", 0, 20, 0)
    elif b.present("top_logprobs"):
        raise InvalidRequest("'top_logprobs' requires 'logprobs' to be true",
                             param="top_logprobs")
    tools, tool_choice, parallel = _tools(b)
    json_schema, json_object = _response_format(b)
    grammar = b.string("grammar")
    forced = tool_choice not in ("none", "auto")
    if sum((grammar is not None, json_schema is not None or json_object, forced)) > 1:
        raise InvalidRequest("use only one of 'grammar', a JSON 'response_format' and a forced "
                             "'tool_choice'", param="grammar" if grammar else "response_format")
    max_tokens = b.integer("max_completion_tokens", 1, MAX_TOKENS_LIMIT, None)
    if max_tokens is None:
        max_tokens = b.integer("max_tokens", 1, MAX_TOKENS_LIMIT, None)
    stream, include_usage = _stream(b)
    assert model is not None
    return GenerationRequest(model, stream, include_usage,
                             _params(b, n_vocab, max_tokens, logprobs), messages=messages,
                             cache_prompt=b.boolean("cache_prompt", True),
                             n=int(b.integer("n", 1, MAX_CHOICES, 1) or 1), grammar=grammar,
                             json_schema=json_schema, json_object=json_object, tools=tools,
                             tool_choice=tool_choice, parallel_tool_calls=parallel)


def parse_completion(body: Any, n_vocab: int) -> GenerationRequest:
    b = _Body(body, COMPLETION_FIELDS)
    model = b.string("model", required=True)
    _unsupported(b, ("echo", "suffix"))
    logprobs = b.integer("logprobs", 0, 20, None)
    if b.integer("best_of", 1, 1, 1) != 1:  # pragma: no cover
        raise InvalidRequest("'best_of' must be 1", param="best_of")
    prompts = _texts_or_tokens(b.body.get("prompt"), n_vocab, "prompt", MAX_PROMPTS)
    max_tokens = b.integer("max_tokens", 1, MAX_TOKENS_LIMIT, 16)
    stream, include_usage = _stream(b)
    assert model is not None
    n = int(b.integer("n", 1, MAX_CHOICES, 1) or 1)
    if n * len(prompts) > MAX_CHOICES:
        raise InvalidRequest(f"at most {MAX_CHOICES} choices per request (prompts x n)",
                             param="n")
    return GenerationRequest(model, stream, include_usage,
                             _params(b, n_vocab, max_tokens, logprobs), prompts=prompts,
                             cache_prompt=b.boolean("cache_prompt", True), n=n,
                             grammar=b.string("grammar"))


MAX_EMBED_INPUTS = 256


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    model: str
    inputs: tuple[str | list[int], ...]
    base64: bool


def parse_embeddings(body: Any, n_vocab: int) -> EmbeddingRequest:
    b = _Body(body, {"model", "input", "encoding_format", "dimensions", "user"})
    model = b.string("model", required=True)
    assert model is not None
    items = _texts_or_tokens(b.body.get("input"), n_vocab, "input", MAX_EMBED_INPUTS)
    fmt = b.string("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise InvalidRequest("'encoding_format' must be 'float' or 'base64'",
                             param="encoding_format")
    if b.present("dimensions"):
        raise InvalidRequest("'dimensions' is not supported: embeddings have the model's size",
                             param="dimensions")
    return EmbeddingRequest(model, items, fmt == "base64")


def parse_tokenize(body: Any) -> tuple[str | None, str, bool, bool, bool]:
    """POST /tokenize: (model, content, add_special, parse_special, with_pieces)."""
    b = _Body(body, {"model", "content", "add_special", "parse_special", "with_pieces"})
    content = b.string("content", required=True)
    assert content is not None
    if len(content) > MAX_TOKENIZE_CHARS:
        raise InvalidRequest(f"'content' may be at most {MAX_TOKENIZE_CHARS} characters "
                             f"(got {len(content)})", param="content")
    return (b.string("model"), content, b.boolean("add_special", False),
            b.boolean("parse_special", True), b.boolean("with_pieces", False))


def parse_detokenize(body: Any, n_vocab: int) -> tuple[str | None, list[int]]:
    b = _Body(body, {"model", "tokens"})
    tokens = b.body.get("tokens")
    if isinstance(tokens, list) and len(tokens) > MAX_DETOKENIZE:
        raise InvalidRequest(f"'tokens' may hold at most {MAX_DETOKENIZE} ids", param="tokens")
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in tokens):
        raise InvalidRequest(f"'tokens' must be a list of token ids in 0..{n_vocab - 1}",
                             param="tokens")
    return b.string("model"), tokens
