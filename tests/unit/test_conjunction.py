"""``allOf`` merged into one sub-schema before the converter sees it (``conjunction``):
the converter took only the ``properties`` of its parts."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from edgeinfer.errors import InvalidRequest
from edgeinfer.prompt.conjunction import ANY, MAX_PARTS, RECURSION_DEPTH, merged
from edgeinfer.prompt.grammar import schema_to_gbnf

COLOR = {"$defs": {"Color": {"enum": ["red", "green"], "type": "string"}}}


def test_an_allof_of_one_ref_is_what_it_names() -> None:
    """pydantic v1's field with a description: the enum came out as ``{}``."""
    schema = {"type": "object", "required": ["c"], **COLOR, "properties": {
        "c": {"allOf": [{"$ref": "#/$defs/Color"}], "description": "the color"}}}
    c = merged(schema)["properties"]["c"]
    assert c == {"$ref": "#/$defs/Color", "description": "the color"}  # its rules shared
    gbnf = schema_to_gbnf(schema, "schema")
    assert '"\\"red\\""' in gbnf and '"{" space  "}"' not in gbnf


def test_parts_merge_their_keywords_tighter_bound_first() -> None:
    got = merged({"allOf": [
        {"type": "number", "minimum": 1, "maximum": 9, "enum": [1, 2, 3, 12]},
        {"type": "integer", "minimum": 2, "maximum": 20, "enum": [3, 2, 7]},
        True, {}]})
    assert got == {"type": "integer", "minimum": 2, "maximum": 9, "enum": [2, 3]}


def test_objects_join_properties_and_the_nodes_own_keywords_are_a_part() -> None:
    """The node's own properties beside ``allOf`` were dropped; a property in two parts
    holds both of its schemas."""
    got = merged({"type": "object", "properties": {"extra": {"type": "boolean"},
                                                    "n": {"maximum": 5}},
                  "required": ["extra"], "allOf": [{"$ref": "#/$defs/Base"}],
                  "$defs": {"Base": {"type": "object", "required": ["name", "n"],
                                     "properties": {"name": {"type": "string"},
                                                    "n": {"type": "integer", "minimum": 1}}}}})
    assert got["required"] == ["name", "n", "extra"] and "$defs" in got
    assert got["properties"] == {"name": {"type": "string"}, "extra": {"type": "boolean"},
                                 "n": {"type": "integer", "minimum": 1, "maximum": 5}}


