"""The OpenAI chat completions dialect: POST /v1/chat/completions.

Parses the body once into a ``GenerateRequest`` (messages, sampling, ``n``,
priority, tools, response_format / grammar), runs it through the service and
renders the events as a chat.completion body or chat.completion.chunk events.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from edgeinfer.api import fields, samplers
from edgeinfer.api.body import read_json
from edgeinfer.api.fields import MAX_CHOICES, MAX_TOKENS_LIMIT, Body
from edgeinfer.api.messages import messages
from edgeinfer.api.openai_render import CompletionMeta
from edgeinfer.api.respond import respond
from edgeinfer.api.stored_chats import saver
from edgeinfer.api.toolchoice import allowed_tools
from edgeinfer.errors import InvalidRequest
from edgeinfer.prompt.tools import ToolSpec
from edgeinfer.service.request import ChatPrompt, Constraint, GenerateRequest

FIELDS = {
    "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "min_p",
    "presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n", "seed", "stop",
    "n", "logit_bias", "user", "ignore_eos", "metadata", "store", "service_tier", "cache_prompt",
    "speculative", "deterministic",
    "priority", "messages", "max_completion_tokens", "response_format", "logprobs",
    "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "grammar", "json_schema",
    "reasoning_format", "chat_template_kwargs", "reasoning_effort", "reasoning_budget",
    "modalities",  # must ask for text
    "functions", "function_call",  # deprecated by OpenAI, still accepted: tools underneath
}
# OpenAI's, accepted and ignored (as /v1/responses does) when they are strings: they steer
# OpenAI's caching, abuse tracking and answer length
IGNORED = ("prompt_cache_key", "prompt_cache_retention", "safety_identifier", "verbosity")
FIELDS |= set(IGNORED) | samplers.NAMES | {"prompt_cache_options", "prediction"}
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")
REASONING_FORMATS = ("auto", "deepseek", "none")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
MAX_TOOLS = 128
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def parse_tools(b: Body) -> tuple[tuple[ToolSpec, ...], str, bool]:
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
            desc, strict = fn.get("description", ""), fn.get("strict")
            if not isinstance(strict, bool | None):
                raise InvalidRequest(f"'tools[{j}].function.strict' must be a boolean",
                                     param=f"tools[{j}].function.strict")
            tools.append(ToolSpec(name, desc if isinstance(desc, str) else "", params,
                                  strict is True))
        if len({t.name for t in tools}) != len(tools):
            raise InvalidRequest("tool names must be unique", param="tools")
    choice_raw = b.body.get("tool_choice")
    if choice_raw is None:
        choice = "auto" if tools else "none"
    elif choice_raw in ("none", "auto", "required"):
        choice = str(choice_raw)
    elif (allowed := allowed_tools(choice_raw, tuple(tools), chat=True)) is not None:
        tools, choice = list(allowed[0]), allowed[1]  # (only these are offered)
    elif isinstance(choice_raw, dict) and choice_raw.get("type") == "function" and isinstance(
            choice_raw.get("function"), dict) and isinstance(
            choice_raw["function"].get("name"), str):
        choice = choice_raw["function"]["name"]
        if choice not in {t.name for t in tools}:
            raise InvalidRequest(f"'tool_choice' names {choice!r}, which is not in 'tools'",
                                 param="tool_choice")
    else:
        raise InvalidRequest("'tool_choice' must be 'none', 'auto', 'required', "
                             "{'type': 'function', 'function': {'name': ...}} or "
                             "{'type': 'allowed_tools', 'allowed_tools': {...}}",
                             param="tool_choice")
    if choice != "none" and not tools:
        raise InvalidRequest("'tool_choice' needs 'tools'", param="tool_choice")
    return tuple(tools), choice, b.boolean("parallel_tool_calls", True)


_FORMAT_KEYS = {"text": {"type"}, "json_object": {"type", "schema"},
                "json_schema": {"type", "json_schema"}}


def _response_format(b: Body) -> tuple[dict[str, Any] | None, bool, str]:
    """(JSON schema, any JSON object, where the schema is) from ``response_format``, or
    from llama-server's ``json_schema`` field and ``json_object`` with a ``schema``."""
    rf = b.body.get("response_format")
    top = b.body.get("json_schema")
    if top is not None:
        if rf is not None or not isinstance(top, dict):
            raise InvalidRequest("'json_schema' must be a JSON schema object, without "
                                 "'response_format'", param="json_schema")
        return top, False, "json_schema"
    if rf is None:
        return None, False, ""
    kind = rf.get("type") if isinstance(rf, dict) else None
    if not isinstance(kind, str) or kind not in _FORMAT_KEYS:
        raise InvalidRequest("'response_format.type' must be 'text', 'json_object' or "
                             "'json_schema'", param="response_format")
    for key in rf:
        if key not in _FORMAT_KEYS[kind] and rf[key] is not None:
            raise InvalidRequest(f"'response_format.{key}': unrecognized field for type "
                                 f"'{kind}'", param=f"response_format.{key}")
    if kind == "json_object":
        schema = rf.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise InvalidRequest("'response_format.schema' must be a JSON schema object",
                                 param="response_format.schema")
        return (schema, False, "response_format.schema") if schema is not None else (
            None, True, "")
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
            raise InvalidRequest("'response_format.json_schema.schema' must be a JSON schema "
                                 "object", param="response_format.json_schema.schema")
        return js["schema"], False, "response_format.json_schema.schema"
    return None, False, ""


