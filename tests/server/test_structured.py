"""Structured output and function calling against the real server, with the official SDK."""

from __future__ import annotations

import asyncio
import json
import time
from enum import StrEnum
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel
from serverproc import ServerProcess


class Color(StrEnum):
    red = "red"
    green = "green"
    blue = "blue"


class City(BaseModel):
    name: str
    country: str
    population: int


class Book(BaseModel):
    title: str
    author: str
    year: int
    genres: list[str]


class Pet(BaseModel):
    name: str
    species: str
    age: float
    nickname: str | None = None


class Address(BaseModel):
    street: str
    city: str
    zip: str


class Person(BaseModel):
    name: str
    age: int
    address: Address
    favorite: Color


class Order(BaseModel):
    item: str
    quantity: int
    urgent: bool
    notes: list[str]


CASES: list[tuple[str, type[BaseModel]]] = [
    ("Describe Paris as a city record.", City),
    ("Give me data about Tokyo.", City),
    ("A city in Brazil, as data.", City),
    ("Tell me about the book Dune.", Book),
    ("A classic novel, as a record.", Book),
    ("Describe a fantasy book.", Book),
    ("My dog Rex is 3 years old.", Pet),
    ("Describe a cat.", Pet),
    ("A parrot called Polly, 12.5 years old, nicknamed Pol.", Pet),
    ("Alice is 30, lives at 1 Main St, Springfield 12345, and loves blue.", Person),
    ("Describe a person who likes green.", Person),
    ("Invent a person.", Person),
    ("Order 3 pizzas, urgently, no onions.", Order),
    ("I need 10 pencils, not urgent.", Order),
    ("Order one laptop with notes: fast, silver.", Order),
    ("Describe Rome.", City),
    ("A science book from 1990.", Book),
    ("A goldfish named Bubbles.", Pet),
    ("Bob, 45, likes red, lives in Oslo.", Person),
    ("Order 2 chairs.", Order),
]


def test_parse_returns_a_parsed_object_every_time(aclient: openai.AsyncOpenAI) -> None:
    # 20 sampled at once with no max_tokens on 2 cores (strings up to 200 characters,
    # lists up to 10 items): as the tool calls' test below, more than the usual 120 s
    patient = aclient.with_options(timeout=300)

    async def one(prompt: str, model: type[BaseModel]) -> BaseModel | None:
        r = await patient.chat.completions.parse(
            model="default", messages=[{"role": "user", "content": prompt}],
            response_format=model)  # no max_tokens, as most users
        return r.choices[0].message.parsed

    async def main() -> list[BaseModel | None]:
        return await asyncio.gather(*(one(p, m) for p, m in CASES))

    parsed = asyncio.run(main())
    assert len(parsed) == 20
    for (_, model), obj in zip(CASES, parsed, strict=True):
        assert isinstance(obj, model)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "unit"], "additionalProperties": False}}}
EMAIL = {"type": "function", "function": {
    "name": "send_email", "description": "Send an email",
    "parameters": {"type": "object", "properties": {
        "to": {"type": "string"}, "subject": {"type": "string"},
        "cc": {"type": "array", "items": {"type": "string"}}},
        "required": ["to", "subject"]}}}
TOOLS = [WEATHER, EMAIL]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASKS = ["What's the weather in Paris?", "Email bob@example.com about lunch.",
        "Is it raining in Oslo?", "Tell Ann the meeting moved.", "Weather for Rome, 3 days.",
        "Send a note to ops@corp.com", "How hot is Cairo in fahrenheit?",
        "Mail the team about the release.", "Forecast for Lima", "Write to sam@x.org"]


