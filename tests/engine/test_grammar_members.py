"""What the grammar of a schema takes, fed to llama.cpp's own grammar sampler: objects whose
members beyond their properties are allowed (``additionalProperties``: pydantic's
``extra="allow"``, zod's ``passthrough``, a record beside known keys) must take every such
JSON text and nothing that does not parse; values, choices and tuples beside other
keywords, and any-values, must take what the schema allows and nothing else. Texts are
fed one character at a time, in a child process (llama.cpp aborts on a token its grammar
refuses if it is accepted)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from vocab_worker import VOCAB

from edgeinfer.prompt.grammar import schema_to_gbnf

WORKER = VOCAB + r"""
from edgeinfer.engine.grammar_check import grammar_sampler

def token(ch):
    buf = (llama_cpp.llama_token * 8)()
    data = ch.encode()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, 8, False, False)
    assert n == 1, (ch, n)
    return buf[0]

def allowed(smpl, tok):
    cand = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(tok, 0.0, 0.0))
    arr = llama_cpp.llama_token_data_array(cand, 1, -1, False)
    llama_cpp.llama_sampler_apply(smpl.ptr, ctypes.byref(arr))
    return cand[0].logit != float("-inf")

def takes(gbnf, text):
    smpl = grammar_sampler(vocab, gbnf)
    try:
        for ch in text:
            tok = token(ch)
            if not allowed(smpl, tok):
                return False
            llama_cpp.llama_sampler_accept(smpl.ptr, tok)
        return allowed(smpl, llama_cpp.llama_vocab_eos(vocab))
    finally:
        smpl.close()

