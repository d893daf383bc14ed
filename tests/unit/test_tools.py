"""Tool-call parsing and prompt preparation as pure units."""

from __future__ import annotations

import json
import random

from edgeinfer.prompt.toolformat import GENERIC, HERMES
from edgeinfer.prompt.tools import (
    CallArgs,
    CallOpen,
    CallParser,
    Content,
    ToolSpec,
    parse_tool_calls,
    prepare_messages,
)

TEXT = ('I will check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
        '"opts": {"unit": "c"}}}\n</tool_call>\n<tool_call>{"name": "add", "arguments": '
        '{"a": 1, "b": "}"}}</tool_call>')


def test_parse_whole_text() -> None:
    content, calls = parse_tool_calls(TEXT)
    assert content == "I will check."
    assert [c.name for c in calls] == ["get_weather", "add"]
    assert json.loads(calls[0].arguments) == {"city": "Paris", "opts": {"unit": "c"}}
    assert json.loads(calls[1].arguments) == {"a": 1, "b": "}"}
    assert calls[0].id != calls[1].id and calls[0].id.startswith("call_")
    assert parse_tool_calls("just text < tool") == ("just text < tool", [])


def test_streaming_in_any_fragmentation_gives_the_same_calls() -> None:
    rng = random.Random(3)
    for _ in range(200):
        stream = CallParser(GENERIC)
        events = []
        i = 0
        while i < len(TEXT):
            n = rng.randint(1, 7)
            events += stream.feed(TEXT[i:i + n])
            i += n
        events += stream.finish()
        content = "".join(e.text for e in events if isinstance(e, Content))
        names = [e.name for e in events if isinstance(e, CallOpen)]
        args = ["", ""]
        for e in events:
            if isinstance(e, CallArgs):
                args[e.index] += e.text
        assert content.strip() == "I will check."
        assert names == ["get_weather", "add"]
        assert json.loads(args[0]) == {"city": "Paris", "opts": {"unit": "c"}}
        assert json.loads(args[1]) == {"a": 1, "b": "}"}
        # the name is announced before any of its arguments
        first_args = next(k for k, e in enumerate(events) if isinstance(e, CallArgs))
        assert isinstance(events[first_args - 1], CallOpen)


def test_generic_prompt_renders_tools_calls_and_results() -> None:
    tools = (ToolSpec("get_weather", "Weather of a city", {"type": "object"}),)
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]
    out, extra = prepare_messages(msgs, tools, GENERIC)
    assert extra == {}
    assert out[0]["role"] == "system" and "get_weather" in out[0]["content"]
    assert '"arguments": {"city": "Paris"}' in out[2]["content"]
    assert out[3] == {"role": "user", "content": "<tool_response>\n21 C\n</tool_response>"}
    native, extra = prepare_messages(msgs, tools, HERMES)
    assert native[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert native[2] == msgs[2] and extra["tools"][0]["function"]["name"] == "get_weather"


def test_kimi_results_name_their_calls_by_index_even_when_ids_repeat() -> None:
    """Kimi K2's templates name a result's call ``functions.NAME:INDEX``: matched by id,
    and in order where ids are missing or repeated."""
    from edgeinfer.prompt.toolformat import KIMI_K2
    calls = [{"id": cid, "type": "function", "function": {"name": n, "arguments": "{}"}}
             for cid, n in (("x", "a"), ("x", "b"), ("y", "c"))]
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "y", "content": "C"},
            {"role": "tool", "tool_call_id": "x", "content": "A"},
            {"role": "tool", "tool_call_id": "x", "content": "B"}]
    out, _ = prepare_messages(msgs, (), KIMI_K2)
    assert [m["tool_call_id"] for m in out[2:]] == [
        "functions.c:2", "functions.a:0", "functions.b:1"]


def test_dsml_marks_a_value_string_true_only_where_it_is_written_as_text() -> None:
    """DeepSeek's string="true" values are raw text; a string with a pattern or a format
    is written as JSON (quoted), so it is string="false", which reads back the same."""
    from edgeinfer.prompt.callgrammar import named_calls_gbnf
    from edgeinfer.prompt.toolformat import DSML
    params = {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]},
        "day": {"type": "string", "format": "date"}, "n": {"type": "integer"}},
        "required": ["city", "unit", "day", "n"]}
    gbnf = named_calls_gbnf([("f", params)], 1, DSML)
    for key, text in (("city", True), ("unit", True), ("day", False), ("n", False)):
        mark = f'name=\\"{key}\\" string=\\"{"true" if text else "false"}\\">'
        assert mark in gbnf, (key, gbnf)
    text = ('<｜DSML｜function_calls><｜DSML｜invoke name="f"><｜DSML｜parameter name="day" '
            'string="false">"2024-01-05"</｜DSML｜parameter></｜DSML｜invoke>'
            "</｜DSML｜function_calls>")
    assert [json.loads(c.arguments) for c in parse_tool_calls(text, DSML)[1]] == [
        {"day": "2024-01-05"}]


