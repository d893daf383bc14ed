"""Constrained output: JSON schemas and tool calls turned into GBNF, checked before use.

Schemas become GBNF with llama-cpp-python's own converter
(``json_schema_to_gbnf``, through ``engine.grammar_check``), cached by schema text. What
the converter or llama.cpp cannot take safely is refused here with a 400
naming the problem: a schema that is not an object, an unsupported keyword, a
recursive ``$ref``, nesting too deep, a grammar llama.cpp cannot parse.
"""

from __future__ import annotations

import json
import logging
import re
from functools import lru_cache
from typing import Any

from edgeinfer.engine.grammar_check import RAW_CHAR, grammar_parses, json_schema_to_gbnf
from edgeinfer.errors import InvalidRequest
from edgeinfer.prompt.budget import (
    MAX_SCHEMA_BYTES,
    check_gbnf_budget,
    check_rewritten_pattern,
)
from edgeinfer.prompt.conjunction import merged
from edgeinfer.prompt.formats import as_pattern, written_format
from edgeinfer.prompt.intersection import VALUE_KEYWORDS, values_kept
from edgeinfer.prompt.intrange import BOUNDS, range_gbnf
from edgeinfer.prompt.keywords import sound
from edgeinfer.prompt.pattern import joined_surrogates, json_pattern, with_lengths
from edgeinfer.prompt.schemacheck import SCHEMA_LISTS, SCHEMA_MAPS, check_schema
from edgeinfer.prompt.toolformat import GENERIC, ToolFormat

log = logging.getLogger("edgeinfer.prompt")

# Arrays without maxItems get this bound: a small model that keeps adding items
# could otherwise loop until max_tokens and leave JSON that does not parse.
DEFAULT_MAX_ITEMS = 10
# Strings without maxLength (nor enum, pattern, format) get this bound, for the same reason.
DEFAULT_MAX_LENGTH = 200


# The converter's string character class admits raw control characters (a newline
# inside a string), which JSON forbids and strict parsers (json, pydantic) reject.
_LOOSE_CHAR = re.compile(r'^(char ::= )\[\^"\\\\\]', re.MULTILINE)


@lru_cache(maxsize=256)
def _schema_gbnf(schema_text: str, prop_order: tuple[str, ...]) -> str:
    ints: dict[str, str] = {}
    tight = _bound(merged(json.loads(schema_text)), ints)
    gbnf = json_schema_to_gbnf(json.dumps(tight), list(prop_order))
    gbnf = _LOOSE_CHAR.sub(lambda m: m.group(1) + RAW_CHAR, gbnf)
    for key, expr in ints.items():
        gbnf = gbnf.replace(f'"\\"{key}\\""', expr)
    return gbnf


