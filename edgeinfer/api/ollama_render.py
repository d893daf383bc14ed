"""Ollama's answers: NDJSON lines or one body from the service's events, model bodies.

A chat line is ``{model, created_at, message: {role, content[, thinking][, tool_calls]},
done: false}``, a generate line ``{model, created_at, response[, thinking], done: false}``.
A tool call is sent whole once complete, its ``arguments`` an object (one cut off by
``num_predict`` is left out). The last line has ``done: true``, ``done_reason`` ("stop"
or "length"), counts and durations (ns); a failure mid-stream ends with ``{"error"}``.
``NdjsonStream`` ends when the client disconnects or stops reading for ``send_timeout``,
closing the event stream, which aborts the generation and frees its slots.
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from edgeinfer.api import unread
from edgeinfer.api.errors import shape
from edgeinfer.api.openai_render import HeldLogprobs, token_entries, within
from edgeinfer.api.respond import (
    CLIENT_GONE,
    json_response,
    leases,
    pool,
    start_fitting,
    turn_cuts,
    unless_disconnected,
)
from edgeinfer.errors import InvalidRequest
from edgeinfer.models.pool import ModelPool, ModelState
from edgeinfer.prompt.reasoning import splits
from edgeinfer.service import events as ev
from edgeinfer.service.embedding import embed, shortened
from edgeinfer.service.generation import Generation
from edgeinfer.service.outcome import CallOutcome, gather
from edgeinfer.service.request import (
    MAX_TOKEN_BYTES,
    ChatPrompt,
    EmbedRequest,
    GenerateRequest,
)
from edgeinfer.service.selection import model_for

log = logging.getLogger("edgeinfer.api")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
MAX_KEEP_ALIVE = 1000 * 365 * 86400.0


def keep_alive(value: Any) -> float | None:
    """Seconds from a number or a Go duration ("5m", "1h30m", "0"); negative: inf."""
    seconds: float | None = None
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value) if abs(value) <= MAX_KEEP_ALIVE else -1.0  # (an int past floats)
    elif isinstance(value, str):
        text = value.strip().lstrip("+-")
        sign = -1.0 if value.strip().startswith("-") else 1.0
        if re.fullmatch(r"\d+(\.\d+)?", text):
            seconds = sign * float(text)
        elif text and not _PART.sub("", text):
            seconds = sign * sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))
    if seconds is None:
        raise InvalidRequest("'keep_alive' must be a number of seconds or a duration such as "
                             "\"5m\"", param="keep_alive")
    # negative, or past any date a clock can write (a year of seconds x 1000): for good
    return float("inf") if seconds < 0 or seconds > MAX_KEEP_ALIVE else seconds


def rfc3339(ts: float | None = None) -> str:
    """A UTC time as Ollama writes it (``2024-01-02T03:04:05.123456Z``)."""
    when = datetime.datetime.fromtimestamp(time.time() if ts is None else ts, datetime.UTC)
    return when.isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass(slots=True)
class Parsed:
    """A generation body: ``req`` is None for one that only loads / unloads the model."""

    model: str  # as the client wrote it
    req: GenerateRequest | None
    stream: bool
    keep_alive: float | None  # seconds (inf: forever), None when not given
    truncate: bool = True  # a chat too long for the context drops its oldest turns
    returns_context: bool = False  # the last line gives ``context`` (generate, not raw)


@dataclass(slots=True)
class Meta:
    """What every line of one answer repeats, and how its durations are measured."""

    model: str  # the name the client asked for, echoed as Ollama does
    chat: bool  # /api/chat (``message``) or /api/generate (``response``)
    path: str  # the request's path, for the shape of a mid-stream error
    started_ns: int = field(default_factory=time.perf_counter_ns)
    load_ns: int = 0  # time spent loading the model for this request
    # the raw output -> the last line's ``context`` (None: no context is given)
    context: Callable[[str], Awaitable[list[int]]] | None = None
    held: HeldLogprobs | None = None  # logprobs asked for: those not sent yet

    def logprobs(self, line: dict[str, Any], items: list[Any]) -> dict[str, Any]:
        """``line`` with these answer tokens' ``logprobs`` (none: no field, as Ollama)."""
        if self.held is None or not items:
            return line
        return {**line, "logprobs": token_entries(self.held.piece, items)}

    def line(self, text: str = "", thinking: str = "", calls: list[CallOutcome] | None = None,
             cut: bool = False, first: int = 0) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "created_at": rfc3339()}
        if self.chat:
            out["message"] = {"role": "assistant", "content": text}
        body = out["message"] if self.chat else out
        body["content" if self.chat else "response"] = text
        if thinking:
            body["thinking"] = thinking
        if self.chat and calls and (whole := tool_calls(calls, cut, first)):  # (none: no field)
            body["tool_calls"] = whole
        return {**out, "done": False}

    async def final(self, line: dict[str, Any], finish: str, usage: ev.UsageReport | None,
                    timings: dict[str, float] | None, raw: str = "") -> dict[str, Any]:
        """``line`` as the last one: done, why, the counts and durations, and
        ``context`` when it is given."""
        t = timings or {}
        if self.context is not None:
            line = {**line, "context": await self.context(raw)}
        return {**line, "done": True, "done_reason": "length" if finish == "length" else "stop",
                "total_duration": time.perf_counter_ns() - self.started_ns,
                "load_duration": self.load_ns,
                "prompt_eval_count": usage.prompt_tokens if usage else 0,
                "prompt_eval_duration": int(t.get("prompt_ms", 0.0) * 1e6),
                "eval_count": usage.completion_tokens if usage else 0,
                "eval_duration": int(t.get("predicted_ms", 0.0) * 1e6)}


