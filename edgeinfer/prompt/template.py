"""Chat templates: the GGUF's Jinja template rendered in jinja2's sandbox."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension
from jinja2.parser import Parser

from edgeinfer.errors import InvalidRequest
from edgeinfer.prompt.markup import CLOSE as MARK_CLOSE
from edgeinfer.prompt.markup import OPEN as MARK_OPEN
from edgeinfer.prompt.sandbox import (
    RENDER_BYTES,
    BudgetedEnvironment,
    BudgetExceeded,
    Spent,
    center,
    check_deadline,
    counted,
    format_filter,
    indent,
    join,
    release_memory,
    rendering,
)
from edgeinfer.prompt.turns import (
    PROBE_CALL,
    PROBE_RESULT,
    PROBE_USER,
    alternating,
    merge_system,
    one_call_each,
    with_call_shape,
)

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
_SYSTEM_PROBE = "\x00edgeinfer-system\x00"
class _Generation(Extension):
    """Hugging Face's ``{% generation %}...{% endgeneration %}`` (it marks the assistant's
    tokens for training): the body is rendered as it is."""

    tags = {"generation"}
    _body = staticmethod(lambda caller: caller())

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
           separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """``tojson`` as Hugging Face's chat templates expect it: plain JSON text (jinja2's
    own escapes HTML and returns markup, which escapes the template text it is joined
    to: DeepSeek's ``'<｜tool▁sep｜>' + arguments|tojson`` would become ``&lt;...``).
    The request-text marks of ``prompt.markup`` stay as they are with ``ensure_ascii``
    (Reka's template), or the control-token text they wrap would reach the prompt bare."""
    text = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys, default=_listed)
    if ensure_ascii and "\\ufdd" in text:
        text = text.replace("\\ufdd0", MARK_OPEN).replace("\\ufdd1", MARK_CLOSE)
    return text


def _listed(value: Any) -> Any:
    """What ``json.dumps`` cannot write: a filter's generator (``tools | map(...)``)."""
    if isinstance(value, Iterator):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


