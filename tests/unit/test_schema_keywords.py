"""Schema keywords the grammar has no element for (``prompt.keywords``): rewritten so they
hold, dropped where every answer satisfies them, or dropped with a warning."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from edgeinfer.errors import InvalidRequest
from edgeinfer.prompt.grammar import schema_to_gbnf
from edgeinfer.prompt.keywords import sound

ABC = {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "boolean"}}


def test_property_counts_become_required_and_left_out_properties() -> None:
    two = sound({"type": "object", "properties": ABC, "required": ["b"],
                 "minProperties": 2, "maxProperties": 2})
    assert two["required"] == ["b", "a"] and list(two["properties"]) == ["a", "b"]
    assert "minProperties" not in two and "maxProperties" not in two
    # an open object is closed at its maximum: no member beyond the properties kept
    most = sound({"type": "object", "properties": ABC, "additionalProperties": True,
                  "maxProperties": 1})
    assert list(most["properties"]) == ["a"] and most["additionalProperties"] is False
    assert sound({"type": "object", "properties": ABC, "required": ["a", "b"],
                  "minProperties": 1}).get("required") == ["a", "b"]


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": ABC, "additionalProperties": False, "minProperties": 4},
    {"type": "object", "properties": ABC, "required": ["a", "b"], "maxProperties": 1},
    {"type": "integer", "minimum": 1, "maximum": 4, "multipleOf": 5},
    {"type": "integer", "multipleOf": 0},
    {"type": "number", "multipleOf": -1.5},
    {"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 10, "multipleOf": 5},
])
def test_counts_and_multiples_nothing_satisfies_are_400(schema: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        schema_to_gbnf(schema, "schema")


def test_a_bounded_integer_multiple_is_the_enum_of_its_multiples() -> None:
    got = sound({"type": "integer", "minimum": -7, "maximum": 20, "multipleOf": 5,
                 "description": "d"})
    assert got == {"enum": [-5, 0, 5, 10, 15, 20], "description": "d"}
    assert sound({"type": "integer", "multipleOf": 1}) == {"type": "integer"}


@pytest.mark.parametrize(("schema", "values"), [
    # pydantic's conint(gt=0, lt=100, multiple_of=7): exclusive bounds (any integer came)
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100, "multipleOf": 7},
     list(range(7, 99, 7))),
    ({"type": "integer", "minimum": 0, "exclusiveMinimum": True, "maximum": 10,
      "multipleOf": 5}, [5, 10]),  # draft 4's boolean form
    ({"type": "integer", "minimum": 2, "exclusiveMinimum": 1, "maximum": 9, "multipleOf": 2},
     [2, 4, 6, 8]),  # both: the narrower holds
    ({"type": "number", "minimum": 0, "maximum": 2, "multipleOf": 0.5}, [0, 0.5, 1, 1.5, 2]),
    ({"type": "number", "minimum": 0, "exclusiveMaximum": 0.5, "multipleOf": 0.1},
     [0, 0.1, 0.2, 0.3, 0.4]),  # decimal steps stay exact (not 0.30000000000000004)
    ({"type": "integer", "minimum": 0, "maximum": 10, "multipleOf": 2.5}, [0, 5, 10]),
])
def test_multiples_within_any_bounds_are_an_enum(schema: dict[str, Any],
                                                 values: list[float]) -> None:
    assert sound(schema) == {"enum": values}


@pytest.mark.parametrize("schema", [
    {"type": "object", "additionalProperties": {"type": "string"},
     "propertyNames": {"type": "string"}},  # zod 4's record
    {"type": "array", "items": [{"type": "string"}, {"type": "number"}],
     "additionalItems": False, "minItems": 2, "maxItems": 2},  # zod's tuple, draft-07
    {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "maxItems": 1},
    {"type": "string", "contentMediaType": "text/plain", "contentEncoding": "base64",
     "x-vendor": {"any": 1}, "markdownDescription": "m", "nullable": True, "example": "e"},
])
def test_what_every_answer_satisfies_is_taken_without_a_warning(
        schema: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="edgeinfer.prompt"):
        assert "root ::=" in schema_to_gbnf(schema, "schema")
    assert "not enforced" not in caplog.text


@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    {"type": "number", "multipleOf": 0.5},
    {"type": "integer", "minimum": 0, "multipleOf": 3},  # no upper bound: no enum
    {"type": "object", "minProperties": 1},  # any members: nothing to require
    {"type": "object", "properties": {"a": {}}, "minProperties": 2},  # open: other members
    {"type": "object", "additionalProperties": {"type": "integer"},
     "propertyNames": {"pattern": "^[a-z]+$"}},
])
def test_what_no_grammar_holds_is_dropped_with_a_warning(
        schema: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="edgeinfer.prompt"):
        assert "root ::=" in schema_to_gbnf(schema, "schema")
    assert "not enforced" in caplog.text


def test_structural_keywords_stay_refused() -> None:
    for key, value in (("patternProperties", {"^a": {}}), ("not", {"type": "string"}), ("if", {}),
                       ("contains", {})):
        with pytest.raises(InvalidRequest, match="unsupported JSON schema keyword"):
            schema_to_gbnf({"type": "object", key: value}, "schema")


def test_members_beyond_the_properties_are_bounded_as_items_are() -> None:
    """A record's members (``additionalProperties``) come at most 10 times, their names
    100 characters at most: a model that keeps adding them (or writing a name) cannot run
    into max_tokens with JSON that does not parse."""
    gbnf = schema_to_gbnf({"type": "object", "additionalProperties": {"type": "integer"},
                           "propertyNames": {"type": "string"}}, "schema")
    [kvs] = [line for line in gbnf.splitlines() if line.startswith("additional-kvs ::=")]
    assert kvs.endswith('( "," space additional-kv ){0,9}'), kvs  # (llama.cpp takes it:
    # the server test of zod's record), and their names are bounded as strings are
    [key] = [line for line in gbnf.splitlines() if line.startswith("additional-key ::=")]
    assert key.endswith('additional-key-tail) space'), key
    assert 'additional-key-tail ::= [^"\\\\\\x7F\\x00-\\x1F]{0,100} "\\""' in gbnf, gbnf
    assert "additional-kv ::= additional-key " in gbnf


@pytest.mark.parametrize("pattern", ["^(a?b?)*$", "^(a|aa|a?)*b$", "^([a-z]?)+$",
                                     "^([a-z]*,?)*$", "(x?)*"])
def test_a_star_over_what_may_match_nothing_is_refused_as_its_count_is(pattern: str) -> None:
    """``*`` and ``+`` become counts of 200 for the converter: over a group that may match
    nothing that took minutes per token for every request of the model (``(a?b?)*``: 516 s
    for 9 tokens), as ``(a?){0,200}`` would, which the budget refuses."""
    with pytest.raises(InvalidRequest) as info:
        schema_to_gbnf({"type": "string", "pattern": pattern}, "schema")
    assert info.value.code == "grammar_too_large" and "* or +" in info.value.message


@pytest.mark.parametrize("pattern", ["^[a-z]*$", "^(ab)*$", "^(\\s*\\w+)*$", "^(a+)*$",
                                     "^([a-z]+ ?)*$"])
def test_a_star_over_what_matches_something_is_taken(pattern: str) -> None:
    assert "root ::=" in schema_to_gbnf({"type": "string", "pattern": pattern}, "schema")


def test_multiples_keep_an_enum_and_stay_exact_past_float_precision() -> None:
    assert sound({"type": "integer", "enum": [3, 5, 7, 8], "multipleOf": 2, "minimum": 0,
                  "maximum": 10}) == {"enum": [8]}
    big = sound({"type": "integer", "multipleOf": 3, "minimum": 10**17,
                 "maximum": 10**17 + 7})["enum"]
    assert big and all(v % 3 == 0 and 10**17 <= v <= 10**17 + 7 for v in big)


def test_counts_as_whole_floats_and_objects_the_converter_does_not_write() -> None:
    two = sound({"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 2.0})
    assert two["required"] == ["a", "b"]
    either = {"type": ["object", "null"], "properties": {"a": {}, "b": {}}, "maxProperties": 1}
    assert sound(either) == {k: v for k, v in either.items() if k != "maxProperties"}
    assert sound({"type": "object", "propertyNames": False}) == {
        "type": "object", "properties": {}, "additionalProperties": False}
    with pytest.raises(InvalidRequest):
        sound({"type": "object", "propertyNames": False, "properties": {"a": {}},
               "required": ["a"]})


def test_a_wide_open_object_stays_within_the_grammar_budget() -> None:
    """40 properties of 15-character names beside ``additionalProperties`` (pydantic's
    ``extra="allow"``): the names a member beyond them may not take are one trie, its
    tails one rule (a tail per trie node came to 55,000 rules: refused)."""
    from edgeinfer.prompt.budget import check_gbnf_budget
    props = {f"field_number_{i:03d}": {"type": "string"} for i in range(40)}
    gbnf = schema_to_gbnf({"type": "object", "properties": props,
                           "additionalProperties": True}, "schema")
    check_gbnf_budget(gbnf, "schema", generated=True)
