"""Conversations reshaped for what a chat template takes: past calls in the shape it shows,
one call per turn, alternation kept, a system message it refuses moved; and the probe
messages that find out which of these a template needs (``edgeinfer.prompt.template``)."""

from __future__ import annotations

import json
from typing import Any

PROBE_CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "edgeinfr1", "type": "function",  # 9 characters, as Mistral demands
     "function": {"name": "edgeinfer_probe", "arguments": {"probe_arg": 1}}}]}
PROBE_USER = {"role": "user", "content": "User message"}
PROBE_RESULT = {"role": "tool", "tool_call_id": "edgeinfr1", "content": "probe result"}


def alternating(messages: list[dict[str, Any]], join_users: bool, tool_answer: str | None
                ) -> list[dict[str, Any]]:
    """Messages as a template that insists on alternation takes them: consecutive user
    turns joined (a blank line between); an assistant turn of ``tool_answer`` (None:
    none) between tool results and a user turn."""
    out: list[dict[str, Any]] = []
    for m in messages:
        prev = out[-1] if out else None
        if join_users and prev is not None and prev.get("role") == m.get("role") == "user":
            out[-1] = {**prev, "content": _joined(prev.get("content"), m.get("content"))}
            continue
        if tool_answer is not None and prev is not None and prev.get("role") == "tool" \
                and m.get("role") == "user":
            out.append({"role": "assistant", "content": tool_answer})
        out.append(m)
    return out


def _joined(a: Any, b: Any) -> Any:
    """Two user contents as one: text joined by a blank line, part lists concatenated."""
    if isinstance(a, str | None) and isinstance(b, str | None):
        return "\n\n".join(t for t in (a, b) if t)
    parts = [*(a if isinstance(a, list) else [{"type": "text", "text": a or ""}]),
             {"type": "text", "text": "\n\n"},
             *(b if isinstance(b, list) else [{"type": "text", "text": b or ""}])]
    return parts


def with_call_shape(messages: list[dict[str, Any]], shape: tuple[bool, bool]
                     ) -> list[dict[str, Any]]:
    """Assistant messages with calls in ``shape``: (content None where it is empty,
    arguments as JSON text)."""
    none_content, text_args = shape
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            m = dict(m)
            if none_content and not m.get("content"):
                m["content"] = None
            if text_args:
                m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": (
                    a if isinstance(a := c["function"].get("arguments"), str)
                    else json.dumps(a, ensure_ascii=False))}} for c in m["tool_calls"]]
        out.append(m)
    return out


def one_call_each(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parallel calls as turns of one call each, each followed by its result (matched by
    ``tool_call_id``, else in order), for templates that show one call per turn."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        calls = (m.get("tool_calls") or []) if m.get("role") == "assistant" else []
        if len(calls) < 2:
            out.append(m)
            i += 1
            continue
        j = i + 1
        while j < len(messages) and messages[j].get("role") == "tool":
            j += 1
        results = list(messages[i + 1:j])
        for k, call in enumerate(calls):
            out.append({**m, "content": m.get("content") if k == 0 else "",
                        "tool_calls": [call]})
            mine = next((r for r in results if r.get("tool_call_id") == call.get("id")),
                        results[0] if results else None)
            if mine is not None:
                results.remove(mine)
                out.append(mine)
        out += results
        i = j
    return out


def merge_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A leading system message joined to the start of the next message ("\n" between),
    or dropped when it is alone: llama.cpp's way with templates that refuse the role."""
    system, rest = messages[0], messages[1:]
    if not rest:
        return rest
    first, text = dict(rest[0]), system.get("content") or ""
    content = first.get("content")
    if isinstance(content, str) or content is None:
        first["content"] = f"{text}\n{content or ''}"
    elif isinstance(content, list):
        first["content"] = [{"type": "text", "text": f"{text}\n"}, *content]
    return [first, *rest[1:]]
