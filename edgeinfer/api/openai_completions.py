"""The OpenAI text completions dialect: POST /v1/completions."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from edgeinfer.api import fields, samplers
from edgeinfer.api.body import read_json
from edgeinfer.api.fields import MAX_CHOICES, MAX_PROMPTS, MAX_TOKENS_LIMIT, Body
from edgeinfer.api.openai_render import CompletionMeta
from edgeinfer.api.respond import respond
from edgeinfer.errors import InvalidRequest
from edgeinfer.service.request import Constraint, GenerateRequest, TextPrompts

FIELDS = {
    "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "min_p",
    "presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n", "seed", "stop",
    "n", "logit_bias", "user", "ignore_eos", "metadata", "store", "service_tier", "cache_prompt",
    "speculative", "deterministic",
    "priority", "prompt", "echo", "logprobs", "best_of", "suffix", "grammar",
} | samplers.NAMES


def parse(body: Any, headers: dict[str, str]) -> tuple[GenerateRequest, bool, bool, bool]:
    """(request, stream, include_usage, echo) from a completions body."""
    b = Body(body, FIELDS)
    model = b.string("model") or ""  # left out: the first configured model
    fields.unsupported(b, ("suffix",))
    logprobs = b.integer("logprobs", 0, 20, None)
    echo = b.boolean("echo")
    if echo and logprobs is not None:  # (they would be the prompt's too: not computed)
        raise InvalidRequest("'echo' with 'logprobs' is not supported by this server: the "
                             "prompt's tokens get no log-probabilities", param="echo")
    b.integer("best_of", 1, 1, 1)  # only 1 (the default) is accepted
    prompts = fields.prompts(b.body.get("prompt"), "prompt", MAX_PROMPTS)
    max_tokens = b.integer("max_tokens", 1, MAX_TOKENS_LIMIT, None)  # (no -1: a prompt
    if max_tokens is None:  # that never ends would run to the end of the context)
        max_tokens = samplers.n_predict(b, 16)
    stream, include_usage = fields.stream_options(b)
    n = int(b.integer("n", 1, MAX_CHOICES, 1) or 1)
    if n * len(prompts) > MAX_CHOICES:
        raise InvalidRequest(f"at most {MAX_CHOICES} choices per request (prompts x n)",
                             param="n")
    req = GenerateRequest(
        model, TextPrompts(prompts),
        samplers.sampling_params(b, max_tokens, logprobs), n=n,
        priority=fields.priority(b.body.get("priority"), headers.get("x-priority")),
        constraint=Constraint(grammar=b.string("grammar")),
        cache_prompt=b.boolean("cache_prompt", True),
        wait_for_model=headers.get("x-edgeinfer-wait", "true").lower() != "false")
    return req, stream, include_usage, echo


async def completions(request: Request) -> Response:
    """``echo``: each choice's text (a stream's first chunk of each) starts with its prompt."""
    req, stream, include_usage, echo = parse(await read_json(request), dict(request.headers))
    assert isinstance(req.prompt, TextPrompts)
    meta = CompletionMeta("text", echo=req.prompt.prompts if echo else (), n=req.n)
    return await respond(request, req, meta, stream, include_usage)
