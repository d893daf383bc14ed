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
  value (OpenAPI 3.0's boolean ``exclusiveMinimum`` applied to its own part first), enums
  keep the values every part and the type allow, ``items`` and ``additionalProperties``
  hold together; what no value satisfies (types or enums with nothing in common,
  different consts, a ``false`` part) is a 400;
- an ``allOf`` of one part (pydantic v1's ``$ref`` with a description) is that part;
- a part that is a choice (``anyOf`` / ``oneOf``) is distributed: one branch per
  combination, each branch with the other parts; a branch nothing satisfies is left out
  (400 when none is left); at most ``MAX_BRANCHES`` branches a node, and ``MAX_PARTS``
  parts in all: 400 ``grammar_too_large`` past them;
- an optional property nothing satisfies is left out (a required one is a 400);
- two different ``pattern``s, ``format``s or other keywords keep the first, logged as not
  enforced.

The same walk writes what the converter cannot read in the forms it reads: a sub-schema
of annotations only (pydantic's ``Any`` field is ``{"title": ...}``; it was a 400), and a
``true`` or ``{}`` sub-schema below the root, are any value (``ANY``; the converter read
``{}`` as an object, and ``items: {}``, pydantic's ``list[Any]``, was a 400); a ``false``
branch of a choice is left out, ``items: false`` is an empty array, ``items: true`` any
items; an upper count past ``budget.MAX_REPEAT`` is that (pydantic's ``HttpUrl`` has
``maxLength: 2083``; what the grammar writes still satisfies it).

A recursive ``$ref`` (pydantic's recursive models, OpenAI's ``"$ref": "#"``; the
converter fails on them) is unrolled ``RECURSION_DEPTH`` levels deep; below that it is
``false``: an optional property or a branch of a choice is left out there, ``items`` is an
empty array, a required property is a 400 (such a schema has no finite value). Each
unrolled copy counts as a part against ``MAX_PARTS``.

An object part closed with ``additionalProperties: false`` closes the merged object with
every part's properties, as a reader of such a schema means it (the letter of JSON
Schema would allow only that part's properties).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from edgeinfer.errors import InvalidRequest
from edgeinfer.prompt.budget import MAX_REPEAT, UPPER_COUNTS
from edgeinfer.prompt.intersection import (
    ANY,
    TOGETHER,
    exclusive_numbers,
    merge,
    none_satisfies,
    numbers,
)
from edgeinfer.prompt.keywords import ANNOTATIONS, choice_values
from edgeinfer.prompt.schemacheck import SCHEMA_LISTS, SCHEMA_MAPS, cyclic_refs, local_refs
from edgeinfer.prompt.tuples import one_tuple

log = logging.getLogger("edgeinfer.prompt")

RECURSION_DEPTH = 4  # levels of a recursive $ref written out
MAX_BRANCHES = 64  # the branches distributing the choices of one allOf may make
MAX_SPREAD = 256  # branches x shared properties a distributed choice may write
MAX_PARTS = 512  # the parts all allOfs of one schema may hold, $refs resolved (a $ref
# fanned out level by level would otherwise make parts by the millions)
TOO_LARGE = "grammar_too_large"
_CHOICES = ("anyOf", "oneOf")
_DEFS = ("$defs", "definitions")
_NAMED = re.compile(r"#|#/(\$defs|definitions)/[^/~%]+")  # refs the converter shares a rule for
# an empty array (without items the converter writes any array, whatever maxItems says)
_EMPTY = {"items": {"type": "null"}, "maxItems": 0}


def merged(schema: Any) -> Any:
    """``schema`` with every ``allOf`` merged away (see the module docstring)."""
    if not isinstance(schema, dict):
        return schema
    defs = local_refs(schema)
    defs["#"] = {k: v for k, v in schema.items() if k not in _DEFS}
    merger = _Merger(defs)
    if "#" in merger.cyclic:
        merger.stack.append("#")
    root = merger.walk(defs["#"])  # (whatever it becomes, the definitions go beside it)
    for _ in defs:  # a $ref at the root, written out: the converter then left the refs
        # in its definitions unresolved (a 400 for pydantic v1's and zod's named models)
        if not isinstance(root, dict) or root.get("$ref") not in defs:
            break
        said = {k: v for k, v in root.items() if k != "$ref"}
        target = merger.walk(defs[root["$ref"]])
        root = {**said, **target} if isinstance(target, dict) else target
    if root is False:
        raise none_satisfies("the schema is false (or 'not': {})")
    kept = merger.children({k: v for k, v in schema.items() if k in _DEFS})
    kept = {key: value for key, value in kept.items() if value}
    return {**root, **kept} if isinstance(root, dict) and kept else root


def _nothing(node: Any) -> bool:
    """``false``, or ``{"not": {}}`` (``not`` of anything): no value satisfies it."""
    return node is False or isinstance(node, dict) and node.get("not", False) is not False


class _Merger:
    def __init__(self, defs: dict[str, Any]) -> None:
        self.defs = defs
        self.cyclic = cyclic_refs(defs)
        self.stack: list[str] = []  # the recursive refs being unrolled
        self.parts = 0

    def walk(self, node: Any) -> Any:
        """``node`` normalized; the recursive refs its ``allOf``s inlined stay on the
        stack while its sub-schemas are walked."""
        depth = len(self.stack)
        try:
            return self._walk(node)
        finally:
            del self.stack[depth:]

    def _walk(self, node: Any) -> Any:
        if node is True:
            return ANY
        if not isinstance(node, dict):
            return node
        node = {k: v for k, v in node.items()  # (a null keyword says nothing)
                if v is not None or k in ("const", "default", "examples")}
        if "not" in node:  # (only true, false and {}: ``schemacheck``)
            if node["not"] is not False:
                return False  # nothing satisfies it (zod's undefined: {"not": {}})
            node = {k: v for k, v in node.items() if k != "not"}
        if node.get("$ref") in self.defs and _nothing(self.defs[node["$ref"]]):
            return False  # (a $ref to false, or to {"not": {}}: left out where it can be)
        if node.get("$ref") in self.cyclic:
            return self.unroll(node)
        if node.get("$ref") in self.defs and not _NAMED.fullmatch(node["$ref"]):
            target = self.defs[node["$ref"]]  # (another pointer: written out here)
            rest = {k: v for k, v in node.items() if k != "$ref"}
            node = {"allOf": [target, rest]} if rest else target
            if not isinstance(node, dict):
                return self.walk(node)
        if isinstance(node.get("$ref"), str) and any(  # a $ref beside keywords: both hold
                k not in ANNOTATIONS and k not in _DEFS and k != "$ref" for k in node):
            said = {k: v for k, v in node.items() if k in ANNOTATIONS or k in _DEFS}
            node = {**said, "allOf": [{"$ref": node["$ref"]}, {
                k: v for k, v in node.items() if k not in said and k != "$ref"}]}
        choices = [c for c in _CHOICES if isinstance(node.get(c), list)]
        if choices and "allOf" not in node and any(  # a choice beside keywords: all hold
                k not in ANNOTATIONS and k not in _DEFS and not k.startswith("x-")
                for k in node if k != choices[0]):
            said = {k: v for k, v in node.items() if k in ANNOTATIONS or k in _DEFS}
            rest = {k: v for k, v in node.items() if k not in said and k not in choices}
            values = choice_values(node[choices[0]]) if len(choices) == 1 else None
            node = {**said, **merge([rest, {"enum": values}])} if values is not None else {
                **said, "allOf": [*({c: node[c]} for c in choices), *([rest] if rest else [])]}
        while isinstance(node.get("allOf"), list):
            node, done = self.conjoin(node)
            if done:
                return node
        if node.get("$ref") in self.cyclic:
            return self.unroll(node)
        if node and all(k in ANNOTATIONS or k.startswith("x-") for k in node):
            return ANY
        return self.children(node)

    def children(self, node: dict[str, Any]) -> Any:
        """``node`` with its sub-schemas walked (``false``: an array nothing satisfies)."""
        out: dict[str, Any] = {}
        empty = False
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                out[key] = self.properties(value, node.get("required"))
            elif key in _DEFS and isinstance(value, dict):  # (recursive ones: unrolled;
                out[key] = {name: self.walk(sub) for name, sub in value.items()  # nothing:
                            if f"#/{key}/{name}" not in self.cyclic and not _nothing(sub)}
            elif key in SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {name: self.walk(sub) for name, sub in value.items()}
            elif key in _CHOICES and isinstance(value, list):
                out[key] = self.choice([(self.sub, sub) for sub in value], key)
            elif key in SCHEMA_LISTS and isinstance(value, list):
                out[key] = [self.sub(sub) for sub in value]
            elif key == "items" and isinstance(value, bool) and not node.get("prefixItems"):
                if value:  # (the converter wants a dict)
                    out[key] = ANY
                else:
                    empty = True
            elif key == "items" and isinstance(value, list):  # a tuple (draft 7)
                out[key] = self.tuple_items(value)
                if len(out[key]) < len(value):  # (a recursion's last level)
                    out["maxItems"] = len(out[key])
            elif key == "items" and isinstance(value, dict):
                if (items := self.sub(value)) is False:  # (a recursion's last level)
                    empty = True
                else:
                    out[key] = items
            elif key == "additionalProperties" and (value is True or isinstance(value, dict)):
                out[key] = self.sub(value if isinstance(value, dict) else {})  # (true and
                # {}: any value; the converter wrote an object)
            elif key == "additionalItems" and isinstance(value, dict):
                out[key] = self.sub(value)
            elif key in TOGETHER and isinstance(value, dict):
                if key == "propertyNames" and value.get("$ref") in self.defs:
                    value = self.defs[value["$ref"]]  # (an Enum's names: ``keywords``)
                out[key] = self.walk(value)
            elif key in UPPER_COUNTS and numbers(value, 0) and value > MAX_REPEAT:
                out[key] = MAX_REPEAT
            else:
                out[key] = value
        if node.get("type") == "array" and "items" not in out and "prefixItems" not in out:
            out["items"] = ANY  # (without items the converter ignores maxItems)
        if empty and isinstance(node.get("minItems"), int) and node["minItems"] > 0:
            return False  # (no array: nothing satisfies it)
        return {**out, **_EMPTY} if empty else one_tuple(out)

    def tuple_items(self, items: list[Any]) -> list[Any]:
        """A tuple's items walked, up to the first one nothing satisfies."""
        out = []
        for sub in items:
            if (walked := self.sub(sub)) is False:
                break
            out.append(walked)
        return out

    def unroll(self, node: dict[str, Any]) -> Any:
        """A recursive ``$ref`` written out (``false`` past ``RECURSION_DEPTH`` levels)."""
        ref = node["$ref"]
        if self.stack.count(ref) >= RECURSION_DEPTH:
            return False
        self.count(1)
        rest = {k: v for k, v in node.items() if k != "$ref"}
        target = self.defs[ref]
        self.stack.append(ref)
        try:
            return self.walk({"allOf": [target, rest]} if rest else target)
        finally:
            self.stack.pop()

    def count(self, parts: int) -> None:
        self.parts += parts
        if self.parts > MAX_PARTS:
            raise InvalidRequest(f"the schema's 'allOf's and recursive '$ref's hold more "
                                 f"than {MAX_PARTS} parts", param="schema", code=TOO_LARGE)

    def sub(self, node: Any) -> Any:
        """A sub-schema below the root walked (``{}`` is any value there)."""
        return ANY if node == {} else self.walk(node)

    def properties(self, props: dict[str, Any], required: Any) -> dict[str, Any]:
        """The properties walked; an optional one nothing satisfies
        (``false``, an ``allOf`` of parts that disagree) is left out."""
        out = {}
        for name, sub in props.items():
            try:
                if (walked := self.sub(sub)) is False:
                    raise none_satisfies(f"the property {name!r} is false (or recursive "
                                          "without end)")
                out[name] = walked
            except InvalidRequest as exc:
                if exc.code == TOO_LARGE or isinstance(required, list) and name in required:
                    raise
                log.info("property %r: nothing satisfies it, left out", name)
        return out

    def conjoin(self, node: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """One node for an ``allOf`` node, and whether it is walked already (a choice's
        branches are merged here, to leave out those nothing satisfies)."""
        kept = {k: v for k, v in node.items() if k in ANNOTATIONS or k in _DEFS}
        own = [k for k in node if k not in kept and k != "allOf"]
        if len(node["allOf"]) == 1 and not own and isinstance(node["allOf"][0], dict):
            return {**node["allOf"][0], **kept}, False  # (a $ref stays one: shared rules)
        parts = self.flat([node])
        self.count(len(parts))  # (once an allOf: nested ones are not counted again)
        choices = [p for p in parts if any(isinstance(p.get(c), list) for c in _CHOICES)]
        if not choices:
            return {**merge(parts), **kept}, False
        combos: list[list[Any]] = [[]]
        for choice in choices:
            key = next(c for c in _CHOICES if isinstance(choice.get(c), list))
            rest = {k: v for k, v in choice.items() if k != key}
            combos = [[*combo, {"allOf": [branch, rest]} if rest else branch]
                      for combo in combos for branch in choice[key]]
            if len(choices) > 1 and len(combos) > MAX_BRANCHES:  # (one choice: its own)
                raise InvalidRequest(
                    f"'allOf' over 'anyOf' / 'oneOf' choices makes more than {MAX_BRANCHES} "
                    "branches: write the choices out", param="schema", code=TOO_LARGE)
        plain = [p for p in parts if not any(p is c for c in choices)]
        base = merge(plain) if plain else {}
        if len(combos) * len(base.get("properties") or {}) > MAX_SPREAD:
            return self.loose(base, choices, kept), False
        branches = self.choice([(self.walk, {"allOf": [base, *combo]}) for combo in combos],
                               "anyOf")
        return {**kept, "anyOf": branches}, True

    def loose(self, base: dict[str, Any], choices: list[dict[str, Any]],
              kept: dict[str, Any]) -> dict[str, Any]:
        """Choices too large to write out beside the other parts (each branch a copy of
        them): their branches' properties join the rest as optional ones, as the
        converter's own ``allOf`` did (the choice itself is not enforced; logged)."""
        log.warning("an 'allOf' with a choice too large to write out: the choice's "
                    "properties are optional, the choice is not enforced")
        props: dict[str, Any] = {}
        for choice in choices:
            for branch in next(choice[c] for c in _CHOICES if isinstance(choice.get(c), list)):
                for part in self.flat([branch]) if branch is not False else []:
                    props.update(part.get("properties") or {})
        return {**merge([base, {"properties": props}]), **kept}

    def choice(self, branches: list[tuple[Callable[[Any], Any], Any]], key: str) -> list[Any]:
        """The branches of a choice, each walked; those nothing satisfies (``false``, a
        recursion's last level, parts that disagree) left out; 400 when none is left."""
        kept, first_error = [], None
        for walk, branch in branches:
            try:
                if branch is not False and (walked := walk(branch)) is not False:
                    kept.append(walked)
            except InvalidRequest as exc:
                if exc.code == TOO_LARGE:
                    raise
                first_error = first_error or exc
        if not kept:
            raise first_error or none_satisfies(f"every branch of '{key}' is false")
        return kept

    def flat(self, nodes: list[Any], path: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """The parts the nodes hold together: ``$ref``s resolved, nested ``allOf``s and
        each node's own keywords (without annotations) taken as parts; ``true`` and
        ``{}`` dropped; 400 for ``false``."""
        parts: list[dict[str, Any]] = []
        for node in nodes:
            if node is True:
                continue
            if not isinstance(node, dict):
                raise none_satisfies("an 'allOf' part is false (or not a schema)")
            if node.get("not", False) is not False:
                raise none_satisfies("an 'allOf' part is 'not': {}")
            own = {k: v for k, v in node.items()
                   if k not in ANNOTATIONS and k not in _DEFS and k not in ("allOf", "$ref")
                   and (v is not None or k == "const") and k != "not"}
            if "$ref" in node:
                ref = node["$ref"]
                if ref not in self.defs:
                    raise InvalidRequest(f"'$ref' {ref!r} names no local definition",
                                         param="schema")
                if ref in path:
                    raise none_satisfies(f"'$ref' {ref!r} is one of its own 'allOf' parts")
                if ref in self.cyclic:  # (its recursion unrolled as ``unroll`` does)
                    if self.stack.count(ref) >= RECURSION_DEPTH:
                        raise none_satisfies(f"'$ref' {ref!r} recurses past "
                                              f"{RECURSION_DEPTH} levels")
                    self.stack.append(ref)
                parts += self.flat([self.defs[ref]], (*path, ref))
            if isinstance(node.get("allOf"), list):
                parts += self.flat(node["allOf"], path)
            if own:
                parts.append(exclusive_numbers(own))
        if len(parts) > MAX_PARTS:  # (counted here too: a fan-out stops early)
            self.count(len(parts))
        return parts
