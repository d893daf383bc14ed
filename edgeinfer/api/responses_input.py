"""The ``input`` of a Responses request: message, function_call, function_call_output and
reasoning items, checked (400 naming the field) and normalised into the shape
``input_items`` lists, each with an id; ``item_reference`` items (an item of a stored
response, by id, as the Vercel AI SDK sends earlier turns) are kept as they are, for
``openai_responses._resolve`` to replace with the stored items (``input_item`` each)."""

from __future__ import annotations

from typing import Any

from edgeinfer.api.messages import MAX_MESSAGES
from edgeinfer.api.responses_render import new_id
from edgeinfer.errors import InvalidRequest

ITEM_KEYS = {"message": {"type", "id", "role", "content", "status", "phase"},
             "function_call": {"type", "id", "call_id", "name", "arguments", "status",
                               "namespace", "caller", "async", "async_"},
             "function_call_output": {"type", "id", "call_id", "output", "status", "name",
                                      "namespace", "caller"},
             # an earlier answer's reasoning, given back: kept with the input, not rendered
             "reasoning": {"type", "id", "summary", "content", "encrypted_content", "status"},
             # an item of a stored response, by id: resolved from the store before use
             "item_reference": {"type", "id"}}
PART_KEYS = {"type", "text", "annotations", "logprobs", "prompt_cache_breakpoint"}

def bad(where: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"'{where}' {what}", param=where)


def _texts(content: Any, where: str) -> list[str]:
    """The texts of message content: a string or a list of text parts (and refusals, which
    an assistant message from an OpenAI conversation may hold)."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise bad(where, "must be a string or a list of content parts")
    out = []
    for j, p in enumerate(content):
        if isinstance(p, dict) and p.get("type") == "refusal" and set(p) <= {
                "type", "refusal"} and isinstance(p.get("refusal"), str):
            out.append(p["refusal"])  # (an earlier answer's refusal, as its text)
            continue
        if not isinstance(p, dict) or p.get("type") not in ("input_text", "output_text", "text"
                                                             ) or set(p) - PART_KEYS or \
                not isinstance(p.get("text"), str):
            raise bad(f"{where}[{j}]", "must be {'type': 'input_text' or 'output_text', "
                       "'text': string} or {'type': 'refusal', 'refusal': string}: only text "
                       "content is supported")
        out.append(p["text"])
    return out


def _strings(raw: dict[str, Any], where: str, *names: str) -> list[str]:
    for name in names:
        if not isinstance(raw.get(name), str):
            raise bad(f"{where}.{name}", "must be a string")
    return [raw[name] for name in names]


def input_item(raw: Any, where: str) -> dict[str, Any]:
    """One input item, checked and normalised (the shape input_items lists), with an id."""
    kind = raw.get("type", "message") if isinstance(raw, dict) else None
    if not isinstance(kind, str) or kind not in ITEM_KEYS:
        raise bad(f"{where}.type" if isinstance(raw, dict) else where,
                   "must be a message, function_call, function_call_output, reasoning or "
                   "item_reference item")
    extra: list[str] = sorted(set(raw) - ITEM_KEYS[kind])
    if extra:
        raise bad(f"{where}.{extra[0]}", "is not a recognized field of this item")
    rid = raw["id"] if isinstance(raw.get("id"), str) and raw["id"] else None
    if kind == "item_reference":
        if rid is None:
            raise bad(f"{where}.id", "must be the id of an item of a stored response")
        return {"type": kind, "id": rid}
    if kind == "function_call":
        call_id, name, args = _strings(raw, where, "call_id", "name", "arguments")
        return {"id": rid or new_id("fc"), "type": kind, "call_id": call_id, "name": name,
                "arguments": args, "status": "completed"}
    if kind == "reasoning":
        texts = [p.get("text", "") for p in raw.get("content") or [] if isinstance(p, dict)]
        return {"id": rid or new_id("rs"), "type": kind, "summary": [],
                "content": [{"type": "reasoning_text", "text": t} for t in texts
                            if isinstance(t, str)]}
    if kind == "function_call_output":
        (call_id,) = _strings(raw, where, "call_id")
        return {"id": rid or new_id("fco"), "type": kind, "call_id": call_id,
                "output": "".join(_texts(raw.get("output"), f"{where}.output")),
                "status": "completed"}
    role = raw.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise bad(f"{where}.role", "must be 'user', 'assistant', 'system' or 'developer'")
    kind = "output_text" if role == "assistant" else "input_text"
    extra_keys: dict[str, Any] = {"annotations": []} if role == "assistant" else {}
    return {"id": rid or new_id("msg"), "type": "message", "role": role, "status": "completed",
            "content": [{"type": kind, "text": t, **extra_keys}
                        for t in _texts(raw.get("content"), f"{where}.content")]}


def input_items(raw: Any) -> list[dict[str, Any]]:
    """The ``input`` of a request: its items checked and normalised, with ids."""
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw or len(raw) > MAX_MESSAGES:
        raise bad("input", f"must be a string or a list of 1 to {MAX_MESSAGES} items")
    return [input_item(r, f"input[{i}]") for i, r in enumerate(raw)]
