"""The Anthropic Messages dialect: POST /v1/messages and /v1/messages/count_tokens.

The body becomes OpenAI-shaped chat messages (checked again by ``api.messages``):
``system`` (a string or text blocks) -> a system message, and so does a message of role
"system" (this SDK's ``SystemMessageParam``) where it stands; user text blocks -> the user
message's content, its ``tool_result`` blocks -> ``tool`` messages (``tool_call_id`` =
``tool_use_id``; ``is_error`` results start with "Error: "), put before the user's text;
assistant text -> content, ``tool_use`` blocks -> ``tool_calls`` (arguments =
``json.dumps(input)``), ``thinking`` / ``redacted_thinking`` blocks dropped. Text blocks
join with a newline. Custom ``tools`` (name, description, input_schema) and ``tool_choice``
(auto, any -> required, tool -> that name, none; ``disable_parallel_tool_use``) and
``output_config.format`` (a JSON schema) become the ``Constraint``.

400 (Anthropic's ``invalid_request_error``), naming the field: a missing ``max_tokens``
(and 0: no cache pre-warming), unknown fields (in the body, messages, blocks and tools),
roles other than user / assistant / system, image / document / search_result /
server-tool blocks, server tools (any ``type`` but "custom", such as web_search_20250305),
``container``, ``thread`` (message threads: ``thread_unsupported_request`` in
``error.details``, so the SDKs' tool runners go on without one), ``temperature`` outside
0..1. ``thinking``: ``enabled`` sets the template's
``enable_thinking`` and its ``budget_tokens`` is the reasoning budget, and a model's
reasoning comes as ``thinking`` blocks; without ``thinking`` (as with ``{"type":
"disabled"}``) the template is told ``enable_thinking: false`` and what a model reasons
anyway is not shown, as Anthropic's API answers without thinking blocks then.
Accepted and ignored: ``metadata``, ``service_tier``, ``cache_control`` (everywhere),
``inference_geo``, ``speed``, ``diagnostics``, ``output_config.effort``,
``user_profile_id``, ``workspace_id``; the ``anthropic-version`` and ``anthropic-beta``
headers. ``x-api-key`` is an API key (the front door's). A last assistant message is a
prefill the answer continues (as Anthropic's API does). See ``api.anthropic_render`` for the
answer, its stop reasons and usage.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeinfer.api import anthropic_render, fields
from edgeinfer.api.anthropic_render import MessageMeta, collect, openapi_paths, sse_events
from edgeinfer.api.body import read_json
from edgeinfer.api.fields import MAX_STOP, MAX_STOP_LEN, MAX_TOKENS_LIMIT, Body
from edgeinfer.api.messages import MAX_MESSAGES, messages
from edgeinfer.api.respond import CLIENT_GONE, leases, pool, sse, start, unless_disconnected
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.errors import InvalidRequest
from edgeinfer.prompt.tools import ToolSpec
from edgeinfer.service.request import ChatPrompt, Constraint, GenerateRequest, check_text_size
from edgeinfer.service.selection import model_named

# accepted and ignored, with the JSON type each must have
IGNORED: dict[str, type] = {
    "metadata": dict, "service_tier": str, "thinking": dict, "cache_control": dict,
    "inference_geo": str, "speed": str, "diagnostics": dict, "user_profile_id": str,
    "workspace_id": str, "context_management": dict, "compaction": dict}
FIELDS = set(IGNORED) | {"model", "messages", "system", "tools", "tool_choice",
                         "output_config", "max_tokens", "stop_sequences", "temperature",
                         "top_p", "top_k", "stream", "container", "thread"}
TOKEN_FIELDS = FIELDS - {"max_tokens"}  # count_tokens: the same body, without max_tokens
TEXT_KEYS = {"type", "text", "cache_control", "citations"}
TOOL_USE_KEYS = {"type", "id", "name", "input", "cache_control", "caller", "toolset_name"}
TOOL_RESULT_KEYS = {"type", "tool_use_id", "content", "is_error", "cache_control",
                    "toolset_name"}
TOOL_KEYS = {"type", "name", "description", "input_schema", "cache_control", "strict",
             "defer_loading", "input_examples", "eager_input_streaming", "allowed_callers"}
THINKING_TYPES = {"enabled", "disabled", "adaptive", "between_tools"}
MAX_TOOLS = 128
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")


def _bad(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _keys(obj: Any, allowed: set[str], where: str) -> dict[str, Any]:
    """``obj`` as an object whose keys are all in ``allowed`` (else 400 naming them)."""
    if not isinstance(obj, dict):
        raise _bad(f"'{where}' must be an object", where)
    for key in obj:
        if key not in allowed:
            raise _bad(f"'{where}.{key}': unrecognized field", f"{where}.{key}")
    return obj


def _text(block: Any, where: str) -> str:
    text = _keys(block, TEXT_KEYS, where).get("text")
    if not isinstance(text, str):
        raise _bad(f"'{where}.text' must be a string", f"{where}.text")
    return text


def _blocks(content: Any, where: str, empty: bool = False) -> list[dict[str, Any]]:
    """A content list: non-empty (unless ``empty``), of objects with a string ``type``."""
    if not isinstance(content, list) or not (content or empty):
        raise _bad(f"'{where}' must be a string or a non-empty list of content blocks", where)
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _bad(f"'{where}[{j}]' must be a content block with a 'type'", f"{where}[{j}]")
    return content


def _refuse(kind: str, where: str, allowed: str) -> InvalidRequest:
    return _bad(f"'{where}': {kind!r} content blocks are not supported by this server "
                f"(here: {allowed})", where)


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    _keys(block, TOOL_RESULT_KEYS, where)
    call_id, content = block.get("tool_use_id"), block.get("content", "")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"'{where}.tool_use_id' must be a non-empty string", f"{where}.tool_use_id")
    if not isinstance(content, str):
        parts = _blocks(content, f"{where}.content", empty=True)  # a tool that printed nothing
        for j, part in enumerate(parts):
            if part["type"] != "text":
                raise _refuse(part["type"], f"{where}.content[{j}]", "text")
        content = "\n".join(_text(p, f"{where}.content[{j}]") for j, p in enumerate(parts))
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise _bad(f"'{where}.is_error' must be a boolean", f"{where}.is_error")
    return {"role": "tool", "tool_call_id": call_id,
            "content": f"Error: {content}" if is_error else content}


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    _keys(block, TOOL_USE_KEYS, where)
    for key in ("id", "name"):
        if not isinstance(block.get(key), str) or not block[key]:
            raise _bad(f"'{where}.{key}' must be a non-empty string", f"{where}.{key}")
    if not isinstance(block.get("input"), dict):
        raise _bad(f"'{where}.input' must be an object", f"{where}.input")
    return {"id": block["id"], "type": "function", "function": {
        "name": block["name"], "arguments": json.dumps(block["input"], ensure_ascii=False)}}


def _user(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    results, texts = [], []
    for j, block in enumerate(_blocks(content, where)):
        kind, at = block["type"], f"{where}[{j}]"
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_result":
            results.append(_tool_result(block, at))
        else:
            raise _refuse(kind, at, "text and tool_result")
    if texts or not results:
        results.append({"role": "user", "content": "\n".join(texts)})
    return results


def _assistant(content: Any, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts, calls = [], []
    for j, block in enumerate(_blocks(content, where)):
        kind, at = block["type"], f"{where}[{j}]"
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_use":
            calls.append(_tool_use(block, at))
        elif kind not in ("thinking", "redacted_thinking"):
            raise _refuse(kind, at, "text, tool_use and thinking")
    msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _system(value: Any, where: str) -> list[dict[str, Any]]:
    """The system message of a system prompt (a string or text blocks); none if empty."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "system", "content": value}] if value else []
    parts = _blocks(value, where)
    for j, part in enumerate(parts):
        if part["type"] != "text":
            raise _refuse(part["type"], f"{where}[{j}]", "text")
    return [{"role": "system",
             "content": "\n".join(_text(p, f"{where}[{j}]") for j, p in enumerate(parts))}]


