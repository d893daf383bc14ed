"""``allOf`` made one sub-schema before the grammar is written (``merged``).

llama-cpp-python's converter reads ``allOf`` as a list of objects and takes only their
``properties``: an ``allOf`` holding an enum, a string's bounds or a ``$ref`` to anything
but an object came out as ``{}`` (the model was made to write ``{}``), the branches of an
``anyOf`` part came out as optional properties, and the node's own keywords beside
``allOf`` were dropped. Here the parts (``$ref``s resolved, nested ``allOf``s flattened,
the node's own keywords one more part) are merged into one sub-schema:

- properties and required names are joined (a property in several parts: ``allOf`` of
  its schemas, merged in turn);
- the types are intersected (``integer`` within ``number``), bounds take the tighter
  value, enums keep the values every part allows, ``items`` and ``additionalProperties``
  hold together; what no value satisfies (types or enums with nothing in common,
  different consts, a ``false`` part) is a 400;
- a part that is a choice (``anyOf`` / ``oneOf``) is distributed: one branch per
  combination, each branch with the other parts (at most ``MAX_BRANCHES`` in a schema,
  and ``MAX_PARTS`` parts in all: 400 ``grammar_too_large`` past them);
- two different ``pattern``s, ``format``s or other keywords keep the first, logged as not
  enforced.

An object part closed with ``additionalProperties: false`` closes the merged object with
every part's properties, as a reader of such a schema means it (the letter of JSON
Schema would allow only that part's properties).
"""

from __future__ import annotations

import logging
from typing import Any

from edgeinfer.errors import InvalidRequest
from edgeinfer.prompt.keywords import ANNOTATIONS
from edgeinfer.prompt.schemacheck import SCHEMA_LISTS, SCHEMA_MAPS

log = logging.getLogger("edgeinfer.prompt")

MAX_BRANCHES = 64  # the branches distributing choices over allOf may make, in one schema
MAX_PARTS = 512  # the parts all allOfs of one schema may hold, $refs resolved (a $ref
# fanned out level by level would otherwise make parts by the millions)
_LOWER = {"minimum", "minLength", "minItems", "minProperties"}
_UPPER = {"maximum", "maxLength", "maxItems", "maxProperties"}
_TOGETHER = {"items", "additionalProperties", "additionalItems", "propertyNames"}
_CHOICES = ("anyOf", "oneOf")
_DEFS = ("$defs", "definitions")


def merged(schema: Any) -> Any:
    """``schema`` with every ``allOf`` merged away (see the module docstring)."""
    if not isinstance(schema, dict):
        return schema
    defs = {f"#/{key}/{name}": sub for key in _DEFS if isinstance(schema.get(key), dict)
            for name, sub in schema[key].items()}
    return _Merger(defs).walk(schema)


