"""A tuple written as the one tuple the converter writes (``one_tuple``)."""

from __future__ import annotations

from typing import Any

from edgeinfer.prompt.intersection import ANY, none_satisfies, numbers


def one_tuple(node: dict[str, Any]) -> dict[str, Any]:
    """A tuple (``prefixItems``, or draft 7's ``items`` list) as the one tuple the converter
    writes: of its own length, or the nearest within ``minItems`` / ``maxItems``, the
    items past it of the rest's schema (``items`` beside ``prefixItems``, else
    ``additionalItems``; any value when absent). The converter took ``items`` alone beside
    ``prefixItems`` and wrote the tuple whatever the counts."""
    prefix, rest_key = node.get("prefixItems"), "items"
    if not isinstance(prefix, list):
        prefix, rest_key = node.get("items"), "additionalItems"
    if not isinstance(prefix, list):
        return node
    rest = node.get(rest_key)
    least: Any = node.get("minItems")
    most: Any = node.get("maxItems")
    size = len(prefix)
    if numbers(least, 0) and least > size:
        size = int(least)
    if numbers(most, 0) and most < size:
        size = int(most)
    if size > len(prefix) and rest is False:
        raise none_satisfies("'minItems' asks for more items than the tuple allows")
    extra = ANY if rest in (None, True) or not isinstance(rest, dict) else rest
    out = {k: v for k, v in node.items() if k not in ("prefixItems", "items", "additionalItems",
                                                       "minItems", "maxItems")}
    return {**out, "prefixItems": [*prefix[:size], *[extra] * (size - len(prefix))]}