def conversation(b: Body) -> tuple[dict[str, Any], ...]:
    """``system`` and ``messages`` as validated OpenAI-shaped chat messages."""
    raw = b.body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty list", "messages")
    if len(raw) > MAX_MESSAGES:
        raise _bad(f"at most {MAX_MESSAGES} messages are allowed", "messages")
    out = _system(b.body.get("system"), "system")
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        _keys(m, {"role", "content"}, where)
        role = m.get("role")
        if role not in ("user", "assistant", "system"):
            raise _bad(f"'{where}.role' must be 'user', 'assistant' or 'system'", f"{where}.role")
        if "content" not in m:
            raise _bad(f"'{where}.content' is required", f"{where}.content")
        if role == "user":
            out += _user(m["content"], f"{where}.content")
        elif role == "assistant":
            out.append(_assistant(m["content"], f"{where}.content"))
        else:
            out += _system(m["content"], f"{where}.content")
    return messages(Body({"messages": out}, {"messages"}))


def _tools(raw: Any) -> tuple[ToolSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise _bad(f"'tools' must be a list of at most {MAX_TOOLS} tools", "tools")
    tools = []
    for j, t in enumerate(raw):
        where = f"tools[{j}]"
        kind = t.get("type") if isinstance(t, dict) else None
        if kind not in (None, "custom"):
            raise _bad(f"'{where}': the server tool {kind!r} is not supported by this server; "
                       "only custom tools (name, description, input_schema) are", where)
        _keys(t, TOOL_KEYS, where)
        name, schema, desc = t.get("name"), t.get("input_schema"), t.get("description", "")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise _bad(f"'{where}.name' must be 1-128 letters, digits, _ or -", f"{where}.name")
        if not isinstance(schema, dict) or schema.get("type", "object") != "object":
            raise _bad(f"'{where}.input_schema' must be a JSON schema of type 'object'",
                       f"{where}.input_schema")
        if not isinstance(desc, str):
            raise _bad(f"'{where}.description' must be a string", f"{where}.description")
        tools.append(ToolSpec(name, desc, schema, t.get("strict") is True))
    if len({t.name for t in tools}) != len(tools):
        raise _bad("tool names must be unique", "tools")
    return tuple(tools)


def _tool_choice(raw: Any, tools: tuple[ToolSpec, ...]) -> tuple[str, bool]:
    """(the service's tool_choice, parallel tool calls) from Anthropic's ``tool_choice``."""
    if raw is None:
        return ("auto" if tools else "none"), True
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise _bad("'tool_choice.type' must be 'auto', 'any', 'tool' or 'none'", "tool_choice")
    _keys(raw, {"type", "disable_parallel_tool_use"} | ({"name"} if kind == "tool" else set()),
          "tool_choice")
    serial = raw.get("disable_parallel_tool_use", False)
    if not isinstance(serial, bool):
        raise _bad("'tool_choice.disable_parallel_tool_use' must be a boolean",
                   "tool_choice.disable_parallel_tool_use")
    choice = {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))
    if kind == "tool":
        choice = raw.get("name")
        if not isinstance(choice, str) or choice not in {t.name for t in tools}:
            raise _bad(f"'tool_choice.name' must name one of 'tools' (got {choice!r})",
                       "tool_choice.name")
    if choice == "required" and not tools:
        raise _bad("'tool_choice' {'type': 'any'} needs 'tools'", "tool_choice")
    return (str(choice) if tools else "none"), not serial


