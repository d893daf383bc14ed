"""OpenAI response bodies and SSE chunk streams built from engine deltas.

A response has one or more choices (``n``, or several prompts on
/v1/completions); each choice is one engine request. ``merge`` interleaves
their deltas as ``(choice index, delta)``; closing it aborts the requests
still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.engine.delta import Delta, Failure, FailureCode
from edgeinfer.errors import APIError, EngineError
from edgeinfer.engine.logprobs import TokenLogprob
from edgeinfer.prompt.tools import Event, ToolCallStream, parse_tool_calls


@dataclass(slots=True)
class CompletionMeta:
    """What every chunk and body of one response repeats."""

    kind: str  # "chat" or "text"
    model: str
    piece: Callable[[int], bytes] = field(default=lambda t: b"")  # token -> its bytes
    tools: bool = False  # parse tool calls out of the text (chat)
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            prefix = "chatcmpl-" if self.kind == "chat" else "cmpl-"
            self.id = prefix + uuid.uuid4().hex[:24]

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.kind == "chat" else "text_completion"

    def base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": "edgeinfer"}


@dataclass(slots=True)
class Usage:
    """Token counts of a response; each distinct prompt counts once."""

    prompt_of: list[int]  # choice index -> prompt index
    prompt_lengths: list[int]
    completion: int = 0
    cached: dict[int, int] = field(default_factory=dict)  # prompt index -> cached tokens

    def add(self, index: int, last: Delta) -> None:
        self.completion += last.completion_tokens
        p = self.prompt_of[index]
        self.cached[p] = min(self.cached.get(p, last.cached_tokens), last.cached_tokens)

    def body(self) -> dict[str, Any]:
        prompt = sum(self.prompt_lengths)
        return {"prompt_tokens": prompt, "completion_tokens": self.completion,
                "total_tokens": prompt + self.completion,
                "prompt_tokens_details": {"cached_tokens": sum(self.cached.values())}}


async def merge(gens: list[AsyncIterator[Delta]]) -> AsyncIterator[tuple[int, Delta]]:
    """Interleave the choices' deltas; each ends with its finishing delta."""
    queue: asyncio.Queue[tuple[int, Delta]] = asyncio.Queue()

    async def pump(i: int, gen: AsyncIterator[Delta]) -> None:
        async for d in gen:
            queue.put_nowait((i, d))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    try:
        remaining = len(gens)
        while remaining:
            i, d = await queue.get()
            if d.finish_reason is not None:
                remaining -= 1
            yield i, d
    finally:
        for t in tasks:  # cancelling a pump aborts its engine request
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t


def logprobs_body(meta: CompletionMeta, items: list[TokenLogprob],
                  text_offset: int = 0) -> dict[str, Any] | None:
    """The ``logprobs`` of a choice, chat or completions shape; None when not asked."""
    if not items:
        return None

    def text(tok: int) -> str:
        return meta.piece(tok).decode("utf-8", "replace")

    if meta.kind == "chat":
        return {"content": [{
            "token": text(lp.token), "logprob": lp.logprob, "bytes": list(meta.piece(lp.token)),
            "top_logprobs": [{"token": text(t), "logprob": v, "bytes": list(meta.piece(t))}
                             for t, v in lp.top],
        } for lp in items], "refusal": None}
    offsets, pos = [], text_offset
    for lp in items:
        offsets.append(pos)
        pos += len(text(lp.token))
    return {
        "tokens": [text(lp.token) for lp in items],
        "token_logprobs": [lp.logprob for lp in items],
        "top_logprobs": [{text(t): v for t, v in lp.top} for lp in items],
        "text_offset": offsets,
    }


def _choice(meta: CompletionMeta, index: int, text: str | None, finish: str | None,
            first: bool = False, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    if meta.kind == "chat":
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        return _chat_choice(index, delta, finish, logprobs)
    return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}


def _tool_delta(e: Event) -> dict[str, Any]:
    if e[0] == "content":
        return {"content": e[1]}
    if e[0] == "call":
        return {"tool_calls": [{"index": e[1], "id": e[2], "type": "function",
                                "function": {"name": e[3], "arguments": ""}}]}
    return {"tool_calls": [{"index": e[1], "function": {"arguments": e[2]}}]}