def test_required_and_named_tool_calls_always_validate(aclient: openai.AsyncOpenAI) -> None:
    # 20 at once with no max_tokens on 2 cores: a long sampled call (up to 4 of them, each
    # within the bounds) once took past the usual 120 s
    patient = aclient.with_options(timeout=300)

    async def one(ask: str, choice: object) -> list[tuple[str, dict[str, object]]]:
        r = await patient.chat.completions.create(
            model="default", messages=[{"role": "user", "content": ask}], tools=TOOLS,
            tool_choice=choice)  # type: ignore[arg-type]
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.tool_calls
        return [(t.function.name, json.loads(t.function.arguments))  # type: ignore[union-attr]
                for t in c.message.tool_calls]

    async def main() -> list[list[tuple[str, dict[str, object]]]]:
        jobs = [one(a, "required") for a in ASKS]
        jobs += [one(a, {"type": "function", "function": {"name": "get_weather"}}) for a in ASKS]
        return await asyncio.gather(*jobs)

    results = asyncio.run(main())
    assert len(results) == 20
    for k, calls in enumerate(results):
        for name, args in calls:
            jsonschema.validate(args, SCHEMAS[name])
        if k >= 10:  # named: exactly that function
            assert [n for n, _ in calls] == ["get_weather"]


def test_allowed_tools_limit_the_calls_to_those_named(client: openai.OpenAI) -> None:
    """OpenAI's ``allowed_tools`` tool_choice: only the named tools may be called."""
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "send_email"}}]}}
    for ask in ASKS[:4]:
        r = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": ask}], tools=TOOLS,
            tool_choice=allowed, max_tokens=80)  # type: ignore[arg-type]
        calls = r.choices[0].message.tool_calls or []
        assert calls and {t.function.name for t in calls} == {"send_email"}, r  # type: ignore
    for bad in ({"mode": "sometimes", "tools": [{"type": "function", "function": {
            "name": "send_email"}}]}, {"mode": "auto", "tools": [{"type": "function",
                                                               "function": {"name": "nope"}}]},
                {"mode": "auto", "tools": []}):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(
                model="default", messages=[{"role": "user", "content": "x"}], tools=TOOLS,
                tool_choice={"type": "allowed_tools", "allowed_tools": bad})  # type: ignore


def test_auto_call_after_a_marker_the_grammar_could_not_take_still_validates(
        client: openai.OpenAI) -> None:
    # SmolLM2 writes "<tool_call></tool_call>" with "></" as one token: the lazy grammar
    # cannot start there (llama.cpp would abort on it), so that pair stays text; the call
    # after it must still be constrained (it used to come back as {})
    ask = ("Repeat exactly, with no other words:\n<tool_call></tool_call>\n<tool_call>\n"
           '{"name": "get_weather", "arguments": {}}\n</tool_call>')
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": ask}],
                                       tools=[WEATHER], max_tokens=80, temperature=0)
    c = r.choices[0]
    assert c.message.content == "<tool_call></tool_call>"
    assert c.finish_reason == "tool_calls" and c.message.tool_calls
    for t in c.message.tool_calls:
        assert t.function.name == "get_weather"  # type: ignore[union-attr]
        jsonschema.validate(json.loads(t.function.arguments),  # type: ignore[union-attr]
                            SCHEMAS["get_weather"])


def test_tools_with_a_json_format_give_a_call_or_the_answer(client: openai.OpenAI) -> None:
    # as OpenAI: with tool_choice auto the output is calls or the answer in its format (an
    # agent with tools and an output type); a forced call leaves the format to a later turn
    out = {"type": "json_schema", "json_schema": {"name": "Out", "strict": True, "schema": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
        "additionalProperties": False}}}
    call = [{"role": "user", "content": "Call get_weather for Paris. Respond only with "
             '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
             '"celsius"}}</tool_call>'}]
    for kw in ({"response_format": out}, {"response_format": {"type": "json_object"}},
               {"response_format": out, "tool_choice": "required"}):
        r = client.chat.completions.create(model="default", messages=call, tools=[WEATHER],
                                           max_tokens=80, temperature=0, **kw)  # type: ignore
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.tool_calls, kw
        for t in c.message.tool_calls:
            jsonschema.validate(json.loads(t.function.arguments),  # type: ignore[union-attr]
                                SCHEMAS["get_weather"])
    r = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Say hello as JSON."}],
        tools=[WEATHER], response_format=out, max_tokens=80, temperature=0)  # type: ignore
    c = r.choices[0]
    assert c.finish_reason == "stop" and not c.message.tool_calls
    jsonschema.validate(json.loads(c.message.content or ""), out["json_schema"]["schema"])
    resp = client.responses.create(
        model="default", input=call[0]["content"], tools=[{"type": "function", **{
            k: v for k, v in WEATHER["function"].items()}}], tool_choice="required",
        text={"format": {"type": "json_schema", **out["json_schema"]}},  # type: ignore
        temperature=0, max_output_tokens=80)
    assert [i.type for i in resp.output] == ["function_call"]


