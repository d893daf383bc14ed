"""JSON schema keywords the grammar has no element for, made sound before conversion.

llama-cpp-python's converter ignores what it does not know, so a keyword it skips would
silently not hold. Each one here is either rewritten into what the converter does take
(so every answer still satisfies it), dropped because every answer satisfies it anyway,
or dropped with a logged warning where no grammar can hold it and breaking it leaves
valid JSON that a client reads the same way (as a pattern with lookarounds is):

- annotations (``ANNOTATIONS``, any ``x-...`` key): no effect.
- ``additionalItems``: the converter writes a tuple (``items`` as a list) exactly, which
  every ``additionalItems`` allows; beside a schema ``items`` it means nothing.
- ``propertyNames``: ``{"type": "string"}`` (what zod writes for a record) always holds;
  ``false`` allows only ``{}``; an ``enum`` or ``const`` of strings (pydantic's
  ``dict[Literal["a", "b"], int]``, or an Enum's ``$ref``) makes each name an optional
  property (of ``additionalProperties``' schema) and closes the object; other constraints
  on names are dropped with a warning.
- ``minProperties`` / ``maxProperties``: the first optional properties become required up
  to the minimum; beyond the maximum the last optional ones are left out and no other
  property is written. An object closed by ``additionalProperties: false`` that cannot
  reach the minimum, or more required properties than the maximum, is a 400 (an open one
  that cannot: dropped with a warning); an object with no ``properties`` (any members)
  cannot be bounded so and the count is dropped with a warning, as beside another type,
  ``anyOf`` / ``oneOf`` / ``allOf`` / ``$ref``, an ``enum`` or a ``const``.
- ``multipleOf``: on an integer or a number with both bounds (inclusive or exclusive)
  and at most ``MAX_MULTIPLES`` multiples between them, the enum of those multiples (of
  its own ``enum``'s, where it has one), exact for decimal steps (0.1); ``multipleOf: 1``
  on an integer holds; otherwise dropped with a warning.
- ``uniqueItems``: dropped with a warning (true with at most one item holds).
"""

from __future__ import annotations

import logging
import math
from fractions import Fraction
from typing import Any

from edgeinfer.errors import InvalidRequest
from edgeinfer.prompt.intersection import ANY

log = logging.getLogger("edgeinfer.prompt")

ANNOTATIONS = {
    "title", "description", "default", "examples", "example", "$schema", "$id", "$comment",
    "$anchor", "strict", "deprecated", "readOnly", "writeOnly", "discriminator", "nullable",
    "contentMediaType", "contentEncoding", "contentSchema", "markdownDescription",
    "enumDescriptions", "markdownEnumDescriptions", "errorMessage",
}
REWRITTEN = {"additionalItems", "propertyNames", "minProperties", "maxProperties",
             "multipleOf", "uniqueItems"}
MAX_MULTIPLES = 256


def accepted(key: str) -> bool:
    """Whether ``key`` is an annotation or a keyword ``sound`` takes care of."""
    return key in ANNOTATIONS or key in REWRITTEN or key.startswith("x-")


def _unenforced(key: str, value: Any) -> None:
    log.warning("a JSON schema keyword a grammar cannot hold is not enforced: %s=%s", key,
                str(value)[:200])