def _output_schema(raw: Any) -> dict[str, Any] | None:
    """The JSON schema of ``output_config.format`` (``effort`` is ignored)."""
    if raw is None:
        return None
    fmt = _keys(raw, {"effort", "format"}, "output_config").get("format")
    if fmt is None:
        return None
    _keys(fmt, {"type", "schema"}, "output_config.format")
    if fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise _bad("'output_config.format' must be {'type': 'json_schema', 'schema': {...}}",
                   "output_config.format")
    return dict(fmt["schema"])


def _check_ignored(b: Body) -> None:
    for name, kind in IGNORED.items():
        v = b.body.get(name)
        if v is not None and not isinstance(v, kind):
            raise _bad(f"'{name}' must be a {'string' if kind is str else 'object'}", name)
    thinking = b.body.get("thinking")
    if thinking is not None and (not isinstance(thinking.get("type"), str)
                                 or thinking["type"] not in THINKING_TYPES):
        raise _bad(f"'thinking.type' must be one of {sorted(THINKING_TYPES)}", "thinking.type")
    if b.present("container"):
        raise _bad("'container' is not supported by this server (no server tools)", "container")


def _sampling(b: Body, max_tokens: int | None) -> SamplingParams:
    raw = b.body.get("stop_sequences")
    if raw is not None and (not isinstance(raw, list) or len(raw) > MAX_STOP or not all(
            isinstance(s, str) and 0 < len(s) <= MAX_STOP_LEN for s in raw)):
        raise _bad(f"'stop_sequences' must be a list of at most {MAX_STOP} non-empty strings "
                   f"of at most {MAX_STOP_LEN} characters", "stop_sequences")
    d = SamplingParams()
    return replace(d, temperature=b.number("temperature", 0.0, 1.0, d.temperature),
                   top_p=b.number("top_p", 0.0, 1.0, d.top_p),
                   top_k=int(b.integer("top_k", 0, 1_000_000, d.top_k) or 0),
                   max_tokens=max_tokens, stop=tuple(raw or ()))


