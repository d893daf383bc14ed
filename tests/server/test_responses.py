"""The OpenAI Responses API against a real server, with the official SDK (create, stream,
parse, function calls, previous_response_id, stored responses) and the OpenAI Agents SDK.

The model is tiny: these tests check structure and contracts, not answers. A tool call is
forced with ``tool_choice``; a stream that must complete ends at a stop string. A test that
asserts how a generation ends samples greedily: a sampled answer may run past its limit."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pydantic
import pytest
from openai.types.responses import Response, ResponseItem, ResponseStreamEvent
from pydantic import BaseModel
from serverproc import ServerProcess, start_server, stop_server

from edgeinfer.api.responses_render import ResponseMeta, sse_events
from edgeinfer.errors import Timeout
from edgeinfer.service.events import ErrorEvent, Event, TextDelta
from edgeinfer.service.response_store import ResponseStore, StoredResponse

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False},
           "strict": True}
EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)
ITEMS = pydantic.TypeAdapter(ResponseItem)
KEY_A, KEY_B = "key-a-0123456789", "key-b-9876543210"


class City(BaseModel):
    name: str
    country: str
    population: int


def post(server: ServerProcess, body: dict[str, Any], path: str = "/v1/responses",
         key: str = "unused") -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=120, headers=_auth(key))


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def invalid(r: httpx.Response, param: str | None, status: int = 400) -> dict[str, Any]:
    """The OpenAI-shaped error of ``r``, checked."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == "invalid_request_error"  # OpenAI's type for its 400s and 404s
    if param is not None:
        assert err["param"] == param, err
    return dict(err)


