"""Chat templates in the sandbox: rendering, prefill, escapes refused, budgets."""

from __future__ import annotations

import time

import psutil
import pytest

from edgeinfer.errors import InvalidRequest
from edgeinfer.prompt import sandbox
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


def test_a_template_may_fill_its_own_lists_but_not_change_what_it_was_given() -> None:
    """Kimi K2's templates queue call ids with ``.append`` / ``.pop(0)`` on a list they
    made: allowed, one item at a time. The messages and tools stay immutable, and no
    method that copies a whole container (``extend``: a doubling loop) is open."""
    own = ("{% set q = namespace(ids=[]) %}{% for m in messages %}{% set _ = q.ids.append("
           "m['role']) %}{% set _ = q.ids.append('x') %}{% endfor %}{% set d = {} %}"
           "{% set _ = d.setdefault('k', 1) %}"
           "{{ q.ids.pop(0) }}-{{ q.ids | length }}-{{ d['k'] }}")
    msgs = [{"role": "user", "content": "x"}]
    assert ChatTemplate(own).render(msgs) == "user-1-1"
    for bad in ("{{ messages.append(1) }}", "{{ messages.pop() }}",
                "{{ messages[0].pop('content') }}", "{{ messages[0].setdefault('z', 1) }}",
                "{{ tools.append(1) }}", "{% set l = [1] %}{{ l.extend(l) }}",
                "{% set d = {} %}{{ d.update(messages[0]) }}",
                "{{ dict.pop(messages[0], 'content') }}", "{{ dict.clear(messages[0]) }}"):
        with pytest.raises(InvalidRequest):
            ChatTemplate(bad).render(msgs, tools=[{"type": "function"}])
    assert msgs == [{"role": "user", "content": "x"}]
    deep: list[object] = []
    for _ in range(5000):  # what the template is given may nest deeply (call arguments)
        deep = [deep]
    assert ChatTemplate(CHATML).render([{"role": "user", "content": "x", "deep": deep}])


def test_raise_exception_becomes_400() -> None:
    t = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(InvalidRequest) as info:
        t.render([{"role": "user", "content": "x"}])
    assert "roles must alternate" in info.value.message


def test_template_time_and_size_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "RENDER_SECONDS", 0.1)  # the real budget is 2 s
    slow = ("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
            "{% endfor %}{% endfor %}{% endfor %}")
    with pytest.raises(InvalidRequest) as info:
        ChatTemplate(slow).render([{"role": "user", "content": "x"}])
    assert info.value.code == "template_budget"
    huge = "{% for a in range(100000) %}{{ messages[0]['content'] * 1000 }}{% endfor %}"
    with pytest.raises(InvalidRequest) as info:
        ChatTemplate(huge).render([{"role": "user", "content": "xxxxxxxxxx"}])
    assert info.value.code == "template_budget"


def test_a_template_that_piles_up_values_is_stopped_and_its_memory_handed_back() -> None:
    """A loop storing a large string each time held gigabytes within the time budget, and
    the process kept them after the 400 (each thread's allocator arena did): the values a
    rendering builds have a budget, and a failed rendering hands freed memory back."""
    hoard = ("{% set d = {} %}{% for i in range(99999) %}"
             "{% set _ = d.setdefault(i, 'x' * 60000) %}{% endfor %}{{ raise_exception('no') }}")
    rss = psutil.Process().memory_info().rss
    t0 = time.monotonic()
    for _ in range(3):
        with pytest.raises(InvalidRequest) as info:
            ChatTemplate(hoard).render([{"role": "user", "content": "x"}])
        assert info.value.code == "template_budget" and "built more" in info.value.message
    assert time.monotonic() - t0 < 3 * 2 * sandbox.RENDER_SECONDS  # not the time budget
    assert psutil.Process().memory_info().rss - rss < 256 << 20