jobs = json.loads(sys.stdin.read())
print(json.dumps([takes(gbnf, text) for gbnf, text in jobs]))
"""

RECORD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
          "additionalProperties": True}
REQUIRED = {**RECORD, "required": ["a"]}
TYPED = {**RECORD, "additionalProperties": {"type": "integer"}}
NESTED = {"type": "object", "properties": {"p": {"type": "object", "additionalProperties": True,
                                               "properties": {"q": {"type": "string"}}},
                                         "r": {"type": "integer"}},
          "additionalProperties": {"type": "integer"}}

CASES: list[tuple[dict[str, Any], str, bool]] = [
    (RECORD, "{}", True),
    (RECORD, '{"a":1}', True),  # (refused before: a member had to follow, with no comma)
    (RECORD, '{"a":1,"b":"x"}', True),
    (RECORD, '{"b":"x","z":[1,"y",null]}', True),  # (any value, not only an object)
    (RECORD, '{"a":1,"z":true}', True),
    (RECORD, '{"z":{"k":1},"y":2}', True),
    (RECORD, '{"a":1"z":2}', False),  # (what it wrote before: JSON that does not parse)
    (RECORD, '{"a":1,}', False),
    (REQUIRED, '{"a":1}', True),
    (REQUIRED, '{"a":1,"b":"x","z":"w"}', True),
    (REQUIRED, '{"a":1,"b":"x""z":"w"}', False),
    (REQUIRED, '{"b":"x"}', False),
    (TYPED, '{"a":1,"n":2}', True),
    (TYPED, '{"a":1,"n":"two"}', False),
    # a member beyond the properties takes none of their names (it took an optional
    # one's, with another value: {"b": 5} where "b" is a string)
    (TYPED, '{"a":100,"b":5,"c":5}', False),
    (TYPED, '{"a":100,"b":"x","c":5}', True),
    (TYPED, '{"a":1,"ab":2,"":3}', True),
    (TYPED, '{"a":1,"a":2}', False),
    (NESTED, '{"p":{"q":"s","r":1},"x":1}', True),  # (r is the outer object's)
    (NESTED, '{"p":{"q":"s","q":1}}', False),
    (NESTED, '{"p":{},"p":1}', False),
]


def wrongly_taken(cases: list[tuple[dict[str, Any], str, bool]]) -> list[tuple[str, bool]]:
    """The cases whose text the schema's grammar takes (True) or refuses against ``want``."""
    jobs = [(schema_to_gbnf(schema, "schema"), text) for schema, text, _ in cases]
    out = subprocess.run([sys.executable, "-c", WORKER], input=json.dumps(jobs), text=True,
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return [(text, want) for (_, text, want), took in zip(cases, got, strict=True)
            if took != want]


def test_members_beyond_the_properties_follow_a_comma_and_may_be_left_out() -> None:
    assert not wrongly_taken(CASES)


UNION = {"type": "object", "anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}],
         "$defs": {"A": {"properties": {"k": {"const": "a"}}, "required": ["k"]},
                   "B": {"properties": {"k": {"const": "b"}, "n": {"type": "integer"}},
                         "required": ["k", "n"]}}}
BESIDE: list[tuple[dict[str, Any], str, bool]] = [
    # an enum or a const beside bounds (the bounds won: any integer in them)
    ({"type": "integer", "enum": [1, 2, 30], "minimum": 0, "maximum": 10}, "1", True),
    ({"type": "integer", "enum": [1, 2, 30], "minimum": 0, "maximum": 10}, "5", False),
    ({"type": "integer", "enum": [1, 2, 30], "minimum": 0, "maximum": 10}, "30", False),
    ({"type": "integer", "const": 5, "minimum": 0, "maximum": 10}, "6", False),
    ({"type": "number", "enum": [1.5, 20], "exclusiveMaximum": 10}, "20", False),
    ({"type": "string", "enum": ["a", 1, "bbbb"], "maxLength": 3}, '"a"', True),
    ({"type": "string", "enum": ["a", 1, "bbbb"], "maxLength": 3}, "1", False),
    ({"type": "string", "enum": ["a", 1, "bbbb"], "maxLength": 3}, '"bbbb"', False),
    # a choice beside other keywords (the converter took the choice alone)
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
      "anyOf": [{"properties": {"b": {"type": "string"}}, "required": ["b"]},
                {"properties": {"c": {"type": "string"}}, "required": ["c"]}]},
     '{"a":1,"b":"x"}', True),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
      "anyOf": [{"properties": {"b": {"type": "string"}}, "required": ["b"]},
                {"properties": {"c": {"type": "string"}}, "required": ["c"]}]},
     '{"b":"x"}', False),
    ({"enum": ["a", "b", "c"], "anyOf": [{"const": "a"}, {"const": "b"}]}, '"c"', False),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}],
      "anyOf": [{"type": "integer"}, {"type": "null"}]}, '"s"', False),
    (UNION, '{"k":"b","n":1}', True),
    (UNION, '{"k":"b"}', False),
    (UNION, "[]", False),
    # a tuple (draft 7's items as a list) walked: its strings bounded as any others
    ({"type": "array", "items": [{"type": "string", "maxLength": 3000}, {}]}, '["a",1]', True),
    ({"type": "array", "items": [{"type": "string"}, {"type": "integer"}]}, "[1,1]", False),
    # prefixItems beside items or counts (the converter took items alone, and wrote the
    # tuple whatever the counts)
    ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
      "minItems": 1, "maxItems": 4, "items": {"type": "null"}}, '[1,"a"]', True),
    ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
      "minItems": 1, "maxItems": 4, "items": {"type": "null"}}, "[null,null]", False),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"},
      "minItems": 3, "maxItems": 3}, '[1,"a","b"]', True),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"},
      "minItems": 3, "maxItems": 3}, '["a","b","c"]', False),
    ({"type": "array", "items": [{"type": "integer"}, {"type": "string"}],
      "additionalItems": False, "maxItems": 1}, '[1,"a"]', False),
    ({"type": "array", "items": [{"type": "integer"}], "minItems": 2}, "[1]", False),
]


def test_values_choices_and_tuples_beside_other_keywords_hold_with_them() -> None:
    assert not wrongly_taken(BESIDE)


ANY_VALUES: list[tuple[dict[str, Any], str, bool]] = [
    ({"type": "object"}, '{"a":{"b":[1,{"c":null}]}}', True),
    ({"type": "object"}, '{"a":{"b":{"c":{"d":1}}}}', True),
    ({"type": "object"}, '{"a":{"b":{"c":{"d":{"e":1}}}}}', False),  # 4 levels at most
    ({"type": "object"}, '{"a":[1,2,3,4,5,6,7,8,9,10]}', True),
    ({"type": "object"}, '{"a":[1,2,3,4,5,6,7,8,9,10,11]}', False),  # 10 items at most
    ({"type": "object"}, '{"a":"' + "x" * 200 + '"}', True),
    ({"type": "object"}, '{"a":"' + "x" * 201 + '"}', False),  # strings of 200 at most
    ({"type": "array", "maxItems": 3}, '[1,"a",{}]', True),
    ({"type": "array", "maxItems": 3}, "[1,2,3,4]", False),  # (maxItems was ignored)
    ({"type": "object", "properties": {"v": {}}, "required": ["v"]}, '{"v":[[[[1]]]]}', True),
    ({"type": "object", "properties": {"object": {"type": "object"},
                                       "value": {"type": "array"}}},
     '{"object":{"k":1},"value":[true]}', True),
]


