"""The parts of one ``allOf`` merged into one sub-schema (``merge``; the walk that finds
them is ``conjunction``): properties and ``required`` joined, types intersected, the
tighter bound kept, enums intersected and kept to the type and the const; what no value
satisfies is a 400; two different values of another keyword keep the first (logged)."""

from __future__ import annotations

import json
import logging
from typing import Any

from edgeinfer.errors import InvalidRequest

log = logging.getLogger("edgeinfer.prompt")

_LOWER = {"minimum", "minLength", "minItems", "minProperties"}
_UPPER = {"maximum", "maxLength", "maxItems", "maxProperties"}
ANY = {"anyOf": [{"type": t} for t in ("string", "number", "boolean", "null", "object",
                                        "array")]}  # any JSON value, as the converter takes it
TOGETHER = {"items", "additionalProperties", "additionalItems", "propertyNames"}
_JSON_TYPES: dict[str, Any] = {"string": str, "object": dict, "array": list,
                               "boolean": bool, "null": type(None)}


def none_satisfies(what: str) -> InvalidRequest:
    return InvalidRequest(f"{what}: no value satisfies the schema", param="schema")


def exclusive_numbers(part: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI 3.0's (draft 4's) ``exclusiveMinimum: true`` beside ``minimum`` as the
    number form, so that bounds of several parts compare."""
    out = dict(part)
    for flag, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(flag), bool):
            if out.pop(flag) and bound in out:
                out[flag] = out.pop(bound)
    return out


def _same(a: Any, b: Any) -> bool:
    """JSON equality (Python's says ``True == 1``)."""
    return a is b or json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One sub-schema holding what every part holds (no choices among them)."""
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = _combine(key, out[key], value) if key in out else value
    return _values_of_the_type(out)


def _values_of_the_type(node: dict[str, Any]) -> dict[str, Any]:
    """An ``enum`` kept to the values of the type and the ``const``; 400 when none is."""
    kept = values_kept(node, "the 'allOf' parts' values and types")
    if kept is None:
        return node
    return {**node, "enum": kept} if "enum" in node and "const" not in node else node


# what the converter drops beside an enum or a const (it writes their values alone)
VALUE_KEYWORDS = {"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                  "minLength", "maxLength", "minItems", "maxItems"}


def values_kept(node: dict[str, Any], what: str) -> list[Any] | None:
    """The values of ``node``'s ``const`` or ``enum`` that its type, bounds and lengths
    allow (and the enum, beside a const); None without either; 400 when none is."""
    kind = node.get("type")
    types = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else None
    values = [node["const"]] if "const" in node else node.get("enum")
    if not isinstance(values, list):
        return None
    kept = [v for v in values if (types is None or any(_is_a(v, t) for t in types))
            and _within(v, exclusive_numbers(node))]
    if "const" in node and isinstance(node.get("enum"), list):
        kept = [v for v in kept if any(_same(v, e) for e in node["enum"])]
    if not kept:
        raise none_satisfies(f"{what} have nothing in common")
    return kept


def _within(value: Any, node: dict[str, Any]) -> bool:
    """Whether ``value`` lies within ``node``'s bounds and lengths (the number form of
    the exclusive bounds)."""
    def bound(key: str) -> Any:
        return node[key] if numbers(node.get(key), 0) else None
    if isinstance(value, int | float) and not isinstance(value, bool):
        lo, hi, above, below = map(bound, ("minimum", "maximum", "exclusiveMinimum",
                                           "exclusiveMaximum"))
        return ((lo is None or value >= lo) and (hi is None or value <= hi)
                and (above is None or value > above) and (below is None or value < below))
    if isinstance(value, str | list):
        lo, hi = map(bound, ("minLength", "maxLength") if isinstance(value, str)
                     else ("minItems", "maxItems"))
        return (lo is None or len(value) >= lo) and (hi is None or len(value) <= hi)
    return True


def _is_a(value: Any, kind: Any) -> bool:
    if kind in ("integer", "number"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        return kind == "number" or float(value).is_integer()
    want = _JSON_TYPES.get(kind)
    return want is None or isinstance(value, want)


def _combine(key: str, a: Any, b: Any) -> Any:
    if _same(a, b):
        return a
    if key == "properties" and isinstance(a, dict) and isinstance(b, dict):
        return {**a, **b, **{n: {"allOf": [a[n], b[n]]} for n in a.keys() & b.keys()
                             if not _same(a[n], b[n])}}
    if key == "required" and isinstance(a, list) and isinstance(b, list):
        return list(dict.fromkeys([*a, *b]))
    if key == "type":
        return _types(a, b)
    if key in _LOWER | _UPPER | {"exclusiveMinimum", "exclusiveMaximum"} and numbers(a, b):
        return max(a, b) if key in _LOWER or key == "exclusiveMinimum" else min(a, b)
    if key == "enum" and isinstance(a, list) and isinstance(b, list):
        if not (both := [v for v in a if any(_same(v, w) for w in b)]):
            raise none_satisfies("the 'allOf' parts' enums have no value in common")
        return both
    if key == "const":
        raise none_satisfies("the 'allOf' parts' consts differ")
    if key in TOGETHER and all(isinstance(v, dict | bool) for v in (a, b)):
        if a is False or b is False:
            return False
        return b if a is True else a if b is True else {"allOf": [a, b]}
    log.warning("an 'allOf' of two different %r is not enforced: the first holds (%s, "
                "not %s)", key, str(a)[:100], str(b)[:100])
    return a


def numbers(a: Any, b: Any) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b))


def _types(a: Any, b: Any) -> str | list[str]:
    """The types both ``a`` and ``b`` allow (a name or a list of names; the Ollama
    client's ``"string, integer"`` is a list)."""
    def names(t: Any) -> list[str]:
        listed = t.split(",") if isinstance(t, str) else t if isinstance(t, list) else []
        return [n.strip() for n in listed if isinstance(n, str) and n.strip()]
    first, second = names(a), names(b)
    both = [n for n in first if n in second or n == "integer" and "number" in second]
    both += [n for n in second if n == "integer" and "number" in first and n not in both]
    if not both:
        raise none_satisfies(f"the 'allOf' parts' types ({a} and {b}) have none in common")
    return both[0] if len(both) == 1 else both