def test_a_hostile_template_spends_one_budget_on_the_load_probes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The probes a template gets at load (system role, call shapes, alternation) stop at
    the first that runs out of time: a looping template costs one render budget, not
    one per probe (eight budgets made its first request take over ten seconds)."""
    monkeypatch.setattr(sandbox, "RENDER_SECONDS", 0.2)
    slow = ("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
            "{% endfor %}{% endfor %}{% endfor %}{{ tool_calls }}")
    t0 = time.monotonic()
    ChatTemplate(slow)
    assert time.monotonic() - t0 < 0.2 * 2


@pytest.mark.parametrize("source", [
    "{{ 7 ** (messages|length * 10**7) }}",
    "{{ 'a' * (messages|length * 10**9) }}",
    "{{ (messages|length) * 10**(10**(messages|length + 9)) }}",
    "{{ '%0999999999d' % 1 }}",
    "{{ '{:>999999999}'.format(1) }}",
    "{{ 'a'|center(10**9) }}",
    "{{ 'a'|indent(10**9, true) }}",
    "{{ '%0999999999d'|format(1) }}",
    "{% set ns = namespace(s='a' * 10**6) %}{% for i in range(30) %}"
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "{% set ns = namespace(s=['a'] * 10**6) %}{% for i in range(30) %}"
    "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    "{% for i in range(10**9) %}{% endfor %}",
    "{{ 1 // 0 }}",
    # string methods and filters that build their value before anything could count it
    "{{ 'x'.ljust(10**10) }}", "{{ 'x'.center(10**10) }}", "{{ 'x'.zfill(10**10) }}",
    "{{ ('\t' * 1000).expandtabs(100000) }}",
    "{% set s = 'x' * 8000000 %}{{ s.replace('x', 'yy') }}",
    "{% set s = 'x' * 8000000 %}{{ [s, s]|join }}",
    "{% set s = 'x' * 8000000 %}{{ ''.join([s, s]) }}",
    # a filter's values count against the budget of what a rendering builds
    "{% set l = [] %}{% for i in range(99999) %}{% set _ = l.append(i|string|center(60000)) %}"
    "{% endfor %}",
])
def test_one_operation_cannot_build_a_value_past_the_budget(source: str) -> None:
    """A single ``**``, ``*``, ``~``, ``%`` or padding filter would hold the interpreter (and
    gigabytes) before any deadline check: each is a 400 instead."""
    with pytest.raises(InvalidRequest) as info:
        ChatTemplate(source).render([{"role": "user", "content": "x"}])
    assert info.value.param == "messages"


def test_ordinary_arithmetic_and_formatting_still_render() -> None:
    t = ChatTemplate("{{ 2 ** 10 }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ '%05d' % 7 }} "
                     "{{ '{:>4}'.format(1) }} {{ 'a' ~ 1 ~ none }} {{ 'x'|center(5) }}|")
    out = t.render([{"role": "user", "content": "x"}])
    assert out == "1024 ababab [1, 2] 00007    1 a1None   x  |"


def test_loop_controls_and_the_generation_tag_compile() -> None:
    """``{% break %}`` / ``{% continue %}`` (Command R7B, Kimi) and Hugging Face's
    ``{% generation %}`` (LFM2.5, Laguna): the body renders as it is."""
    t = ChatTemplate("{% for m in messages %}{% if m.role == 'tool' %}{% continue %}{% endif %}"
                     "{% if loop.index > 3 %}{% break %}{% endif %}"
                     "{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}")
    msgs = [{"role": "user", "content": "a"}, {"role": "tool", "content": "t"},
            {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert t.render(msgs, add_generation_prompt=False) == "[a][b]"


def test_a_template_without_a_system_role_gets_the_system_text_in_the_next_message() -> None:
    """Gemma 2's template raises on a system message: its text joins the first user
    message ("\\n" between), as llama.cpp does; alone, it is dropped."""
    gemma2 = ("{% for m in messages %}{% if m.role == 'system' %}"
              "{{ raise_exception('System role not supported') }}{% endif %}"
              "<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}")
    t = ChatTemplate(gemma2)
    assert not t.system_role and ChatTemplate(CHATML).system_role
    out = t.render([{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert out == "<start_of_turn>user\nBe brief.\nhi<end_of_turn>\n"
    assert t.render([{"role": "system", "content": "Be brief."}],
                    add_generation_prompt=False) == ""


def test_past_calls_take_the_shape_the_template_shows() -> None:
    """DeepSeek R1's distill template writes calls only when content is None and joins
    the arguments as text: a probe at load finds that shape, so past calls stay in the
    prompt (with "" and an object they vanished, or failed with a TypeError)."""
    r1 = ("{% for m in messages %}{% if m.role == 'user' %}<U>{{ m.content }}{% endif %}"
          "{% if m.role == 'assistant' and m.content is none %}{% for t in m.tool_calls %}"
          "<call>{{ t.function.name + '\\n' + t.function.arguments }}</call>{% endfor %}"
          "{% endif %}{% endfor %}")
    t = ChatTemplate(r1)
    assert t.call_shape == (True, True) and ChatTemplate(CHATML).call_shape == (False, False)
    out = t.render([{"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": "c1", "type": "function", "function": {
                            "name": "get_weather", "arguments": {"city": "Paris"}}}]},
                    {"role": "user", "content": "Thanks."}], add_generation_prompt=False)
    assert out == '<U>Weather?<call>get_weather\n{"city": "Paris"}</call><U>Thanks.'


def test_tojson_with_ensure_ascii_keeps_request_text_marked() -> None:
    """Reka's template writes arguments with ``tojson(ensure_ascii=True)``: the marks that
    wrap control-token text from a request stay marks, so the text stays text."""
    from edgeinfer.prompt.markup import CLOSE, OPEN, Markup, segments
    t = ChatTemplate("{{ messages[0]['content'] | tojson(ensure_ascii=True) }}")
    msgs = Markup(["<|im_end|>"]).escape([{"role": "user", "content": "a<|im_end|>é"}])
    text = t.render(msgs)
    assert OPEN + "<|im_end|>" + CLOSE in text
    assert all("<|im_end|>" not in part for part, markup in segments(text) if markup)


def test_text_plus_an_undefined_value_is_the_text() -> None:
    """As llama.cpp renders it (Command R+'s template adds each tool parameter's
    description, which a client may leave out); other uses of an undefined value still
    fail as before."""
    t = ChatTemplate("{% for m in messages %}{{ '[' + m.note + m['content'] + ']' }}{% endfor %}")
    assert t.render([{"role": "user", "content": "x"}]) == "[x]"
    with pytest.raises(InvalidRequest):
        ChatTemplate("{{ messages[0].note.deeper }}").render([{"role": "user", "content": "x"}])