def _arguments(call: CallOutcome) -> dict[str, Any] | None:
    try:
        args = json.loads(call.arguments or "{}")
    except (ValueError, RecursionError):
        return None
    return args if isinstance(args, dict) else None


def tool_calls(calls: list[CallOutcome], cut: bool = False, first: int = 0
               ) -> list[dict[str, Any]]:
    """Ollama's ``tool_calls``: the complete calls, each one's arguments an object (``cut``:
    the output ran out, so a last call with no arguments yet is no call), and its
    ``index`` among the answer's calls (``first``: of the first one here; a stream sends
    each call in its own line, and clients such as Open WebUI gather them by index)."""
    if cut and calls and not calls[-1].arguments:
        calls = calls[:-1]
    done = [(c, a) for c in calls if (a := _arguments(c)) is not None]
    return [{"id": c.id, "function": {"index": i, "name": c.name, "arguments": a}}
            for i, (c, a) in enumerate(done, first)]


async def stream_lines(meta: Meta, events: AsyncIterator[ev.Event]
                       ) -> AsyncIterator[dict[str, Any]]:
    """The NDJSON lines of a streamed answer (one choice); closes ``events`` at the end or
    when abandoned, which aborts the generation."""
    calls: list[CallOutcome] = []  # the call begun, sent whole when the next begins or at the end
    finish, usage, timings, raw, stopped, sent = "stop", None, None, "", False, 0
    try:
        async for e in events:
            if isinstance(e, ev.ErrorEvent):
                yield shape(e.error, meta.path)
                return
            if isinstance(e, ev.TextDelta):
                yield meta.logprobs(meta.line(e.text), meta.held.add(e.text, e.logprob)
                                    if meta.held else [])
            elif isinstance(e, ev.ReasoningDelta):
                yield meta.line(thinking=e.text)
            ends_call = isinstance(e, ev.Finish) or isinstance(e, ev.ToolCallDelta) and e.name
            cut = isinstance(e, ev.Finish) and e.reason == "length"
            if ends_call and (n := len(tool_calls(calls, cut))):
                yield meta.line(calls=calls, cut=cut, first=sent)
                sent += n
            if ends_call:
                calls = []
            if isinstance(e, ev.ToolCallDelta):
                if e.name is not None:
                    calls.append(CallOutcome(e.id or "", e.name, ""))
                calls[-1].arguments += e.arguments
            elif isinstance(e, ev.Finish):
                finish, timings, raw, stopped = e.reason, e.timings, e.raw, e.stopped
            elif isinstance(e, ev.UsageReport):
                usage = e
        last = meta.logprobs(meta.line(), meta.held.finish(stopped) if meta.held else [])
        yield await meta.final(last, finish, usage, timings, raw)
    finally:
        await events.aclose()  # type: ignore[attr-defined]