def _chat_choice(index: int, delta: dict[str, Any], finish: str | None,
                 logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def delta_error(d: Delta) -> APIError:
    """The API error for a request the engine ended with an error."""
    failure = d.failure or Failure(FailureCode.INTERNAL, "generation failed")
    if failure.code is FailureCode.TIMEOUT:
        return APIError(failure.message, code="timeout", status=504)
    if failure.code is FailureCode.SHUTDOWN:
        return APIError(failure.message, code="server_shutting_down", status=503)
    return EngineError(failure.message, code=failure.code.value)


async def sse_chunks(
    meta: CompletionMeta, events: AsyncIterator[tuple[int, Delta]], usage: Usage,
    include_usage: bool,
) -> AsyncIterator[dict[str, str]]:
    """The SSE events of a streamed response, ending with ``[DONE]``."""

    def event(choice: dict[str, Any], **extra: Any) -> dict[str, str]:
        body = {**meta.base(obj), "choices": [choice], **extra}
        if include_usage:
            body["usage"] = None
        return {"data": json.dumps(body, ensure_ascii=False)}

    obj = meta.chunk_object
    n = len(usage.prompt_of)
    if meta.kind == "chat":
        for i in range(n):
            yield event(_choice(meta, i, "", None, first=True))
    offsets = [0] * n
    parsers = [ToolCallStream() for _ in range(n)] if meta.tools else []
    try:
        async for i, d in events:
            if d.finish_reason == "error":
                yield {"data": json.dumps(delta_error(d).to_dict())}
                break
            if parsers:
                found = parsers[i].feed(d.text)
                if d.finish_reason is not None:
                    found += parsers[i].finish()
                for e in found:
                    yield event(_chat_choice(i, _tool_delta(e), None))
            elif d.text or d.logprob:
                lps = logprobs_body(meta, [d.logprob] if d.logprob else [], offsets[i])
                yield event(_choice(meta, i, d.text, None, logprobs=lps))
                offsets[i] += len(d.text)
            if d.finish_reason is not None:
                usage.add(i, d)
                extra = {"timings": d.timings} if d.timings else {}
                reason = d.finish_reason
                if parsers and parsers[i].num_calls and reason == "stop":
                    reason = "tool_calls"
                yield event(_choice(meta, i, None, reason), **extra)
        else:
            if include_usage:
                yield {"data": json.dumps({**meta.base(obj), "choices": [],
                                           "usage": usage.body()})}
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    yield {"data": "[DONE]"}


async def collect(meta: CompletionMeta, events: AsyncIterator[tuple[int, Delta]],
                  usage: Usage) -> dict[str, Any]:
    """The whole (non-streamed) response body."""
    n = len(usage.prompt_of)
    parts: list[list[str]] = [[] for _ in range(n)]
    lps: list[list[TokenLogprob]] = [[] for _ in range(n)]
    finish: list[str] = [""] * n
    timings = None
    try:
        async for i, d in events:
            if d.finish_reason == "error":
                raise delta_error(d)
            parts[i].append(d.text)
            if d.logprob:
                lps[i].append(d.logprob)
            if d.finish_reason is not None:
                finish[i] = d.finish_reason
                usage.add(i, d)
                timings = timings or d.timings
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    choices: list[dict[str, Any]] = []
    for i in range(n):
        text = "".join(parts[i])
        if meta.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            reason = finish[i]
            if meta.tools:
                content, calls = parse_tool_calls(text)
                if calls:
                    message = {"role": "assistant", "content": content,
                               "tool_calls": [c.openai() for c in calls]}
                    reason = "tool_calls" if reason == "stop" else reason
            choices.append({"index": i, "message": message,
                            "logprobs": logprobs_body(meta, lps[i]), "finish_reason": reason})
        else:
            choices.append({"index": i, "text": text, "logprobs": logprobs_body(meta, lps[i]),
                            "finish_reason": finish[i]})
    obj = "chat.completion" if meta.kind == "chat" else "text_completion"
    body = {**meta.base(obj), "choices": choices, "usage": usage.body()}
    if timings:
        body["timings"] = timings
    return body