def test_sdk_results_go_back_as_history_and_openai_only_fields_are_accepted(
        client: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "Describe Paris as a city record."}]
    parsed = client.chat.completions.parse(model="default", messages=ask,  # type: ignore
                                           response_format=City, max_tokens=80, temperature=0)
    again = client.chat.completions.create(
        model="default", max_tokens=4, temperature=0, prompt_cache_key="k",
        safety_identifier="u1", verbosity="low", modalities=["text"],  # type: ignore
        messages=[*ask, parsed.choices[0].message,  # type: ignore[list-item]
                  {"role": "user", "content": "And Rome?"}])
    assert again.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="default", max_tokens=4, messages=ask,
                                       modalities=["text", "audio"])  # type: ignore


def test_streamed_tool_call_equals_the_non_streamed_one(client: openai.OpenAI) -> None:
    # one call (a second one, free to fill optional fields, may loop to max_tokens: how
    # far a tiny model gets depends on near ties that drafts can tip past 512 KV cells)
    kw = {"model": "default", "messages": [{"role": "user", "content": "Weather in Berlin?"}],
          "tools": TOOLS, "tool_choice": "required", "max_tokens": 200, "temperature": 0,
          "seed": 5, "parallel_tool_calls": False, "extra_body": {"cache_prompt": False}}
    whole = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    with client.chat.completions.stream(**kw) as stream:  # type: ignore[arg-type]
        for _ in stream:
            pass
        streamed = stream.get_final_completion()
    a, b = whole.choices[0].message.tool_calls, streamed.choices[0].message.tool_calls
    assert a and b and len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x.function.name, x.function.arguments) == (  # type: ignore[union-attr]
            y.function.name, y.function.arguments)  # type: ignore[union-attr]
    assert streamed.choices[0].finish_reason == "tool_calls"
    # two calls: the blank line between them is not content, streamed or whole
    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    two = [{"type": "function", "function": {"name": n, "parameters": city}}
           for n in ("get_weather", "get_time")]
    kw = {"model": "default", "tools": two, "tool_choice": "required", "max_tokens": 100,
          "temperature": 0, "messages": [
              {"role": "user", "content": "What's the weather and time in Paris?"}]}
    w = client.chat.completions.create(**kw).choices[0].message  # type: ignore[call-overload]
    content, calls = "", set()
    for chunk in client.chat.completions.create(stream=True, **kw):  # type: ignore
        for c in chunk.choices:
            content += c.delta.content or ""
            calls |= {t.index for t in c.delta.tool_calls or []}
    assert w.tool_calls and len(w.tool_calls) == len(calls) == 2
    assert w.content is None and content == ""


