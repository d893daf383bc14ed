"""/api/chat's ``tool_choice`` (an edgeinfer extension: Ollama has none, and drops it):
taken in the shapes clients of every dialect send, dropped (not a 400) in the others."""

from __future__ import annotations

from typing import Any

import pytest

from edgeinfer.api.ollama_api import parse_chat
from edgeinfer.errors import InvalidRequest

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


def _choice(**body: Any) -> tuple[str, tuple[str, ...]]:
    parsed = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                         **body}, {})
    assert parsed.req is not None
    c = parsed.req.constraint
    return c.tool_choice, tuple(t.name for t in c.tools)


@pytest.mark.parametrize("choice", [
    {"type": "function", "name": "weather"},  # Responses' (the Vercel AI SDK's provider)
    {"type": "tool", "name": "weather"},  # Anthropic's
    {"type": "function", "function": {"name": "weather"}}])  # Chat Completions'
def test_a_named_tool_in_every_dialect_s_shape_is_forced(choice: Any) -> None:
    assert _choice(tools=[WEATHER], tool_choice=choice) == ("weather", ("weather",))


@pytest.mark.parametrize(("choice", "meant"), [
    ("any", "required"), ({"type": "any"}, "required"), ({"type": "auto"}, "auto"),
    ({"type": "none"}, "none"), ("required", "required"), (None, "auto")])
def test_modes_in_every_dialect_s_shape(choice: Any, meant: str) -> None:
    assert _choice(tools=[WEATHER], tool_choice=choice) == (meant, ("weather",))


@pytest.mark.parametrize("body", [
    {"tools": [], "tool_choice": "auto"},  # (llama-index sends "tools": [] always)
    {"tools": [], "tool_choice": "required"},
    {"tool_choice": {"type": "function", "name": "weather"}},
    {"tools": [WEATHER], "tool_choice": "sometimes"},
    {"tools": [WEATHER], "tool_choice": {"type": "mystery"}},
    {"tools": [WEATHER], "tool_choice": 3},
    {"tools": [WEATHER], "tool_choice": {"type": "function"}}])
def test_what_ollama_would_drop_is_dropped_not_refused(body: dict[str, Any]) -> None:
    choice, tools = _choice(**body)
    assert choice == ("auto" if tools else "none")


def test_a_named_tool_not_offered_is_still_a_400() -> None:
    with pytest.raises(InvalidRequest) as info:
        _choice(tools=[WEATHER], tool_choice={"type": "function", "name": "other"})
    assert info.value.param == "tool_choice"


@pytest.mark.parametrize("choice", [
    {"type": "allowed_tools", "mode": "required", "tools": [
        {"type": "function", "name": "weather"}]},  # Responses'
    {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "weather"}}]}}])  # Chat Completions'
def test_allowed_tools_in_either_shape(choice: Any) -> None:
    other = {"type": "function", "function": {"name": "other", "parameters": {}}}
    assert _choice(tools=[WEATHER, other], tool_choice=choice) == ("required", ("weather",))