def test_any_values_are_bounded_in_depth_members_and_length() -> None:
    """The converter's any-object / any-array repeat without end (a small model could
    write into max_tokens and leave JSON that does not parse)."""
    assert not wrongly_taken(ANY_VALUES)



def pattern(regex: str) -> dict[str, Any]:
    return {"type": "string", "pattern": regex}


PATTERNS: list[tuple[dict[str, Any], str, bool]] = [
    # a quote or a backslash the pattern asks for is written as its JSON escape (it was
    # written raw: a string ended early, or an escape of the next character)
    (pattern('^a"b$'), r'"a\"b"', True),
    (pattern('^a"b$'), '"a"b"', False),
    (pattern('^["]+$'), r'"\"\""', True),
    (pattern('^["]+$'), '""""', False),
    (pattern(r"^a\\b$"), r'"a\\b"', True),
    (pattern(r"^a\\b$"), r'"a\b"', False),
    (pattern(r'^["\\/]+$'), r'"\\/\""', True),
    (pattern("^[ -~]{1,5}$"), r'"\""', True),
    (pattern("^[ -~]{1,5}$"), r'"\q"', False),  # (printable ASCII holds " and \)
    (pattern(r"^[\t a]+$"), r'"a\ta"', True),
    (pattern(r"^[\t a]+$"), '"a\ta"', False),  # (a raw tab: strict parsers refuse it)
    # a "-" last in a negated class stays a "-" (it made a range with what came after)
    (pattern(r"^[^\s-]{8,}$"), '"abcdefgh"', True),
    (pattern(r"^[^\s-]{8,}$"), '"abcd-efgh"', False),
]


def test_patterns_are_written_as_json_text() -> None:
    assert not wrongly_taken(PATTERNS)


NAMED = {"$ref": "#/definitions/M", "$schema": "http://json-schema.org/draft-07/schema#",
         "definitions": {"M": {"type": "object", "properties": {
             "xs": {"type": "array", "items": {"$ref": "#/definitions/M/properties/n"}},
             "n": {"type": "integer"}, "c": {"$ref": "#/definitions/C"}},
             "required": ["xs"], "additionalProperties": False},
             "C": {"$ref": "#/definitions/D"}, "D": {"type": "string", "maxLength": 3}}}
REFS: list[tuple[dict[str, Any], str, bool]] = [
    # a $ref at the root (zod-to-json-schema's named model, pydantic v1): its definitions'
    # refs were a 400 ("cannot turn the JSON schema into a grammar: '#/definitions/C'")
    (NAMED, '{"xs":[1,2],"c":"abc"}', True),
    (NAMED, '{"xs":["a"]}', False),
    (NAMED, '{"xs":[],"c":1}', False),
    # any local JSON pointer (zod's reused schemas: "#/properties/a"; "~1" for "/")
    ({"type": "object", "properties": {"a/b": {"type": "integer"},
                                       "c": {"$ref": "#/properties/a~1b"}},
      "required": ["c"]}, '{"c":"x"}', False),
    ({"type": "object", "properties": {"a/b": {"type": "integer"},
                                       "c": {"$ref": "#/properties/a~1b"}},
      "required": ["c"]}, '{"c":1}', True),
    # zod's optional member: {"not": {}} is nothing, a branch left out
    ({"type": "object", "properties": {"u": {"anyOf": [{"not": {}}, {"type": "string"}]}},
      "required": ["u"]}, '{"u":"s"}', True),
    ({"type": "object", "properties": {"u": {"anyOf": [{"not": {}}, {"type": "string"}]}},
      "required": ["u"]}, '{"u":1}', False),
]


def test_refs_to_any_local_pointer_and_at_the_root_resolve() -> None:
    assert not wrongly_taken(REFS)


def fmt(name: str, **more: Any) -> dict[str, Any]:
    return {"type": "string", "format": name, **more}


FORMATS: list[tuple[dict[str, Any], str, bool]] = [
    # formats the converter has no rule for were ignored: any string
    (fmt("email"), '"ann.lee@mail.example.com"', True),
    (fmt("email"), '"Euclid"', False),
    (fmt("ipv4"), '"192.168.0.1"', True),
    (fmt("ipv4"), '"256.1.1.1"', False),
    (fmt("uri", minLength=1, maxLength=2083), '"https://example.com/a/b"', True),  # HttpUrl
    (fmt("uri", minLength=1, maxLength=2083), '"2020-01-01"', False),
    (fmt("duration"), '"PT1H2M3S"', True),  # (pydantic's timedelta)
    (fmt("duration"), '"2020-01-01"', False),
    (fmt("hostname"), '"api.example.org"', True),
    (fmt("email", maxLength=5), '"abcdefg"', False),  # (the format not enforced: lengths)
    # propertyNames of an enum (pydantic's dict[Literal["a", "b"], int]; an Enum's $ref)
    ({"type": "object", "additionalProperties": {"type": "integer"},
      "propertyNames": {"enum": ["a", "b"]}}, '{"b":2}', True),
    ({"type": "object", "additionalProperties": {"type": "integer"},
      "propertyNames": {"enum": ["a", "b"]}}, '{"m1":1}', False),
    ({"type": "object", "additionalProperties": {"type": "integer"},
      "propertyNames": {"$ref": "#/$defs/K"},
      "$defs": {"K": {"enum": ["x", "y"], "type": "string"}}}, '{"z":1}', False),
]


