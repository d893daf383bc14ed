"""The OpenAI Responses dialect: /v1/responses (create; retrieve, delete and list the input
items of stored responses) and /v1/responses/input_tokens.

``instructions`` (a system message, never carried over, as OpenAI does) + the stored
conversation of ``previous_response_id`` + ``input`` (a string, or message, function_call
and function_call_output items, and ``item_reference`` items naming an input or output item
of a stored response of the same API key, 400 ``not_found`` when none has it) become
OpenAI chat messages (calls: assistant ``tool_calls``; outputs: ``tool`` messages) checked
by ``api.messages``. Earlier turns
render the same way each time, so a continued conversation's prompt is a prefix-cache hit.
Function ``tools`` (also inside ``namespace`` tools), ``tool_choice``,
``parallel_tool_calls`` and ``text.format`` (text, json_object, json_schema) become the
``Constraint``.

400 naming the field: unknown fields, hosted tools (file_search, computer_use ...; a
``web_search`` tool is left out, logged), other input items, non-text content, set
``UNSUPPORTED`` fields.
Accepted, ignored: ``IGNORED`` (``reasoning``: no reasoning output), known ``include``s.
``truncation: "auto"``: a conversation over the context loses its oldest turns (up to a
user message; instructions stay) until it fits; "disabled" (default): 400
``context_length_exceeded``. Stored responses (``store``, default true; see
``service.response_store``) are readable only with the API key that created them.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgeinfer.api import fields, openai_chat
from edgeinfer.api.body import read_json
from edgeinfer.api.fields import MAX_TOKENS_LIMIT, Body
from edgeinfer.api.guard import key_owner
from edgeinfer.api.listing import input_items_page
from edgeinfer.api.messages import messages
from edgeinfer.api.respond import (
    CLIENT_GONE,
    leases,
    pool,
    sse,
    start_fitting,
    turn_cuts,
    unless_disconnected,
)
from edgeinfer.api.responses_input import bad as _bad
from edgeinfer.api.responses_input import input_item, input_items
from edgeinfer.api.responses_render import (
    ResponseMeta,
    chat_messages,
    collect,
    openapi_paths,
    sse_events,
)
from edgeinfer.api.toolchoice import responses_choice
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.errors import InvalidRequest, NotFound
from edgeinfer.prompt.tools import ToolSpec
from edgeinfer.service.generation import Generation
from edgeinfer.service.request import ChatPrompt, Constraint, GenerateRequest, check_text_size
from edgeinfer.service.response_store import StoredResponse, kept_on
from edgeinfer.service.selection import model_named

log = logging.getLogger("edgeinfer.api")
TOKEN_FIELDS = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
                "previous_response_id", "reasoning", "text", "truncation"}
IGNORED = {"user": str, "service_tier": str, "safety_identifier": str, "prompt_cache_key": str,
           "prompt_cache_retention": str, "prompt_cache_options": dict, "stream_options": dict,
           "reasoning": dict, "client_metadata": dict,
           "max_tool_calls": int}  # (it bounds calls of built-in tools: there are none here)
UNSUPPORTED = ("background", "conversation", "prompt", "context_management")
FIELDS = TOKEN_FIELDS | set(IGNORED) | set(UNSUPPORTED) | {
    "stream", "store", "metadata", "max_output_tokens", "temperature", "top_p", "include",
    "seed", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repeat_penalty",
    "stop", "priority", "reasoning_format", "chat_template_kwargs", "top_logprobs"}
INCLUDABLE = {"file_search_call.results", "web_search_call.results", "reasoning.encrypted_content",
              "web_search_call.action.sources", "message.input_image.image_url",
              "computer_call_output.output.image_url", "code_interpreter_call.outputs",
              "message.output_text.logprobs"}
TOOL_KEYS = {"type", "name", "description", "parameters", "strict", "defer_loading",
             "allowed_callers", "output_schema"}
MAX_TOOLS = 128
SUMMARIES = ("auto", "concise", "detailed")
RENAMED = {"response_format.json_schema.schema": "text.format.schema",
           "response_format": "text.format", "messages": "input"}
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass(slots=True)
class Draft:
    """A parsed body: everything but the earlier conversation (which needs the store)."""

    model: str | None
    instructions: str | None
    items: list[dict[str, Any]]  # the input items, normalised, with ids
    messages: list[dict[str, Any]]  # the input as OpenAI chat messages
    previous_id: str | None
    constraint: Constraint
    params: SamplingParams
    echo: dict[str, Any]  # the request fields a response object repeats
    stream: bool = False
    store: bool = True
    truncate: bool = False
    priority: int = 0
    reasoning_format: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def request(self, conversation: list[dict[str, Any]]) -> GenerateRequest:
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        msgs = messages(Body({"messages": system + conversation}, {"messages"}))
        return GenerateRequest(self.model or "", ChatPrompt(msgs), self.params,
                               priority=self.priority, constraint=self.constraint,
                               reasoning_format=self.reasoning_format,
                               template_kwargs=self.template_kwargs)


def _tools(b: Body) -> tuple[tuple[ToolSpec, ...], list[dict[str, Any]]]:
    """Function tools, and those of ``namespace`` tools (each called by its own name; the
    call's item names its namespace); a ``web_search`` tool is left out (no web here)."""
    raw = b.body["tools"] if b.present("tools") else []
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise _bad("tools", f"must be a list of at most {MAX_TOOLS} tools")
    specs, echo = [], []
    for j, t in enumerate(raw):
        kind = t.get("type") if isinstance(t, dict) else None
        if isinstance(kind, str) and kind.startswith("web_search"):
            log.info("left out the hosted tool %r (no web access here)", kind)
            continue
        if kind == "namespace":
            ns, desc, inner = t.get("name"), t.get("description"), t.get("tools")
            if set(t) - {"type", "name", "description", "tools"} or not isinstance(
                    ns, str) or not _NAME.match(ns) or not isinstance(desc, str) or not (
                    isinstance(inner, list) and 0 < len(inner) <= MAX_TOOLS):
                raise _bad(f"tools[{j}]", "a namespace needs a 'name' (1-64 letters, digits, _ "
                           "or -), a string 'description' and a list of function 'tools'")
            pairs = [_function(f, f"tools[{j}].tools[{k}]") for k, f in enumerate(inner)]
            specs += [spec for spec, _ in pairs]
            echo.append({"type": "namespace", "name": ns, "description": desc,
                         "tools": [e for _, e in pairs]})
            continue
        spec, one = _function(t, f"tools[{j}]")
        specs.append(spec)
        echo.append(one)
    if len(specs) > MAX_TOOLS or len({s.name for s in specs}) != len(specs):
        raise _bad("tools", f"must hold at most {MAX_TOOLS} uniquely named functions in all")
    return tuple(specs), echo


def _function(t: Any, where: str) -> tuple[ToolSpec, dict[str, Any]]:
    """A function tool and its echo."""
    kind = t.get("type") if isinstance(t, dict) else None
    if kind != "function":
        raise _bad(f"{where}.type", f"{kind!r} is not supported: only 'function' tools "
                   "(file_search, computer_use and other hosted tools are not)")
    extra = sorted(set(t) - TOOL_KEYS)
    if extra:
        raise _bad(f"{where}.{extra[0]}", "is not a recognized field of a function tool")
    name, desc = t.get("name"), t.get("description") or ""
    params = t.get("parameters")
    params = {"type": "object", "properties": {}} if params is None else params
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(f"{where}.name", "must be 1-64 letters, digits, _ or -")
    strict = t.get("strict")
    if not isinstance(params, dict) or not isinstance(desc, str) or not isinstance(
            strict, bool | None):
        raise _bad(where, "needs a JSON schema object 'parameters', a string 'description' "
                   "and a boolean 'strict'")
    return ToolSpec(name, desc, params, strict is not False), {
        "type": "function", "name": name, "description": desc or None, "parameters": params,
        "strict": strict is not False}


def _text_format(b: Body) -> tuple[dict[str, Any] | None, bool, dict[str, Any]]:
    """(json schema, json object, echo) of ``text``."""
    raw = b.body["text"] if b.present("text") else {}
    if not isinstance(raw, dict) or set(raw) - {"format", "verbosity"}:
        raise _bad("text", "must be an object with 'format' (and 'verbosity')")
    if raw.get("verbosity") not in (None, "low", "medium", "high"):
        raise _bad("text.verbosity", "must be 'low', 'medium' or 'high'")
    fmt: Any = {"type": "text"} if raw.get("format") is None else raw["format"]
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    echo = {"format": {"type": kind}, "verbosity": raw.get("verbosity")}
    if kind in ("text", "json_object") and set(fmt) == {"type"}:
        return None, kind == "json_object", echo
    if kind != "json_schema":
        raise _bad("text.format", "must be {'type': 'text'}, {'type': 'json_object'} or "
                   "{'type': 'json_schema', 'name': ..., 'schema': {...}}")
    if set(fmt) - {"type", "name", "schema", "strict", "description"}:
        raise _bad("text.format", "has fields a json_schema format does not take")
    if not isinstance(fmt.get("name"), str) or not _NAME.match(fmt["name"]):
        raise _bad("text.format.name", "must be 1-64 letters, digits, _ or -")
    if not isinstance(fmt.get("schema"), dict):
        raise _bad("text.format.schema", "must be a JSON schema object")
    if not isinstance(fmt.get("strict", False), bool | None) or not isinstance(
            fmt.get("description", ""), str):
        raise _bad("text.format", "'strict' must be a boolean and 'description' a string")
    echo["format"] = {k: fmt[k] for k in ("type", "name", "schema", "strict", "description")
                      if k in fmt}
    return fmt["schema"], False, echo


def _accepted(b: Body) -> None:
    """Fields taken and ignored must still have the right type; unsupported ones be unset."""
    for name, kind in IGNORED.items():
        if b.body.get(name) is not None and (not isinstance(b.body[name], kind)
                                             or isinstance(b.body[name], bool)):
            raise _bad(name, "must be " + ("a string" if kind is str else "an object"
                                           if kind is dict else "an integer"))
    include = b.body["include"] if b.present("include") else []
    if not isinstance(include, list) or not all(isinstance(i, str) and i in INCLUDABLE
                                                for i in include):
        raise _bad("include", f"must be a list of {sorted(INCLUDABLE)}")
    if b.body.get("truncation") not in (None, "auto", "disabled"):
        raise _bad("truncation", "must be 'auto' or 'disabled'")
    fields.unsupported(b, UNSUPPORTED)


def _logprobs(b: Body) -> int | None:
    """Alternatives per token when the output text's logprobs are asked for (``include``
    "message.output_text.logprobs", or ``top_logprobs``); None when they are not."""
    top = b.integer("top_logprobs", 0, 20, 0) or 0
    wanted = "message.output_text.logprobs" in (b.body.get("include") or [])
    return top if wanted or top else None


def parse(body: Any, headers: dict[str, str], allowed: set[str]) -> Draft:
    """A Responses body (``allowed``: its fields) as a ``Draft``; every error a 400."""
    b = Body(body, allowed)
    _accepted(b)
    model = b.string("model", required=allowed is FIELDS)
    items = input_items(b.body.get("input"))
    tools, tools_echo = _tools(b)
    tools, choice, choice_echo = responses_choice(b.body.get("tool_choice"), tools)
    schema, json_object, text_echo = _text_format(b)
    max_tokens = b.integer("max_output_tokens", 1, MAX_TOKENS_LIMIT, None)
    params = fields.sampling_params(b, max_tokens, _logprobs(b))
    parallel = b.boolean("parallel_tool_calls", True)
    instructions, previous = b.string("instructions"), b.string("previous_response_id")
    store = b.boolean("store", True)
    echo = {"instructions": instructions, "metadata": fields.metadata(b), "tools": tools_echo,
            "tool_choice": choice_echo, "parallel_tool_calls": parallel, "text": text_echo,
            "temperature": params.temperature, "top_p": params.top_p,
            "max_output_tokens": max_tokens, "previous_response_id": previous,
            "store": store, "truncation": b.body.get("truncation") or "disabled",
            "reasoning": {"effort": None, "summary": None}, "user": b.string("user"),
            "service_tier": "default", "background": False,
            "top_logprobs": b.integer("top_logprobs", 0, 20, 0),
            "prompt_cache_key": b.string("prompt_cache_key")}
    constraint = Constraint(json_schema=schema, json_object=json_object, tools=tools,
                            tool_choice=choice, parallel_tool_calls=parallel)
    priority = fields.priority(b.body.get("priority"), headers.get("x-priority"))
    reasoning_format, template_kwargs = openai_chat.reasoning(b)
    asked = b.body.get("reasoning")
    effort = asked.get("effort") if isinstance(asked, dict) else None
    if isinstance(effort, str):  # for templates that take it, as chat's reasoning_effort
        if effort == "none":
            template_kwargs.setdefault("enable_thinking", False)
        else:
            template_kwargs.setdefault("reasoning_effort", effort)
        echo["reasoning"]["effort"] = effort
    if (summary := asked.get("summary") if isinstance(asked, dict) else None) in SUMMARIES:
        echo["reasoning"]["summary"] = summary  # echoed as asked (none is written here)
    return Draft(model, instructions, items, chat_messages(items), previous, constraint,
                 params, echo, b.boolean("stream"), store, echo["truncation"] == "auto",
                 priority, reasoning_format, template_kwargs)


async def _earlier(request: Request, previous_id: str | None) -> list[dict[str, Any]]:
    """The stored conversation ``previous_id`` continues (400 when there is none)."""
    if previous_id is None:
        return []
    found = await kept_on(request.app.state).get(key_owner(request), previous_id)
    if found is None:
        raise InvalidRequest(f"Previous response with id '{previous_id}' not found.",
                             param="previous_response_id", code="previous_response_not_found")
    return found.conversation


async def _resolve(request: Request, d: Draft) -> None:
    """Replace the ``item_reference`` input items with the stored items they name (400
    when no stored response of this API key holds one)."""
    if all(it["type"] != "item_reference" for it in d.items):
        return
    store, owner, items = kept_on(request.app.state), key_owner(request), []
    for i, it in enumerate(d.items):
        if it["type"] == "item_reference":
            found = await store.item(owner, it["id"])
            if found is None:
                raise InvalidRequest(f"Item with id '{it['id']}' not found.",
                                     param=f"input[{i}].id", code="not_found")
            it = input_item(found, f"input[{i}]")  # (an output item has the same shape;
            # the store holds no references: they are resolved before a response is kept)
        items.append(it)
    d.items, d.messages = items, chat_messages(items)


async def _start(request: Request, d: Draft, conversation: list[dict[str, Any]],
                 request_id: str) -> Generation:
    """Start the generation; with truncation "auto", drop the oldest turns while the
    prompt does not fit (``respond.turn_cuts``)."""
    cuts = turn_cuts(conversation) if d.truncate else [0]
    try:
        gen, _ = await start_fitting(request, cuts, lambda cut: d.request(conversation[cut:]),
                                     request_id)
    except InvalidRequest as exc:
        exc.param = RENAMED.get(exc.param or "", exc.param)  # the service's names
        raise
    return gen


async def create_response(request: Request) -> Response:
    d = parse(await read_json(request), dict(request.headers), FIELDS)
    await _resolve(request, d)
    owner = key_owner(request)
    conversation = await _earlier(request, d.previous_id) + d.messages
    meta = ResponseMeta("", d.echo)
    gen = await _start(request, d, conversation, meta.id)
    meta.model = gen.model
    if d.params.logprobs is not None:
        meta.piece = gen.piece

    async def save(body: dict[str, Any]) -> None:
        """Store ``body`` when asked; one the store could not keep (a full or read-only
        disk, too large) says ``"store": false``, as it cannot be retrieved."""
        if d.store and not await kept_on(request.app.state).put(owner, StoredResponse(
                meta.id, body, d.items, conversation + chat_messages(body["output"]))):
            body["store"] = False

    if d.stream:
        return sse(request, sse_events(meta, gen.events, save, request.url.path))
    body = await unless_disconnected(request, collect(meta, gen.events))
    if body is None:
        return Response(status_code=CLIENT_GONE)
    await save(body)
    return JSONResponse(body)


async def stored_response(request: Request) -> Response:
    """GET (the response), DELETE, or GET .../input_items of a stored response: 404 when
    there is none or another API key stored it."""
    rid, owner = request.path_params["response_id"], key_owner(request)
    found = None
    if request.method == "DELETE":
        if await kept_on(request.app.state).delete(owner, rid):
            return JSONResponse({"id": rid, "object": "response.deleted", "deleted": True})
    else:
        found = await kept_on(request.app.state).get(owner, rid)
    if found is None:
        raise NotFound(f"Response with id '{rid}' not found.", param="response_id",
                       code="not_found")
    if request.url.path.endswith("/input_items"):
        return JSONResponse(input_items_page(found.input_items, request.query_params))
    if request.url.path.endswith("/cancel"):  # (what is stored has ended)
        raise InvalidRequest("Only background responses can be cancelled; this server does "
                             "not run them ('background' is refused).", param="response_id")
    if request.query_params.get("stream", "false").lower() not in ("false", "0", ""):
        raise InvalidRequest("Only background responses can be streamed again; this server "
                             "does not run them ('background' is refused). Retrieve the "
                             "response without 'stream'.", param="stream")
    return JSONResponse(found.response)


async def compact(request: Request) -> Response:
    """POST /v1/responses/compact: not served (it was a 405 of the stored-response route)."""
    raise NotFound("Compaction (POST /v1/responses/compact) is not supported by this server; "
                   "send the conversation whole ('truncation': 'auto' drops its oldest turns "
                   "when it outgrows the context).", code="unsupported_endpoint")


async def count_input_tokens(request: Request) -> Response:
    """The prompt tokens ``input`` (with instructions, tools and the previous response's
    conversation) would take, rendered with the model's chat template."""
    d = parse(await read_json(request), dict(request.headers), TOKEN_FIELDS)
    await _resolve(request, d)
    req = d.request(await _earlier(request, d.previous_id) + d.messages)
    served = await model_named(pool(request), d.model, leases(request))
    tools = req.constraint.tools if req.constraint.offers_tools else ()
    assert isinstance(req.prompt, ChatPrompt)
    check_text_size(req, served.n_ctx)  # (a prompt that cannot fit is not tokenized)
    tokens = await served.run(served.chat_prompt, [dict(m) for m in req.prompt.messages], tools)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": len(tokens)})


ROUTES: list[Route] = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/v1/responses/input_tokens", count_input_tokens, methods=["POST"]),
    Route("/v1/responses/compact", compact, methods=["POST"]),
    Route("/v1/responses/{response_id}/input_items", stored_response, methods=["GET"]),
    Route("/v1/responses/{response_id}/cancel", stored_response, methods=["POST"]),
    Route("/v1/responses/{response_id}", stored_response, methods=["GET", "DELETE"]),
]

OPENAPI_PATHS: dict[str, Any] = openapi_paths(FIELDS, TOKEN_FIELDS)