def _bound(node: Any, ints: dict[str, str]) -> Any:
    """A copy of the schema where arrays and strings without an upper bound get one, and
    bounded integers become placeholders for their range grammar (collected in ``ints``).

    With every array and string bounded, any output the grammar allows ends
    after a bounded number of tokens, so it cannot run into max_tokens halfway
    (as a small model that repeats itself otherwise does).
    """
    if not isinstance(node, dict):
        return node
    if isinstance(node.get("pattern"), str):  # (JavaScript's UTF-16 pairs: characters)
        node = {**node, "pattern": joined_surrogates(node["pattern"])}
    node = _lengths_in_pattern(as_pattern(sound(_required_present(_one_type(node)))))
    if (kept := values_kept(node, "the schema's values and its other keywords")) is not None:
        node = {**{k: v for k, v in node.items() if k not in VALUE_KEYWORDS | {"enum"}},
                **({"const": kept[0]} if "const" in node else {"enum": kept})}  # (the
        # converter wrote the values alone, bounds beside them won over an enum)
    if node.get("type") in ("integer", "number") and any(k in node for k in BOUNDS):
        try:
            expr = range_gbnf(node)
        except ValueError as exc:
            raise InvalidRequest(f"invalid {node['type']} bounds: {exc}", param="schema") \
                from None
        if expr is not None:
            key = f"__edgeinfer_int_{len(ints)}__"
            ints[key] = expr
            return {"const": key}
        log.warning("number bounds too narrow for the grammar are not enforced: %s",
                    {k: node[k] for k in BOUNDS if k in node})
    out: dict[str, Any] = {}
    for k, v in node.items():  # recurse into sub-schemas only, never into data (enum, const)
        if v is None and k not in ("const", "default", "examples"):
            continue  # a null keyword says nothing (serializers that keep None send them)
        if k in SCHEMA_MAPS and isinstance(v, dict):
            out[k] = {name: _bound(sub, ints) for name, sub in v.items()}
        elif k in SCHEMA_LISTS and isinstance(v, list):
            out[k] = [_bound(sub, ints) for sub in v]
        elif k in ("items", "additionalProperties"):  # (a list: a tuple's items)
            out[k] = [_bound(sub, ints) for sub in v] if isinstance(v, list) else _bound(v, ints)
        elif k == "pattern" and isinstance(v, str):
            _check_regex(v)
            if (rewritten := json_pattern(v)) is not None:
                check_rewritten_pattern(v, rewritten, "schema")
                out[k] = rewritten
            else:  # the rest of the schema still holds
                log.warning("a JSON schema pattern a grammar cannot express is not enforced: "
                            "%r", v[:200])
        else:
            out[k] = v
    if (out.get("type") == "array" or "items" in out) and "maxItems" not in out:
        out["maxItems"] = max(DEFAULT_MAX_ITEMS, int(out.get("minItems", 0) or 0))
    if out.get("type") == "string" and not {"maxLength", "enum", "const", "pattern"} & set(
            out) and not written_format(out.get("format")):  # (a format dropped bounds none)
        out["maxLength"] = max(DEFAULT_MAX_LENGTH, int(out.get("minLength", 0) or 0))
    return out


_OWN_KEYWORDS = {  # the keywords that apply to values of one type only
    "object": {"properties", "required", "additionalProperties", "minProperties",
               "maxProperties", "propertyNames"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "uniqueItems", "additionalItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
}
_OWN_KEYWORDS["number"] = _OWN_KEYWORDS["integer"]


def _one_type(node: dict[str, Any]) -> dict[str, Any]:
    """A list of types (``["string", "null"]``, OpenAI's optional field; Ollama's client
    writes ``"string, integer"``) as ``anyOf`` of one type each, with the keywords of that
    type (each once: the schema does not grow): llama-cpp-python's converter drops every
    other keyword beside a list (an enum, a maxLength, integer bounds). Beside ``enum`` or
    ``const`` the values say the type; beside ``anyOf`` and the like it stays as it was."""
    kind = node.get("type")
    if isinstance(kind, str) and "," in kind:
        kind = [k.strip() for k in kind.split(",") if k.strip()]
    if not isinstance(kind, list) or {"anyOf", "oneOf", "allOf", "$ref"} & set(node):
        return node
    rest = {k: v for k, v in node.items() if k != "type"}
    if len(kind) == 1 or "enum" in rest or "const" in rest or not kind:
        return {**rest, "type": kind[0]} if len(kind) == 1 else rest
    own = set().union(*_OWN_KEYWORDS.values())
    top: dict[str, Any] = {k: v for k, v in rest.items() if k not in own}
    return {**top, "anyOf": [{"type": k, **{key: v for key, v in rest.items()
                                            if key in _OWN_KEYWORDS.get(k, ())}}
                             for k in dict.fromkeys(kind)]}


# the lengths of what the converter's formats write (it writes them whatever lengths are
# beside: "YYYY-MM-DD", "HH:MM:SS[.sss](Z|+HH:MM)", a uuid's 36 characters)
_FORMAT_LENGTHS = {"date": (10, 10), "time": (9, 18), "date-time": (20, 29), "uuid": (36, 36)}


def _format_lengths(node: dict[str, Any]) -> None:
    """400 for ``minLength`` / ``maxLength`` beside a ``format`` no value of which has such
    a length; lengths that only narrow the format's are logged as not enforced."""
    fmt = node.get("format")
    fmt = "uuid" if isinstance(fmt, str) and re.fullmatch(r"uuid[1-5]?", fmt) else fmt
    if not isinstance(fmt, str) or fmt not in _FORMAT_LENGTHS or node.get("pattern"):
        return
    low, high = _FORMAT_LENGTHS[fmt]
    least, most = node.get("minLength", 0), node.get("maxLength", high)
    if not isinstance(least, int) or not isinstance(most, int):
        return
    if least > high or most < low:
        raise InvalidRequest(f"no {fmt!r} string is {least} to {most} characters long (its "
                             f"values are {low} to {high})", param="schema")
    if least > low or most < high:
        log.warning("minLength / maxLength beside format %r are not enforced", fmt)


def _lengths_in_pattern(node: dict[str, Any]) -> dict[str, Any]:
    """A string's ``minLength`` / ``maxLength`` folded into its ``pattern`` (the converter
    ignores them beside one: ``pattern.with_lengths``); 400 where that cannot be done.
    A pattern the grammar drops leaves them as they are."""
    pattern, lengths = node.get("pattern"), {"minLength", "maxLength"} & set(node)
    if lengths:
        _format_lengths(node)
    if not isinstance(pattern, str) or not lengths:
        return node
    _check_regex(pattern)
    if json_pattern(pattern) is None:  # (lookarounds, \b, ...: dropped, the lengths kept)
        return node
    try:
        folded = with_lengths(pattern, node.get("minLength") or 0, node.get("maxLength"))
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="schema") from None
    if json_pattern(folded) is None:
        return node
    return {**{k: v for k, v in node.items() if k not in lengths}, "pattern": folded}


