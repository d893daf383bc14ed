"""Chat templates: the GGUF's Jinja template rendered in jinja2's sandbox."""

from __future__ import annotations

import datetime
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from edgeinfer.errors import InvalidRequest

# Used when a model has no template of its own (base models): ChatML.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_PREFILL_MARK = "\x00edgeinfer-prefill\x00"


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(source: str) -> Any:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


class ChatTemplate:
    """Renders OpenAI-style messages into a prompt string.

    If the last message is from the assistant, the prompt ends inside that
    message so the model continues it (assistant prefill).
    """

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or CHATML
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _compile(self.source)
        except TemplateError as exc:
            raise ValueError(f"invalid chat template: {exc}") from None

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               **extra: Any) -> str:
        """The prompt for ``messages``; ``add_generation_prompt=False`` renders them as a
        prefix of a longer conversation (for pinning a system prompt)."""
        prefill = bool(messages) and messages[-1].get("role") == "assistant"
        if prefill:
            last = dict(messages[-1])
            last["content"] = (last.get("content") or "") + _PREFILL_MARK
            messages = [*messages[:-1], last]
        try:
            text: str = self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt and not prefill,
                bos_token=self.bos_token, eos_token=self.eos_token, **extra,
            )
        except TemplateError as exc:
            raise InvalidRequest(f"the chat template rejected the messages: {exc}",
                                 param="messages") from None
        if prefill:
            cut = text.rfind(_PREFILL_MARK)
            if cut == -1:
                raise InvalidRequest("this model's chat template cannot continue an assistant "
                                     "message", param="messages")
            text = text[:cut]
        return text