def test_a_call_cut_off_by_max_tokens_comes_back_as_far_as_it_was_written(
        client: openai.OpenAI, server: ServerProcess) -> None:
    """OpenAI (and llama-server) answer finish "length" with the partial call, whole or
    streamed alike; Anthropic's shape gives the tool_use block (input {}), no empty text."""
    kw = {"model": "default", "messages": [{"role": "user", "content": "Weather in Berlin?"}],
          "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
          "max_tokens": 20, "temperature": 0}
    whole = client.chat.completions.create(**kw).choices[0]  # type: ignore[call-overload]
    calls = whole.message.tool_calls or []
    assert whole.finish_reason == "length" and [
        k.function.name for k in calls] == ["get_weather"], whole  # type: ignore[union-attr]
    names, arguments, finish = [], "", None
    for chunk in client.chat.completions.create(stream=True, **kw):  # type: ignore
        for c in chunk.choices:
            for t in c.delta.tool_calls or []:
                names += [t.function.name] if t.function and t.function.name else []
                arguments += t.function.arguments or "" if t.function else ""
            finish = c.finish_reason or finish
    assert (names, arguments, finish) == (
        ["get_weather"], calls[0].function.arguments, "length")  # type: ignore[union-attr]
    # cut off inside the opening marker, before any call: no markup comes back as content
    early = client.chat.completions.create(**{**kw, "max_tokens": 3}).choices[0]  # type: ignore
    assert early.finish_reason == "length" and not early.message.content, early
    named = []  # cut anywhere: once the name is written, the call (it was dropped until
    for cap in range(4, 20):  # its arguments began: an empty answer)
        one = client.chat.completions.create(**{**kw, "max_tokens": cap}).choices[0]  # type: ignore
        assert not one.message.content, (cap, one)
        named += [cap] if one.message.tool_calls else []
    assert named and named == list(range(named[0], 20)), named
    first = client.chat.completions.create(**{**kw, "max_tokens": named[0]}).choices[0]  # type: ignore
    assert first.message.tool_calls[0].function.name == "get_weather"  # type: ignore
    assert not first.message.tool_calls[0].function.arguments  # type: ignore  # (none yet)
    r = httpx.post(f"{server.base_url}/v1/messages", timeout=60, json={
        "model": "default", "max_tokens": 20, "temperature": 0,
        "messages": [{"role": "user", "content": "Weather in Berlin?"}],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "tools": [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}]})
    body = r.json()
    assert body["stop_reason"] == "max_tokens", body
    assert [(b["type"], b["name"], b["input"]) for b in body["content"]] == [
        ("tool_use", "get_weather", {})]


def test_streamed_tool_call_deltas_have_the_openai_shape(server: ServerProcess) -> None:
    body = {"model": "default", "stream": True, "max_tokens": 300, "temperature": 0, "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "send_email"}},
            "messages": [{"role": "user",
                          "content": "Send an email to joe@example.com saying hi."}]}
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body,
                      timeout=60) as r:
        chunks = [json.loads(ln[6:]) for ln in r.iter_lines()
                  if ln.startswith("data: ") and ln != "data: [DONE]"]
    # the role comes first, with content null before a call (as OpenAI streams calls)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks
             if c["choices"] and c["choices"][0]["delta"].get("tool_calls")]
    first, rest = calls[0], calls[1:]
    assert first["index"] == 0 and first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"]["name"] == "send_email"
    assert rest and all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"}
                        for c in rest)  # then the arguments, in fragments
    args = json.loads("".join(c["function"]["arguments"] for c in calls))
    jsonschema.validate(args, SCHEMAS["send_email"])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_parallel_calls_may_repeat_a_tool_but_never_a_call(client: openai.OpenAI) -> None:
    """Two cities, one tool: calls of the same tool, none with the same arguments; a
    small model's repeated call ends the answer as "tool_calls", even when max_tokens
    runs out in the repeat (the SDK's parse() then raises nothing)."""
    tool = {"type": "function", "function": {
        "name": "get_weather", "strict": True, "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"], "additionalProperties": False}}}
    seen: set[int] = set()
    for ask in ("What is the weather in Paris and in London?", "Weather in Paris?"):
        for max_tokens in (45, 300):
            r = client.chat.completions.parse(
                model="default", messages=[{"role": "user", "content": ask}], tools=[tool],
                tool_choice="required", max_tokens=max_tokens, temperature=0)
            choice = r.choices[0]
            assert choice.finish_reason == "tool_calls", (ask, max_tokens)
            calls = [(c.function.name, json.loads(c.function.arguments))  # type: ignore
                     for c in choice.message.tool_calls or []]
            assert calls and all(name == "get_weather" for name, _ in calls)
            assert len({json.dumps(a, sort_keys=True) for _, a in calls}) == len(calls)
            seen.add(len(calls))
    assert max(seen) > 1  # the same tool called twice in one answer