def test_a_past_call_with_arguments_nested_too_deep_for_json_stays_text() -> None:
    """A client's past call whose arguments nest deeper than the JSON reader goes: kept as
    written (it made the request a 500)."""
    from edgeinfer.prompt.toolformat import KIMI_K2
    args = "[" * 5000 + "]" * 5000
    msgs = [{"role": "user", "content": "x"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "a", "content": "r"}]
    for fmt in (GENERIC, HERMES, KIMI_K2):
        out, _ = prepare_messages(msgs, (), fmt)
        assert args in json.dumps(out) or args in str(out), fmt.name


def test_text_around_a_call_keeps_its_blank_streamed_or_whole() -> None:
    """Text before and after a call is not glued together when the answer streams: the
    blank between them is held across the call (it was dropped when the call opened,
    so a streamed 'Checking.' and 'After.' became 'Checking.After.')."""
    from edgeinfer.engine.delta import Delta
    from edgeinfer.prompt.toolformat import QWEN3_CODER
    from edgeinfer.service.events import TextDelta, ToolCallDelta
    from edgeinfer.service.reader import ChoiceReader, Reading
    for fmt, call in ((HERMES, '<tool_call>{"name": "t", "arguments": {}}</tool_call>'),
                      (QWEN3_CODER, "<tool_call>\n<function=t>\n</function>\n</tool_call>")):
        for text, want in (("Checking.\nCALL\nAfter.", "Checking.\nAfter."),
                           ("Checking.\n\nCALL\n\nAfter.", "Checking.\n\nAfter."),
                           ("Checking. CALL After.", "Checking.  After."),
                           ("Checking.\nCALL\n", "Checking."),
                           ("\nCALL\nChecking.\n", "Checking."),
                           ("Checking. CALL CALL2 After.", "Checking.  After.")):
            names = ["t", "u"] if "CALL2" in text else ["t"]
            text = text.replace("CALL2", call.replace('"t"', '"u"').replace("=t>", "=u>"))
            text = text.replace("CALL", call)
            for pieces in ([text], list(text)):
                reader = ChoiceReader(0, Reading(tools=fmt))
                events = [e for k, p in enumerate(pieces) for e in reader.read(Delta(
                    p, finish_reason="stop" if k == len(pieces) - 1 else None))]
                assert "".join(e.text for e in events if isinstance(e, TextDelta)) == want
                assert [e.name for e in events if isinstance(e, ToolCallDelta) and e.name] \
                    == names


def test_muse_glimmers_reasoning_before_a_call_is_reasoning_and_the_call_a_call() -> None:
    """What a forced call's grammar lets Muse Glimmer write: a message to ``self``, then
    a message to the tool; streamed or whole alike."""
    from edgeinfer.engine.delta import Delta
    from edgeinfer.prompt.reasoning import MUSE_SELF
    from edgeinfer.prompt.toolformat import MUSE_GLIMMER
    from edgeinfer.service.events import ReasoningDelta, TextDelta, ToolCallDelta
    from edgeinfer.service.reader import ChoiceReader, Reading
    text = (" to=self<|message|>I check.<|eom|><|start|>assistant to=get_weather<|message|>"
            '<atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter '
            'name="city">Paris</atem:parameter>\n</atem:invoke>\n</atem:function_calls>')
    for pieces in ([text], list(text)):
        reader = ChoiceReader(0, Reading(tools=MUSE_GLIMMER, markers=MUSE_SELF,
                                         types={"get_weather": {"city": "string"}}))
        events = [e for k, p in enumerate(pieces) for e in reader.read(Delta(
            p, finish_reason="stop" if k == len(pieces) - 1 else None))]
        assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "I check."
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == ""
        calls = [e for e in events if isinstance(e, ToolCallDelta)]
        assert [e.name for e in calls if e.name] == ["get_weather"]
        assert "".join(e.arguments for e in calls) == '{"city": "Paris"}'


def test_muse_glimmers_messages_to_itself_are_reasoning_wherever_they_come() -> None:
    """Muse Glimmer may write several messages to ``self`` before its answer: each is
    reasoning (the split took only the first), streamed or whole; without the split
    (reasoning_format none, ``thought_to`` off) they are content."""
    from dataclasses import replace

    from edgeinfer.engine.delta import Delta
    from edgeinfer.prompt.reasoning import MUSE_SELF
    from edgeinfer.prompt.toolformat import MUSE_GLIMMER
    from edgeinfer.service.events import ReasoningDelta, TextDelta
    from edgeinfer.service.reader import ChoiceReader, Reading
    text = (" to=self<|message|>A.<|eom|><|start|>assistant to=self<|message|>B.<|eom|>"
            "<|start|>assistant to=user<|message|>Hi!")
    for reading, want in ((Reading(tools=MUSE_GLIMMER, markers=MUSE_SELF), ("A.B.", "Hi!")),
                          (Reading(tools=replace(MUSE_GLIMMER, thought_to="")), ("", "A.B.Hi!"))):
        for pieces in ([text], list(text)):
            reader = ChoiceReader(0, reading)
            events = [e for k, p in enumerate(pieces) for e in reader.read(Delta(
                p, finish_reason="stop" if k == len(pieces) - 1 else None))]
            assert ("".join(e.text for e in events if isinstance(e, ReasoningDelta)),
                    "".join(e.text for e in events if isinstance(e, TextDelta))) == want
