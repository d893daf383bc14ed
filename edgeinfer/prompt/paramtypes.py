"""What the tagged-parameter formats need to know of the offered tools' parameters: each
parameter's JSON type (they write values untyped) and each tool's whole schema (MiniMax M3
nests its arguments)."""

from __future__ import annotations

from typing import Any


def parameter_types(tools: Any) -> dict[str, dict[str, str]]:
    """Each tool's parameter JSON types (``{"get_weather": {"days": "integer"}}``), from
    ToolSpecs; a parameter without one plain type is left out (read as JSON if it parses)."""
    out: dict[str, dict[str, str]] = {}
    for t in tools:
        props = (t.parameters or {}).get("properties") or {}
        if not isinstance(props, dict):
            continue  # not a schema: the grammar made from it refuses it (400)
        out[t.name] = {k: "quoted" if quoted_string(v) else v["type"] for k, v in props.items()
                       if isinstance(v, dict) and isinstance(v.get("type"), str)}
    return out


def parameter_schemas(tools: Any) -> dict[str, dict[str, Any]]:
    """Each tool's parameters schema, from ToolSpecs (for formats that nest arguments)."""
    return {t.name: t.parameters for t in tools if isinstance(t.parameters, dict)}


def quoted_string(prop: dict[str, Any]) -> bool:
    """A string parameter that the tagged-parameter grammars write as JSON, quotes and all
    (one with a const, pattern or format: llama.cpp's schema grammar enforces it), where
    plain text parameters and string enums are written bare."""
    if prop.get("type") != "string":
        return False
    enum = prop.get("enum")
    if isinstance(enum, list) and all(isinstance(v, str) for v in enum):
        return False
    return bool({"enum", "const", "pattern", "format"} & set(prop))