@lru_cache(maxsize=16)
def _compile(source: str) -> Any:
    env = BudgetedEnvironment(trim_blocks=True, lstrip_blocks=True,
                              extensions=["jinja2.ext.loopcontrols", _Generation])
    # jinja's ``dict`` global is the type: ``dict.pop(messages[0], ...)`` would change
    # what the template was given; a function that builds one has no such methods
    env.globals["dict"] = lambda *args, **kwargs: dict(*args, **kwargs)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = tojson
    env.filters.update(center=center, indent=indent, format=format_filter, join=join)
    env.filters = {name: counted(f) for name, f in env.filters.items()}
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
        self._over_budget = False
        self.system_role = self._renders_system()
        # how past calls must look for the template to show them: content None instead of
        # "" (DeepSeek R1's renders calls only then), arguments as JSON text, not an object
        self.call_shape = self._call_shape() if "tool_calls" in self.source else (False, False)
        # a template that shows one call per assistant turn (Llama 3.x refuses more, gpt-oss
        # drops all but the first): parallel calls are rendered one turn each
        self.one_call = "tool_calls" in self.source and not self._shows_two_calls()
        # a template that shows no past call at all (LFM2's older ones, Granite 3.3): the
        # calls go into the content, as the model wrote them
        self.shows_calls = ("edgeinfer_probe" in self._probe(PROBE_CALL, self.call_shape)
                            or self._over_budget)  # not known: left to the template
        # templates that insist on user/assistant alternation (Gemma 2, Mistral's): two user
        # turns in a row are joined, and a user turn right after tool results (Anthropic's
        # tool_result blocks with text, an agent's follow-up) gets an empty answer before it
        self.joins_users = (not self._accepts([PROBE_USER, PROBE_USER])
                            and self._accepts([PROBE_USER]))
        self.tool_answer = self._tool_answer() if "tool_calls" in self.source else None

    def _try(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """A probe's rendering; "" when the template refuses it. Once a probe ran out of
        time or space (a hostile template), the rest are not tried: each would take the
        whole budget again."""
        if self._over_budget:
            return ""
        try:
            return self._render(messages, add_generation_prompt, {})
        except InvalidRequest as exc:
            self._over_budget = exc.code == "template_budget"
            return ""

    def _renders_system(self) -> bool:
        """Whether the template renders a system message (Gemma 2's refuses one: its text
        then goes to the next message, as llama.cpp does)."""
        return _SYSTEM_PROBE in self._try([{"role": "system", "content": _SYSTEM_PROBE},
                                           {"role": "user", "content": "User message"}])

    def _call_shape(self) -> tuple[bool, bool]:
        """(content None, arguments as text): a shape of a past call whose rendering shows
        the call's name and arguments, arguments as an object where that shows them; of
        content "" and None, the one that renders less (DeepSeek R1's Qwen distill writes
        an empty answer turn after the calls for "", its Llama distill shows calls only
        for None)."""
        for text_args in (False, True):
            shown = [(len(t), none) for none in (False, True)
                     if all(w in (t := self._probe(PROBE_CALL, (none, text_args)))
                            for w in ("edgeinfer_probe", "probe_arg"))]
            if shown:
                return min(shown)[1], text_args
        return False, False

    def _shows_two_calls(self) -> bool:
        two = {**PROBE_CALL, "tool_calls": [*PROBE_CALL["tool_calls"], {
            "id": "edgeinfr2", "type": "function",
            "function": {"name": "edgeinfer_other", "arguments": {"probe_arg": 2}}}]}
        text = self._probe(two, self.call_shape)
        return "edgeinfer_probe" in text and "edgeinfer_other" in text

    def _tool_answer(self) -> str | None:
        """The content of the answer a user turn after tool results needs before it ("" or,
        where an empty one is refused, " "); None: none needed (or none helps)."""
        after_tools = [PROBE_USER, *with_call_shape([PROBE_CALL], self.call_shape), PROBE_RESULT]
        if self._accepts([*after_tools, PROBE_USER]):
            return None
        return next((text for text in ("", " ") if self._accepts(
            [*after_tools, {"role": "assistant", "content": text}, PROBE_USER])), None)

    def _accepts(self, messages: list[dict[str, Any]]) -> bool:
        return bool(self._try(messages))

    def _probe(self, call: dict[str, Any], shape: tuple[bool, bool]) -> str:
        """A user turn and ``call`` (an assistant message with calls) in ``shape``, as the
        template renders them; "" when it refuses them."""
        return self._try([PROBE_USER, *with_call_shape([call], shape)], False)

    @property
    def takes_tools(self) -> bool:
        """Whether the template renders a ``tools`` variable (native tool support)."""
        return "tools" in self.source

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               **extra: Any) -> str:
        """The prompt for ``messages``; ``add_generation_prompt=False`` renders them as a
        prefix of a longer conversation (for pinning a system prompt)."""
        if not self.system_role and messages and messages[0].get("role") == "system":
            messages = merge_system(messages)
        if self.joins_users or self.tool_answer is not None:
            messages = alternating(messages, self.joins_users, self.tool_answer)
        if self.one_call:
            messages = one_call_each(messages)
        if any(self.call_shape):
            messages = with_call_shape(messages, self.call_shape)
        prefill = bool(messages) and messages[-1].get("role") == "assistant"
        if prefill:
            last = dict(messages[-1])
            last["content"] = (last.get("content") or "") + _PREFILL_MARK
            messages = [*messages[:-1], last]
        text = self._render(messages, add_generation_prompt and not prefill, extra)
        if prefill:
            cut = text.rfind(_PREFILL_MARK)
            if cut == -1:
                raise InvalidRequest("this model's chat template cannot continue an assistant "
                                     "message", param="messages")
            text = text[:cut]
        return text

    def _context(self, extra: dict[str, Any]) -> dict[str, Any]:
        """FireFunction's variables, where a template uses them: ``datetime`` (as llama.cpp
        gives it) and ``functions`` (the tools as JSON text)."""
        out: dict[str, Any] = {}
        if "datetime" in self.source:
            out["datetime"] = datetime.datetime.now().strftime("%b %d %Y")
        if "functions" in self.source:
            out["functions"] = json.dumps([t.get("function", t) for t in extra.get("tools") or []],
                                          ensure_ascii=False, indent=4)
        return out

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
                extra: dict[str, Any]) -> str:
        parts: list[str] = []
        size = 0
        extra = {**self._context(extra), **extra}
        spent = Spent()
        try:
            with rendering((messages, extra), spent):
                for part in self._template.generate(
                    messages=messages, add_generation_prompt=add_generation_prompt,
                    bos_token=self.bos_token, eos_token=self.eos_token, **extra,
                ):
                    size += len(part)
                    if size > RENDER_BYTES:
                        raise BudgetExceeded("the chat template's output is too large")
                    check_deadline()
                    parts.append(part)
        except BudgetExceeded as exc:
            failed = InvalidRequest(str(exc), param="messages", code="template_budget")
        except (TemplateError, RecursionError, TypeError, ValueError, ArithmeticError,
                LookupError, MemoryError) as exc:
            failed = InvalidRequest(f"the chat template rejected the messages: {exc}",
                                    param="messages")
        else:
            return "".join(parts)
        release_memory(spent)  # (here, not in the handler: its traceback held what was built)
        raise failed
