"""Schema -> GBNF conversion and its guards, as units (no model needed)."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest

from edgeinfer.errors import InvalidRequest
from edgeinfer.prompt.budget import check_nullable_repeats
from edgeinfer.prompt.grammar import schema_to_gbnf
from edgeinfer.prompt.pattern import joined_surrogates, with_lengths


def test_property_names_that_are_keywords_are_data_not_schema() -> None:
    schema = {"type": "object", "properties": {
        "items": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
        "type": {"enum": ["a", "b"]}, "maxItems": {"type": "integer"}}}
    gbnf = schema_to_gbnf(schema, "s")
    assert '"\\"items\\""' in gbnf and '"\\"maxItems\\""' in gbnf


def test_unbounded_arrays_and_strings_get_bounds() -> None:
    gbnf = schema_to_gbnf({"type": "array", "items": {"type": "string"}}, "s")
    assert "*" not in gbnf.split("root ::=")[1].splitlines()[0]  # no open-ended repetition
    assert "char*" not in gbnf


@pytest.mark.parametrize("fmt", ["binary", "password", "path", "regex", "x-own"])
def test_a_string_whose_format_is_not_enforced_keeps_the_length_bound(fmt: str) -> None:
    """pydantic writes ``bytes`` as format ``binary``, ``SecretStr`` as ``password``: the
    converter ignores those, and the string went without the 200-character bound (a
    small model ran past max_tokens inside it, and the JSON did not parse)."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "format": fmt}},
              "required": ["s"]}
    assert schema_to_gbnf(schema, "s") == schema_to_gbnf(
        {**schema, "properties": {"s": {"type": "string", "maxLength": 200}}}, "s")
    assert "char*" not in schema_to_gbnf(schema, "s")