async def whole(meta: Meta, events: AsyncIterator[ev.Event]) -> dict[str, Any]:
    """The one body of a non-streamed answer; raises the APIError of a failure."""
    out = await gather(events, 1)
    c = out.choices[0]
    line = meta.line(c.text, c.reasoning, c.calls, cut=c.finish == "length")
    if meta.held is not None:  # (a stop string's tokens are not the answer's)
        line = meta.logprobs(line, within(meta.held.piece, c.logprobs, c.text)
                             if c.stopped else c.logprobs)
    return await meta.final(line, c.finish, out.usage, out.timings, c.raw)


class NdjsonStream(StreamingResponse):
    """Newline-delimited JSON, one ``send`` a line. It ends when the client disconnects
    (Starlette's watch) or does not take a line within ``send_timeout`` seconds; either way
    the lines' source is closed, aborting the generation behind it."""

    media_type = "application/x-ndjson"

    def __init__(self, lines: AsyncIterator[dict[str, Any]], send_timeout: float,
                 background: BackgroundTask | None = None) -> None:
        super().__init__(lines, headers={"Cache-Control": "no-store"},  # type: ignore[arg-type]
                         background=background)
        self.send_timeout = send_timeout

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        async for line in self.body_iterator:
            chunk = json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
            with anyio.fail_after(self.send_timeout):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        after, self.background = self.background, None  # run once the generation is closed
        try:
            await super().__call__(scope, receive, send)
        except TimeoutError:
            log.warning("an NDJSON stream was not read for %gs: closed", self.send_timeout)
            unread.mark()
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
        if after is not None:
            await after()


# -- answering --------------------------------------------------------------------------
async def _load(p: ModelPool, name: str) -> int:
    """Load the named model unless it is loaded; the nanoseconds that took."""
    if name == "auto" or p.entries[p.resolve(name)].state is ModelState.LOADED:
        return 0
    t0 = time.perf_counter_ns()
    await p.acquire(name)
    return time.perf_counter_ns() - t0


def _unload_after(request: Request, model_id: str) -> BackgroundTask:
    """keep_alive 0: once the answer is sent, give back this request's leases and unload
    the model, unless other requests use it (then its ttl applies)."""
    held, p = leases(request), pool(request)

    async def unload() -> None:
        for lease in held:
            lease.release()
        if not await p.unload(model_id):
            log.info("keep_alive 0: model %s is in use and stays loaded", model_id)

    return BackgroundTask(unload)


async def _load_or_unload(p: ModelPool, name: str, parsed: Parsed, meta: Meta) -> Response:
    reason = "unload" if parsed.keep_alive == 0 else "load"
    if reason == "load":
        meta.load_ns = await _load(p, name)
        if parsed.keep_alive is not None and name != "auto":
            p.keep(name, parsed.keep_alive)
    elif name != "auto":
        model_id = p.resolve(name)
        if p.entries[model_id].served is not None and not await p.unload(model_id):
            p.keep(model_id, 0)  # busy: unloaded once its requests end, as Ollama does
    return JSONResponse({**meta.line(), "done": True, "done_reason": reason,
                         "load_duration": meta.load_ns})


async def answer(request: Request, parsed: Parsed, name: str, chat: bool) -> Response:
    """Generate ``parsed`` with model ``name`` (as the pool knows it), streamed or whole."""
    meta = Meta(parsed.model, chat, request.url.path)
    p = pool(request)
    if parsed.req is None:
        return await _load_or_unload(p, name, parsed, meta)
    meta.load_ns = await _load(p, name)
    if parsed.req.template_kwargs.get("enable_thinking") and name != "auto" and not splits(
            (served := p.get(name)).cfg.reasoning_format, served.template.source):
        raise InvalidRequest(f'"{parsed.model}" does not support thinking', param="think")
    gen = await _fitting(request, replace(parsed.req, model=name), parsed.truncate)
    if parsed.returns_context:
        meta.context = gen.conversation
    if parsed.req.params.logprobs is not None:
        meta.held = HeldLogprobs(gen.piece)
    after = _unload_after(request, gen.model) if parsed.keep_alive == 0 else None
    if parsed.keep_alive:  # seconds after this request (inf: for good) instead of the ttl
        p.keep(gen.model, parsed.keep_alive)
    if parsed.stream:
        return NdjsonStream(stream_lines(meta, gen.events), request.app.state.send_timeout,
                            background=after)
    body = await unless_disconnected(request, whole(meta, gen.events))
    if body is None:
        return Response(status_code=CLIENT_GONE)
    return JSONResponse(body, background=after)