def sound(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` (one sub-schema) without the ``REWRITTEN`` keywords, each made to hold as
    the module docstring says; 400 where no object satisfies the counts."""
    if not REWRITTEN & set(node):
        return node
    out = {k: v for k, v in node.items() if k not in REWRITTEN}
    names = node.get("propertyNames")
    if names is False:  # no name allowed: only {}
        if node.get("required"):
            raise InvalidRequest("'propertyNames' is false but properties are required: "
                                 "nothing satisfies the schema", param="schema")
        out = {**out, "properties": {}, "additionalProperties": False}
    elif (listed := _listed_names(names)) is not None:
        out = _only_names(out, listed)
    elif not isinstance(names, dict) and names not in (None, True) or isinstance(
            names, dict) and (set(names) - ANNOTATIONS - {"type"}
                              or names.get("type", "string") != "string"):
        _unenforced("propertyNames", names)
    if node.get("uniqueItems") is True and not (
            isinstance(node.get("maxItems"), int) and node["maxItems"] <= 1):
        _unenforced("uniqueItems", True)
    if "multipleOf" in node:
        out = _multiples(out, node["multipleOf"])
    if "minProperties" in node or "maxProperties" in node:
        least, most = (_whole(node.get(k)) for k in ("minProperties", "maxProperties"))
        if node.get("type", "object") != "object" or {"anyOf", "oneOf", "allOf", "$ref",
                                                       "enum", "const"} & set(node):
            _unenforced("minProperties/maxProperties", (least, most))  # (the converter
        else:  # writes no object of these properties there)
            out = _counted(out, least, most)
    return out


def _listed_names(names: Any) -> list[str] | None:
    """The names a ``propertyNames`` of an ``enum`` or a ``const`` of strings allows
    (pydantic's ``dict[Literal["a", "b"], int]``); None for any other."""
    if not isinstance(names, dict) or set(names) - ANNOTATIONS - {"type", "enum", "const"}:
        return None
    values = [names["const"]] if "const" in names else names.get("enum")
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return None
    return values


def _only_names(node: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """An object whose names are ``names``: each a property (of its own schema, else of
    ``additionalProperties``' or any value), none other; 400 if a required name is not
    one of them."""
    if missing := [r for r in node.get("required") or [] if r not in names]:
        raise InvalidRequest(f"'propertyNames' does not allow the required {missing[0]!r}: "
                             "nothing satisfies the schema", param="schema")
    props, extra = node.get("properties") or {}, node.get("additionalProperties", True)
    value = extra if isinstance(extra, dict) else ANY if extra is True else None
    kept = {n: s for n, s in props.items() if n in names}
    kept.update({n: value for n in names if n not in props and value is not None})
    return {**node, "properties": kept, "additionalProperties": False}


def _whole(count: Any) -> int | None:
    """A count as an integer (2.0 is 2; the budget has checked it is a whole number)."""
    return int(count) if isinstance(count, int | float) and not isinstance(count, bool) \
        else None


def _multiples(node: dict[str, Any], step: Any) -> dict[str, Any]:
    if not _number(step) or step <= 0:
        raise InvalidRequest("'multipleOf' must be a number greater than 0", param="schema")
    kind = node.get("type")
    if kind == "integer" and step == 1:
        return node
    bounds = _bounds(node)
    if kind not in ("integer", "number") or bounds is None:
        _unenforced("multipleOf", step)
        return node
    (lo, lo_out), (hi, hi_out), unit = *bounds, _exact(step)
    first, last = math.ceil(lo / unit), math.floor(hi / unit)
    first += lo_out and first * unit == lo
    last -= hi_out and last * unit == hi
    if last - first >= MAX_MULTIPLES:
        _unenforced("multipleOf", step)
        return node
    values = [k * unit for k in range(first, last + 1)]
    if kind == "integer":
        values = [v for v in values if v.denominator == 1]
    if isinstance(node.get("enum"), list):  # an enum stays: its multiples in range
        listed = {_exact(e) for e in node["enum"] if _number(e)}
        values = [v for v in values if v in listed]
    if not values:
        raise InvalidRequest(f"no multiple of {step} lies within the bounds: nothing "
                             "satisfies the schema", param="schema")
    rest = {k: v for k, v in node.items() if k not in (
        "type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")}
    return {**rest, "enum": [int(v) if v.denominator == 1 else float(v) for v in values]}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(
        value)


def _exact(value: int | float) -> Fraction:
    """A number as the decimal it is written as (0.1 is 1/10, not the nearest double)."""
    return Fraction(value) if isinstance(value, int) else Fraction(repr(value))


def _bounds(node: dict[str, Any]) -> tuple[tuple[Fraction, bool], tuple[Fraction, bool]] | None:
    """((least, exclusive), (most, exclusive)) of a number's bounds (draft 4's boolean
    ``exclusiveMinimum`` too); None without both."""
    def side(key: str, out_key: str, low: bool) -> tuple[Fraction, bool] | None:
        bound: Any = node.get(key)
        out: Any = node.get(out_key)
        found = ([(_exact(bound), out is True)] if _number(bound) else []) + (
            [(_exact(out), True)] if _number(out) else [])
        if not found:
            return None
        return (max if low else min)(found, key=lambda b: (b[0], b[1] == low))
    lower, upper = side("minimum", "exclusiveMinimum", True), side(
        "maximum", "exclusiveMaximum", False)
    return None if lower is None or upper is None else (lower, upper)


def _counted(node: dict[str, Any], least: int | None, most: int | None) -> dict[str, Any]:
    props = node.get("properties")
    extra = node.get("additionalProperties")
    if not isinstance(props, dict):  # any members: nothing to choose or close
        _unenforced("minProperties/maxProperties", (least, most))
        return node
    required = [n for n in node.get("required") or [] if n in props]
    optional = [n for n in props if n not in required]
    open_ = extra is not None and extra is not False
    if least is not None and len(required) < least:
        if len(required) + len(optional) < least:
            if extra is False:  # (unset, JSON Schema's objects are open: other members)
                raise InvalidRequest(f"'minProperties' is {least} but the object has only "
                                     f"{len(props)} properties: nothing satisfies the schema",
                                     param="schema")
            _unenforced("minProperties", least)
        else:
            take = least - len(required)
            required, optional = required + optional[:take], optional[take:]
            node = {**node, "required": required}
    if most is not None:
        if len(required) > most:
            raise InvalidRequest(f"'maxProperties' is {most} but {len(required)} properties "
                                 "are required: nothing satisfies the schema", param="schema")
        kept = set(required) | set(optional[:most - len(required)])
        node = {**node, "properties": {n: s for n, s in props.items() if n in kept}}
        if open_:
            node["additionalProperties"] = False
    return node


def choice_values(branches: list[Any]) -> list[Any] | None:
    """The values of a choice whose every branch is a ``const`` or an ``enum`` (pydantic's
    described enum members, as many as there are values), as one list; None otherwise."""
    values: list[Any] = []
    for branch in branches:
        if not isinstance(branch, dict) or set(branch) - ANNOTATIONS - {"const", "enum"}:
            return None
        if "const" in branch:
            values.append(branch["const"])
        elif isinstance(branch.get("enum"), list):
            values += branch["enum"]
        else:
            return None
    return values