@pytest.mark.parametrize("schema", [
    5, {"type": "object", "properties": {"a": 5}}, {"not": {"type": "string"}},
    {"$ref": "#/$defs/x"}, {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
    {"type": "integer", "minimum": 5, "maximum": 1},
    # integers past a float's range (math.isfinite overflowed on them: a 500)
    *({"type": t, k: 10 ** 400} for t, k in [
        ("number", "maximum"), ("integer", "minimum"), ("number", "exclusiveMaximum"),
        ("integer", "multipleOf"), ("string", "minLength"), ("array", "minItems"),
        ("object", "minProperties")]),
    {"type": "integer", "minimum": 10 ** 20, "maximum": 10 ** 21},  # past 16 digits
    {"$ref": ["x"]}, {"$ref": {}},  # (unhashable: a 500)
])
def test_bad_schemas_are_400(schema: object) -> None:
    with pytest.raises(InvalidRequest) as info:
        schema_to_gbnf(schema, "response_format")
    assert info.value.param == "response_format"


def test_null_keywords_say_nothing() -> None:
    # serializers that keep None send them ("required": null); "const": null is data
    plain = {"type": "object", "properties": {"city": {"type": "string"}}}
    nulls = {"type": "object", "required": None, "description": None,
             "properties": {"city": {"type": "string", "description": None, "format": None}}}
    assert schema_to_gbnf(nulls, "s") == schema_to_gbnf(plain, "s")
    assert schema_to_gbnf({"const": None}, "s") != schema_to_gbnf({}, "s")


@pytest.mark.parametrize(("grammar", "refused"), [
    ('root ::= ("a"?){0,300}', True), ('root ::= ("a"?){0,50}', False),
    ('root ::= x{0,300}\nx ::= "a" | ""', True), ('root ::= x{2,300}\ny ::= "b"*\nx ::= y', True),
    ('root ::= ("a" | "b"){0,300}', False), ('root ::= ("a" "b"?){0,300}', False),
    ('root ::= [a-z]{0,999}', False),
])
def test_counted_repetitions_of_what_may_match_nothing(grammar: str, refused: bool) -> None:
    from edgeinfer.prompt.budget import check_gbnf_budget
    if refused:
        with pytest.raises(InvalidRequest, match="may match nothing"):
            check_gbnf_budget(grammar, "grammar", generated=False)
    else:
        check_gbnf_budget(grammar, "grammar", generated=False)
    for pattern, bad in (("^(a?){0,1000}$", True), ("^(a|){0,100}$", True),
                         ("^(ab?){0,900}$", False), ("^[a-z]{0,999}$", False)):
        if bad:
            with pytest.raises(InvalidRequest, match="may match nothing"):
                schema_to_gbnf({"type": "string", "pattern": pattern}, "s")
        else:
            schema_to_gbnf({"type": "string", "pattern": pattern}, "s")


SAMPLES = ["", "a", "ab", "abc", "ABC", "AB-12", "ABC-12", "12345", "1234", "+4412345",
           "x@y.com", "x@y.org", "a b", "a.c", "a-c", "ab_9", "__", "x ABC y", "1.5", "..",
           "aXc", "éé", "a$", "[x]", "a|b"]


@pytest.mark.parametrize("pattern", [
    r"^\d{5}$", r"^[\w-]+$", r"^\S+$", r"^[A-Z]{3}-\d{2}$", r"^\+?[1-9]\d{1,14}$",
    r"^\w+@\w+\.com$", "[A-Z]{3}", r"^(?:a|b)+?$", r"^[^@]+@[^@]+$", "^a.c$", r"^[\d.]+$",
    r"\d", r"^\D+$", r"^(?P<x>a)b*$", r"^a\$$", r"^\[x\]$", r"^[\x41-\x5A]+$", "a|b",
])
def test_a_pattern_becomes_one_the_converter_takes_and_matches_the_same(pattern: str) -> None:
    """JSON Schema patterns search (unanchored unless ^ / $), with \\d, \\w, \\s and escaped
    punctuation, which llama-cpp-python's converter passes on to llama.cpp as GBNF it
    cannot parse (a 400 for every request carrying such a tool): rewritten, anchored, and
    matching the same short JSON-safe strings."""
    import re

    from edgeinfer.prompt.pattern import json_pattern
    rewritten = json_pattern(pattern)
    assert rewritten is not None and rewritten.startswith("^") and rewritten.endswith("$")
    for s in SAMPLES:
        # ECMA-262 (JSON Schema) classes are ASCII, as re.ASCII makes them
        assert bool(re.search(pattern, s, re.ASCII)) == bool(re.fullmatch(rewritten, s)), s
    gbnf = schema_to_gbnf({"type": "string", "pattern": pattern}, "s")
    assert "\\d" not in gbnf and "\\w" not in gbnf and "\\." not in gbnf


@pytest.mark.parametrize("pattern", [r"^(?!x)\d+$", r"\bword\b", r"^(a)\1$", "^a$|^b$",
                                     r"^a\cJb$"])
def test_a_pattern_no_grammar_can_express_is_dropped_not_refused(pattern: str) -> None:
    from edgeinfer.prompt.pattern import json_pattern
    assert json_pattern(pattern) is None
    with_it = schema_to_gbnf({"type": "object", "properties": {
        "v": {"type": "string", "pattern": pattern}}}, "s")
    assert with_it == schema_to_gbnf({"type": "object", "properties": {"v": {"type": "string"}}},
                                     "s")


def test_functionarys_calls_start_with_the_name_the_prompt_opened(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Functionary v3.2's prompt ends with ``>>>``: a forced call starts with the name,
    later ones with ``>>>NAME``; under "auto" the grammar waits for ``>>>`` and one of the
    tools' names (``>>>all`` starts the answer's text, which no grammar constrains)."""
    from edgeinfer.prompt.toolformat import FUNCTIONARY_V32
    from edgeinfer.prompt.tools import ToolSpec
    from edgeinfer.service import constraint
    from edgeinfer.service.request import Constraint
    monkeypatch.setattr(constraint, "check_generated", lambda *a: None)
    tools = (ToolSpec("get_time", "", {"type": "object", "properties": {}}),
             ToolSpec("get_date", "", {"type": "object", "properties": {}}))
    forced, triggers = constraint.grammar_for(None, Constraint(tools=tools,
                                                               tool_choice="required"),
                                              fmt=FUNCTIONARY_V32)
    assert forced is not None and triggers == ()
    assert forced.startswith("root ::= first inner{0,3}") and 'inner ::= ">>>" (' in forced
    lazy, triggers = constraint.grammar_for(None, Constraint(tools=tools, tool_choice="auto"),
                                            fmt=FUNCTIONARY_V32)
    assert triggers == (">>>get_time", ">>>get_date")
    assert lazy is not None and lazy.startswith("root ::= inner")


def test_command_r_plus_may_decline_under_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    """Command R+'s template asks for a ``directly-answer`` action when no tool is needed:
    under "auto" the grammar allows it (it listed only the offered tools, so "auto" acted
    as "required"), a forced call does not."""
    from edgeinfer.prompt.toolformat import COMMAND_R_PLUS
    from edgeinfer.prompt.tools import ToolSpec
    from edgeinfer.service import constraint
    from edgeinfer.service.request import Constraint
    monkeypatch.setattr(constraint, "check_generated", lambda *a: None)
    tools = (ToolSpec("get_time", "", {"type": "object", "properties": {}}),)
    lazy, _ = constraint.grammar_for(None, Constraint(tools=tools, tool_choice="auto"),
                                     fmt=COMMAND_R_PLUS)
    forced, _ = constraint.grammar_for(None, Constraint(tools=tools, tool_choice="required"),
                                       fmt=COMMAND_R_PLUS)
    assert lazy is not None and "directly-answer" in lazy and "get_time" in lazy
    assert forced is not None and "directly-answer" not in forced
    # a tool of the request's own named so is that tool, offered once, with its schema
    own = (ToolSpec("directly-answer", "", {"type": "object", "properties": {
        "text": {"type": "string"}}, "required": ["text"]}),)
    fmt = COMMAND_R_PLUS.offering({"directly-answer"})
    assert fmt.decline == "" and COMMAND_R_PLUS.offering({"get_time"}) is COMMAND_R_PLUS
    mine, _ = constraint.grammar_for(None, Constraint(tools=own, tool_choice="auto"), fmt=fmt)
    assert mine is not None and mine.count('directly-answer') == 1 and "text" in mine
    # as a request is read: the format its reader and its grammar get
    from types import SimpleNamespace

    from edgeinfer.service.generation import reading_for
    from edgeinfer.service.request import ChatPrompt, GenerateRequest
    served: Any = SimpleNamespace(template=SimpleNamespace(source=""), tool_format=COMMAND_R_PLUS,
                                  cfg=SimpleNamespace(reasoning_format="none"))
    for offered, decline in ((own, ""), (tools, "directly-answer")):
        req = GenerateRequest("m", ChatPrompt(()), constraint=Constraint(tools=offered,
                                                                      tool_choice="auto"))
        reading = reading_for(served, req, "")
        assert reading.tools is not None and reading.tools.decline == decline


def test_kimi_k3_forced_calls_follow_its_template() -> None:
    """Kimi K3's template writes an empty answer (``response`` tags) before the calls, and
    every string parameter raw with type="string", one with a pattern or format too."""
    from edgeinfer.prompt.callgrammar import tool_calls_gbnf
    from edgeinfer.prompt.toolformat import KIMI_K3
    params = {"type": "object", "properties": {"day": {"type": "string", "format": "date"},
                                               "n": {"type": "integer"}}, "required": ["day"]}
    forced = tool_calls_gbnf([("f", params)], 1, fmt=KIMI_K3)
    assert forced.startswith(
        'root ::= "<|open|>response<|sep|><|close|>response<|sep|>"? "<|open|>tools<|sep|>"')
    assert 'key=\\"day\\" type=\\"string\\"<|sep|>" [^<]' in forced
    assert 'key=\\"n" ("\\" type=\\"number\\"<|sep|>"' in forced
    lazy = tool_calls_gbnf([("f", params)], 1, fmt=KIMI_K3, lazy=True)
    assert lazy.startswith('root ::= ("<|open|>tools<|sep|>"')


def test_a_forced_call_after_an_assistant_prefill_writes_its_opening() -> None:
    """Functionary's and Muse Glimmer's generation prompts open the first call (``>>>``, a
    message's ``<|start|>assistant``): a forced call starts inside it; after an assistant
    prefill (the format with ``prompt_opens`` off) it writes the opening itself."""
    from dataclasses import replace

    from edgeinfer.prompt.callgrammar import tool_calls_gbnf
    from edgeinfer.prompt.toolformat import FUNCTIONARY_V32, MUSE_GLIMMER
    tools = [("get_time", {"type": "object", "properties": {}})]
    assert tool_calls_gbnf(tools, 1, fmt=FUNCTIONARY_V32).startswith("root ::= first")
    assert tool_calls_gbnf(tools, 1, fmt=replace(FUNCTIONARY_V32, prompt_opens=False)
                           ).startswith("root ::= inner")
    # (a forced call may follow a message of reasoning: to self)
    assert tool_calls_gbnf(tools, 1, fmt=MUSE_GLIMMER).startswith("root ::= thought? head call")
    assert tool_calls_gbnf(tools, 1, fmt=replace(MUSE_GLIMMER, prompt_opens=False)).startswith(
        'root ::= "<|eom|><|start|>assistant" thought? head call')
    assert tool_calls_gbnf(tools, 1, fmt=replace(MUSE_GLIMMER, thought_to="")
                           ).startswith("root ::= head call")
    assert tool_calls_gbnf(tools, 1, fmt=MUSE_GLIMMER, lazy=True).startswith("root ::= head call")


def test_muse_glimmers_calls_start_at_a_message_to_a_tool(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under "auto" Muse Glimmer's grammar waits for a message to one of the tools (its
    header), so its markup quoted in an answer or in reasoning (messages to user, self)
    starts nothing, and does not end the reasoning; a forced call's header names a tool."""
    from edgeinfer.prompt.reasoning import MUSE_SELF
    from edgeinfer.prompt.toolformat import MUSE_GLIMMER
    from edgeinfer.prompt.tools import ToolSpec
    from edgeinfer.service import constraint
    from edgeinfer.service.generation import _calls_end_thought
    from edgeinfer.service.reader import Reading
    from edgeinfer.service.request import Constraint
    monkeypatch.setattr(constraint, "check_generated", lambda *a: None)
    tools = (ToolSpec("get_time", "", {"type": "object", "properties": {}}),
             ToolSpec("get_date", "", {"type": "object", "properties": {}}))
    lazy, triggers = constraint.grammar_for(None, Constraint(tools=tools, tool_choice="auto"),
                                            fmt=MUSE_GLIMMER)
    assert triggers == (" to=get_time<|message|>", " to=get_date<|message|>")
    reading = Reading(tools=MUSE_GLIMMER, markers=MUSE_SELF)
    assert not _calls_end_thought(reading, triggers).calls_end_thought
    forced, _ = constraint.grammar_for(None, Constraint(tools=tools, tool_choice="required"),
                                       fmt=MUSE_GLIMMER)
    assert forced is not None and lazy is not None
    assert 'head ::= " to=get_time<|message|>" | " to=get_date<|message|>"' in forced


def _root_literal(gbnf: str) -> str:
    """The text a ``root ::= "..."`` rule stands for (GBNF escapes undone)."""
    line = next(ln for ln in gbnf.splitlines() if ln.startswith("root ::= "))
    body = line.removeprefix('root ::= "').removesuffix('"')
    return re.sub(r'\\(["\\nr])', lambda m: {"n": "\n", "r": "\r"}.get(m[1], m[1]), body)


@pytest.mark.parametrize("value", ['say "hi"', "C:\\temp", 'both \\"', "line\nbreak"])
def test_quotes_and_backslashes_in_a_const_stay_json(value: str) -> None:
    """llama-cpp-python's converter left a backslash unescaped in GBNF literals: a quote
    ended the literal early (llama.cpp could not parse the grammar) and a backslash let
    the model write another text."""
    assert _root_literal(schema_to_gbnf({"const": value}, "s")) == json.dumps(value)
    gbnf = schema_to_gbnf({"type": "object", "properties": {value: {"enum": [value]}},
                           "required": [value]}, "s")
    assert f'"{json.dumps(json.dumps(value))[1:-1]}"' in gbnf  # the name and the value


@pytest.mark.parametrize(("pattern", "low", "high", "folded"), [
    ("^[a-z]+$", 0, 3, "^[a-z]{1,3}$"),
    ("^[a-z]*$", 3, 5, "^[a-z]{3,5}$"),
    ("[a-z]+", None, 3, "^[a-z]{1,3}$"),  # anchored: whole strings also match
    (r"^\d{3}-\d{4}$", 0, 8, r"^\d{3}-\d{4}$"),  # its own lengths: as it is
    (r"^[A-Z][a-z]*$", 2, 10, r"^[A-Z][a-z]{1,9}$"),
    (r"^\u00e9+$", None, 4, r"^\u00e9{1,4}$"),
    (r"^[^@]+@[^@]+\.[a-z]{2,}$", None, 50, r"^[^@]{1,15}@[^@]{1,16}\.[a-z]{2,17}$"),
    (r"^\+?\d+$", 10, 15, r"^\+{0,1}\d{10,14}$"),  # what minLength asks: the widest count
    ("^a?b*$", 4, 5, "^b{4,5}$"),
    ("abc", 5, None, "^.{2,}abc.{0,}$"),  # an open side may pad to minLength
    ("^[^]]+$", 5, 5, "^[^]]{5}$"),  # a leading "]" in a class is a character
])
def test_lengths_beside_a_pattern_are_folded_into_it(pattern: str, low: int | None,
                                                    high: int, folded: str) -> None:
    """The converter ignores minLength / maxLength beside a pattern: "^[a-z]+$" with
    maxLength 3 gave a 12-letter word."""
    assert with_lengths(pattern, low or 0, high) == folded
    schema: dict[str, Any] = {"type": "string", "pattern": pattern}
    schema.update({k: v for k, v in (("minLength", low), ("maxLength", high)) if v is not None})
    assert schema_to_gbnf(schema, "s") == schema_to_gbnf(
        {"type": "string", "pattern": folded}, "s")


@pytest.mark.parametrize(("pattern", "low", "high"), [
    ("^[a-z]+$", 0, 3), ("[a-z]+", 2, 4), (r"^\d{2}-?\d*$", 3, 6), ("^a?b*c?$", 2, 3),
    ("x[0-9]{1,3}", 4, 6), ("^[^]x]*y$", 0, 3), ("[ab]{2}", 3, None),
    ("^[a-z0-9]+(?:-[a-z0-9]+)*$", 3, 5), ("^(ab)+$", 0, 5), ("(a|bb)+", 2, 4),
    ("^(x|y1)*a-?b$", 3, 5)])
def test_folded_patterns_only_match_what_both_bounds_allow(pattern: str, low: int,
                                                          high: int | None) -> None:
    """Every short string over a small alphabet that the folded pattern matches also
    matches the pattern (searched, as JSON Schema does) and has an allowed length."""
    folded = re.compile(with_lengths(pattern, low, high))
    matched = 0
    for n in range(6):
        for chars in itertools.product("ab1-xyc]", repeat=n):
            text = "".join(chars)
            if folded.fullmatch(text):
                matched += 1
                assert re.search(pattern, text) and low <= n <= (high or n), (text, folded)
    assert matched, folded.pattern  # (not an empty language)


@pytest.mark.parametrize("schema", [
    {"type": "string", "minLength": 10, "maxLength": 1},
    {"type": "array", "items": {"type": "integer"}, "minItems": 5, "maxItems": 2},
    {"type": "number", "minimum": 2.5, "maximum": 1},
    {"type": "string", "pattern": r"^\d{3}-\d{4}$", "maxLength": 7},
    {"type": "string", "pattern": "^(ab)+$", "maxLength": 1},
    {"type": "string", "pattern": "^(a|bb)$", "minLength": 3},
    {"type": "string", "pattern": "^a|(bc)+$", "minLength": 5},  # (alternatives: not raised)
    {"type": "object", "properties": {"a": {}}, "required": ["b"],
     "additionalProperties": False},
])
def test_schemas_nothing_satisfies_or_that_cannot_be_enforced_are_400(
        schema: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest) as info:
        schema_to_gbnf({"type": "object", "properties": {"x": schema}}, "response_format")
    assert info.value.param == "response_format"


def test_many_repeats_share_one_cap_and_few_are_raised_one_by_one() -> None:
    """Raising each repeat re-reads the pattern ~10 times: for hundreds of them (a hostile
    pattern) that took seconds, so past ``MAX_RAISED`` they keep the common cap."""
    assert with_lengths("^" + "(a+)" * 13 + "$", 0, 26) == "^(" + "(a{1,2})" * 13 + ")$"
    assert with_lengths("^" + "(a+)" * 3 + "$", 0, 26) == "^((a{1,10})(a{1,8})(a{1,8}))$"


@pytest.mark.parametrize(("schema", "key"), [
    ({"type": "object", "properties": {"ab": {"type": "integer"}}, "required": "ab"},
     "required"),  # (was taken, and the requirement dropped)
    ({"type": []}, "type"), ({"type": "foo"}, "type"), ({"type": ["string", 5]}, "type"),
    ({"type": "array", "items": 5}, "items"),  # (was "'int' object has no attribute")
    ({"type": "object", "additionalProperties": 5}, "additionalProperties"),
    ({"enum": 5}, "enum"), ({"required": [1]}, "required"),
])
def test_keywords_of_the_wrong_shape_are_400_naming_them(schema: dict[str, Any],
                                                       key: str) -> None:
    with pytest.raises(InvalidRequest, match=f"^'{key}' must be "):
        schema_to_gbnf(schema, "response_format")


@pytest.mark.parametrize("pattern", [r"^\bab$", r"^(?=.*\d).+$"])
def test_a_pattern_the_grammar_drops_keeps_its_lengths(pattern: str) -> None:
    """(The length check once ran first, and refused them.)"""
    assert schema_to_gbnf({"type": "string", "pattern": pattern, "maxLength": 4}, "s") == \
        schema_to_gbnf({"type": "string", "maxLength": 4}, "s")


def test_a_required_name_missing_from_properties_is_still_written() -> None:
    gbnf = schema_to_gbnf({"type": "object", "properties": {"a": {"type": "integer"}},
                           "required": ["zzz"]}, "s")
    root = next(ln for ln in gbnf.splitlines() if ln.startswith("root ::= "))
    assert root.startswith('root ::= "{" space zzz-kv'), root  # required: first, always


@pytest.mark.parametrize(("pattern", "low", "high"), [
    ("[a-z]+", 5, 3),  # no length at all
    (r"-\b[a-z]+", 3, None),  # \b is no character: not counted as one
])
def test_lengths_that_cannot_be_folded_raise(pattern: str, low: int, high: int | None
                                             ) -> None:
    with pytest.raises(ValueError):
        with_lengths(pattern, low, high)


@pytest.mark.parametrize(("pattern", "high", "says"), [
    ("^(a|bbbbbb)$", 3, "an alternative in it is longer"),  # "a" matches: not "no string"
    ("^(aaaa|bbbbbb)$", 3, "no string matches"),
])
def test_a_length_refused_beside_alternatives_says_why(pattern: str, high: int, says: str
                                                       ) -> None:
    with pytest.raises(ValueError, match=says):
        with_lengths(pattern, 0, high)


def test_rules_that_branch_into_each_other_before_any_text_are_counted() -> None:
    """llama.cpp's left-recursion check walks leading rule references unmemoized:
    a chain of rules of 4 alternatives each leading to the next is 4 ** levels walks."""
    def chain(levels: int) -> str:
        rules = [f'r{i} ::= r{i + 1} | r{i + 1} "a" | r{i + 1} "b" | r{i + 1} "c"'
                 for i in range(levels)]
        return "root ::= r0\n" + "\n".join(rules) + f'\nr{levels} ::= "x"\n'
    check_nullable_repeats(chain(8), "grammar")
    with pytest.raises(InvalidRequest) as info:
        check_nullable_repeats(chain(12), "grammar")
    assert info.value.code == "grammar_too_large"
    # a rule that may be empty passes the walk on to what follows it
    deep = 'root ::= e r0\ne ::= "" | "q"\n' + chain(12).split("\n", 1)[1]
    with pytest.raises(InvalidRequest):
        check_nullable_repeats(deep, "grammar")


def _rule(gbnf: str, name: str) -> str:
    return next(line for line in gbnf.splitlines() if line.startswith(f"{name} ::="))


def test_a_list_of_types_keeps_the_other_keywords() -> None:
    """OpenAI's optional field is ``"type": [T, "null"]``; the converter dropped every
    other keyword beside a list (an enum, a maxLength, integer bounds: a 1000 for 0-9)."""
    def prop(schema: dict[str, object]) -> str:
        return schema_to_gbnf({"type": "object", "properties": {"a": schema},
                               "required": ["a"]}, "response_format")
    g = prop({"type": ["string", "null"], "enum": ["red", "green", None]})
    assert _rule(g, "a") == 'a ::= "\\"red\\"" | "\\"green\\"" | "null"'
    g = prop({"type": ["integer", "null"], "minimum": 0, "maximum": 9})
    assert _rule(g, "a") == "a ::= a-0 | null" and _rule(g, "a-0") == "a-0 ::= ([0-9])"
    g = prop({"type": ["string", "null"], "maxLength": 3})
    assert _rule(g, "a-0").count("char") == 3
    # the Ollama client writes a union of a Python function's parameter so
    g = prop({"type": "string, integer", "description": "how"})
    assert _rule(g, "a") == "a ::= a-0 | integer"



@pytest.mark.parametrize("unit", [
    "#c\n r{n}",  # a comment is no text
    '"a"? r{n}',  # an optional literal may be skipped
    "[a]* r{n}",
])
def test_what_leads_to_the_next_rule_without_text_is_counted(unit: str) -> None:
    alt = " | ".join([unit] * 4)
    rules = [f"r{i} ::= " + alt.replace("{n}", str(i + 1)) for i in range(16)]
    gbnf = "root ::= r0\n" + "\n".join(rules) + '\nr16 ::= "x"\n'
    with pytest.raises(InvalidRequest):
        check_nullable_repeats(gbnf, "grammar")


def test_counted_copies_and_many_entry_rules_are_counted() -> None:
    # S{4} of an S that may be empty: four copies, each walked
    rules = [f'd{i} ::= d{i + 1}{{4}} "x" | ""' for i in range(15)]
    with pytest.raises(InvalidRequest):
        check_nullable_repeats("root ::= d0\n" + "\n".join(rules) + '\nd15 ::= "x"\n', "g")
    # a chain that passes alone, entered from 4,000 rules: llama.cpp walks it from each
    chain = [f"c{i} ::= c{i + 1} | c{i + 1} \"a\"" for i in range(12)] + ['c12 ::= "x"']
    check_nullable_repeats("root ::= c0\n" + "\n".join(chain) + "\n", "g")
    entries = "\n".join(f"e{j} ::= c0" for j in range(4000))
    with pytest.raises(InvalidRequest):
        check_nullable_repeats("root ::= c0\n" + "\n".join(chain) + "\n" + entries, "g")


@pytest.mark.parametrize(("fmt", "lengths", "refused"), [
    ("uuid", {"maxLength": 10}, True),  # every uuid is 36 characters
    ("uuid4", {"minLength": 40}, True),
    ("date", {"maxLength": 8}, True),
    ("date-time", {"minLength": 30}, True),
    ("uuid", {"minLength": 36, "maxLength": 36}, False),
    ("time", {"maxLength": 12}, False),  # narrows the format's: taken, not enforced
    ("email", {"maxLength": 3}, False),  # a format the converter does not write
])
def test_lengths_beside_a_format_nothing_satisfies_are_400(
        fmt: str, lengths: dict[str, int], refused: bool) -> None:
    schema = {"type": "string", "format": fmt, **lengths}
    if refused:
        with pytest.raises(InvalidRequest, match=f"no '{fmt.rstrip('4')}' string"):
            schema_to_gbnf(schema, "schema")
    else:
        assert "root ::=" in schema_to_gbnf(schema, "schema")


@pytest.mark.parametrize("schema", [
    {"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083},  # HttpUrl
    {"type": "string", "maxLength": 10 ** 400}, {"type": "array", "maxItems": 10 ** 400},
])
def test_an_upper_count_past_the_budget_is_the_budget(schema: dict[str, Any]) -> None:
    """pydantic's ``HttpUrl`` (maxLength 2083) was a 400 for every tool taking a URL: what
    the grammar writes (at most 1,000) still satisfies an upper bound."""
    assert "root ::=" in schema_to_gbnf(schema, "schema")


def test_utf16_pairs_in_patterns_are_their_characters_and_lone_surrogates_a_400() -> None:
    """JavaScript spells U+1F600 as ``\\ud83d\\ude00``: one character (each half was
    written as its own invalid bytes, U+FFFD in the answer); a half alone matches no text."""
    assert joined_surrogates(r"^\ud83d\ude00$") == "^\U0001F600$"
    assert joined_surrogates(r"^[\ud83d\ude00-\ud83d\ude4f]$") == "^[\U0001F600-\U0001F64F]$"
    assert joined_surrogates(r"\\ud83d\\ude00") == r"\\ud83d\\ude00"  # escaped backslashes
    gbnf = schema_to_gbnf({"type": "string", "pattern": r"^\ud83d\ude00$"}, "schema")
    assert "\U0001F600" in gbnf and "D83D" not in gbnf.upper(), gbnf
    for lone in (r"^\ud800$", r"^a\uDE00b$", "^\ud83d$"):
        with pytest.raises(InvalidRequest, match="surrogate"):
            schema_to_gbnf({"type": "string", "pattern": lone}, "schema")
    # in a class, the surrogates are left out of its ranges: "any character but them"
    # holds, and JavaScript's "any astral character" is that range
    assert joined_surrogates(r"^[^\uD800-\uDFFF]+$") == r"^[^\uD800-\uDFFF]+$"
    assert joined_surrogates(r"^[\uD800-\uDBFF][\uDC00-\uDFFF]$") == \
        "^[\U00010000-\U0010FFFF]$"
    assert joined_surrogates(r"^\UD800$") == r"^\UD800$"  # (\U: ECMA's literal "U")
    for ok in (r"^[\uD800-\uDBFF][\uDC00-\uDFFF]$", r"^[^\uD800-\uDFFF]{2}$"):
        schema_to_gbnf({"type": "string", "pattern": ok}, "schema")


def _nested_arrays(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        node = {"type": "array", "items": node}
    return node


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 200}
                                      for i in range(400)}},  # over 64 KiB
    _nested_arrays(40),  # over 32 levels
    {"type": "integer", "maximum": 10 ** 400},
    {"type": "number", "minimum": float("inf")},  # (JSON's 1e400)
])
def test_schemas_over_the_budget_say_grammar_too_large(schema: dict[str, Any]) -> None:
    """The README's table says every limit answers code grammar_too_large (the size, the
    depth and out-of-range numbers had no code)."""
    with pytest.raises(InvalidRequest) as info:
        schema_to_gbnf(schema, "response_format")
    assert info.value.code == "grammar_too_large"
