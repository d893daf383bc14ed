"""OpenAI chat messages: validated into the plain dicts the chat template renders."""

from __future__ import annotations

from typing import Any

from edgeinfer.api.fields import Body
from edgeinfer.errors import InvalidRequest

MAX_MESSAGES = 4096
ROLES = {"system", "developer", "user", "assistant", "tool", "function"}  # function: deprecated
# what the SDK may send back from an earlier response; everything else is refused
MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal",
                "function_call", "audio", "annotations", "reasoning_content",
                "parsed"}  # the SDK's parse() / stream() results keep their parsed answer


def _content(msg: dict[str, Any], i: int) -> str:
    content = msg.get("content")
    where = f"messages[{i}].content"
    if content is None:
        if msg.get("role") == "assistant":
            return ""
        raise InvalidRequest(f"'{where}' is required", param=where)
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"'{where}' must be a string or a list of content parts", param=where)
    parts = []
    for j, part in enumerate(content):
        if (msg.get("role") == "assistant" and isinstance(part, dict)
                and part.get("type") == "refusal" and isinstance(part.get("refusal"), str)):
            parts.append(part["refusal"])  # an earlier answer's refusal, as its text
            continue
        if isinstance(part, dict) and part.get("type") == "text" and not isinstance(
                part.get("text"), str):
            raise InvalidRequest(f"'{where}[{j}].text' must be a string",
                                 param=f"{where}[{j}].text")
        if not isinstance(part, dict) or part.get("type") != "text":
            raise InvalidRequest(f"'{where}[{j}]': only text content parts are supported",
                                 param=f"{where}[{j}]")
        parts.append(part["text"])
    return "\n".join(parts)  # as llama.cpp and vLLM join text parts


def _past_calls(calls: Any, i: int) -> list[dict[str, Any]]:
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise InvalidRequest(f"'{where}' must be a list", param=where)
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(
                fn.get("arguments", ""), str):
            raise InvalidRequest(f"'{where}[{j}]' must be a function call with a name and "
                                 "string arguments", param=f"{where}[{j}]")
        out.append({"id": str(c.get("id", "")), "type": "function",
                    "function": {"name": fn["name"], "arguments": fn.get("arguments", "")}})
    return out


def messages(b: Body) -> tuple[dict[str, Any], ...]:
    msgs = b.body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise InvalidRequest("'messages' must be a non-empty list", param="messages")
    if len(msgs) > MAX_MESSAGES:
        raise InvalidRequest(f"at most {MAX_MESSAGES} messages are allowed", param="messages")
    out, last_call = [], ""
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise InvalidRequest(f"'messages[{i}]' must be an object", param=f"messages[{i}]")
        for key in m:
            if key not in MESSAGE_KEYS:
                raise InvalidRequest(f"unrecognized message field: {key}",
                                     param=f"messages[{i}].{key}")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRequest(f"'messages[{i}].role' must be one of {sorted(ROLES)}",
                                 param=f"messages[{i}].role")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                               "content": _content(m, i)}
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        if role == "assistant" and m.get("tool_calls") is not None:
            msg["tool_calls"] = _past_calls(m["tool_calls"], i)
        elif role == "assistant" and isinstance(m.get("function_call"), dict):
            last_call = f"call_{i}"  # the deprecated shape: a call without an id
            msg["tool_calls"] = _past_calls([{"id": last_call, "type": "function",
                                              "function": m["function_call"]}], i)
        if role == "function":  # the deprecated result of the last function_call
            msg["role"], msg["tool_call_id"] = "tool", last_call
        if role == "assistant" and isinstance(m.get("reasoning_content"), str):
            # for templates that render (or drop) earlier reasoning their own way
            msg["reasoning_content"] = m["reasoning_content"]
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise InvalidRequest(f"'messages[{i}].tool_call_id' is required for tool messages",
                                     param=f"messages[{i}].tool_call_id")
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return tuple(out)
