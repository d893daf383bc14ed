"""Chat templates in the sandbox: rendering, prefill, escapes refused, budgets."""

from __future__ import annotations

import pytest

from edgeinfer.errors import InvalidRequest
from edgeinfer.prompt import template
from edgeinfer.prompt.template import CHATML, ChatTemplate


def test_renders_generation_prompt() -> None:
    t = ChatTemplate(CHATML)
    out = t.render([{"role": "user", "content": "hi"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_assistant_prefill_is_continued() -> None:
    t = ChatTemplate(CHATML)
    out = t.render([{"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "Sure, the answer is"}])
    assert out.endswith("<|im_start|>assistant\nSure, the answer is")


def test_template_cannot_escape_sandbox() -> None:
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(InvalidRequest):
        ChatTemplate(evil).render([{"role": "user", "content": "x"}])


def test_raise_exception_becomes_400() -> None:
    t = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(InvalidRequest) as info:
        t.render([{"role": "user", "content": "x"}])
    assert "roles must alternate" in info.value.message


def test_template_time_and_size_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(template, "RENDER_SECONDS", 0.1)  # the real budget is 2 s
    slow = ("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
            "{% endfor %}{% endfor %}{% endfor %}")
    with pytest.raises(InvalidRequest) as info:
        ChatTemplate(slow).render([{"role": "user", "content": "x"}])
    assert info.value.code == "template_budget"
    huge = "{% for a in range(100000) %}{{ messages[0]['content'] * 1000 }}{% endfor %}"
    with pytest.raises(InvalidRequest) as info:
        ChatTemplate(huge).render([{"role": "user", "content": "xxxxxxxxxx"}])
    assert info.value.code == "template_budget"
