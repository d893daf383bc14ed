"""OpenAI response bodies and SSE chunk streams built from engine deltas."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.engine import Delta
from edgeinfer.errors import EngineError
from edgeinfer.logprobs import TokenLogprob


@dataclass(slots=True)
class CompletionMeta:
    """What every chunk and body of one response repeats."""

    kind: str  # "chat" or "text"
    model: str
    piece: Callable[[int], bytes] = field(default=lambda t: b"")  # token -> its bytes
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


def usage(last: Delta) -> dict[str, Any]:
    return {
        "prompt_tokens": last.prompt_tokens,
        "completion_tokens": last.completion_tokens,
        "total_tokens": last.prompt_tokens + last.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": last.cached_tokens},
    }


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


def _choice(meta: CompletionMeta, text: str | None, finish: str | None,
            first: bool = False, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    if meta.kind == "chat":
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    return {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}


def error_body(message: str, status_type: str = "server_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": status_type, "param": None, "code": None}}


async def sse_chunks(
    meta: CompletionMeta, deltas: AsyncIterator[Delta], include_usage: bool
) -> AsyncIterator[dict[str, str]]:
    """The SSE events of a streamed response, ending with ``[DONE]``."""

    def event(body: dict[str, Any]) -> dict[str, str]:
        if include_usage and "usage" not in body:
            body["usage"] = None
        return {"data": json.dumps(body, ensure_ascii=False)}

    obj = meta.chunk_object
    if meta.kind == "chat":
        yield event({**meta.base(obj), "choices": [_choice(meta, "", None, first=True)]})
    offset = 0
    async for d in deltas:
        if d.finish_reason == "error":
            yield {"data": json.dumps(error_body(d.error or "generation failed"))}
            break
        if d.text or d.logprob:
            lps = logprobs_body(meta, [d.logprob] if d.logprob else [], offset)
            yield event({**meta.base(obj), "choices": [_choice(meta, d.text, None, logprobs=lps)]})
            offset += len(d.text)
        if d.finish_reason is not None:
            final = {**meta.base(obj), "choices": [_choice(meta, None, d.finish_reason)]}
            if d.timings:
                final["timings"] = d.timings
            yield event(final)
            if include_usage:
                yield {"data": json.dumps({**meta.base(obj), "choices": [], "usage": usage(d)})}
    yield {"data": "[DONE]"}


async def collect(meta: CompletionMeta, deltas: AsyncIterator[Delta]) -> dict[str, Any]:
    """The whole (non-streamed) response body."""
    parts: list[str] = []
    lps: list[TokenLogprob] = []
    last: Delta | None = None
    async for d in deltas:
        parts.append(d.text)
        if d.logprob:
            lps.append(d.logprob)
        last = d
    assert last is not None and last.finish_reason is not None
    if last.finish_reason == "error":
        raise EngineError(last.error or "generation failed")
    text = "".join(parts)
    if meta.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0, "message": {"role": "assistant", "content": text},
            "logprobs": logprobs_body(meta, lps), "finish_reason": last.finish_reason,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs_body(meta, lps),
                  "finish_reason": last.finish_reason}
        obj = "text_completion"
    body = {**meta.base(obj), "choices": [choice], "usage": usage(last)}
    if last.timings:
        body["timings"] = last.timings
    return body