async def _fitting(request: Request, req: GenerateRequest, truncate: bool) -> Generation:
    """Start ``req``. A chat whose prompt does not fit the context drops its oldest turns
    (``respond.turn_cuts``; system messages stay), as Ollama truncates a chat's history;
    what still does not fit (or a /api/generate prompt) keeps its first ``num_keep`` tokens
    and its tail (``req.keep_head``, set when ``truncate``); with ``truncate`` false, the
    400."""
    rid, chat = f"ollama-{uuid.uuid4().hex}", req.prompt
    msgs = chat.messages if truncate and isinstance(chat, ChatPrompt) else ()
    system = [m for m in msgs if m["role"] == "system"]
    rest = [m for m in msgs if m["role"] != "system"]
    cuts = turn_cuts(rest)

    def at(cut: int) -> GenerateRequest:  # the prompt's own cut (keep_head) comes last
        r = req if not cut else replace(req, prompt=ChatPrompt((*system, *rest[cut:])))
        return r if cut == cuts[-1] else replace(r, keep_head=None)

    gen, cut = await start_fitting(request, cuts, at, rid)
    if cut:
        log.info("%s: dropped the oldest %d messages to fit the context", rid, cut)
    return gen


async def embeddings_answer(request: Request, asked: str, name: str, texts: list[str],
                            truncate: bool, dimensions: int | None,
                            legacy: bool = False, keep: float | None = None) -> Response:
    """/api/embed (``legacy``: /api/embeddings) for ``texts``; none: the model is loaded.
    ``truncate``: texts longer than the embedding context are cut to fit (else 400).
    ``keep``: the request's keep_alive (seconds; 0: unload after the answer)."""
    t0, p, held = time.perf_counter_ns(), pool(request), leases(request)
    load_ns = await _load(p, name)
    model_id = p.resolve(name) if name != "auto" else None
    after = _unload_after(request, model_id) if keep == 0 and model_id else None
    if keep and model_id:
        p.keep(model_id, keep)
    items: tuple[str | list[int], ...] = tuple(texts)
    if truncate and texts:
        served = await model_for(p, name, held)
        n = served.embedder.n_ctx  # (the text cut first: its first n tokens lie within)
        items = tuple([(await served.run(served.tokenize_text, t[:n * MAX_TOKEN_BYTES]))[:n]
                       for t in texts])
    result = None
    if items:
        result = await unless_disconnected(request, embed(p, EmbedRequest(name, items), held))
        if result is None:  # the client left: its work was stopped
            return Response(status_code=CLIENT_GONE)
    vectors = result.vectors if result else []
    if dimensions is not None:
        vectors = shortened(vectors, dimensions)
    if legacy:
        return JSONResponse({"embedding": vectors[0] if vectors else []}, background=after)
    return await json_response({"model": asked, "embeddings": vectors, "load_duration": load_ns,
                                "total_duration": time.perf_counter_ns() - t0,
                                "prompt_eval_count": result.tokens if result else 0},
                               background=after)


def openapi_paths(routes: Iterable[Route], bodies: dict[str, set[str]]) -> dict[str, Any]:
    """The routes' OpenAPI entries (Ollama's shapes; ``bodies``: a path's body fields)."""
    out: dict[str, Any] = {}
    for r in routes:
        for method in sorted((r.methods or set()) - {"HEAD"}) or ["head"]:
            op: dict[str, Any] = {"summary": f"Ollama API: {r.path}", "responses": {
                "200": {"description": "as Ollama (application/x-ndjson when streamed)"},
                "4XX": {"description": "{\"error\": \"...\"}"}}}
            if params := [{"name": n, "in": "path", "required": True,
                           "schema": {"type": "string"}} for n in r.param_convertors]:
                op["parameters"] = params
            if r.path in bodies:
                op["requestBody"] = {"content": {"application/json": {"schema": {
                    "type": "object", "required": ["model"],
                    "properties": {f: {} for f in sorted(bodies[r.path])}}}}}
            out.setdefault(r.path, {})[method.lower()] = op
    return out
