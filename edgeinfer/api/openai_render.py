"""OpenAI response bodies and SSE chunks (chat and text completions) from service events."""

from __future__ import annotations

import codecs
import itertools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from sse_starlette.sse import EventSourceResponse, SendTimeoutError

from edgeinfer.api import unread
from edgeinfer.engine.logprobs import TokenLogprob
from edgeinfer.service.events import (
    ErrorEvent,
    Event,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UsageReport,
)
from edgeinfer.service.outcome import ChoiceOutcome, gather
from edgeinfer.service.request import MixedPrompt

log = logging.getLogger("edgeinfer.api")


@dataclass(slots=True)
class CompletionMeta:
    """What every chunk and body of one response repeats."""

    kind: str  # "chat" or "text"
    functions: bool = False  # the request used the deprecated functions: answer in kind
    model: str = ""
    piece: Callable[[int], bytes] = field(default=lambda t: b"")  # token -> its bytes
    logprobs: bool = False  # asked for: a whole answer has them even when none are left
    echo: tuple[Any, ...] = ()  # completions' ``echo``: the prompts, choice c's is c // n
    n: int = 1
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            prefix = "chatcmpl-" if self.kind == "chat" else "cmpl-"
            self.id = prefix + uuid.uuid4().hex[:24]

    def echoed(self, choice: int) -> str:
        """The prompt of ``choice`` as text where ``echo`` asked for it, else ""."""
        if not self.echo:
            return ""
        p = self.echo[choice // self.n]
        parts = p.parts if isinstance(p, MixedPrompt) else [p] if isinstance(p, str) else p
        out = []  # each run of token ids decoded whole: a character may span tokens
        for is_text, run in itertools.groupby(parts, key=lambda t: isinstance(t, str)):
            ids = list(run)
            out.append("".join(ids) if is_text else
                       b"".join(self.piece(t) for t in ids).decode("utf-8", "replace"))
        return "".join(out)

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.kind == "chat" else "text_completion"

    def base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": "edgeinfer"}


def usage_body(u: UsageReport) -> dict[str, Any]:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def token_entries(piece: Callable[[int], bytes], items: list[TokenLogprob], ids: bool = False
                  ) -> list[dict[str, Any]]:
    """Each token's text, logprob and bytes with its top alternatives, as OpenAI's chat
    and Responses give them (``ids``: with the token id too, as llama-server's
    ``completion_probabilities``)."""
    def one(token: int, logprob: float) -> dict[str, Any]:
        raw = piece(token)
        entry = {"token": raw.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(raw)}
        return {"id": token, **entry} if ids else entry
    return [{**one(lp.token, lp.logprob), "top_logprobs": [one(t, v) for t, v in lp.top]}
            for lp in items]


def char_offsets(pieces: list[bytes], start: int = 0, partial: bytes = b""
                 ) -> tuple[list[int], int, bytes]:
    """Each token's ``text_offset``: the characters written before it, a character counted
    once its last byte came (a token may hold part of one). Also the offset after them and
    the bytes of a character not complete yet, to go on from (``start``, ``partial``)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(partial)
    offsets, pos = [], start
    for raw in pieces:
        offsets.append(pos)
        pos += len(decoder.decode(raw))
    return offsets, pos, decoder.getstate()[0]


def logprobs_body(meta: CompletionMeta, items: list[TokenLogprob],
                  text_offset: int = 0, partial: bytes = b"") -> dict[str, Any] | None:
    """The ``logprobs`` of a choice, chat or completions shape; None when not asked
    (``text_offset``, ``partial``: where the text before these tokens ended)."""
    if not items:
        return None

    def text(tok: int) -> str:
        return meta.piece(tok).decode("utf-8", "replace")

    if meta.kind == "chat":
        return {"content": token_entries(meta.piece, items), "refusal": None}
    offsets = char_offsets([meta.piece(lp.token) for lp in items], text_offset, partial)[0]
    return {
        "tokens": [text(lp.token) for lp in items],
        "token_logprobs": [lp.logprob for lp in items],
        "top_logprobs": [{text(t): v for t, v in lp.top} for lp in items],
        "text_offset": offsets,
    }


def no_logprobs(meta: CompletionMeta) -> dict[str, Any]:
    """The ``logprobs`` of a choice or chunk that asked for them and has no token."""
    return ({"content": [], "refusal": None} if meta.kind == "chat" else
            {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []})


class HeldLogprobs:
    """A streamed choice's token logprobs, each held until the text it wrote has been
    sent: text that might start a stop string is held back, and a stop string's tokens
    are not part of the answer (as in a whole answer, and in llama-server's stream)."""

    def __init__(self, piece: Callable[[int], bytes]) -> None:
        self.piece = piece
        self.offset = 0  # characters of text the tokens sent so far wrote
        self.partial = b""  # and the bytes of a character they began, not complete yet
        self._pending: list[TokenLogprob] = []
        self._room = 0  # bytes of text sent that no token sent so far accounts for

    def add(self, text: str, logprob: TokenLogprob | None) -> list[TokenLogprob]:
        """The tokens to send with ``text`` (which may be "" while text is held)."""
        if logprob is not None:
            self._pending.append(logprob)
        self._room += len(text.encode())
        out: list[TokenLogprob] = []
        while self._pending and len(self.piece(self._pending[0].token)) <= self._room:
            lp = self._pending.pop(0)
            self._room -= len(self.piece(lp.token))
            out.append(lp)
        self._sent(out)
        return out

    def finish(self, stopped: bool) -> list[TokenLogprob]:
        """The tokens still held: none when a stop string ended the text."""
        out, self._pending = ([] if stopped else self._pending), []
        self._sent(out)
        return out

    def _sent(self, items: list[TokenLogprob]) -> None:
        _, self.offset, self.partial = char_offsets([self.piece(lp.token) for lp in items],
                                                    self.offset, self.partial)


def _delta(e: TextDelta | ToolCallDelta | ReasoningDelta, functions: bool = False
           ) -> dict[str, Any]:
    if isinstance(e, TextDelta):
        return {"content": e.text}
    if isinstance(e, ReasoningDelta):
        return {"reasoning_content": e.text}
    if functions:  # the deprecated shape: one call, no index or id
        named = {"name": e.name} if e.name is not None else {}
        return {"function_call": {**named, "arguments": e.arguments}}
    if e.name is not None:
        return {"tool_calls": [{"index": e.index, "id": e.id, "type": "function",
                                "function": {"name": e.name, "arguments": e.arguments}}]}
    return {"tool_calls": [{"index": e.index, "function": {"arguments": e.arguments}}]}


def _choice(meta: CompletionMeta, index: int, delta: dict[str, Any], finish: str | None,
            logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    if meta.kind == "chat":
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    return {"index": index, "text": delta.get("content") or "", "logprobs": logprobs,
            "finish_reason": finish}


class _Chunks:
    """The chunks of one streamed response, choice by choice: a chat choice's first chunk
    has the role and content "" (null before a tool call, as OpenAI streams calls); blank
    text is held until what follows shows whether it is content (before a tool call, or
    after calls at the end, it is not, as the whole answer strips it); token logprobs come
    with the text they wrote (``HeldLogprobs``)."""

    def __init__(self, meta: CompletionMeta, num_choices: int, include_usage: bool) -> None:
        self.meta, self.include_usage = meta, include_usage
        self.opened = [meta.kind != "chat"] * num_choices
        self.held = [HeldLogprobs(meta.piece) for _ in range(num_choices)]
        self.blanks: list[list[TextDelta]] = [[] for _ in range(num_choices)]
        self.called = [False] * num_choices

    def event(self, choice: dict[str, Any], **extra: Any) -> dict[str, str]:
        body = {**self.meta.base(self.meta.chunk_object), "choices": [choice], **extra}
        if self.include_usage:
            body["usage"] = None
        return {"data": json.dumps(body, ensure_ascii=False)}

    def role(self, i: int, e: Event) -> list[dict[str, str]]:
        if self.opened[i]:
            return []
        self.opened[i] = True
        first = None if isinstance(e, ToolCallDelta) else ""
        return [self.event(_choice(self.meta, i, {"role": "assistant", "content": first}, None))]

    def text(self, e: TextDelta) -> list[dict[str, str]]:
        held = self.held[e.choice]
        at = held.offset, held.partial
        lps = logprobs_body(self.meta, held.add(e.text, e.logprob), *at)
        if not e.text and not lps:
            return []
        if lps is None and self.meta.logprobs:  # its token's rest is still to come (a
            lps = no_logprobs(self.meta)  # character split over tokens, a held stop)
        return [*self.role(e.choice, e),
                self.event(_choice(self.meta, e.choice, _delta(e), None, lps))]

    def of(self, e: TextDelta | ToolCallDelta | ReasoningDelta | Finish) -> list[dict[str, str]]:
        i, meta = e.choice, self.meta
        if isinstance(e, TextDelta) and meta.kind == "chat" and not e.text.strip():
            self.blanks[i].append(e)
            return []
        if isinstance(e, TextDelta):
            texts, self.blanks[i] = [*self.blanks[i], e], []
            return [c for t in texts for c in self.text(t)]
        if isinstance(e, ToolCallDelta | ReasoningDelta):
            if isinstance(e, ToolCallDelta):
                self.called[i], self.blanks[i] = True, []
            return [*self.role(i, e), self.event(_choice(meta, i, _delta(e, meta.functions), None))]
        out = self.role(i, e) + [c for t in ([] if self.called[i] else self.blanks[i])
                                 for c in self.text(t)]
        at = self.held[i].offset, self.held[i].partial  # the tokens of text released at
        lps = logprobs_body(meta, self.held[i].finish(e.stopped), *at)  # the end (no stop's)
        if lps:
            out.append(self.event(_choice(meta, i, {"content": ""}, None, lps)))
        extra = {"timings": e.timings} if e.timings else {}
        return [*out, self.event(_choice(meta, i, {}, _reason(meta, e.reason)), **extra)]


async def sse_chunks(meta: CompletionMeta, events: AsyncIterator[Event], num_choices: int,
                     include_usage: bool) -> AsyncIterator[dict[str, str]]:
    """The SSE events of a streamed response, ending with ``[DONE]``."""
    chunks = _Chunks(meta, num_choices, include_usage)
    for i in range(num_choices if meta.echo else 0):  # each prompt first, as echoed
        yield chunks.event(_choice(meta, i, {"content": meta.echoed(i)}, None))
    try:
        async for e in events:
            if isinstance(e, ErrorEvent):
                yield {"data": json.dumps(e.error.to_dict())}
                break
            if isinstance(e, UsageReport):
                if include_usage:
                    yield {"data": json.dumps({**meta.base(meta.chunk_object), "choices": [],
                                               "usage": usage_body(e)})}
                continue
            for chunk in chunks.of(e):
                yield chunk
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    yield {"data": "[DONE]"}


async def collect(meta: CompletionMeta, events: AsyncIterator[Event],
                  num_choices: int) -> dict[str, Any]:
    """The whole (non-streamed) response body; raises the APIError of an ErrorEvent."""
    out = await gather(events, num_choices)
    body = {**meta.base("chat.completion" if meta.kind == "chat" else "text_completion"),
            "choices": [_body_choice(meta, i, c) for i, c in enumerate(out.choices)],
            "usage": usage_body(out.usage)}
    if out.timings:
        body["timings"] = out.timings
    return body


def _reason(meta: CompletionMeta, reason: str) -> str:
    return "function_call" if meta.functions and reason == "tool_calls" else reason


def within(piece: Callable[[int], bytes], items: list[TokenLogprob], text: str
           ) -> list[TokenLogprob]:
    """The tokens whose bytes lie within ``text``: those of a stop string are not part of
    the answer (llama-server leaves them out of a whole answer's probabilities too)."""
    room, out = len(text.encode()), []
    for lp in items:
        room -= len(piece(lp.token))
        if room < 0:
            break
        out.append(lp)
    return out


def _body_choice(meta: CompletionMeta, i: int, c: ChoiceOutcome) -> dict[str, Any]:
    lps = logprobs_body(meta, within(meta.piece, c.logprobs, c.text) if c.stopped
                        else c.logprobs)
    if lps is None and meta.logprobs:  # asked, but no token is the answer's
        lps = no_logprobs(meta)
    if meta.kind != "chat":
        return {"index": i, "text": meta.echoed(i) + c.text, "logprobs": lps,
                "finish_reason": c.finish}
    message: dict[str, Any] = {"role": "assistant", "content": c.text}
    if c.calls and meta.functions:
        message = {"role": "assistant", "content": c.text.strip() or None, "function_call": {
            "name": c.calls[0].name, "arguments": c.calls[0].arguments}}
    elif c.calls:
        message = {"role": "assistant", "content": c.text.strip() or None, "tool_calls": [
            {"id": k.id, "type": "function",
             "function": {"name": k.name, "arguments": k.arguments}} for k in c.calls]}
    if c.reasoning:
        message["reasoning_content"] = c.reasoning
    return {"index": i, "message": message, "logprobs": lps,
            "finish_reason": _reason(meta, c.finish)}


class Stream(EventSourceResponse):
    """Server-sent events that end (aborting the generation, freeing its slot) when the
    client stops reading for ``send_timeout`` seconds."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except SendTimeoutError:
            log.warning("a stream was not read for %gs: closed", self.send_timeout)
            unread.mark()
