"""OpenAI's ``tool_choice`` where its two dialects share it: ``allowed_tools``, and the
Responses dialect's whole ``tool_choice``.

``{"type": "allowed_tools", ...}`` lets the model call only some of ``tools``, in mode
``auto`` (it may answer instead) or ``required``. Chat Completions nests it
(``{"allowed_tools": {"mode", "tools": [{"type": "function", "function": {"name"}}]}}``),
Responses does not (``{"mode", "tools": [{"type": "function", "name"}]}``). Here the
other tools are left out of the request, prompt and all, so the prompt differs from one
that offers them all (OpenAI keeps it whole, for its prompt cache).
"""

from __future__ import annotations

import logging
from typing import Any

from edgeinfer.errors import InvalidRequest
from edgeinfer.prompt.tools import ToolSpec

log = logging.getLogger("edgeinfer.api")


def allowed_tools(raw: Any, tools: tuple[ToolSpec, ...], chat: bool
                  ) -> tuple[tuple[ToolSpec, ...], str] | None:
    """(the tools ``raw`` allows, in the order of ``tools``; its mode) for an
    ``allowed_tools`` tool_choice (``chat``: Chat Completions' shape), else None."""
    if not isinstance(raw, dict) or raw.get("type") != "allowed_tools":
        return None
    where = "tool_choice.allowed_tools" if chat else "tool_choice"
    spec = raw.get("allowed_tools") if chat else raw
    listed = spec.get("tools") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or spec.get("mode") not in ("auto", "required") or not (
            isinstance(listed, list) and listed):
        raise InvalidRequest(f"'{where}' needs 'mode' ('auto' or 'required') and a non-empty "
                             "list 'tools'", param=where)
    names, known = set(), {x.name for x in tools}
    for j, t in enumerate(listed):
        fn = t.get("function") if chat and isinstance(t, dict) else t
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(name, str):
            shape = "{'function': {'name': ...}}" if chat else "'name'"
            raise InvalidRequest(f"'{where}.tools[{j}]' must be a function tool with {shape}",
                                 param=f"{where}.tools[{j}]")
        if name not in known:
            raise InvalidRequest(f"'{where}.tools[{j}]' names {name!r}, which is not in "
                                 "'tools'", param=f"{where}.tools[{j}]")
        names.add(name)
    return tuple(x for x in tools if x.name in names), str(spec["mode"])


def responses_choice(raw: Any, tools: tuple[ToolSpec, ...]
                     ) -> tuple[tuple[ToolSpec, ...], str, Any]:
    """(the tools offered, the constraint's tool_choice, its echo) of a Responses body's
    ``tool_choice``."""
    if raw is None or raw in ("none", "auto", "required"):
        choice = raw or "auto"
        if choice == "required" and not tools:
            raise InvalidRequest("'tool_choice' 'required' needs 'tools'", param="tool_choice")
        return tools, (choice if tools else "none"), choice
    if isinstance(raw, dict) and raw.get("type") == "function" and isinstance(
            raw.get("name"), str) and set(raw) == {"type", "name"}:
        if raw["name"] not in {t.name for t in tools}:
            raise InvalidRequest(f"'tool_choice' names {raw['name']!r}, which is not in "
                                 "'tools'", param="tool_choice")
        return tools, raw["name"], {"type": "function", "name": raw["name"]}
    if (allowed := allowed_tools(raw, tools, chat=False)) is not None:
        return allowed[0], allowed[1], {"type": "allowed_tools", "mode": allowed[1], "tools": [
            {"type": "function", "name": t.name} for t in allowed[0]]}
    raise InvalidRequest("'tool_choice' must be 'none', 'auto', 'required', {'type': "
                         "'function', 'name': ...} or {'type': 'allowed_tools', ...}",
                         param="tool_choice")


def ollama_choice(raw: Any, tools: Any) -> Any:
    """An Ollama body's ``tool_choice`` (an edgeinfer extension: Ollama has none, and drops
    it) in Chat Completions' shape, taken in the shapes clients of the other dialects send
    too (the Vercel AI SDK's Ollama provider sends Responses' ``{"type": "function",
    "name"}``): Responses' (``allowed_tools`` too) and Anthropic's (``{"type": "auto" |
    "any" | "none"}``, ``{"type": "tool", "name"}``, ``"any"``). Without tools, or in no
    shape known, it is dropped (logged), as Ollama drops it."""
    if isinstance(raw, dict) and "function" not in raw and "allowed_tools" not in raw:
        kind, name, listed = raw.get("type"), raw.get("name"), raw.get("tools")
        if kind in ("function", "tool") and isinstance(name, str):
            raw = {"type": "function", "function": {"name": name}}
        elif kind in ("auto", "any", "none"):
            raw = kind
        elif kind == "allowed_tools" and isinstance(listed, list):  # (Responses' shape)
            raw = {"type": kind, "allowed_tools": {"mode": raw.get("mode"), "tools": [
                {"type": "function", "function": {"name": t.get("name")}}
                if isinstance(t, dict) else t for t in listed]}}
    raw = "required" if raw == "any" else raw
    fn = raw.get("function") if isinstance(raw, dict) else None
    known = raw in ("none", "auto", "required") or isinstance(raw, dict) and (
        raw.get("type") == "function" and isinstance(fn, dict) and isinstance(fn.get("name"), str)
        or raw.get("type") == "allowed_tools" and isinstance(raw.get("allowed_tools"), dict))
    if raw is not None and not (tools and known):
        log.info("ignored a 'tool_choice' %s: %.100r", "of no shape known" if tools and not
                 known else "without tools", raw)
        return None
    return raw