def test_a_choice_among_the_parts_is_distributed() -> None:
    """An ``anyOf`` part came out as optional properties: now one branch per choice, each
    with the other parts."""
    got = merged({"allOf": [
        {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
        {"anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                   {"properties": {"b": {"type": "boolean"}}, "required": ["b"]}]}]})
    first, second = got["anyOf"]
    assert first["required"] == ["id", "a"] and set(first["properties"]) == {"id", "a"}
    assert second["required"] == ["id", "b"] and first["type"] == second["type"] == "object"


@pytest.mark.parametrize("schema", [
    {"allOf": [{"type": "string"}, {"type": "integer"}]},
    {"allOf": [{"enum": [1, 2]}, {"enum": [3]}]},
    {"allOf": [{"const": 1}, {"const": 2}]},
    {"allOf": [{"type": "string"}, False]},
    {"allOf": [{"$ref": "#/$defs/missing"}]},
])
def test_parts_nothing_satisfies_together_are_400(schema: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        schema_to_gbnf(schema, "schema")


def test_refs_fanned_out_level_by_level_are_refused_not_expanded() -> None:
    """Each level an allOf of four refs to the next: 4 ** 12 parts if expanded."""
    defs = {f"L{i}": {"allOf": [{"$ref": f"#/$defs/L{i + 1}"}] * 4} for i in range(12)}
    defs["L12"] = {"type": "string"}
    with pytest.raises(InvalidRequest, match=f"more than {MAX_PARTS} parts") as err:
        schema_to_gbnf({"$ref": "#/$defs/L0", "$defs": defs}, "schema")
    assert err.value.code == "grammar_too_large"


def test_two_different_patterns_keep_the_first_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="edgeinfer.prompt"):
        got = merged({"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]})
    assert got == {"type": "string", "pattern": "^a"}
    assert "not enforced" in caplog.text


def test_a_branch_nothing_satisfies_is_left_out_and_an_optional_property_too() -> None:
    """An optional string beside a non-empty string (zod's ``.optional().and(...)``) was a
    400 for the null branch; an optional property two parts disagree on is left out."""
    got = merged({"allOf": [{"anyOf": [{"type": "string"}, {"type": "null"}]},
                            {"type": "string", "minLength": 1}]})
    assert got == {"anyOf": [{"type": "string", "minLength": 1}]}
    obj = merged({"allOf": [
        {"type": "object", "properties": {"k": {"const": "a"}, "x": {"type": "integer"}},
         "required": ["x"]},
        {"properties": {"k": {"const": "b"}}}]})
    assert obj["properties"] == {"x": {"type": "integer"}}
    with pytest.raises(InvalidRequest, match="consts differ"):  # required: nothing fits
        merged({"allOf": [{"properties": {"k": {"const": "a"}}, "required": ["k"]},
                          {"properties": {"k": {"const": "b"}}}]})


def test_many_described_refs_to_a_choice_stay_refs() -> None:
    """OpenAPI's ``allOf: [$ref]`` beside a description, 17 times to a 4-way choice, was
    counted as 68 branches (a 400): each stays a $ref."""
    shape = {"oneOf": [{"$ref": f"#/$defs/S{i}"} for i in range(4)]}
    defs = {"Shape": shape, **{f"S{i}": {"type": "object", "properties": {
        "kind": {"const": f"s{i}"}}, "required": ["kind"]} for i in range(4)}}
    props = {f"f{i}": {"allOf": [{"$ref": "#/$defs/Shape"}], "description": f"field {i}"}
             for i in range(17)}
    schema = {"type": "object", "properties": props, "$defs": defs}
    assert all(p == {"$ref": "#/$defs/Shape", "description": f"field {i}"}
               for i, p in enumerate(merged(schema)["properties"].values()))
    assert "root ::=" in schema_to_gbnf(schema, "schema")


def test_draft4_exclusive_bounds_values_of_the_type_and_json_equality() -> None:
    got = merged({"allOf": [{"type": "integer", "minimum": 3, "exclusiveMinimum": True},
                            {"minimum": 5}]})
    assert got == {"type": "integer", "exclusiveMinimum": 3, "minimum": 5}  # 5 allowed
    assert merged({"allOf": [{"enum": ["a", 1]}, {"type": "string"}]})["enum"] == ["a"]
    with pytest.raises(InvalidRequest):
        merged({"allOf": [{"const": "c"}, {"enum": ["a", "b"]}]})
    with pytest.raises(InvalidRequest, match="no value in common"):  # true is not 1
        merged({"allOf": [{"enum": [True]}, {"enum": [1]}]})
    assert merged({"allOf": [{"type": "string, integer"}, {"type": "integer"}]}) == {
        "type": "integer"}


def test_an_annotations_only_or_true_schema_is_any_value() -> None:
    """pydantic's ``Any`` field is ``{"title": ...}``: a 400 ("Unrecognized schema") for
    every such tool; ``true`` sub-schemas, ``false`` branches and boolean ``items`` were
    400s of the converter too."""
    schema = {"type": "object", "required": ["v", "w"], "properties": {
        "v": {"title": "V", "x-order": 1}, "w": True, "gone": False,
        "c": {"anyOf": [False, {"type": "integer"}]},
        "e": {"type": "array", "items": False}, "f": {"type": "array", "items": True}}}
    got = merged(schema)["properties"]
    assert got["v"] == got["w"] == ANY and "gone" not in got
    assert got["c"] == {"anyOf": [{"type": "integer"}]}
    assert got["e"] == {"type": "array", "items": {"type": "null"}, "maxItems": 0}
    assert got["f"] == {"type": "array", "items": ANY}  # (its maxItems kept)
    gbnf = schema_to_gbnf(schema, "schema")
    assert '"\\"v\\""' in gbnf and '"\\"gone\\""' not in gbnf
    with pytest.raises(InvalidRequest, match="every branch"):
        merged({"anyOf": [False, False]})


def _depth(node: Any, key: str) -> int:
    """How many times ``key`` nests in ``node``'s first branches."""
    found = 0
    while isinstance(node, dict):
        if "anyOf" in node:
            node = next((b for b in node["anyOf"] if b.get("type") == "object"), None)
            continue
        if key not in node.get("properties", {}):
            break
        found += 1
        node = node["properties"][key]
    return found


def test_a_recursive_ref_is_unrolled_and_ends() -> None:
    """pydantic's recursive model and OpenAI's ``"$ref": "#"`` were a 400: written out
    ``RECURSION_DEPTH`` levels deep, the last level leaves out what would recurse."""
    linked = {"$defs": {"Node": {"type": "object", "required": ["v", "next"], "properties": {
        "v": {"type": "integer"},
        "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}}}},
              "$ref": "#/$defs/Node"}
    got = merged(linked)
    assert _depth(got, "next") == RECURSION_DEPTH and "$defs" not in json.dumps(got)
    assert "root ::=" in schema_to_gbnf(linked, "schema")
    ui = {"type": "object", "required": ["label", "children"], "properties": {
        "label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}}}
    text = json.dumps(merged(ui))
    assert text.count('"children"') == 2 * RECURSION_DEPTH and '"maxItems": 0}' in text
    assert "root ::=" in schema_to_gbnf(ui, "schema")


def test_a_recursion_without_end_or_past_the_budget_is_400() -> None:
    endless = {"$defs": {"A": {"type": "object", "required": ["a"],
                               "properties": {"a": {"$ref": "#/$defs/A"}}}},
               "$ref": "#/$defs/A"}
    with pytest.raises(InvalidRequest):
        schema_to_gbnf(endless, "schema")
    wide = {"$defs": {"T": {"type": "object", "properties": {
        c: {"$ref": "#/$defs/T"} for c in "abcdefgh"}}}, "$ref": "#/$defs/T"}
    with pytest.raises(InvalidRequest) as err:  # 8 ** 4 copies
        schema_to_gbnf(wide, "schema")
    assert err.value.code == "grammar_too_large"


def test_a_ref_beside_keywords_holds_with_them() -> None:
    """The converter took the $ref alone (2020-12: both hold)."""
    got = merged({"$defs": {"B": {"type": "object", "properties": {"b": {"type": "integer"}}}},
                  "type": "object", "properties": {"x": {
                      "$ref": "#/$defs/B", "description": "d", "required": ["c"],
                      "properties": {"c": {"type": "string"}}}}})
    assert got["properties"]["x"] == {"type": "object", "required": ["c"], "description": "d",
                                      "properties": {"b": {"type": "integer"},
                                                     "c": {"type": "string"}}}


def test_review_cases_of_recursion_and_arrays() -> None:
    """A recursive model that uses another model kept no $defs for it (a 400); recursion
    through a $ref with sibling keywords never ended (past the budget); ``items: true``
    lost ``maxItems``; an empty array beside ``minItems`` wrote ``[null]``; a float
    ``maxLength`` past the budget was a TypeError."""
    tree = {"$defs": {"Addr": {"type": "object", "properties": {"city": {"type": "string"}}},
                      "Tree": {"type": "object", "required": ["children"], "properties": {
                          "children": {"type": "array", "items": {"$ref": "#/$defs/Tree"}},
                          "note": {"$ref": "#/$defs/Addr"}}}},
            "$ref": "#/$defs/Tree"}
    got = merged(tree)
    assert list(got["$defs"]) == ["Addr"] and "root ::=" in schema_to_gbnf(tree, "schema")
    sibling = {"$defs": {"N": {"type": "object", "properties": {
        "next": {"$ref": "#/$defs/N", "type": "object"}}}}, "$ref": "#/$defs/N"}
    assert "root ::=" in schema_to_gbnf(sibling, "schema")
    assert merged({"type": "array", "items": True, "maxItems": 2}) == {
        "type": "array", "items": ANY, "maxItems": 2}
    assert merged({"type": "object", "properties": {"a": {
        "type": "array", "items": False, "minItems": 1}}})["properties"] == {}
    assert merged({"type": "string", "maxLength": 2083.0})["maxLength"] == 1000
    assert merged({"allOf": [{"minimum": None}, {"type": "integer", "minimum": 3}]}) == {
        "type": "integer", "minimum": 3}


def test_a_choice_too_large_to_write_out_beside_shared_properties_is_loose(
        caplog: pytest.LogCaptureFixture) -> None:
    """A base of 40 properties beside an 8-way choice would be 8 copies of the base: the
    converter's own reading instead (the choice's properties optional), logged."""
    base = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(40)}}
    schema = {"$defs": {"Base": base}, "allOf": [{"$ref": "#/$defs/Base"}, {"oneOf": [
        {"properties": {"k": {"const": f"v{i}"}}, "required": ["k"]} for i in range(8)]}]}
    with caplog.at_level(logging.WARNING, logger="edgeinfer.prompt"):
        got = merged(schema)
    assert "anyOf" not in got and len(got["properties"]) == 41 and "too large" in caplog.text
