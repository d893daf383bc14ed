"""What a JSON schema may hold before it is turned into a grammar: supported keywords,
bounded depth, local ``$ref``s without cycles (``check_schema``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from edgeinfer.errors import InvalidRequest
from edgeinfer.prompt.budget import MAX_SCHEMA_DEPTH, check_schema_node
from edgeinfer.prompt.keywords import accepted

_SUPPORTED = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
    "definitions", "pattern", "format", "minLength", "maxLength", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "not",
}  # and what keywords.accepted says: annotations, and keywords keywords.sound rewrites
SCHEMA_MAPS = {"properties", "$defs", "definitions"}
SCHEMA_LISTS = {"anyOf", "oneOf", "allOf", "prefixItems"}
_TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
_SHAPES: dict[str, tuple[Callable[[Any], bool], str]] = {  # what a keyword's value must be
    "type": (lambda v: bool(v) and all(isinstance(t, str) and t.strip() in _TYPES for t in (
        v.split(",") if isinstance(v, str) else v if isinstance(v, list) else [v])),
             f"one of {', '.join(sorted(_TYPES))}, or a non-empty list of them"),  # ("a, b":
    # the Ollama client's union)
    "required": (lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v),
                 "a list of property names"),
    "items": (lambda v: isinstance(v, dict | bool | list), "a schema"),
    "additionalProperties": (lambda v: isinstance(v, dict | bool), "a schema or a boolean"),
    "enum": (lambda v: isinstance(v, list), "a list of values"),
}


def _too_deep(param: str) -> InvalidRequest:
    return InvalidRequest(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels",
                          param=param, code="grammar_too_large")


def check_schema(schema: Any, param: str) -> None:
    """Walk a schema: supported keywords only, bounded depth (a recursive ``$ref``, which
    ``conjunction`` unrolls, counted once)."""
    if not isinstance(schema, dict):
        raise InvalidRequest("the JSON schema must be an object", param=param)
    defs = local_refs(schema)

    heights: dict[str, int] = {}  # a $ref's sub-schema walked once (else: fan-out ** depth)

    def walk(node: Any, depth: int, refs: tuple[str, ...]) -> int:
        """The levels below ``node`` (errors for what the schema may not have)."""
        if depth > MAX_SCHEMA_DEPTH:
            raise _too_deep(param)
        if isinstance(node, bool):
            return 0
        if not isinstance(node, dict):
            raise InvalidRequest("every sub-schema must be an object", param=param)
        check_schema_node(node, param)
        subs: list[Any] = []
        for key, value in node.items():
            if key == "not" and not (value is False or value is True or value == {}):
                raise InvalidRequest("unsupported JSON schema keyword: 'not' (only "
                                     "'not': {} is taken: nothing)", param=param)
            if key not in _SUPPORTED and not accepted(key):
                raise InvalidRequest(f"unsupported JSON schema keyword: {key!r}", param=param)
            if key in _SHAPES and value is not None and not _SHAPES[key][0](value):
                raise InvalidRequest(f"'{key}' must be {_SHAPES[key][1]}", param=param)
            if key in SCHEMA_MAPS:
                if not isinstance(value, dict):
                    raise InvalidRequest(f"'{key}' must be an object", param=param)
                subs += value.values()  # unreferenced $defs are converted too
            elif key in SCHEMA_LISTS:
                if not isinstance(value, list):
                    raise InvalidRequest(f"'{key}' must be a list", param=param)
                subs += value
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                subs.append(value)
            elif key == "items" and isinstance(value, list):  # (draft 7's tuple)
                subs += value
        height = max((1 + walk(sub, depth + 1, refs) for sub in subs), default=0)
        ref = node.get("$ref")
        if ref is None:
            return height
        if not isinstance(ref, str):
            raise InvalidRequest("'$ref' must be a string", param=param)
        if ref in refs:  # (recursion: unrolled to a few levels by ``conjunction``)
            return height
        if ref not in defs:
            raise InvalidRequest(f"unresolvable $ref: {ref!r} (only local ones: #/..., #)",
                                 param=param)
        if ref not in heights:  # (walked once; a cycle is cut where it closes)
            heights[ref] = walk(defs[ref], depth + 1, (*refs, ref))
        if depth + 1 + heights[ref] > MAX_SCHEMA_DEPTH:
            raise _too_deep(param)
        return max(height, 1 + heights[ref])

    walk(schema, 0, ("#",))


def local_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """The sub-schemas the local ``$ref``s of ``schema`` name: ``#``, every ``$defs`` /
    ``definitions`` entry, and any other JSON pointer a ``$ref`` in it holds that
    resolves (zod-to-json-schema's ``#/properties/a``, ``~1`` for ``/``)."""
    defs: dict[str, Any] = {"#": schema}
    for key in ("$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            defs.update({f"#/{key}/{k}": v for k, v in schema[key].items()})
    todo: list[Any] = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo += node
        elif isinstance(node, dict):
            todo += node.values()
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/") and ref not in defs:
                target: Any = schema
                for part in ref[2:].split("/"):
                    part = unquote(part).replace("~1", "/").replace("~0", "~")
                    if isinstance(target, dict) and part in target:
                        target = target[part]
                    elif isinstance(target, list) and part.isdigit() and \
                            int(part) < len(target):
                        target = target[int(part)]
                    else:
                        break
                else:
                    if isinstance(target, dict | bool):
                        defs[ref] = target
    return defs


def cyclic_refs(defs: dict[str, Any]) -> set[str]:
    """The refs that lead back to themselves."""
    def refs_in(node: Any) -> set[str]:
        if isinstance(node, dict):
            own = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
            return own.union(*(refs_in(v) for k, v in node.items()
                               if k not in ("$defs", "definitions")))
        if isinstance(node, list):
            return set().union(*(refs_in(v) for v in node))
        return set()
    edges = {ref: refs_in(sub) & defs.keys() for ref, sub in defs.items()}
    cyclic = set()
    for start in edges:
        seen, todo = set(), list(edges[start])
        while todo:
            ref = todo.pop()
            if ref == start:
                cyclic.add(start)
                break
            if ref not in seen:
                seen.add(ref)
                todo += edges[ref]
    return cyclic
