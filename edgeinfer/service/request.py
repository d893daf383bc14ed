"""The one internal request every API dialect parses its body into.

A dialect module (``edgeinfer.api.openai_chat`` ...) reads its wire format once
and builds a ``GenerateRequest``: everything the service needs, typed, with
every user error already raised as a 400 (except what depends on the model the
service picks: token ids against its vocabulary, the prompt against its context).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.errors import ContextTooLong
from edgeinfer.prompt.tools import ToolSpec


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """Messages (OpenAI-shaped dicts, validated) rendered with the model's chat template."""

    messages: tuple[dict[str, Any], ...]
    # for a model without a chat template of its own: the last message's text alone, as
    # a raw prompt (Ollama's /api/generate, whose default template is the prompt itself)
    plain_without_template: bool = False


@dataclass(frozen=True, slots=True)
class MixedPrompt:
    """llama-server's mixed prompt: token ids and texts in one list, one prompt of them in
    order (the texts tokenized; only a text that comes first gets the model's BOS)."""

    parts: tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class TextPrompts:
    """Raw prompts (text, token ids, or both mixed): one set of ``n`` choices per prompt."""

    prompts: tuple[str | list[int] | MixedPrompt, ...]


@dataclass(frozen=True, slots=True)
class Constraint:
    """What the output must follow: a grammar, or tools (``tool_choice`` "auto",
    "required" or a function name) and / or a JSON format (json_schema or json_object).
    With both, "auto" lets the output be calls or the answer in its format; a forced
    call leaves the format to a later turn's answer."""

    grammar: str | None = None  # raw GBNF
    json_schema: dict[str, Any] | None = None
    schema_param: str = "response_format.json_schema.schema"  # where it was (for errors)
    json_object: bool = False
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "none"  # "none" | "auto" | "required" | a function name
    parallel_tool_calls: bool = True

    @property
    def offers_tools(self) -> bool:
        return self.tool_choice != "none" and bool(self.tools)


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One generation request, whatever dialect it came in."""

    model: str  # an id, an alias, or "auto"
    prompt: ChatPrompt | TextPrompts
    params: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1  # choices per prompt
    priority: int = 0  # -10..10: admission order (see Scheduler)
    constraint: Constraint = field(default_factory=Constraint)
    cache_prompt: bool = True  # reuse cached prompt prefixes
    wait_for_model: bool = True  # wait for a model that is loading (else 503 + Retry-After)
    # reasoning split from the answer: "auto", "deepseek", "none"; None: the model's setting
    reasoning_format: str | None = None
    # tokens a reasoning block may take before it is closed (None: no limit)
    reasoning_budget: int | None = None
    # extra chat template variables (chat_template_kwargs, such as enable_thinking)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # max_tokens only caps the answer: lowered to what the context leaves after the prompt
    # instead of a 400 (Ollama's num_predict; the answer then ends as "length")
    max_tokens_is_cap: bool = False
    # a prompt longer than the context keeps its first keep_head tokens and its last ones,
    # with room left for the answer, instead of a 400 (Ollama's truncate and num_keep)
    keep_head: int | None = None
    # OpenAI's Predicted Outputs: text the answer is expected to repeat (drafts, not output)
    prediction: str | None = None
    # token ids placed before each prompt's own (after its BOS): Ollama's ``context``, an
    # earlier answer's conversation so far
    context: tuple[int, ...] = ()

    @property
    def num_choices(self) -> int:
        many = len(self.prompt.prompts) if isinstance(self.prompt, TextPrompts) else 1
        return self.n * many


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    model: str
    inputs: tuple[str | list[int], ...]


MAX_TOKEN_BYTES = 256  # no vocabulary has longer tokens (SmolLM2: 81 bytes, Gemma 3: 48)


def check_text_size(req: GenerateRequest, n_ctx: int) -> None:
    """400 context_length_exceeded for a prompt whose text is too long for the context
    whatever it tokenizes to (a token is at most MAX_TOKEN_BYTES), before it is rendered
    and tokenized (seconds of the model's native worker for megabytes); a request that
    cuts its prompt to fit (``keep_head``) is left to that."""
    if req.keep_head is not None:
        return
    if isinstance(req.prompt, ChatPrompt):
        texts = [m.get("content") for m in req.prompt.messages]
        chars = sum(len(t) if isinstance(t, str) else sum(
            len(p.get("text") or "") for p in t if isinstance(p, dict))
            if isinstance(t, list) else 0 for t in texts)
    else:
        chars = max((len(p) if isinstance(p, str) else sum(  # (a mixed prompt's texts)
            len(x) for x in p.parts if isinstance(x, str)) if isinstance(p, MixedPrompt) else 0
            for p in req.prompt.prompts), default=0)
    check_chars(chars, n_ctx, "messages" if isinstance(req.prompt, ChatPrompt) else "prompt")


def check_chars(chars: int, n_ctx: int, where: str) -> None:
    """400 context_length_exceeded for ``chars`` characters of text: more than any
    ``n_ctx`` tokens hold (a token is at most MAX_TOKEN_BYTES)."""
    if chars > n_ctx * MAX_TOKEN_BYTES:
        # the token count (Anthropic's wording gives one, which Claude Code sizes its
        # compaction by) estimated: text is about 4 characters a token
        raise ContextTooLong(
            f"This model's maximum context length is {n_ctx} tokens. However, your "
            f"{where} has {chars} characters, more than any {n_ctx} tokens hold. Please "
            "reduce the prompt.", param=where, prompt_tokens=max(n_ctx + 1, chars // 4),
            max_tokens=0, n_ctx=n_ctx)


def choice_params(params: SamplingParams, i: int, alone: bool) -> SamplingParams:
    """Choice i of a request's sequences: a seeded request gives each choice its own,
    reproducible seed. Sequences that share the KV cache with others of their request
    (``alone`` false: n > 1, several prompts) do not draft: the cells a sequence's rejected
    drafts leave are taken by the others, in another order than without drafts, which
    changes their numbers' last bits, so speculation would change the output."""
    if not alone:
        params = replace(params, speculative=False)
    if i == 0 or params.seed is None:
        return params
    return replace(params, seed=params.seed + i)