def test_formats_and_names_the_converter_ignores_hold() -> None:
    assert not wrongly_taken(FORMATS)


CAFE = {"type": "object", "properties": {"café": {"type": "string", "maxLength": 5},
                                         "b": {"type": "string", "maxLength": 5}},
        "additionalProperties": {"type": "integer"}}
LONG = {"type": "object", "properties": {"a" * 100: {"type": "string", "maxLength": 3}},
        "additionalProperties": {"type": "integer"}}
REVIEWED: list[tuple[dict[str, Any], str, bool]] = [
    # a member beyond the properties spells no property's name with an escape
    (CAFE, '{"caf\\u00e9":5}', False),
    (CAFE, '{"café":5}', False),
    (CAFE, '{"b":"x","\\u0062":5}', False),
    (CAFE, '{"b":"x","c":5}', True),
    (LONG, '{"' + "a" * 100 + ':1}', False),  # (a name at the bound: its quote stays)
    (LONG, '{"' + "a" * 100 + 'b":1}', True),
    # an exclusive bound is not reached by a text a double rounds onto it
    ({"type": "number", "exclusiveMinimum": -100, "exclusiveMaximum": 100},
     "99.999999999999999", False),
    ({"type": "number", "exclusiveMinimum": -100, "exclusiveMaximum": 100}, "99.5", True),
    ({"type": "number", "minimum": 0}, "12.99", True),
    # described enum members (pydantic), as many as there are, beside a type
    ({"type": "string", "oneOf": [{"const": f"lang_{i}", "description": "d"}
                                  for i in range(100)]}, '"lang_99"', True),
    ({"type": "string", "oneOf": [{"const": f"lang_{i}", "description": "d"}
                                  for i in range(100)]}, '"lang_100"', False),
    # a $ref to nothing is a property left out
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/N"}, "b": {"type": "integer"}},
      "$defs": {"N": {"not": {}}}}, '{"a":1}', False),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/N"}, "b": {"type": "integer"}},
      "$defs": {"N": {"not": {}}}}, '{"b":1}', True),
    # a property named "" of the root took the root's rule: the answer was its value
    ({"type": "object", "properties": {"": {"type": "integer"}}, "required": [""],
      "additionalProperties": False}, '{"":1}', True),
    ({"type": "object", "properties": {"": {"type": "integer"}}, "required": [""],
      "additionalProperties": False}, "1", False),
    # pointers with escapes into the definitions (~1 for "/", %20 for " ")
    ({"type": "object", "properties": {"v": {"$ref": "#/$defs/a~1b"},
                                       "w": {"$ref": "#/$defs/a%20b"}},
      "required": ["v", "w"], "$defs": {"a/b": {"type": "integer"}, "a b": {"type": "boolean"}}},
     '{"v":"x","w":true}', False),
    ({"type": "number", "minimum": 0.1, "maximum": 0.2}, "1", False),  # (narrow: decimals)
    ({"type": "number", "minimum": 0.1, "maximum": 0.2}, "0.2", True),
    # validators refuse an all-digit top-level domain (pydantic's HttpUrl)
    (fmt("uri", minLength=1, maxLength=2083), '"http://a.123"', False),
]


def test_what_a_review_found_holds() -> None:
    assert not wrongly_taken(REVIEWED)


def test_a_tool_parameters_pointer_names_its_own_property() -> None:
    """``#/properties/name`` in a tool's parameters is the parameter ``name``, not the call
    object's ``name`` (the function's name: the grammar wrote "f" for an integer)."""
    from edgeinfer.prompt.grammar import tool_calls_gbnf
    gbnf = tool_calls_gbnf([("f", {"type": "object", "properties": {
        "name": {"type": "integer"}, "other": {"$ref": "#/properties/name"}},
        "required": ["name", "other"], "additionalProperties": False})], 1)
    [other] = [line for line in gbnf.splitlines() if line.startswith("t0-arguments-other-kv")]
    assert other.endswith("integer"), other