class _Merger:
    def __init__(self, defs: dict[str, Any]) -> None:
        self.defs = defs
        self.branches = self.parts = 0

    def walk(self, node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        if isinstance(node.get("allOf"), list):
            node = self.conjoin(node)
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {name: self.walk(sub) for name, sub in value.items()}
            elif key in SCHEMA_LISTS and isinstance(value, list):
                out[key] = [self.walk(sub) for sub in value]
            elif key in _TOGETHER and isinstance(value, dict):
                out[key] = self.walk(value)
            else:
                out[key] = value
        return out

    def conjoin(self, node: dict[str, Any]) -> dict[str, Any]:
        """One node for an ``allOf`` node (its choices distributed: ``anyOf`` of ``allOf``
        nodes, which ``walk`` merges in turn)."""
        kept = {k: v for k, v in node.items() if k in ANNOTATIONS or k in _DEFS}
        parts = self.flat([node])
        choices = [p for p in parts if any(isinstance(p.get(c), list) for c in _CHOICES)]
        if not choices:
            return {**merge(parts), **kept}
        plain = [p for p in parts if not any(p is c for c in choices)]
        combos: list[list[Any]] = [[]]
        for choice in choices:
            key = next(c for c in _CHOICES if isinstance(choice.get(c), list))
            rest = {k: v for k, v in choice.items() if k != key}
            combos = [[*combo, {"allOf": [branch, rest]} if rest else branch]
                      for combo in combos for branch in choice[key]]
            self.branches += len(combos)
            if self.branches > MAX_BRANCHES:
                raise InvalidRequest(
                    f"'allOf' over 'anyOf' / 'oneOf' choices makes more than {MAX_BRANCHES} "
                    "branches: write the choices out", param="schema", code="grammar_too_large")
        base = merge(plain) if plain else {}
        return {**kept, "anyOf": [{"allOf": [base, *combo]} for combo in combos]}

    def flat(self, nodes: list[Any]) -> list[dict[str, Any]]:
        """The parts the nodes hold together: ``$ref``s resolved, nested ``allOf``s and
        each node's own keywords (without annotations) taken as parts; ``true`` and
        ``{}`` dropped; 400 for ``false``."""
        parts: list[dict[str, Any]] = []
        for node in nodes:
            if node is True:
                continue
            if not isinstance(node, dict):
                raise InvalidRequest("an 'allOf' part is false (or not a schema): no value "
                                     "satisfies the schema", param="schema")
            own = {k: v for k, v in node.items()
                   if k not in ANNOTATIONS and k not in _DEFS and k not in ("allOf", "$ref")}
            if "$ref" in node:
                if node["$ref"] not in self.defs:
                    raise InvalidRequest(f"'$ref' {node['$ref']!r} names no local definition",
                                         param="schema")
                parts += self.flat([self.defs[node["$ref"]]])
            if isinstance(node.get("allOf"), list):
                parts += self.flat(node["allOf"])
            if own:
                parts.append(own)
        self.parts += len(parts)
        if self.parts > MAX_PARTS:
            raise InvalidRequest(f"the schema's 'allOf's hold more than {MAX_PARTS} parts "
                                 "($refs resolved)", param="schema", code="grammar_too_large")
        return parts


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One sub-schema holding what every part holds (no choices among them)."""
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = _combine(key, out[key], value) if key in out else value
    return out


def _combine(key: str, a: Any, b: Any) -> Any:
    if a == b:
        return a
    if key == "properties" and isinstance(a, dict) and isinstance(b, dict):
        return {**a, **b, **{n: {"allOf": [a[n], b[n]]} for n in a.keys() & b.keys()
                             if a[n] != b[n]}}
    if key == "required" and isinstance(a, list) and isinstance(b, list):
        return list(dict.fromkeys([*a, *b]))
    if key == "type":
        return _types(a, b)
    if key in _LOWER | _UPPER and _numbers(a, b):
        return max(a, b) if key in _LOWER else min(a, b)
    if key in ("exclusiveMinimum", "exclusiveMaximum") and _numbers(a, b):
        return max(a, b) if key == "exclusiveMinimum" else min(a, b)
    if key == "enum" and isinstance(a, list) and isinstance(b, list):
        if not (both := [v for v in a if v in b]):
            raise InvalidRequest("the 'allOf' parts' enums have no value in common: no value "
                                 "satisfies the schema", param="schema")
        return both
    if key == "const":
        raise InvalidRequest("the 'allOf' parts' consts differ: no value satisfies the "
                             "schema", param="schema")
    if key in _TOGETHER:
        if a is False or b is False:
            return False
        return b if a is True else a if b is True else {"allOf": [a, b]}
    log.warning("an 'allOf' of two different %r is not enforced: the first holds (%s, "
                "not %s)", key, str(a)[:100], str(b)[:100])
    return a


def _numbers(a: Any, b: Any) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b))


def _types(a: Any, b: Any) -> str | list[str]:
    """The types both ``a`` and ``b`` allow (a name or a list of names)."""
    def names(t: Any) -> set[str]:
        listed = t if isinstance(t, list) else [t]
        return {n for n in listed if isinstance(n, str)}
    first, second = names(a), names(b)
    both = first & second
    if "integer" in first and "number" in second or "number" in first and "integer" in second:
        both.add("integer")
    if not both:
        raise InvalidRequest(f"the 'allOf' parts' types ({a} and {b}) have none in common: "
                             "no value satisfies the schema", param="schema")
    ordered = [n for n in (a if isinstance(a, list) else [a]) if n in both]
    ordered += sorted(both - set(ordered))
    return ordered[0] if len(ordered) == 1 else ordered