def test_stop_strings_never_cut_a_forced_call(client: openai.OpenAI) -> None:
    """A stop string applies to text, not to a call the grammar forces: the call is
    whole and valid, streamed and not, and no markup becomes content."""
    for stop in ("}", "\n", "city"):
        kw: dict[str, Any] = dict(
            model="default", messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER], tool_choice="required", max_tokens=120, temperature=0, stop=stop)
        whole = client.chat.completions.create(**kw).choices[0]
        assert whole.finish_reason == "tool_calls" and not whole.message.content, stop
        calls = whole.message.tool_calls or []
        assert calls and all(json.loads(c.function.arguments) for c in calls)  # type: ignore
        args: dict[int, str] = {}
        for chunk in client.chat.completions.create(**kw, stream=True):
            for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                args[d.index] = args.get(d.index, "") + (d.function.arguments or "")  # type: ignore
        assert [json.loads(a) for a in args.values()] == [
            json.loads(c.function.arguments) for c in calls]  # type: ignore[union-attr]


def test_round_trip_call_result_answer(client: openai.OpenAI) -> None:
    messages: list[dict[str, object]] = [
        {"role": "user", "content": "What's the weather in Madrid?"}]
    r = client.chat.completions.create(model="default", messages=messages, tools=TOOLS,
                                       tool_choice="required", temperature=0)
    call = r.choices[0].message.tool_calls[0]  # type: ignore[index]
    messages.append(r.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id,
                     "content": json.dumps({"temperature": 24, "sky": "sunny"})})
    final = client.chat.completions.create(model="default", messages=messages, tools=TOOLS,
                                           tool_choice="none", max_tokens=60, temperature=0)
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls


def test_the_deprecated_functions_api_still_works(client: openai.OpenAI) -> None:
    """``functions`` / ``function_call`` (OpenAI still takes them; older clients send
    them): the call comes back as ``function_call``, finish_reason "function_call",
    streamed or whole, and a ``function`` message answers it."""
    fn = WEATHER["function"]
    ask = [{"role": "user", "content": "Weather in Oslo?"}]
    kw = {"model": "default", "messages": ask, "functions": [fn], "temperature": 0,
          "function_call": {"name": "get_weather"}, "max_tokens": 80,
          "extra_body": {"cache_prompt": False}}  # the same numerics for both runs
    c = client.chat.completions.create(**kw).choices[0]  # type: ignore[call-overload]
    assert c.finish_reason == "function_call" and not c.message.tool_calls
    call = c.message.function_call
    assert call is not None and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), fn["parameters"])
    name, arguments, finish = "", "", None
    for chunk in client.chat.completions.create(stream=True, **kw):  # type: ignore
        for ch in chunk.choices:
            if ch.delta.function_call:
                name += ch.delta.function_call.name or ""
                arguments += ch.delta.function_call.arguments or ""
            finish = ch.finish_reason or finish
    assert (name, arguments, finish) == ("get_weather", call.arguments, "function_call")
    history = [*ask, {"role": "assistant", "content": None, "function_call": {
        "name": "get_weather", "arguments": call.arguments}},
        {"role": "function", "name": "get_weather", "content": '{"sky": "clear"}'}]
    final = client.chat.completions.create(  # type: ignore[call-overload]
        model="default", messages=history, functions=[fn], function_call="none",
        temperature=0, max_tokens=30).choices[0]
    assert final.message.content and final.finish_reason in ("stop", "length")