def reasoning(b: Body) -> tuple[str | None, dict[str, Any]]:
    """(reasoning_format, template variables) from ``reasoning_format``,
    ``chat_template_kwargs`` and ``reasoning_effort`` (passed to templates that take it)."""
    fmt = b.string("reasoning_format")
    if fmt is not None and fmt not in REASONING_FORMATS:
        raise InvalidRequest(f"'reasoning_format' must be one of {', '.join(REASONING_FORMATS)}",
                             param="reasoning_format")
    kwargs = b.body.get("chat_template_kwargs", {})
    if not isinstance(kwargs, dict) or len(kwargs) > 32 or not all(
            isinstance(k, str) and len(k) <= 64 for k in kwargs):
        raise InvalidRequest("'chat_template_kwargs' must be an object of at most 32 variables",
                             param="chat_template_kwargs")
    effort = b.string("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise InvalidRequest("'reasoning_effort' must be one of "
                                 f"{', '.join(REASONING_EFFORTS)}", param="reasoning_effort")
        kwargs = ({**kwargs, "enable_thinking": False} if effort == "none"  # as llama-server
                  else {**kwargs, "reasoning_effort": effort})
    return fmt, dict(kwargs)


def _ignored(b: Body) -> None:
    """Fields taken and ignored must still have the right type."""
    for name in (*IGNORED, "user"):
        b.string(name)
    b.boolean("store")
    fields.metadata(b)
    if b.body.get("service_tier", "auto") not in SERVICE_TIERS:
        raise InvalidRequest(f"'service_tier' must be one of {', '.join(SERVICE_TIERS)}",
                             param="service_tier")
    if not isinstance(b.body.get("prompt_cache_options", {}), dict):
        raise InvalidRequest("'prompt_cache_options' must be an object",
                             param="prompt_cache_options")
    if b.body.get("modalities", ["text"]) != ["text"]:
        raise InvalidRequest("'modalities' must be [\"text\"]: this server writes text only",
                             param="modalities")


def _prediction(value: Any) -> str | None:
    """Predicted Outputs: the text the answer is expected to repeat (a file being edited).
    It only speeds the answer up (drafts for speculative decoding): the answer is the same
    without it."""
    if value is None:
        return None
    content = value.get("content") if isinstance(value, dict) else None
    if not isinstance(value, dict) or value.get("type") != "content" or not (
            isinstance(content, str) or isinstance(content, list) and all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                for p in content)):
        raise InvalidRequest("'prediction' must be {\"type\": \"content\", \"content\": a "
                             "string or text parts}", param="prediction")
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


def legacy_functions(body: Any) -> Any:
    """A body with OpenAI's deprecated ``functions`` / ``function_call`` as the ``tools`` /
    ``tool_choice`` they became (one call at a time, as they allowed)."""
    if not isinstance(body, dict) or body.get("functions") is None and body.get(
            "function_call") is None:
        return body
    if body.get("tools") is not None or body.get("tool_choice") is not None:
        raise InvalidRequest("use 'tools' or the deprecated 'functions', not both",
                             param="functions")
    out = {k: v for k, v in body.items() if k not in ("functions", "function_call")}
    fns, call = body.get("functions"), body.get("function_call")
    if not isinstance(fns, list):
        raise InvalidRequest("'functions' must be a list of functions", param="functions")
    out["tools"] = [{"type": "function", "function": f} for f in fns]
    if isinstance(call, dict) and isinstance(call.get("name"), str):
        out["tool_choice"] = {"type": "function", "function": {"name": call["name"]}}
    elif call is not None:
        out["tool_choice"] = call
    out["parallel_tool_calls"] = False
    return out


def parse(body: Any, headers: dict[str, str]) -> tuple[GenerateRequest, bool, bool]:
    """(request, stream, include_usage) from a chat completions body."""
    b = Body(legacy_functions(body), FIELDS)
    model = b.string("model") or ""  # left out (llama.cpp's web UI): the first configured
    msgs = messages(b)
    logprobs = None
    if b.boolean("logprobs"):
        logprobs = b.integer("top_logprobs", 0, 20, 0)
    elif b.present("top_logprobs"):
        raise InvalidRequest("'top_logprobs' requires 'logprobs' to be true",
                             param="top_logprobs")
    _ignored(b)
    tools, tool_choice, parallel = parse_tools(b)
    json_schema, json_object, schema_param = _response_format(b)
    grammar = b.string("grammar")
    forced = tool_choice not in ("none", "auto")
    if grammar is not None and (json_schema is not None or json_object or forced):
        raise InvalidRequest("use 'grammar' without a JSON 'response_format' or a forced "
                             "'tool_choice'", param="grammar")
    max_tokens = samplers.chat_max_tokens(b)
    stream, include_usage = fields.stream_options(b)
    reasoning_format, template_kwargs = reasoning(b)
    req = GenerateRequest(
        model, ChatPrompt(msgs),
        samplers.sampling_params(b, max_tokens, logprobs),
        n=int(b.integer("n", 1, MAX_CHOICES, 1) or 1),
        priority=fields.priority(b.body.get("priority"), headers.get("x-priority")),
        constraint=Constraint(grammar=grammar, json_schema=json_schema, json_object=json_object,
                              schema_param=schema_param,
                              tools=tools, tool_choice=tool_choice, parallel_tool_calls=parallel),
        cache_prompt=b.boolean("cache_prompt", True),
        wait_for_model=headers.get("x-edgeinfer-wait", "true").lower() != "false",
        reasoning_format=reasoning_format, template_kwargs=template_kwargs,
        reasoning_budget=b.integer("reasoning_budget", 0, MAX_TOKENS_LIMIT, None),
        prediction=_prediction(b.body.get("prediction")))
    return req, stream, include_usage


async def chat_completions(request: Request) -> Response:
    body = await read_json(request)
    req, stream, include_usage = parse(body, dict(request.headers))
    legacy = isinstance(body, dict) and body.get("functions") is not None
    return await respond(request, req, CompletionMeta("chat", functions=legacy), stream,
                         include_usage, saver(request, body))