def _required_present(node: dict[str, Any]) -> dict[str, Any]:
    """An object's ``required`` names missing from its ``properties`` made properties of
    any value (or of ``additionalProperties``' schema): the converter drops them, so the
    answer lacked them. 400 where ``additionalProperties`` is false (no object can)."""
    props, required = node.get("properties") or {}, node.get("required")
    if not isinstance(required, list) or not isinstance(props, dict):
        return node
    missing = [n for n in required if isinstance(n, str) and n not in props]
    if not missing:
        return node
    extra = node.get("additionalProperties", True)
    if extra is False:
        raise InvalidRequest(f"the required property {missing[0]!r} is not among the "
                             "'properties' and 'additionalProperties' is false: no object "
                             "satisfies the schema", param="schema")
    any_value = extra if isinstance(extra, dict) else {}
    return {**node, "properties": {**props, **{n: any_value for n in missing}}}


# what Python's re says of a pattern no regex dialect takes (not of ECMA-only syntax)
_BROKEN = ("missing )", "unbalanced parenthesis", "unterminated character set",
           "nothing to repeat", "multiple repeat", "bad character range")


def _check_regex(pattern: str) -> None:
    """400 for a ``pattern`` that is no regular expression at all (unbalanced, a lone
    ``[``): it would otherwise be dropped and the schema silently not enforced."""
    try:
        re.compile(pattern)
    except re.error as exc:
        if str(exc).startswith(_BROKEN):
            raise InvalidRequest(f"'pattern' {pattern[:100]!r} is not a valid regular "
                                 f"expression: {exc}", param="schema") from None


def schema_to_gbnf(schema: Any, param: str, prop_order: tuple[str, ...] = ()) -> str:
    """GBNF for a JSON schema (root rule ``root``); 400 for what cannot be converted."""
    check_schema(schema, param)  # first: it bounds the depth that json.dumps recurses
    text = json.dumps(schema, sort_keys=False)
    if len(text) > MAX_SCHEMA_BYTES:
        raise InvalidRequest(f"the JSON schema is larger than {MAX_SCHEMA_BYTES} bytes",
                             param=param, code="grammar_too_large")
    try:
        return _schema_gbnf(text, prop_order)
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message, param=param, code=exc.code) from None
    except (ValueError, AssertionError, KeyError, TypeError, AttributeError,
            RecursionError) as exc:
        raise InvalidRequest(f"cannot turn the JSON schema into a grammar: {exc}",
                             param=param) from None


JSON_OBJECT_DEPTH = 4  # nesting of objects / arrays in json_object mode