def test_patterns_with_shorthand_classes_constrain_answers_and_calls(
        client: openai.OpenAI) -> None:
    """Patterns as pydantic and MCP tools write them (\\d, \\w, escaped dots, unanchored):
    the answer matches; a tool with such a pattern no longer fails every request."""
    import re
    props = {"zip": {"type": "string", "pattern": r"^\d{5}$"},
             "code": {"type": "string", "pattern": r"^[A-Z]{3}-\d{2}$"},
             "tag": {"type": "string", "pattern": "[a-z]{3}"},
             "amount": {"type": "string", "pattern": r"^(?!^[-+.]*$)[+-]?0*\d*\.?\d*$"}}
    schema = {"type": "object", "properties": props, "required": list(props),
              "additionalProperties": False}
    r = client.chat.completions.create(
        model="default", temperature=0, max_tokens=600,
        messages=[{"role": "user", "content": "Fill in the form."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "form", "strict": True, "schema": schema}})
    got = json.loads(r.choices[0].message.content or "")
    for name in ("zip", "code", "tag"):  # the lookahead one is not enforced (logged)
        assert re.search(props[name]["pattern"], got[name], re.ASCII), (name, got)
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"zip": props["zip"]}, "required": ["zip"]}}}
    call = client.chat.completions.create(
        model="default", temperature=0, max_tokens=100, tools=[WEATHER, tool],  # type: ignore
        tool_choice={"type": "function", "function": {"name": "lookup"}},
        messages=[{"role": "user", "content": "Look up 90210."}]).choices[0].message
    zip_code = json.loads(call.tool_calls[0].function.arguments)["zip"]  # type: ignore
    assert re.fullmatch(r"\d{5}", zip_code), zip_code


@pytest.mark.parametrize(("extra", "param"), [
    ({"grammar": "root ::= ( \"a\" "}, "grammar"),
    ({"grammar": "root ::= " + "(" * 3000 + '"a"' + ")" * 3000}, "grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "patternProperties": {"^a": {"type": "string"}}}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "$ref": "#/$defs/node", "$defs": {"node": {  # (a recursion without end)
            "type": "object", "required": ["next"], "properties": {
                "next": {"$ref": "#/$defs/node"}}}}}}}}, "response_format.json_schema.schema"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_object", "schema": {"type": "hiccup"}}},
     "response_format.schema"),
    ({"json_schema": {"type": "hiccup"}}, "json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "pattern": "^(a|b"}}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "pattern": "["}}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "pattern": "^\\ud800$"}}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_object", "schema": 123}}, "response_format.schema"),
    ({"response_format": {"type": "json_object", "foo": 1}}, "response_format.foo"),
    ({"response_format": {"type": "text", "schema": {}}}, "response_format.schema"),
    ({"response_format": {"type": 123}}, "response_format"),
    ({"json_schema": {"type": "object"}, "response_format": {"type": "text"}}, "json_schema"),
])
def test_bad_constraints_get_a_quick_400(server: ServerProcess, extra: dict[str, object],
                                         param: str) -> None:
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], **extra}
    t0 = time.monotonic()
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert time.monotonic() - t0 < 5
    assert server.health()["status"] == "ok"


def test_llama_servers_schema_fields_constrain_the_answer(server: ServerProcess) -> None:
    """llama-server's forms: ``json_object`` with a ``schema``, and a ``json_schema`` field."""
    for extra in ({"response_format": {"type": "json_object", "schema": {"const": "42"}}},
                  {"json_schema": {"const": "42"}}):
        body = {"model": "default", "max_tokens": 6, "temperature": 0,
                "messages": [{"role": "user", "content": "Write an example"}], **extra}
        r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == '"42"', extra
    # a pattern's UTF-16 pairs (as JavaScript spells an emoji) are their characters: the
    # answer holds them (each half came back as its own bytes: U+FFFD U+FFFD U+FFFD)
    body = {"model": "default", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": "An emoji"}], "response_format": {
                "type": "json_schema", "json_schema": {"name": "e", "schema": {
                    "type": "string", "pattern": "^[\\ud83d\\ude00-\\ud83d\\ude4f]{2}$"}}}}
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
    text = json.loads(r.json()["choices"][0]["message"]["content"])
    assert len(text) == 2 and all(0x1F600 <= ord(c) <= 0x1F64F for c in text), text


def test_quotes_backslashes_and_lengths_in_schemas_hold_in_the_answer(
        client: openai.OpenAI) -> None:
    """A const, an enum and a property name holding a quote or a backslash (they were a
    400), and a pattern with a maxLength (the length was not enforced): the answer
    validates."""
    schemas: list[dict[str, Any]] = [
        {"const": 'say "hi"'}, {"enum": ["C:\\temp", 'x"y']}, {"enum": ["\u0000"]},
        {"type": "object", "properties": {'a"b': {"type": "string", "maxLength": 5}},
         "required": ['a"b'], "additionalProperties": False},
        {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3},
        # what a pattern asks for is written as JSON text: a quote, a backslash, a NUL
        {"type": "string", "pattern": '^a"b\\\\c\\x00$'}, {"type": "string", "pattern": '^["]{2}$'}]
    for schema in schemas:
        _answer_validates(client, schema, "Reply with the word extraordinary", 40)


