"""Ollama's chat messages as the OpenAI-shaped ones the rest of the server reads.

System / user / assistant (``tool_calls`` with object arguments, made OpenAI's JSON text
with an id when none is given; ``thinking`` as ``reasoning_content``) / tool (answers the
open call named by ``tool_name``, else the first: its id becomes ``tool_call_id``);
``images`` are refused: no model here sees them. Other fields Ollama does not know are
ignored, as Ollama ignores them.
"""

from __future__ import annotations

import json
from typing import Any

from edgeinfer.api.fields import Body
from edgeinfer.api.messages import messages
from edgeinfer.errors import InvalidRequest


def _past_calls(calls: Any, i: int) -> list[dict[str, Any]]:
    """An assistant message's Ollama ``tool_calls`` (arguments objects) in OpenAI's shape."""
    where, out = f"messages[{i}].tool_calls", []
    for j, call in enumerate(calls if isinstance(calls, list) else [None]):
        fn = call.get("function") if isinstance(call, dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        args = {} if args is None else args  # (null: none)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(
                args, dict):
            raise InvalidRequest(f"'{where}' must be a list of {{'function': {{'name': ..., "
                                 "'arguments': {...}}}}", param=f"{where}[{j}]")
        assert isinstance(call, dict)
        call_id = call["id"] if isinstance(call.get("id"), str) else f"call_{i}_{j}"
        out.append({"id": call_id, "type": "function", "function": {
            "name": fn["name"], "arguments": json.dumps(args)}})
    return out


def _message(m: Any, i: int, open_calls: list[dict[str, Any]]) -> dict[str, Any]:
    """One Ollama message as an OpenAI one; ``open_calls``: the calls not yet answered."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise InvalidRequest(f"'{where}' must be an object", param=where)
    if m.get("images"):  # (other fields Ollama does not know it ignores, as here)
        raise InvalidRequest(f"'{where}.images' is not supported: no model here sees images",
                             param=f"{where}.images")
    if not isinstance(m.get("content", ""), str | None):
        raise InvalidRequest(f"'{where}.content' must be a string", param=f"{where}.content")
    out: dict[str, Any] = {"role": m.get("role"), "content": m.get("content") or ""}
    if m.get("role") == "assistant":
        if m.get("tool_calls"):
            out["tool_calls"] = open_calls[:] = _past_calls(m["tool_calls"], i)
        if m.get("thinking") and isinstance(m["thinking"], str):
            out["reasoning_content"] = m["thinking"]
    elif m.get("role") == "tool":
        name = m.get("tool_name")
        answered = next((c for c in open_calls if c["function"]["name"] == name),
                        open_calls[0] if open_calls else None)
        if answered is not None:
            open_calls.remove(answered)
        given = m.get("tool_call_id")
        out["tool_call_id"] = given if isinstance(given, str) else (
            answered["id"] if answered else f"call_{i}")
        if isinstance(name, str):
            out["name"] = name
    return out


def conversation(raw: Any) -> tuple[dict[str, Any], ...]:
    """Ollama messages as validated OpenAI messages (``api.messages``)."""
    if not isinstance(raw, list):
        raise InvalidRequest("'messages' must be a list", param="messages")
    open_calls: list[dict[str, Any]] = []
    converted = [_message(m, i, open_calls) for i, m in enumerate(raw)]
    return messages(Body({"messages": converted}, {"messages"}))