def sse(server: ServerProcess, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of a raw streamed response; each SSE event name is its data's type."""
    out = []
    with httpx.stream("POST", f"{server.base_url}/v1/responses", json={**body, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name
                out.append(data)
    return out


# -- create ---------------------------------------------------------------------------------


def test_create_string_input(server: ServerProcess, client: openai.OpenAI) -> None:
    raw = post(server, {"model": "default", "input": "Say hello.", "max_output_tokens": 24,
                        "temperature": 0, "metadata": {"run": "1"}})
    assert raw.status_code == 200, raw.text
    body = raw.json()
    r = Response.model_validate(body)  # the SDK's model, validated, not just constructed
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.model == "smollm2-135m-instruct" and r.metadata == {"run": "1"}
    assert r.status in ("completed", "incomplete") and r.error is None
    assert (r.incomplete_details is not None) == (r.status == "incomplete")
    [msg] = r.output
    assert msg.type == "message" and msg.id.startswith("msg_") and msg.role == "assistant"
    assert msg.content[0].type == "output_text" and msg.content[0].annotations == []
    assert r.output_text == msg.content[0].text and r.output_text
    u = r.usage
    assert u is not None and u.input_tokens > 5 and 0 < u.output_tokens <= 24
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.output_tokens_details.reasoning_tokens == 0
    assert body["store"] is True and body["tools"] == [] and body["instructions"] is None
    sdk = client.responses.create(model="default", input="Say hello.", max_output_tokens=8,
                                 temperature=0)
    assert sdk.id != r.id and sdk.output_text


def test_cancel_is_a_400_naming_background(client: openai.OpenAI) -> None:
    r = client.responses.create(model="default", input="Say hi.", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="background"):
        client.responses.cancel(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_nope")
    # streaming a stored response again is for background responses too (it was the
    # JSON body, which the SDK's stream could not read)
    with pytest.raises(openai.BadRequestError, match="background"):
        client.responses.retrieve(r.id, stream=True)
    assert client.responses.retrieve(r.id).id == r.id
    # compaction (the Agents SDK's compaction session) is not served: a 404 that says so
    # (it was the stored-response route's 405 "Method Not Allowed")
    with pytest.raises(openai.NotFoundError, match="Compaction"):
        client.responses.compact(model="default", previous_response_id=r.id)


def test_paths_without_v1(server: ServerProcess) -> None:
    """llama-server's paths: /responses and /responses/input_tokens, /v1/health."""
    r = post(server, {"model": "default", "input": "Say hello.", "max_output_tokens": 4},
             "/responses")
    assert r.status_code == 200, r.text
    assert Response.model_validate(r.json()).output_text
    n = post(server, {"input": "Hello there"}, "/responses/input_tokens")
    assert n.status_code == 200 and n.json()["input_tokens"] > 3
    health = httpx.get(f"{server.base_url}/v1/health", timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_create_items_with_instructions(server: ServerProcess, client: openai.OpenAI) -> None:
    items: list[Any] = [
        {"role": "developer", "content": "Answer in one short sentence."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hi, I am Ann."}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello Ann!", "annotations": []}]},
        {"role": "user", "content": "What is my name?"}]
    r = client.responses.create(model="default", instructions="You are terse.", input=items,
                                max_output_tokens=16, temperature=0)
    assert r.instructions == "You are terse." and r.output_text
    listed = client.responses.input_items.list(r.id, order="asc")
    assert [(i.type, i.role) for i in listed.data] == [  # type: ignore[union-attr]
        ("message", "developer"), ("message", "user"), ("message", "assistant"),
        ("message", "user")]
    assert all(i.id for i in listed.data)
    count = client.responses.input_tokens.count(model="default", instructions="You are terse.",
                                                input=items)
    assert r.usage is not None and count.input_tokens == r.usage.input_tokens
    without = client.responses.input_tokens.count(model="default", input=items)
    assert without.input_tokens < count.input_tokens  # the instructions are in the prompt


# -- streaming -------------------------------------------------------------------------------


MESSAGE_ORDER = ["response.created", "response.in_progress", "response.output_item.added",
                 "response.content_part.added", "response.output_text.delta"]
MESSAGE_END = ["response.output_text.done", "response.content_part.done",
               "response.output_item.done", "response.completed"]


def test_stream_events_and_final_response(client: openai.OpenAI) -> None:
    with client.responses.stream(model="default", input="Name a color.", max_output_tokens=120,
                                 temperature=0, extra_body={"stop": ["."]}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert types[:5] == MESSAGE_ORDER and types[-4:] == MESSAGE_END
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.status == "completed" and final.output_text == "".join(deltas)
    assert final.output_text.strip()
    stored = client.responses.retrieve(final.id)
    assert stored.output_text == final.output_text and stored.status == "completed"


def test_raw_stream_events_validate(server: ServerProcess) -> None:
    events = sse(server, {"model": "default", "input": "Write a long story.",
                          "max_output_tokens": 4, "temperature": 0})
    for e in events:
        EVENTS.validate_python(e)
    assert events[-1]["type"] == "response.incomplete"
    final = Response.model_validate(events[-1]["response"])
    assert final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_output_tokens"
    assert final.output[0].status == "incomplete" and final.usage is not None
    assert final.usage.output_tokens == 4
    done = [e for e in events if e["type"] == "response.output_text.done"]
    assert done[0]["text"] == final.output_text


def test_stream_function_call(client: openai.OpenAI) -> None:
    with client.responses.stream(model="default", input="Weather in Oslo?", tools=[WEATHER],
                                 tool_choice="required", max_output_tokens=60,
                                 temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert "response.content_part.added" not in types  # no message, only the call
    args = "".join(e.delta for e in events
                   if e.type == "response.function_call_arguments.delta")
    [call] = final.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.arguments == args and isinstance(json.loads(args)["city"], str)
    assert call.id and call.id.startswith("fc_") and call.call_id
    assert types.index("response.function_call_arguments.done") < types.index(
        "response.output_item.done") < types.index("response.completed")


async def _events(*items: Event) -> AsyncIterator[Event]:
    for e in items:
        yield e


def test_generation_error_mid_stream() -> None:
    saved: list[dict[str, Any]] = []

    async def save(body: dict[str, Any]) -> None:
        saved.append(body)

    async def run() -> list[dict[str, Any]]:
        meta = ResponseMeta("m", {"tools": [], "tool_choice": "auto", "parallel_tool_calls": True})
        events = _events(TextDelta(0, "Hel"), ErrorEvent(Timeout("too slow", code="timeout")))
        return [json.loads(s["data"]) async for s in sse_events(meta, events, save,
                                                                "/v1/responses")]

    out = asyncio.run(run())
    assert [e["type"] for e in out][-2:] == ["error", "response.failed"]
    assert out[-2]["message"] == "too slow" and out[-2]["code"] == "timeout"
    failed = Response.model_validate(out[-1]["response"])
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.code == "server_error" and saved == [out[-1]["response"]]
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    # the text the stream showed stays in the failed response (it was an empty item)
    [msg] = failed.output
    assert msg.type == "message" and msg.status == "incomplete"
    assert msg.content[0].type == "output_text" and msg.content[0].text == "Hel"


# -- structured output and function calls ---------------------------------------------------


def test_parse_text_format(client: openai.OpenAI) -> None:
    r = client.responses.parse(model="default", input="Describe Paris as a city record.",
                               text_format=City, max_output_tokens=200, temperature=0)
    assert r.status == "completed"
    assert isinstance(r.output_parsed, City)
    assert r.text is not None and r.text.format is not None
    assert r.text.format.type == "json_schema"


def test_function_call_round_trip(client: openai.OpenAI) -> None:
    first = client.responses.create(model="default", input="What is the weather in Paris?",
                                    tools=[WEATHER], tool_choice="required",
                                    max_output_tokens=60, temperature=0)
    [call] = first.output
    assert call.type == "function_call" and call.status == "completed"
    assert isinstance(json.loads(call.arguments)["city"], str)
    assert first.tool_choice == "required" and first.tools[0].name == "get_weather"  # type: ignore[union-attr]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}
    # the whole conversation sent again ...
    again = client.responses.create(
        model="default", tools=[WEATHER], max_output_tokens=40, input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            call.model_dump(exclude_none=True), result])
    assert again.status in ("completed", "incomplete") and again.output
    # ... or continued from the stored response
    cont = client.responses.create(model="default", previous_response_id=first.id,
                                   tools=[WEATHER], input=[result], max_output_tokens=40)
    assert cont.previous_response_id == first.id and cont.output
    assert cont.usage is not None and again.usage is not None
    assert cont.usage.input_tokens == again.usage.input_tokens  # the same conversation
    [item] = client.responses.input_items.list(cont.id).data
    assert item.type == "function_call_output" and item.call_id == call.call_id


def test_codex_tools_namespace_web_search_and_client_metadata(server: ServerProcess) -> None:
    """What Codex sends: functions inside a ``namespace`` tool (each offered by its own
    name; the call's item names its namespace, as OpenAI's), a ``web_search`` tool (left out:
    no web here) and ``client_metadata`` (ignored); each was a 400."""
    ns = {"type": "namespace", "name": "crm", "description": "Customer records",
          "tools": [{**WEATHER, "name": "find_customer"}]}
    r = post(server, {"model": "default", "input": "Find Ann", "max_output_tokens": 60,
                      "temperature": 0, "tools": [WEATHER, ns, {"type": "web_search",
                                                                "external_web_access": False}],
                      "tool_choice": {"type": "function", "name": "find_customer"},
                      "client_metadata": {"thread_id": "t1"}})
    assert r.status_code == 200, r.text
    body = Response.model_validate(r.json())
    (call,) = [o for o in body.output if o.type == "function_call"]
    assert (call.name, call.namespace) == ("find_customer", "crm")
    assert [t.type for t in body.tools] == ["function", "namespace"]
    plain = post(server, {"model": "default", "input": "Weather in Rome?", "tools": [WEATHER, ns],
                          "tool_choice": "required", "max_output_tokens": 60, "temperature": 0})
    calls = [o for o in plain.json()["output"] if o["type"] == "function_call"]
    assert calls and all(("namespace" in c) == (c["name"] == "find_customer") for c in calls)


def test_named_tool_choice(client: openai.OpenAI) -> None:
    other = {**WEATHER, "name": "get_time", "description": "The time in a city"}
    r = client.responses.create(model="default", input="Time in Rome?", tools=[WEATHER, other],
                                tool_choice={"type": "function", "name": "get_time"},
                                max_output_tokens=60, temperature=0)
    assert [o.name for o in r.output if o.type == "function_call"] == ["get_time"]
    allowed = {"type": "allowed_tools", "mode": "required",
               "tools": [{"type": "function", "name": "get_time"}]}
    for ask in ("Weather in Rome?", "Time in Rome?"):  # only the allowed one is called
        r = client.responses.create(model="default", input=ask, tools=[WEATHER, other],
                                    tool_choice=allowed,  # type: ignore[arg-type]
                                    max_output_tokens=60, temperature=0, max_tool_calls=3)
        assert [o.name for o in r.output if o.type == "function_call"] == ["get_time"]
        assert r.tool_choice.type == "allowed_tools"  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError, match="not in 'tools'"):
        client.responses.create(model="default", input="x", tools=[WEATHER],
                                tool_choice={**allowed, "mode": "auto"})  # type: ignore


# -- conversation state ----------------------------------------------------------------------


def test_previous_response_id_three_turns(client: openai.OpenAI) -> None:
    previous = None
    usage = []
    for question in ("My name is Bob and I like trains.", "What do I like?",
                     "What is my name?"):
        r = client.responses.create(model="default", input=question, temperature=0,
                                    previous_response_id=previous, max_output_tokens=20)
        assert r.previous_response_id == previous and r.usage is not None
        usage.append(r.usage)
        previous = r.id
    inputs = [u.input_tokens for u in usage]
    cached = [u.input_tokens_details.cached_tokens for u in usage]
    assert inputs[0] < inputs[1] < inputs[2]
    assert cached[0] < cached[1] < cached[2]
    # each turn's prompt starts with the whole previous prompt, computed once
    assert cached[1] >= inputs[0] and cached[2] >= inputs[1]


def test_item_references_stand_for_the_stored_items(server: ServerProcess,
                                                    client: openai.OpenAI) -> None:
    """``item_reference`` input items (the Vercel AI SDK's earlier turns with store on) are
    the stored input or output items they name: the same prompt as the items themselves;
    an id no stored response holds is a 400 (another API key's: see below)."""
    first = client.responses.create(model="default", input="Hi, my name is Bob.",
                                    max_output_tokens=12, temperature=0)
    [answer] = first.output
    [asked] = client.responses.input_items.list(first.id).data
    follow = {"role": "user", "content": "What is my name?"}
    whole = client.responses.create(model="default", max_output_tokens=8, temperature=0,
                                    input=[{"role": "user", "content": "Hi, my name is Bob."},
                                           answer.model_dump(exclude_none=True), follow])
    by_ref = client.responses.create(
        model="default", max_output_tokens=8, temperature=0, input=[
            {"type": "item_reference", "id": asked.id},
            {"type": "item_reference", "id": answer.id}, follow])
    assert by_ref.usage is not None and whole.usage is not None
    assert by_ref.usage.input_tokens == whole.usage.input_tokens
    assert by_ref.output_text == whole.output_text
    [_, ref, _] = client.responses.input_items.list(by_ref.id, order="asc").data
    assert ref.type == "message" and ref.id == answer.id and ref.role == "assistant"
    err = invalid(post(server, {"model": "default", "input": [
        {"type": "item_reference", "id": "msg_nope"}]}), "input[0].id")
    assert err["code"] == "not_found" and "msg_nope" in err["message"]


def test_unknown_previous_response(server: ServerProcess) -> None:
    err = invalid(post(server, {"model": "default", "input": "hi",
                                "previous_response_id": "resp_nope"}), "previous_response_id")
    assert err["code"] == "previous_response_not_found"


def test_retrieve_input_items_delete(server: ServerProcess, client: openai.OpenAI) -> None:
    r = client.responses.create(model="default", input="Say hi.", max_output_tokens=8,
                                metadata={"k": "v"})
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.metadata == {"k": "v"}
    listed = httpx.get(f"{server.base_url}/v1/responses/{r.id}/input_items", timeout=30,
                       headers={"Authorization": "Bearer unused"}).json()
    assert listed["object"] == "list" and listed["has_more"] is False
    [item] = listed["data"]
    ITEMS.validate_python(item)
    assert listed["first_id"] == listed["last_id"] == item["id"]
    assert item["content"] == [{"type": "input_text", "text": "Say hi."}]
    gone = httpx.delete(f"{server.base_url}/v1/responses/{r.id}", timeout=30,
                        headers={"Authorization": "Bearer unused"})
    assert gone.json() == {"id": r.id, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    invalid(httpx.delete(f"{server.base_url}/v1/responses/{r.id}", timeout=30), "response_id",
            404)
    invalid(httpx.get(f"{server.base_url}/v1/responses/{r.id}/input_items", timeout=30),
            "response_id", 404)


def test_store_false_is_not_kept(server: ServerProcess, client: openai.OpenAI) -> None:
    r = client.responses.create(model="default", input="Say hi.", max_output_tokens=4,
                                store=False)
    assert r.store is False and r.output
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    invalid(post(server, {"model": "default", "input": "again", "previous_response_id": r.id}),
            "previous_response_id")


def test_input_tokens(server: ServerProcess, client: openai.OpenAI) -> None:
    plain = client.responses.input_tokens.count(model="default", input="Hello there")
    assert plain.object == "response.input_tokens" and plain.input_tokens > 3
    with_tools = client.responses.input_tokens.count(model="default", input="Hello there",
                                                     tools=[WEATHER])
    assert with_tools.input_tokens > plain.input_tokens + 20  # the tool schema is rendered
    r = client.responses.create(model="default", input="Hello there", max_output_tokens=2)
    assert r.usage is not None and r.usage.input_tokens == plain.input_tokens
    no_model = post(server, {"input": "Hello there"}, "/v1/responses/input_tokens")
    assert no_model.json() == {"object": "response.input_tokens",
                               "input_tokens": plain.input_tokens}
    invalid(post(server, {"input": "hi", "stream": True}, "/v1/responses/input_tokens"),
            "stream")
    invalid(post(server, {"input": []}, "/v1/responses/input_tokens"), "input")


# -- refusals --------------------------------------------------------------------------------


BASE = {"model": "default", "input": "hi", "max_output_tokens": 1}
BAD: list[tuple[dict[str, Any], str | None]] = [
    ({"tools": [{"type": "namespace", "name": "ns", "description": "d", "tools": [
        {"type": "web_search"}]}]}, "tools[0].tools[0].type"),
    ({"tools": [WEATHER, {"type": "namespace", "name": "ns", "description": "d",
                          "tools": [WEATHER]}]}, "tools"),  # the same name twice
    ({"tools": [{"type": "namespace", "name": "ns", "tools": [WEATHER]}]}, "tools[0]"),
    ({"tools": [{"type": "namespace", "name": f"n{k}", "description": "d", "tools": [
        {**WEATHER, "name": f"f{k}_{i}"} for i in range(100)]} for k in range(2)]}, "tools"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
    ({"tools": [{**WEATHER, "colour": 1}]}, "tools[0].colour"),
    ({"text": {"format": {"type": "xml"}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
    ({"text": "json"}, "text"),
    ({"surprise": 1}, "surprise"),
    ({"input": 5}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "computer_call_output", "call_id": "x"}]}, "input[0].type"),
    ({"input": [{"type": "item_reference"}]}, "input[0].id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     "input[0].content[0]"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
     "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"role": "user", "content": "x", "extra": 1}]}, "input[0].extra"),
    ({"temperature": "hot"}, "temperature"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"metadata": {"k": 1}}, "metadata"),
    ({"store": "yes"}, "store"),
    ({"stream": 1}, "stream"),
    ({"include": ["everything"]}, "include"),
    ({"truncation": "sometimes"}, "truncation"),
    ({"background": True}, "background"),
    ({"instructions": 5}, "instructions"),
    ({"previous_response_id": 5}, "previous_response_id"),
    ({"reasoning": "high"}, "reasoning"),
    ({"model": None}, "model"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": "x"}}}}}},
     "text.format.schema"),
    ({"max_output_tokens": 100_000}, "input"),  # over the context: the service's check
]


@pytest.mark.parametrize("extra,param", BAD, ids=[p or "body" for _, p in BAD])
def test_bad_requests_are_400(server: ServerProcess, extra: dict[str, Any],
                              param: str | None) -> None:
    body = {k: v for k, v in {**BASE, **extra}.items() if v is not None}
    err = invalid(post(server, body), param)
    if param == "tools[0].type":
        assert extra["tools"][0]["type"] in err["message"]


def test_accepted_and_ignored_fields(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model="default", input="hi", max_output_tokens=2, user="u1", service_tier="auto",
        reasoning={"effort": "low", "summary": "auto"}, include=["reasoning.encrypted_content"],
        truncation="disabled", parallel_tool_calls=False, top_p=0.9, temperature=0.5,
        extra_body={"seed": 7})
    assert r.status in ("completed", "incomplete") and r.temperature == 0.5 and r.top_p == 0.9
    assert r.truncation == "disabled" and r.parallel_tool_calls is False
    assert r.reasoning is not None and (r.reasoning.effort, r.reasoning.summary) == ("low", "auto")


def test_output_text_logprobs(client: openai.OpenAI) -> None:
    """include message.output_text.logprobs: each token's logprob and top_logprobs
    alternatives, whole and streamed, joining up to the text."""
    r = client.responses.create(model="default", input="Say hello", max_output_tokens=12,
                                temperature=0, top_logprobs=3,
                                include=["message.output_text.logprobs"])
    part = r.output[0].content[0]  # type: ignore[union-attr]
    assert part.type == "output_text" and part.logprobs and r.top_logprobs == 3
    assert "".join(lp.token for lp in part.logprobs) == part.text
    for lp in part.logprobs:
        assert len(lp.top_logprobs) == 3 and lp.top_logprobs[0].logprob == lp.logprob
    streamed = list(client.responses.create(
        model="default", input="Say hello", max_output_tokens=12, temperature=0,
        top_logprobs=3, include=["message.output_text.logprobs"], stream=True))
    deltas = [e for e in streamed if e.type == "response.output_text.delta"]
    tokens = [lp.token for e in deltas for lp in e.logprobs or []]  # type: ignore[union-attr]
    assert "".join(tokens) == part.text == "".join(e.delta for e in deltas)  # type: ignore
    cut = client.responses.create(model="default", input="Say hello", max_output_tokens=12,
                                  temperature=0, include=["message.output_text.logprobs"],
                                  extra_body={"stop": [" "]})  # a stop string's tokens: none
    first = cut.output[0].content[0]  # type: ignore[union-attr]
    assert first.text and "".join(lp.token for lp in first.logprobs or []) == first.text
    plain = client.responses.create(model="default", input="Say hello", max_output_tokens=4)
    assert not getattr(plain.output[0].content[0], "logprobs", None)  # type: ignore


HOSTILE = ['"\\ud800"', "NaN", "1e400", "-1", "true", "null", "[]", "{}", '""',
           json.dumps("x" * 100_000), str(10**30)]
FUZZ_BODY = {
    **BASE, "instructions": "be brief", "metadata": {"k": "v"}, "temperature": 0,
    "previous_response_id": None, "store": False, "include": ["reasoning.encrypted_content"],
    "truncation": "disabled", "reasoning": {"effort": "low"}, "tools": [WEATHER],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
    "input": [{"type": "message", "role": "user", "content": [{"type": "input_text",
                                                               "text": "hi"}]},
              {"type": "function_call", "call_id": "c", "name": "get_weather",
               "arguments": "{}"},
              {"type": "function_call_output", "call_id": "c", "output": "sunny"}]}
FUZZED = ["model", "input", "input.0", "input.0.type", "input.0.role", "input.0.content",
          "input.0.content.0", "input.0.content.0.type", "input.0.content.0.text",
          "input.1.call_id", "input.1.arguments", "input.2.output", "input.2.call_id",
          "instructions", "tools", "tools.0", "tools.0.type", "tools.0.name",
          "tools.0.parameters", "tools.0.strict", "tool_choice", "tool_choice.name", "text",
          "text.format", "text.format.type", "text.format.schema", "text.format.strict",
          "metadata", "metadata.k", "temperature", "max_output_tokens", "previous_response_id",
          "store", "include", "include.0", "truncation", "reasoning", "stream"]
MARK = "__HOSTILE__"


def _with(path: str, raw: str) -> str:
    """FUZZ_BODY as JSON text with the value at ``path`` (dotted) replaced by ``raw``."""
    doc = json.loads(json.dumps(FUZZ_BODY))
    *parents, last = path.split(".")
    node: Any = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = MARK
    return json.dumps(doc).replace(json.dumps(MARK), raw)


@pytest.mark.parametrize("path", FUZZED)
def test_hostile_values_never_500(server: ServerProcess, path: str) -> None:
    for raw in HOSTILE:
        r = httpx.post(f"{server.base_url}/v1/responses", content=_with(path, raw), timeout=60,
                       headers={"content-type": "application/json"})
        assert r.status_code < 500, (path, raw, r.text)
        if r.status_code >= 400:
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}


# -- a server of its own: API keys, a corrupt database, truncation --------------------------


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    """A server with two API keys, a small context, and a cache folder whose response
    database is garbage before it starts."""
    tmp = tmp_path_factory.mktemp("keyed")
    cache = tmp / "cache"
    cache.mkdir()
    (cache / "responses.sqlite3").write_bytes(os.urandom(8192))
    keys = tmp / "keys.txt"
    keys.write_text(f"{KEY_A}\n{KEY_B}\n")
    old = os.environ.get("EDGEINFER_CACHE")
    os.environ["EDGEINFER_CACHE"] = str(cache)
    try:
        srv = start_server(tmp, "--model", "default", "--slots", "2", "--threads", "1",
                           "--context", "1024", "--api-key-file", str(keys))
    finally:
        if old is None:
            del os.environ["EDGEINFER_CACHE"]
        else:
            os.environ["EDGEINFER_CACHE"] = old
    yield srv, cache / "responses.sqlite3"
    stop_server(srv)


def _get(srv: ServerProcess, rid: str, key: str) -> httpx.Response:
    return httpx.get(f"{srv.base_url}/v1/responses/{rid}", timeout=30, headers=_auth(key))


def test_responses_belong_to_their_api_key(keyed: tuple[ServerProcess, Path]) -> None:
    srv, _ = keyed
    made = post(srv, BASE, key=KEY_A)
    assert made.status_code == 200, made.text  # a garbage database did not stop anything
    rid = made.json()["id"]
    assert _get(srv, rid, KEY_A).json()["id"] == rid
    invalid(_get(srv, rid, KEY_B), "response_id", 404)
    invalid(httpx.get(f"{srv.base_url}/v1/responses/{rid}/input_items", timeout=30,
                      headers={"x-api-key": KEY_B}), "response_id", 404)
    invalid(httpx.delete(f"{srv.base_url}/v1/responses/{rid}", timeout=30,
                         headers={"x-api-key": KEY_B}), "response_id", 404)
    invalid(post(srv, {**BASE, "previous_response_id": rid}, key=KEY_B), "previous_response_id")
    ref = {**BASE, "input": [{"type": "item_reference", "id": made.json()["output"][0]["id"]}]}
    invalid(post(srv, ref, key=KEY_B), "input[0].id")
    assert post(srv, ref, key=KEY_A).status_code == 200
    assert post(srv, {**BASE, "previous_response_id": rid}, key=KEY_A).status_code == 200
    assert _get(srv, rid, KEY_A).status_code == 200  # B's delete did nothing
    assert _get(srv, rid, "").status_code == 401


def test_corrupt_database_degrades_to_not_found(keyed: tuple[ServerProcess, Path]) -> None:
    srv, db = keyed
    old = post(srv, BASE, key=KEY_A).json()["id"]
    assert _get(srv, old, KEY_A).status_code == 200
    db.write_bytes(b"not a database at all " * 512)  # under the running server
    invalid(_get(srv, old, KEY_A), "response_id", 404)
    new = post(srv, BASE, key=KEY_A)
    assert new.status_code == 200, new.text
    assert _get(srv, new.json()["id"], KEY_A).status_code == 200
    assert db.with_name("responses.sqlite3.corrupt").is_file()
    db.write_bytes(b"")  # an empty file is a fresh database
    assert post(srv, BASE, key=KEY_A).status_code == 200


def test_a_response_the_store_cannot_keep_says_store_false(
        keyed: tuple[ServerProcess, Path]) -> None:
    """A store that cannot be written (here: a folder where its file should be; on a
    laptop, a full or read-only disk) answers ``"store": false``, streamed or not."""
    srv, db = keyed
    db.unlink(missing_ok=True)
    db.mkdir()
    try:
        made = post(srv, BASE, key=KEY_A)
        assert made.status_code == 200, made.text
        assert made.json()["store"] is False
        invalid(_get(srv, made.json()["id"], KEY_A), "response_id", 404)
        with httpx.stream("POST", f"{srv.base_url}/v1/responses", timeout=60,
                          json={**BASE, "stream": True}, headers=_auth(KEY_A)) as r:
            last = [ln for ln in r.iter_lines() if ln.startswith("data:")][-1]
        assert json.loads(last[5:])["response"]["store"] is False
    finally:
        db.rmdir()
    kept = post(srv, BASE, key=KEY_A).json()  # a writable store again
    assert kept["store"] is True and _get(srv, kept["id"], KEY_A).status_code == 200


def test_truncation_auto_drops_oldest_turns(keyed: tuple[ServerProcess, Path]) -> None:
    srv, _ = keyed
    long = "Here is a long note about trains and stations. " * 40  # ~400 tokens
    previous = None
    for _ in range(2):
        r = post(srv, {**BASE, "input": long, "previous_response_id": previous}, key=KEY_A)
        assert r.status_code == 200, r.text
        previous = r.json()["id"]
    third = {**BASE, "input": long, "previous_response_id": previous}
    err = invalid(post(srv, third, key=KEY_A), None)
    assert err["code"] == "context_length_exceeded"
    ok = post(srv, {**third, "truncation": "auto"}, key=KEY_A)
    assert ok.status_code == 200, ok.text
    assert ok.json()["truncation"] == "auto" and ok.json()["usage"]["input_tokens"] < 1024


def test_truncation_auto_keeps_as_much_of_a_long_history_as_fits(
        keyed: tuple[ServerProcess, Path]) -> None:
    """The oldest turns go, only as many as must: however long the history (a search of
    the cut once tried the 1st, 2nd, 4th, 8th ... turn, so the longer the history, the
    less of it was kept: 32 of 8,000 tokens at 60 turns of 354)."""
    srv, _ = keyed
    kept = []
    for turns in (30, 120):  # ~50 tokens each: 1,500 and 6,000 tokens
        history = [{"role": "user" if i % 2 == 0 else "assistant",
                    "content": f"Turn {i}: " + "the train left the station at noon. " * 4}
                   for i in range(turns)]
        r = post(srv, {**BASE, "truncation": "auto",
                       "input": [*history, {"role": "user", "content": "When?"}]}, key=KEY_A)
        assert r.status_code == 200, r.text
        kept.append(r.json()["usage"]["input_tokens"])
    # a context of 1,024 with one token to answer: one more turn pair would not have fit
    assert all(1024 - 2 * 50 - 20 < n < 1024 for n in kept), kept


# -- the store's bounds, without a server -----------------------------------------------------


def test_store_bounds(tmp_path: Path) -> None:
    async def run() -> None:
        store = ResponseStore(tmp_path / "r.sqlite3", max_rows=3)
        for i in range(5):
            assert await store.put("o", StoredResponse(f"r{i}", {"i": i}, [], []))
        kept = [await store.get("o", f"r{i}") is not None for i in range(5)]
        assert kept == [False, False, True, True, True]  # oldest removed first
        assert await store.get("other", "r4") is None
        aged = ResponseStore(tmp_path / "r.sqlite3", max_age_s=-1)  # everything too old
        assert await aged.get("o", "r4") is None
        await aged.put("o", StoredResponse("x", {}, [], []))
        assert await store.get("o", "r4") is None and await store.get("o", "x") is None
        # a byte budget too: large conversations push out the oldest, the newest stays
        small = ResponseStore(tmp_path / "b.sqlite3", max_bytes=25_000)
        for i in range(4):
            assert await small.put("o", StoredResponse(f"b{i}", {}, [], ["x" * 10_000]))
        kept = [await small.get("o", f"b{i}") is not None for i in range(4)]
        assert kept == [False, False, True, True]

    asyncio.run(run())


def test_store_items_by_id(tmp_path: Path) -> None:
    """An item id is found in the latest stored response that holds it, and still in an
    older one when the latest is deleted or pruned; never in another owner's."""
    async def run() -> None:
        store = ResponseStore(tmp_path / "i.sqlite3", max_rows=3)
        item = {"id": "msg_1", "type": "message", "role": "user", "content": []}
        out = {"output": [{"id": "msg_out", "type": "message"}]}
        await store.put("o", StoredResponse("a", out, [item], []))
        await store.put("o", StoredResponse("b", {"output": []}, [item], []))
        assert await store.item("o", "msg_1") == item
        assert await store.item("o", "msg_out") == out["output"][0]
        assert await store.item("other", "msg_1") is None
        assert await store.delete("o", "b")
        assert await store.item("o", "msg_1") == item  # (a's)
        for rid in ("c", "d", "e"):  # a is pruned (3 rows at most): its items go with it
            await store.put("o", StoredResponse(rid, {"output": []}, [], []))
        assert await store.item("o", "msg_1") is None

    asyncio.run(run())


# -- the OpenAI Agents SDK ---------------------------------------------------------------------


def test_agents_sdk_runs_a_tool(server: ServerProcess) -> None:
    from agents import (
        Agent,
        ModelSettings,
        Runner,
        function_tool,
        set_default_openai_client,
        set_tracing_disabled,
    )

    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"The weather in {city} is sunny and 21 degrees."

    async def run() -> Any:
        set_tracing_disabled(True)
        set_default_openai_client(openai.AsyncOpenAI(
            base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120),
            use_for_tracing=False)
        agent = Agent(name="weather", instructions="Answer weather questions with the tool.",
                      model="default", tools=[get_weather], model_settings=ModelSettings(
                          tool_choice="required", max_tokens=120, temperature=0))
        return await Runner.run(agent, "What is the weather in Paris?", max_turns=4)

    result = asyncio.run(run())
    assert len(calls) >= 1 and all(isinstance(c, str) for c in calls)
    assert isinstance(result.final_output, str) and result.final_output.strip()
