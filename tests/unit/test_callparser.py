"""Tool calls parsed in each format's own syntax: whole outputs, the same output cut at
every position while streaming, several calls, calls after text, malformed calls."""

from __future__ import annotations

import json
import random

import pytest

from edgeinfer.prompt.callparser import CallArgs, CallOpen, CallParser, Content
from edgeinfer.prompt.toolformat import GENERIC, GRANITE, HERMES, LLAMA3, MISTRAL, ToolFormat

W = '{"city": "Paris", "opts": {"unit": "c", "note": "a } and \\" and ]"}}'
CASES: list[tuple[ToolFormat, str, str, list[tuple[str, object]]]] = [
    (HERMES, f'Checking.\n<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>'
             '\n<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
     "Checking.", [("get_weather", json.loads(W)), ("add", {"a": 1})]),
    (GENERIC, "no call at all, <tool not a marker", "no call at all, <tool not a marker", []),
    (LLAMA3, f'{{"name": "get_weather", "parameters": {W}}}', "", [("get_weather", json.loads(W))]),
    (LLAMA3, '<|python_tag|>{"name": "f", "parameters": {}}', "", [("f", {})]),
    (LLAMA3, 'Plain text with {"name": "x"} inside', 'Plain text with {"name": "x"} inside', []),
    (MISTRAL, f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {W}, "id": "abc123XYZ"}}, '
              '{"name": "b", "arguments": {"k": [1, 2]}, "id": "def456uvw"}]',
     "", [("get_weather", json.loads(W)), ("b", {"k": [1, 2]})]),
    (GRANITE, '<|tool_call|>[{"name": "a", "arguments": {"s": "]}"}}]', "", [("a", {"s": "]}"})]),
    (HERMES, "<tool_call>not json</tool_call> after", "<tool_call>not json</tool_call> after", []),
    (MISTRAL, "[TOOL_CALLS]oops", "[TOOL_CALLS]oops", []),
    (HERMES, '<tool_call>{"arguments": {"a": 1}}</tool_call>',
     '<tool_call>{"arguments": {"a": 1}}</tool_call>', []),
]


def parse(fmt: ToolFormat, pieces: list[str]) -> tuple[str, list[tuple[str, object]], list[str]]:
    p = CallParser(fmt)
    events = [e for piece in pieces for e in p.feed(piece)] + p.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    opens = [e for e in events if isinstance(e, CallOpen)]
    args = [""] * len(opens)
    for k, e in enumerate(events):
        if isinstance(e, CallArgs):
            args[e.index] += e.text
            # a call's name is announced before any of its arguments
            assert any(isinstance(x, CallOpen) and x.index == e.index for x in events[:k])
    assert [o.index for o in opens] == list(range(len(opens)))
    if fmt.id_length:
        assert all(len(o.id) == fmt.id_length and o.id.isalnum() for o in opens)
    calls = [(o.name, json.loads(a)) for o, a in zip(opens, args, strict=True)]
    return content, calls, [o.id for o in opens]


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES)
def test_whole(fmt: ToolFormat, text: str, content: str, calls: list[tuple[str, object]]) -> None:
    got_content, got_calls, _ = parse(fmt, [text])
    assert got_content.strip() == content
    assert got_calls == calls


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES)
def test_cut_anywhere(fmt: ToolFormat, text: str, content: str,
                      calls: list[tuple[str, object]]) -> None:
    for cut in range(1, len(text)):
        got_content, got_calls, _ = parse(fmt, [text[:cut], text[cut:]])
        assert (got_content.strip(), got_calls) == (content, calls), cut
    rng = random.Random(len(text))
    for _ in range(30):
        pieces, i = [], 0
        while i < len(text):
            n = rng.randint(1, 5)
            pieces.append(text[i:i + n])
            i += n
        got_content, got_calls, _ = parse(fmt, pieces)
        assert (got_content.strip(), got_calls) == (content, calls)


def test_no_marker_leaks_into_content_while_streaming() -> None:
    text = CASES[0][1]
    p = CallParser(HERMES)
    seen = "".join(e.text for ch in text for e in p.feed(ch) if isinstance(e, Content))
    assert "<" not in seen and seen.strip() == "Checking."


def test_a_call_cut_off_keeps_its_partial_arguments() -> None:
    p = CallParser(HERMES)
    events = p.feed('<tool_call>{"name": "f", "arguments": {"a": "unfinis') + p.finish()
    assert isinstance(events[0], CallOpen) and p.num_calls == 1
    assert "".join(e.text for e in events if isinstance(e, CallArgs)) == '{"a": "unfinis'