def test_what_the_converter_wrote_wrong_holds_in_the_answer(client: openai.OpenAI) -> None:
    """Schemas whose answers did not validate, or were a 400, through llama-cpp-python's
    converter alone: pydantic's extra="allow" beside an optional field (members came
    without a comma, or took the field's name), float bounds (ignored), a zod named model
    ($ref at the root, its refs unresolved: a 400), a reused schema's pointer, zod's
    optional member ({"not": {}}), dict[Literal] keys, an enum beside integer bounds, a
    choice beside required properties, prefixItems beside items."""
    schemas: list[dict[str, Any]] = [
        {"type": "object", "properties": {"a": {"type": "integer"},
                                          "b": {"type": "string", "maxLength": 8}},
         "required": ["a"], "additionalProperties": {"type": "integer"}},
        {"type": "object", "properties": {"p": {"type": "number", "minimum": -5,
                                                "maximum": -4},
                                          "q": {"type": "number", "exclusiveMinimum": 0,
                                                "exclusiveMaximum": 1}},
         "required": ["p", "q"]},
        {"$ref": "#/definitions/M", "definitions": {
            "M": {"type": "object", "properties": {"c": {"$ref": "#/definitions/C"}},
                  "required": ["c"], "additionalProperties": False},
            "C": {"type": "string", "enum": ["x", "y"]}}},
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 3},
                                          "b": {"$ref": "#/properties/a"},
                                          "u": {"anyOf": [{"not": {}}, {"type": "boolean"}]}},
         "required": ["a", "b", "u"]},
        {"type": "object", "additionalProperties": {"type": "integer"},
         "propertyNames": {"enum": ["left", "right"]}, "minProperties": 1},
        {"type": "integer", "enum": [1, 2, 30], "minimum": 0, "maximum": 10},
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
         "anyOf": [{"properties": {"b": {"type": "string", "maxLength": 4}}, "required": ["b"]},
                   {"properties": {"c": {"type": "boolean"}}, "required": ["c"]}]},
        {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "array",
         "prefixItems": [{"type": "integer"}], "items": {"type": "string", "maxLength": 4},
         "minItems": 3, "maxItems": 3},
    ]
    for schema in schemas:
        _answer_validates(client, schema, "Write an example with many fields", 120)