@lru_cache(maxsize=1)
def json_object_gbnf() -> str:
    """Any JSON object, with bounded nesting, members, items and whitespace.

    The bounds keep a small model from nesting or repeating until max_tokens,
    which would leave text that does not parse.
    """
    n = DEFAULT_MAX_ITEMS - 1
    rules = [
        "root ::= obj1",
        'ws ::= " "?',
        (r'string ::= "\"" ([^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))*'
         r' "\"" ws'),
        ('number ::= "-"? ([0-9] | [1-9] [0-9]{1,15}) ("." [0-9]{1,16})?'
         ' ([eE] [-+]? [0-9]{1,3})? ws'),
        'scalar ::= string | number | ("true" | "false" | "null") ws',
    ]
    for d in range(1, JSON_OBJECT_DEPTH + 1):
        inner = f"obj{d + 1} | arr{d + 1} | scalar" if d < JSON_OBJECT_DEPTH else "scalar"
        rules += [
            (f'obj{d} ::= "{{" ws (string ":" ws val{d} ("," ws string ":" ws val{d}){{0,{n}}})? '
             f'"}}" ws'),
            f'arr{d} ::= "[" ws (val{d} ("," ws val{d}){{0,{n}}})? "]" ws',
            f"val{d} ::= {inner}",
        ]
    return "\n".join(rules) + "\n"


def _rename_rules(gbnf: str, prefix: str) -> str:
    """Prefix every rule name of a grammar so several can live in one file."""
    names = {m.group(1) for m in re.finditer(r"^([a-zA-Z0-9-]+)\s*::=", gbnf, re.MULTILINE)}
    if not names:
        return gbnf
    pattern = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\b(' + "|".join(
        sorted(map(re.escape, names), key=len, reverse=True)) + r")\b(?![-])")
    return pattern.sub(lambda m: f"{prefix}{m.group(1)}" if m.group(1) else m.group(0), gbnf)


def either(first: str, second: str) -> str:
    """What ``first`` or ``second`` describes (tool calls, or an answer in a schema)."""
    return ("root ::= f-root | s-root\n" + _rename_rules(first, "f-") + "\n"
            + _rename_rules(second, "s-"))


def after_marker(gbnf: str, marker: str) -> str:
    """``marker``, blanks, then what ``gbnf`` describes. Used lazily, with ``marker`` as
    the trigger word, the output is free until the marker and constrained after it: the
    reasoning block of a thinking model comes before its structured answer."""
    if '"' in marker or "\\" in marker:
        raise ValueError("a marker is plain text")
    return f'root ::= "{marker}" [ \\t\\n]* a-root\n' + _rename_rules(gbnf, "a-")