def parse(body: Any, headers: dict[str, str], allowed: set[str] = FIELDS
          ) -> tuple[GenerateRequest, bool]:
    """(request, stream) from a Messages body; with ``TOKEN_FIELDS`` (count_tokens), no
    ``max_tokens`` is taken (the sampling fields are checked, and do not matter)."""
    b = Body(body, allowed)
    model = b.string("model", required=True)
    assert model is not None
    max_tokens = None
    if "max_tokens" in allowed:
        if not b.present("max_tokens"):
            raise _bad("'max_tokens' is required", "max_tokens")
        max_tokens = b.integer("max_tokens", 1, MAX_TOKENS_LIMIT, None)
    _check_ignored(b)
    if b.body.get("thread") is not None:
        # Anthropic's SDK tool runners then send the whole conversation without one
        raise InvalidRequest("message threads ('thread') are not supported by this server: "
                             "send the whole conversation", param="thread", details={
                                 "error_code": "thread_unsupported_request", "unsupported": []})
    msgs = conversation(b)
    tools = _tools(b.body.get("tools"))
    choice, parallel = _tool_choice(b.body.get("tool_choice"), tools)
    if choice not in ("auto", "none") and (b.body.get("thinking") or {}).get("type") in (
            "enabled", "adaptive"):  # (as Anthropic's API refuses it)
        raise _bad("Thinking may not be enabled when tool_choice forces tool use.", "tool_choice")
    schema = _output_schema(b.body.get("output_config"))
    if schema is not None and msgs[-1]["role"] == "assistant" and "max_tokens" in allowed:
        raise _bad("a prefilled assistant message cannot be combined with "  # (its JSON
                   "'output_config.format': the answer is a whole JSON value",  # would
                   "output_config.format")  # follow the prefill, which then does not parse)
    req = GenerateRequest(
        model, ChatPrompt(msgs), _sampling(b, max_tokens),
        priority=fields.priority(None, headers.get("x-priority")),
        constraint=Constraint(json_schema=schema, tools=tools, tool_choice=choice,
                              parallel_tool_calls=parallel),
        wait_for_model=headers.get("x-edgeinfer-wait", "true").lower() != "false",
        # clients made for Claude send 32000 or 64000: a cap, as llama-server and Ollama
        # take it (the answer ends with stop_reason max_tokens when the context is full)
        max_tokens_is_cap=True, **_thinking(b.body.get("thinking")))
    return req, b.boolean("stream")


def _thinking(raw: Any) -> dict[str, Any]:
    """``thinking`` for the template (``enable_thinking``) and, when enabled with
    ``budget_tokens``, as the reasoning budget."""
    if raw is None or isinstance(raw, dict) and raw.get("type") == "disabled":
        return {"template_kwargs": {"enable_thinking": False}}  # (Anthropic's default: off)
    if not isinstance(raw, dict) or raw.get("type") != "enabled":
        return {}
    if (budget := raw.get("budget_tokens")) is None:
        return {"template_kwargs": {"enable_thinking": True}}
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise _bad("'thinking.budget_tokens' must be a non-negative integer",
                   "thinking.budget_tokens")  # (Anthropic's >= 1024 is not asked for)
    return {"template_kwargs": {"enable_thinking": True},
            "reasoning_budget": min(budget, MAX_TOKENS_LIMIT)}


async def create_message(request: Request) -> Response:
    raw = await read_json(request)
    req, stream = parse(raw, dict(request.headers))
    thinking = raw.get("thinking") or {"type": "disabled"}  # (Anthropic's default: off)
    meta = MessageMeta(show_thinking=thinking.get("type") != "disabled")
    gen = await start(request, req, meta.id)
    meta.model = gen.model
    if stream:
        return sse(request, sse_events(meta, gen.events, gen.prompt_tokens, request.url.path),
                   ping=anthropic_render.ping_event)
    body = await unless_disconnected(request, collect(meta, gen.events))
    if body is None:
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(body)


async def count_tokens(request: Request) -> Response:
    """``{"input_tokens": n}``: the prompt tokens of the conversation (with tools), as the
    model's chat template renders it; rendered and tokenized off the event loop."""
    req, _ = parse(await read_json(request), dict(request.headers), TOKEN_FIELDS)
    served = await model_named(pool(request), None if req.model in ("auto", "") else req.model,
                               leases(request))
    assert isinstance(req.prompt, ChatPrompt)
    check_text_size(req, served.n_ctx)  # (a prompt that cannot fit is not tokenized)
    tools = req.constraint.tools if req.constraint.offers_tools else ()
    tokens = await served.run(functools.partial(
        served.chat_prompt, [dict(m) for m in req.prompt.messages], tools,
        template_kwargs=req.template_kwargs))
    return JSONResponse({"input_tokens": len(tokens)})


ROUTES: list[Route] = [
    Route("/v1/messages", create_message, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]

OPENAPI_PATHS: dict[str, Any] = openapi_paths(FIELDS, TOKEN_FIELDS)