def _answer_validates(client: openai.OpenAI, schema: dict[str, Any], ask: str,
                      max_tokens: int) -> None:
    """The answer under ``schema`` as response_format validates against it (draft 7, or
    the draft its ``$schema`` names)."""
    r = client.chat.completions.create(
        model="default", temperature=0, max_tokens=max_tokens,
        messages=[{"role": "user", "content": ask}],
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    validator(schema).validate(json.loads(r.choices[0].message.content or ""))


def test_keywords_zod_and_pydantic_write_are_taken_and_hold_in_the_answer(
        client: openai.OpenAI) -> None:
    """zod's record (propertyNames) and draft-07 tuple (additionalItems), property counts,
    an integer's multipleOf and annotations were a 400: taken now, and the answer validates
    against the whole schema."""
    schemas: list[dict[str, Any]] = [
        {"type": "object", "properties": {"headers": {
            "type": "object", "propertyNames": {"type": "string"},
            "additionalProperties": {"type": "string", "maxLength": 16}}},
         "required": ["headers"]},
        {"type": "array", "items": [{"type": "string"}, {"type": "integer"}],
         "additionalItems": False, "minItems": 2, "maxItems": 2},
        {"type": "object", "properties": {c: {"type": "string", "maxLength": 16}
                                          for c in "abc"},
         "minProperties": 2, "maxProperties": 2, "additionalProperties": True},
        {"type": "integer", "minimum": 3, "maximum": 40, "multipleOf": 7,
         "contentMediaType": "text/plain", "x-order": 1}]
    for schema in schemas:
        _answer_validates(client, schema, "Give me an example.", 400)
    tool = {"type": "function", "function": {"name": "set_headers", "parameters": {
        "type": "object", "properties": schemas[0]["properties"], "required": ["headers"],
        "additionalProperties": False, "$schema": "http://json-schema.org/draft-07/schema#"}}}
    r = client.chat.completions.create(  # (room for the grammar's 10 members of 100+16)
        model="default", max_tokens=600, temperature=0, tools=[tool], tool_choice="required",
        messages=[{"role": "user", "content": "Set the header Accept to text/html."}])
    [call] = r.choices[0].message.tool_calls or []
    assert isinstance(json.loads(call.function.arguments)["headers"], dict)


def test_allof_and_any_value_fields_hold_in_the_answer(client: openai.OpenAI) -> None:
    """``allOf`` as pydantic v1 writes a described enum field (the answer had ``{}`` for
    it), as zod writes an intersection with a union (the union's properties came out
    optional), and beside the node's own properties (they were dropped); pydantic's
    ``Any`` field (``{"title": ...}``, a 400): the answer validates against the whole
    schema."""
    schemas: list[dict[str, Any]] = [
        {"type": "object", "required": ["color", "size"],
         "definitions": {"Color": {"enum": ["red", "green", "blue"], "type": "string"}},
         "properties": {"color": {"allOf": [{"$ref": "#/definitions/Color"}],
                                  "description": "a color"},
                        "size": {"allOf": [{"type": "integer", "minimum": 1},
                                           {"maximum": 9}]}}},
        {"allOf": [
            {"type": "object", "properties": {"id": {"type": "string", "maxLength": 8}},
             "required": ["id"]},
            {"anyOf": [{"type": "object", "required": ["kind", "n"], "properties": {
                "kind": {"const": "a"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}}},
                       {"type": "object", "required": ["kind", "ok"], "properties": {
                "kind": {"const": "b"}, "ok": {"type": "boolean"}}}]}]},
        {"type": "object", "properties": {"extra": {"type": "boolean"}}, "required": ["extra"],
         "allOf": [{"$ref": "#/$defs/Base"}], "$defs": {"Base": {
             "type": "object", "required": ["name"],
             "properties": {"name": {"type": "string", "maxLength": 10}}}}},
        {"type": "object", "properties": {"value": {"title": "Value"}}, "required": ["value"],
         "title": "Setting"}]
    for schema in schemas:
        _answer_validates(client, schema, "Give me an example.", 120)


def test_recursive_schemas_hold_in_the_answer(client: openai.OpenAI) -> None:
    """A recursive pydantic model (``$ref`` to its own definition) and OpenAI's recursive
    UI example (``"$ref": "#"``) were a 400: unrolled a few levels, the answer validates."""
    schemas: list[dict[str, Any]] = [
        {"$defs": {"Node": {"type": "object", "required": ["name", "children"], "properties": {
            "name": {"type": "string", "maxLength": 6},
            "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/Node"}}}}},
         "$ref": "#/$defs/Node"},
        {"type": "object", "required": ["type", "children"], "additionalProperties": False,
         "properties": {"type": {"enum": ["div", "button", "form"]},
                        "children": {"type": "array", "maxItems": 2, "items": {"$ref": "#"}}}}]
    for schema in schemas:
        _answer_validates(client, schema, "A small tree, as data.", 1500)  # (15 nodes at most)


def test_deeply_nested_schema_is_refused(server: ServerProcess) -> None:
    for depth in (200, 5000):  # deeper than our limit; deeper than Python's JSON recursion
        schema = '{"type": "array", "items": ' * depth + '{"type": "string"}' + "}" * depth
        body = ('{"model": "default", "messages": [{"role": "user", "content": "hi"}], '
                '"response_format": {"type": "json_schema", "json_schema": {"name": "deep", '
                f'"schema": {schema}}}}}}}')
        r = httpx.post(f"{server.base_url}/v1/chat/completions", content=body,
                       headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 400, r.text
    assert server.health()["status"] == "ok"
