"""One generation: a typed request in, one typed event stream out, for every dialect.

``generate`` picks and leases the model, builds the prompt tokens (chat template,
tools, markup), checks them against the model, makes the request's grammar,
fans the ``n`` choices of each prompt out to the engine (the prompt computed
once, through the prefix cache) and turns the engine's deltas into ``Event``s:
text, tool calls (parsed from the model's output as it streams), finish and
usage. Engine failures become typed API errors here, and only here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace

from edgeinfer.engine.delta import Delta, Failure, FailureCode
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.errors import APIError, EngineError, InvalidRequest, Overloaded, Timeout, Unavailable
from edgeinfer.models.lease import Lease
from edgeinfer.models.pool import ModelPool
from edgeinfer.models.served import ServedModel
from edgeinfer.prompt.callparser import partial_suffix
from edgeinfer.prompt.reasoning import harmony_reasoning, markers_for, starts_in_thought
from edgeinfer.prompt.template import CHATML_ENDS
from edgeinfer.prompt.tools import parameter_schemas, parameter_types
from edgeinfer.service import request as rq
from edgeinfer.service.constraint import grammar_for
from edgeinfer.service.events import ErrorEvent, Event, Finish, UsageReport
from edgeinfer.service.reader import ChoiceReader, Reading
from edgeinfer.service.request import ChatPrompt, GenerateRequest, MixedPrompt, TextPrompts
from edgeinfer.service.selection import NoneLeft, features, model_for

log = logging.getLogger("edgeinfer.service")


@dataclass(slots=True)
class Generation:
    """A running generation. Iterate ``events``; closing it aborts what still runs."""

    model: str  # the id of the model that answers
    num_choices: int
    piece: Callable[[int], bytes]  # token id -> its bytes (for logprobs)
    events: AsyncIterator[Event]
    prompt_lengths: tuple[int, ...] = ()  # the tokens of each prompt
    # a choice's raw output -> the first prompt's tokens (BOS left out) and the output's
    # (Ollama's ``context``)
    conversation: Callable[[str], Awaitable[list[int]]] | None = None

    @property
    def prompt_tokens(self) -> int:
        """Of every distinct prompt, before any generation."""
        return sum(self.prompt_lengths)


MAX_PREDICTION = 8192  # tokens of a request's prediction that draft (the rest: not used)


def failure_error(failure: Failure | None) -> APIError:
    """The API error for a request the engine ended with a failure."""
    f = failure or Failure(FailureCode.INTERNAL, "generation failed")
    if f.code is FailureCode.TIMEOUT:
        return Timeout(f.message, code="timeout")
    if f.code is FailureCode.SHUTDOWN:
        return Unavailable(f.message, code="server_shutting_down")
    if f.code is FailureCode.KV_FULL:  # capacity, for now: others hold the cells
        return Unavailable(f.message, code=f.code.value, retry_after=5)
    if f.code is FailureCode.GRAMMAR:
        return InvalidRequest(f.message, param="grammar", code=f.code.value)
    return EngineError(f.message, code=f.code.value)


@dataclass(frozen=True, slots=True)
class _Fitted:
    """A request checked against its model, its prompts rendered and tokenized."""

    served: ServedModel
    req: GenerateRequest
    params: SamplingParams
    implicit: tuple[str, ...]  # the template's own stop strings
    read: Prompts
    prompts: list[list[int]]


async def _fitted(pool: ModelPool, req: GenerateRequest, leases: list[Lease],
                  request_id: str, skip: tuple[str, ...] = ()) -> _Fitted:
    """``req`` on its model (passing over those in ``skip``), its prompts made; 400
    context_length_exceeded (and the other errors of ``generate``) where they do not fit
    the context."""
    served = await model_for(pool, req.model, leases, choices=req.num_choices,
                             routing=features(req), wait=req.wait_for_model, skip=skip)
    _check_vocab(req, served.runtime.info.n_vocab)
    rq.check_text_size(req, served.n_ctx)
    params = req.params
    if params.max_tokens is None and served.cfg.max_tokens is not None:
        params = replace(params, max_tokens=served.cfg.max_tokens)  # the model's default
    req, params, implicit = _without_template(served, req, params)
    read = await _prompts(served, req)
    prompts = read.tokens
    if req.keep_head is not None:
        prompts = [middle_cut(p, served.n_ctx, req.keep_head, params.max_tokens, request_id)
                   for p in prompts]
    room = served.n_ctx - max((len(p) for p in prompts), default=0)
    if req.max_tokens_is_cap and params.max_tokens is not None and room >= 1:
        params = replace(params, max_tokens=min(params.max_tokens, room))
    where = "messages" if isinstance(req.prompt, ChatPrompt) else "prompt"
    for p in prompts:
        served.check_fits(len(p), params.max_tokens, where)
    return _Fitted(served, req, params, implicit, read, prompts)


async def prompt_fits(pool: ModelPool, req: GenerateRequest, leases: list[Lease]) -> bool:
    """Whether ``req``'s prompts fit its model's context (nothing is started; other
    errors are raised as ``generate`` raises them)."""
    try:
        await _fitted(pool, req, leases, "fits")
    except InvalidRequest as exc:
        if exc.code != "context_length_exceeded":
            raise
        return False
    return True


async def generate(pool: ModelPool, req: GenerateRequest, leases: list[Lease],
                   request_id: str, skip: tuple[str, ...] = ()) -> Generation:
    """Start ``req``; its engine requests are named ``{request_id}-{k}``. Raises APIError
    (4xx / 429 / 503) for what is wrong before anything is generated. A model found
    saturated right before submitting (a burst filled its queue while this request was
    rendered) passes the request down its fallbacks, as ``model_for`` does."""
    held = len(leases)
    f = await _fitted(pool, req, leases, request_id, skip)
    try:
        return await _started(f, req, leases, request_id)
    except Overloaded as exc:
        while len(leases) > held:  # model_for's lease of that model: it may unload now
            leases.pop().release()
        try:
            return await generate(pool, req, leases, request_id, (*skip, f.served.cfg.id))
        except NoneLeft:
            raise exc from None
        except APIError as other:  # no fallback could take it: the one named was busy
            log.warning("%s: busy %s's fallback failed: %s", request_id, f.served.cfg.id, other)
            raise exc from None


async def _started(f: _Fitted, req: GenerateRequest, leases: list[Lease],
                   request_id: str) -> Generation:
    """Submit the fitted request: its constraint made, its places reserved (Overloaded
    when the queue filled since ``model_for`` admitted it)."""
    served, req, params, implicit, read, prompts = (
        f.served, f.req, f.params, f.implicit, f.read, f.prompts)
    # a prompt that leaves a reasoning block open: the constraint applies after the block
    reading = read.reading
    close_marker = reading.markers.close if reading.markers and reading.in_thought else None
    fmt = reading.tools or served.tool_format  # (as the prompt left it: see reading_for)
    gbnf, triggers = await served.run(grammar_for, served.runtime.vocab, req.constraint,
                                      close_marker, fmt)
    reading = _calls_end_thought(reading, triggers)
    if gbnf is not None:
        params = replace(params, grammar=gbnf, grammar_triggers=triggers)
        if req.constraint.offers_tools and not triggers:  # calls from the first token:
            params = replace(params, stop=implicit)  # no stop string cuts a call
    if req.prediction and params.speculative:
        predicted = await served.run(functools.partial(
            served.runtime.tokenize, req.prediction, add_special=False, parse_special=False))
        params = replace(params, prediction=tuple(predicted[:MAX_PREDICTION]))
    # a forced call (or schema answer) waits after the block: the output may not end in it
    waits = gbnf is not None and close_marker is not None and triggers == (close_marker,)
    if close_marker is not None and (req.reasoning_budget is not None or waits):
        close = await served.run(functools.partial(
            served.runtime.tokenize, close_marker, add_special=False, parse_special=True))
        budget = req.reasoning_budget if req.reasoning_budget is not None else 1 << 30
        params = replace(params, reasoning_budget=budget, reasoning_close=tuple(close),
                         reasoning_end_closes=waits)
    jobs = [(pi, prompt, rq.choice_params(params, i, len(prompts) * req.n == 1))
            for pi, prompt in enumerate(prompts) for i in range(req.n)]
    # checked again right before submitting (model_for's check ran before rendering and
    # tokenizing, while other requests kept arriving), and the places held from here on
    places = served.reserve(len(jobs))
    leases.append(places)
    streams = [served.generate(f"{request_id}-{k}", prompt, p, places,
                               use_cache=req.cache_prompt, priority=req.priority,
                               group=request_id)
               for k, (_, prompt, p) in enumerate(jobs)]
    events = to_events(merge(streams), [pi for pi, _, _ in jobs], [len(p) for p in prompts],
                       reading, implicit, lambda k: served.finish_early(f"{request_id}-{k}"))
    return Generation(served.cfg.id, len(jobs), served.runtime.piece, events, tuple(
        map(len, prompts)), functools.partial(_conversation, served, prompts[0]))


def middle_cut(tokens: list[int], n_ctx: int, keep: int, max_tokens: int | None,
               request_id: str = "") -> list[int]:
    """``tokens`` when they fit the context, else their first ``keep`` and their last ones,
    leaving the answer ``max_tokens`` (at most half the context; a quarter when not given):
    Ollama's runner keeps ``num_keep`` and the tail of a prompt longer than its context."""
    if len(tokens) < n_ctx:
        return tokens
    room = min(max_tokens, n_ctx // 2) if max_tokens else n_ctx // 4
    budget = max(n_ctx - room, 1)
    head = min(max(keep, 0), budget // 2)
    log.warning("%s: prompt of %d tokens truncated to %d (the first %d kept) to fit a "
                "context of %d", request_id, len(tokens), budget, head, n_ctx)
    return tokens[:head] + tokens[len(tokens) - (budget - head):]


def _without_template(served: ServedModel, req: GenerateRequest, params: SamplingParams
                      ) -> tuple[GenerateRequest, SamplingParams, tuple[str, ...]]:
    """A chat request to a model without a chat template of its own (a base model): the
    prompt alone when the dialect asks for it (Ollama's generate), else ChatML with its
    markers as stop strings (to the model they are text, not end-of-generation tokens).
    Returns the request, its parameters and the stop strings added."""
    if not isinstance(req.prompt, ChatPrompt) or served.template.own:
        return req, params, ()
    if req.prompt.plain_without_template:
        text = str(req.prompt.messages[-1]["content"])
        return replace(req, prompt=TextPrompts((text,))), params, ()
    implicit = tuple(w for w in CHATML_ENDS if w not in params.stop)
    return req, replace(params, stop=(*params.stop, *implicit)), implicit


def _check_vocab(req: GenerateRequest, n_vocab: int) -> None:
    for tok, _ in req.params.logit_bias:
        if tok >= n_vocab:
            raise InvalidRequest(f"'logit_bias' token id {tok} is outside the vocabulary "
                                 f"(0..{n_vocab - 1})", param="logit_bias")
    if any(t >= n_vocab for t in req.context):
        raise InvalidRequest(f"'context' token ids must be in 0..{n_vocab - 1}",
                             param="context")
    if not isinstance(req.prompt, ChatPrompt):
        for p in req.prompt.prompts:
            ids = p if isinstance(p, list) else p.parts if isinstance(p, MixedPrompt) else ()
            if any(isinstance(t, int) and t >= n_vocab for t in ids):
                raise InvalidRequest(f"'prompt' token ids must be in 0..{n_vocab - 1}",
                                     param="prompt")


@dataclass(frozen=True, slots=True)
class Prompts:
    """The token ids of each prompt, and how the output is to be read."""

    tokens: list[list[int]]
    reading: Reading = Reading()


def reading_for(served: ServedModel, req: GenerateRequest, prompt_tail: str) -> Reading:
    """How a chat request's output is read: its model's tool-call and reasoning formats
    (the request's ``reasoning_format`` first), from the end of the rendered prompt."""
    source = served.template.source
    fmt = served.tool_format
    offers = req.constraint.offers_tools
    if fmt.prompt_opens and not prompt_tail.endswith(fmt.opening):  # an assistant prefill
        fmt = replace(fmt, prompt_opens=False)  # (Functionary, Muse Glimmer): its text goes on
    if offers:  # (Command R+) a tool of its own named "directly-answer" is called
        fmt = fmt.offering({t.name for t in req.constraint.tools})
    if not offers and fmt.noise:  # read for the answer's markup alone (Kimi K3, Muse): no
        fmt = replace(fmt, block_open="", call_open="")  # calls where none were offered
    reasoning = req.reasoning_format or served.cfg.reasoning_format
    markers = markers_for(reasoning, source)
    if markers is None and fmt.thought_to:  # (reasoning_format none: reasoning is content)
        fmt = replace(fmt, thought_to="")
    thoughts = harmony_reasoning(reasoning, source)
    return Reading(  # (Functionary's answer is a message to "all": read with or without tools)
        tools=fmt if offers or fmt.always_read else None, markers=markers,
        in_thought=markers is not None and starts_in_thought(prompt_tail, markers),
        harmony=fmt.syntax == "harmony" and (offers or thoughts), harmony_thoughts=thoughts,
        types=parameter_types(req.constraint.tools) if offers else {},
        schemas=parameter_schemas(req.constraint.tools) if offers else {})


async def _conversation(served: ServedModel, prompt: list[int], output: str) -> list[int]:
    head, tail = await served.run(lambda: (served.bos_head(), served.runtime.tokenize(
        output, add_special=False, parse_special=True)))
    return [*prompt[len(head) if head and prompt[:len(head)] == head else 0:], *tail]


def with_context(tokens: list[int], context: tuple[int, ...], head: list[int]) -> list[int]:
    """``context`` placed before ``tokens``, after their BOS (``head``) when they start
    with it: the tokens of Ollama's context text before a prompt, tokenized whole."""
    if head and tokens[:len(head)] == head:
        return [*head, *context, *tokens[len(head):]]
    return [*context, *tokens]


async def _prompts(served: ServedModel, req: GenerateRequest) -> Prompts:
    """Render and tokenize the prompts (off the event loop), ``req.context`` first."""
    if req.context:
        read = await _prompts(served, replace(req, context=()))
        head = await served.run(served.bos_head)
        return replace(read, tokens=[with_context(t, req.context, head) for t in read.tokens])
    if isinstance(req.prompt, ChatPrompt):
        tools = req.constraint.tools if req.constraint.offers_tools else ()
        chat = await served.run(functools.partial(
            served.chat_render, [dict(m) for m in req.prompt.messages], tools,
            template_kwargs=req.template_kwargs))
        return Prompts([chat.tokens], reading_for(served, req, chat.tail))
    out = []
    for p in req.prompt.prompts:
        tokens = (await served.run(served.tokenize_text, p) if isinstance(p, str) else
                  await served.run(served.tokenize_mixed, p.parts)
                  if isinstance(p, MixedPrompt) else p)
        if not tokens:
            raise InvalidRequest("'prompt' is empty", param="prompt")
        out.append(tokens)
    if not req.constraint.offers_tools:
        return Prompts(out)
    return Prompts(out, Reading(tools=served.tool_format,
                                types=parameter_types(req.constraint.tools),
                                schemas=parameter_schemas(req.constraint.tools)))


def _calls_end_thought(reading: Reading, triggers: tuple[str, ...]) -> Reading:
    """``reading``, where a call marker ends an open reasoning block when the call grammar
    is triggered by the format's markers (tool_choice auto: the call is constrained from
    its marker on, wherever it comes)."""
    if reading.tools is not None and set(reading.tools.triggers) & set(triggers):
        return replace(reading, calls_end_thought=True)
    return reading


def _without_marker_start(text: str, markers: tuple[str, ...]) -> str:
    """``text`` less a tail that starts one of ``markers``: the output ran out (max_tokens)
    while a base model wrote the ChatML marker that would have ended its answer."""
    return text[:len(text) - max(partial_suffix(text, m) for m in markers)]


async def merge(gens: list[AsyncIterator[Delta]]) -> AsyncIterator[tuple[int, Delta]]:
    """Interleave the choices' deltas as (choice, delta); each choice ends with its
    finishing delta. Closing this aborts the engine requests still running."""
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


async def to_events(merged: AsyncIterator[tuple[int, Delta]], prompt_of: list[int],
                    prompt_lengths: list[int], reading: Reading | None = None,
                    implicit: tuple[str, ...] = (), end: Callable[[int], None] | None = None
                    ) -> AsyncIterator[Event]:
    """Engine deltas -> events; ends with UsageReport, or with one ErrorEvent.
    ``reading``: how the text is read (tool calls, reasoning; ``reader.Reading``);
    ``implicit``: stop strings the server added (an end of generation, not the request's
    stop string, when one of them ends a choice); ``end(i)``: asks the engine to finish
    choice i now (its finishing delta still comes)."""
    readers = [ChoiceReader(i, reading) for i in range(len(prompt_of))]
    raw: list[list[str]] = [[] for _ in prompt_of]  # each choice's output as written
    ended: set[int] = set()
    completion = 0
    cached: dict[int, int] = {}  # prompt index -> fewest cached tokens among its choices
    try:
        async for i, d in merged:
            if d.finish_reason == "error":
                yield ErrorEvent(failure_error(d.failure))
                return
            if d.finish_reason == "length" and implicit and d.text:
                d = replace(d, text=_without_marker_start(d.text, implicit))
            raw[i].append(d.text)
            for e in readers[i].read(d):
                yield e
            if readers[i].repeated and i not in ended and end is not None:
                ended.add(i)
                end(i)  # a repeated tool call: the answer is complete without the rest
            if d.finish_reason is not None:
                completion += d.completion_tokens
                p = prompt_of[i]
                cached[p] = min(cached.get(p, d.cached_tokens), d.cached_tokens)
                reason = d.finish_reason
                if readers[i].num_calls and (reason == "stop" or readers[i].whole_calls):
                    reason = "tool_calls"
                word = None if d.stop_word in implicit else d.stop_word
                yield Finish(i, reason, d.completion_tokens, d.timings, word,
                             d.stop_word is not None, "".join(raw[i]), d.cached_tokens)
        yield UsageReport(sum(prompt_lengths), completion, sum(cached.values()))
    finally:
        await merged.aclose()  # type: ignore[attr-defined]
