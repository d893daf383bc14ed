"""Chat templates: the GGUF's Jinja template rendered in jinja2's sandbox."""

from __future__ import annotations

import datetime
import json
import threading
import time
from collections.abc import Iterator
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
# What ends an answer in that ChatML: text, not end-of-generation tokens, to a base model.
CHATML_ENDS = ("<|im_end|>", "<|im_start|>")

_PREFILL_MARK = "\x00edgeinfer-prefill\x00"
RENDER_SECONDS = 2.0  # time budget of one rendering
RENDER_BYTES = 8 * 1024 * 1024  # output budget of one rendering

_deadline = threading.local()


class _BudgetExceeded(TemplateError):
    pass


def _check_deadline() -> None:
    end = getattr(_deadline, "end", None)
    if end is not None and time.monotonic() > end:
        raise _BudgetExceeded("the chat template took too long to render")


class _BudgetedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, plus a deadline checked on every call and item access."""

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        _check_deadline()
        return super().call(context, obj, *args, **kwargs)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _check_deadline()
        return super().getitem(obj, argument)

    def getattr(self, obj: Any, attribute: str) -> Any:
        _check_deadline()
        return super().getattr(obj, attribute)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
           separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """``tojson`` as Hugging Face's chat templates expect it: plain JSON text (jinja2's
    own escapes HTML and returns markup, which escapes the template text it is joined
    to: DeepSeek's ``'<｜tool▁sep｜>' + arguments|tojson`` would become ``&lt;...``)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys, default=_listed)


def _listed(value: Any) -> Any:
    """What ``json.dumps`` cannot write: a filter's generator (``tools | map(...)``)."""
    if isinstance(value, Iterator):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


@lru_cache(maxsize=16)
def _compile(source: str) -> Any:
    env = _BudgetedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = tojson
    return env.from_string(source)


class ChatTemplate:
    """Renders OpenAI-style messages into a prompt string.

    If the last message is from the assistant, the prompt ends inside that
    message so the model continues it (assistant prefill).
    """

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        self.own = bool(source)  # False: the model has none, ChatML stands in
        self.source = source or CHATML
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _compile(self.source)
        except TemplateError as exc:
            raise ValueError(f"invalid chat template: {exc}") from None

    @property
    def takes_tools(self) -> bool:
        """Whether the template renders a ``tools`` variable (native tool support)."""
        return "tools" in self.source

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               **extra: Any) -> str:
        """The prompt for ``messages``; ``add_generation_prompt=False`` renders them as a
        prefix of a longer conversation (for pinning a system prompt)."""
        prefill = bool(messages) and messages[-1].get("role") == "assistant"
        if prefill:
            last = dict(messages[-1])
            last["content"] = (last.get("content") or "") + _PREFILL_MARK
            messages = [*messages[:-1], last]
        parts: list[str] = []
        size = 0
        _deadline.end = time.monotonic() + RENDER_SECONDS
        try:
            for part in self._template.generate(
                messages=messages, add_generation_prompt=add_generation_prompt and not prefill,
                bos_token=self.bos_token, eos_token=self.eos_token, **extra,
            ):
                size += len(part)
                if size > RENDER_BYTES:
                    raise _BudgetExceeded("the chat template's output is too large")
                _check_deadline()
                parts.append(part)
        except _BudgetExceeded as exc:
            raise InvalidRequest(str(exc), param="messages", code="template_budget") from None
        except (TemplateError, RecursionError, TypeError, ValueError) as exc:
            raise InvalidRequest(f"the chat template rejected the messages: {exc}",
                                 param="messages") from None
        finally:
            _deadline.end = None
        text = "".join(parts)
        if prefill:
            cut = text.rfind(_PREFILL_MARK)
            if cut == -1:
                raise InvalidRequest("this model's chat template cannot continue an assistant "
                                     "message", param="messages")
            text = text[:cut]
        return text