def _call_schema(name: str, parameters: dict[str, Any], fmt: ToolFormat
                 ) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The JSON schema of one call object in ``fmt`` (and its key order)."""
    where = name if fmt.keyed else fmt.args_key  # the parameters' place in the call object
    parameters = _rebased(parameters, "#/properties/" + where.replace("~", "~0").replace(
        "/", "~1"))
    props: dict[str, Any] = {fmt.name_key: {"const": name}, fmt.args_key: parameters}
    order: tuple[str, ...] = (fmt.name_key, fmt.args_key)
    if fmt.keyed:  # Apertus: {NAME: ARGUMENTS}
        props, order = {name: parameters}, (name,)
    if fmt.index_key:  # Cohere: "tool_call_id": "0" first
        props = {fmt.index_key: {"type": "string", "pattern": "^[0-9A-Za-z_-]{1,32}$"},
                 **props}
        order = (fmt.index_key, *order)
    if fmt.id_length:
        props["id"] = {"type": "string", "pattern": f"^[a-zA-Z0-9]{{{fmt.id_length}}}$"}
        order += ("id",)
    schema: dict[str, Any] = {"type": "object", "properties": props, "required": list(order),
                              "additionalProperties": False}
    for key in ("$defs", "definitions"):  # keep references resolvable
        if key in parameters:
            schema[key] = parameters[key]
    return schema, order


def _rebased(node: Any, root: str) -> Any:
    """``node`` (a tool's parameters) with its local ``$ref``s to anything but its
    definitions (which go to the call object's root) pointing into ``root``, where the
    parameters sit in the call object (``#/properties/a`` named the call's own)."""
    if isinstance(node, list):
        return [_rebased(v, root) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _rebased(v, root) for k, v in node.items()}
    ref = node.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")) and not ref.startswith(
            ("#/$defs/", "#/definitions/")):
        out["$ref"] = root + ref[1:]
    return out


def lit(text: str) -> str:
    """A GBNF string literal (``""`` for none)."""
    return json.dumps(text, ensure_ascii=False)


def tool_calls_gbnf(tools: list[tuple[str, dict[str, Any]]], max_calls: int,
                    param: str = "tools", fmt: ToolFormat = GENERIC, lazy: bool = False) -> str:
    """GBNF of one to ``max_calls`` calls of ``tools`` in ``fmt``'s syntax, such as
    ``<tool_call>{"name": .., "arguments": ..}</tool_call>`` (Hermes) or
    ``[TOOL_CALLS][{"name": .., "arguments": .., "id": ..}]`` (Mistral). The grammar
    starts with the format's trigger word, as a lazy grammar must (``lazy``: a bare
    object's format too: Llama 3's ``<|python_tag|>``; forced, the object alone)."""
    alts, parts = [], []
    for i, (name, parameters) in enumerate(tools):
        check_schema(parameters, param)  # (its own refs, as the client wrote them)
        schema, order = _call_schema(name, parameters, fmt)
        rules = _rename_rules(schema_to_gbnf(schema, param, order), f"t{i}-")
        if fmt.indented:  # (Command R+) a line break and indentation where a space may go
            rules = rules.replace(f't{i}-space ::= " "?',
                                  f't{i}-space ::= " "? | "\\n" " "{{0,16}}')
        parts.append(rules)
        alts.append(f"t{i}-root")
    obj = f"({' | '.join(alts)})"
    n = max(1, min(max_calls, fmt.max_calls))
    opening, closing = lit(fmt.open), lit(fmt.close)
    if fmt.listed:
        more = f' ("," space-c call){{0,{n - 1}}}' if n > 1 else ""
        # Cohere writes each call on a line of its own, indented: "[\n    {...},\n    {...}\n]"
        root = (f'root ::= {opening} "[" space-c call{more} "\\n"? "]" {closing}\n'
                f'space-c ::= "\\n"? " "{{0,4}}\ncall ::= {obj}\n')
    elif fmt.joined:  # MiniMax M1: one block, a call per line
        more = f' ("\\n" call){{0,{n - 1}}}' if n > 1 else ""
        root = (f'root ::= {opening} "\\n"? call{more} "\\n"? {closing}\n'
                f"call ::= {obj}\n")
    elif fmt.close:
        more = f' ("\\n"? call){{0,{n - 1}}}' if n > 1 else ""  # some write none between
        root = (f"root ::= call{more}\n"
                f'call ::= {opening} "\\n"? {obj} "\\n"? {closing}\n')
    elif fmt.open and (lazy or not fmt.bare):  # one object after its marker (GigaChat;
        # Llama 3's python tag, which a forced call leaves out)
        root = f"root ::= {opening} [ \\n]? {obj}\n"
    else:  # a bare object (Llama 3)
        root = f"root ::= {obj}\n"
    return root + "\n".join(parts)


def check_generated(vocab: Any, gbnf: str, param: str) -> None:
    """400 unless a grammar we generated from a schema is inside the grammar budget and
    llama.cpp parses it."""
    check_gbnf_budget(gbnf, param, generated=True)
    if not grammar_parses(vocab, gbnf):
        raise InvalidRequest("llama.cpp cannot parse the grammar made from this schema",
                             param=param)


def check_gbnf(vocab: Any, gbnf: str, param: str = "grammar") -> None:
    """400 unless a client's GBNF is inside the grammar budget (size, nesting, repetition)
    and parsed by llama.cpp (which returns a null sampler for a grammar it cannot parse)."""
    check_gbnf_budget(gbnf, param, generated=False)
    if not grammar_parses(vocab, gbnf):
        raise InvalidRequest("llama.cpp cannot parse this grammar (GBNF)", param=param)
