"""The Anthropic Messages API against a real server, with the official ``anthropic`` SDK:
create, the stream helper, tool use (streamed input_json_delta, a tool round trip), stop
reasons, count_tokens, the error shape and classes, and API keys given as x-api-key.

The model is tiny: these tests check structure and contracts, not answers. A tool call is
forced with ``tool_choice``; a stop sequence is made certain by a JSON schema output."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from anthropic.types import Message, ModelInfo
from serverproc import ServerProcess, start_server, stop_server
from starlette.applications import Starlette
from starlette.routing import Route

from edgeinfer.api import respond
from edgeinfer.api.anthropic_render import MessageMeta, ping_event, sse_events
from edgeinfer.errors import Timeout
from edgeinfer.service.events import (
    ErrorEvent,
    Event,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UsageReport,
)

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"name": "get_weather", "description": "The weather in a city", "input_schema": SCHEMA}
HI = [{"role": "user", "content": "Say hello."}]
STORY = [{"role": "user", "content": "Tell me a long story about a dragon."}]
GREEDY = {"temperature": 0}  # not a typed argument of this SDK's create()


@pytest.fixture()
def ac(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0,
                               timeout=120)


def post(server: ServerProcess, body: Any, path: str = "/v1/messages",
         headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=120, headers=headers)


def anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    """The message of ``r``'s Anthropic-shaped error, checked."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return str(body["error"]["message"])


def sse_pairs(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event, data) of each server-sent event of a raw stream."""
    out = []
    for chunk in text.replace("\r\n", "\n").split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines() if ": " in line)
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


def total_input(m: Message) -> int:
    """All the prompt tokens (the SDK: input + cache creation + cache read)."""
    u = m.usage
    return u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens
                                                                 or 0)


def text_of(m: Message) -> str:
    return "".join(b.text for b in m.content if b.type == "text")


# -- create and stream ----------------------------------------------------------------------


def test_create_with_a_system_string_and_system_blocks(ac: anthropic.Anthropic) -> None:
    plain = ac.messages.create(model="default", max_tokens=8, system="Be brief.", messages=HI,
                               extra_body=GREEDY)
    assert plain.type == "message" and plain.role == "assistant" and plain.id.startswith("msg_")
    assert plain.model == "smollm2-135m-instruct"
    assert [b.type for b in plain.content] == ["text"] and text_of(plain)
    assert plain.stop_reason in ("end_turn", "max_tokens") and plain.stop_sequence is None
    assert 0 < plain.usage.output_tokens <= 8 and plain.usage.cache_creation_input_tokens == 0
    blocks = ac.messages.create(model="default", max_tokens=8, messages=HI, system=[
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}])
    assert total_input(blocks) == total_input(plain)  # the same prompt
    as_message = ac.messages.create(model="default", max_tokens=8, messages=[
        {"role": "system", "content": "Be brief."}, *HI])  # this SDK's SystemMessageParam
    assert total_input(as_message) == total_input(plain)
    longer = ac.messages.create(model="default", max_tokens=8, messages=HI, system=[
        {"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}])
    assert total_input(longer) > total_input(plain)  # both blocks are in the prompt


def test_usage_splits_cached_input_from_new_input(ac: anthropic.Anthropic) -> None:
    system = "You are a patient assistant. " * 20
    first = ac.messages.create(model="default", max_tokens=2, system=system, messages=HI)
    again = ac.messages.create(model="default", max_tokens=2, system=system, messages=HI)
    assert total_input(first) == total_input(again)
    assert (again.usage.cache_read_input_tokens or 0) > 0
    assert again.usage.input_tokens < total_input(again)


def test_stream_helper_text_equals_final_message(ac: anthropic.Anthropic) -> None:
    with ac.messages.stream(model="default", max_tokens=24, messages=STORY,
                            extra_body=GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed and streamed == text_of(final)
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.output_tokens > 0 and total_input(final) > 0


def test_stream_events_come_in_anthropic_order(server: ServerProcess) -> None:
    r = post(server, {"model": "default", "max_tokens": 12, "stream": True, "messages": STORY,
                      **GREEDY},
             headers={"anthropic-version": "2023-06-01", "anthropic-beta": "whatever"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    pairs = sse_pairs(r.text)
    kinds = [k for k, _ in pairs]
    assert all(data["type"] == kind for kind, data in pairs)
    assert kinds[:3] == ["message_start", "content_block_start", "ping"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    start = pairs[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] > 0  # the prompt's size, known up front
    assert start["usage"]["cache_read_input_tokens"] == 0  # (the split comes at the end)
    assert start["usage"]["cache_creation_input_tokens"] == 0
    assert pairs[1][1] == {"type": "content_block_start", "index": 0,
                           "content_block": {"type": "text", "text": ""}}
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for _, d in pairs[3:-3])
    delta = pairs[-2][1]
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    usage = delta["usage"]
    assert 0 < usage["output_tokens"] <= 12
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == start["usage"][
        "input_tokens"]


# -- tools ----------------------------------------------------------------------------------


def test_streamed_tool_use_is_built_from_input_json_deltas(ac: anthropic.Anthropic) -> None:
    partial: list[str] = []
    kinds: list[str] = []
    with ac.messages.stream(model="default", max_tokens=100, tools=[WEATHER], extra_body=GREEDY,
                            tool_choice={"type": "tool", "name": "get_weather"},
                            messages=[{"role": "user", "content": "Weather in Paris?"}]
                            ) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial.append(event.delta.partial_json)
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    calls = [b for b in final.content if b.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert calls[0].id.startswith("toolu_")
    jsonschema.validate(calls[0].input, SCHEMA)
    assert partial and json.loads("".join(partial)) == calls[0].input
    assert "input_json" in kinds and kinds[-1] == "message_stop"


def test_tool_round_trip(ac: anthropic.Anthropic) -> None:
    ask: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = ac.messages.create(model="default", max_tokens=100, messages=ask, tools=[WEATHER],
                               tool_choice={"type": "any", "disable_parallel_tool_use": True},
                               extra_body=GREEDY)
    assert first.stop_reason == "tool_use"
    calls = [b for b in first.content if b.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(calls[0].input, SCHEMA)
    turns = ask + [first.to_param(), {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": calls[0].id,
         "content": [{"type": "text", "text": "Sunny, 21 C"}]},
        {"type": "text", "text": "Answer in one sentence."}]}]
    answer = ac.messages.create(model="default", max_tokens=24, messages=turns,
                                tools=[WEATHER], tool_choice={"type": "none"}, extra_body=GREEDY)
    assert [b.type for b in answer.content] == ["text"] and text_of(answer)
    assert answer.stop_reason in ("end_turn", "max_tokens")
    # the call and its result are in the prompt: it is longer than the question alone
    alone = ac.messages.count_tokens(model="default", messages=ask)
    assert total_input(answer) > alone.input_tokens + 10
    counted = ac.messages.count_tokens(model="default", messages=turns, tools=[WEATHER],
                                       tool_choice={"type": "none"})
    assert counted.input_tokens == total_input(answer)
    auto = ac.messages.create(model="default", max_tokens=40, messages=turns, tools=[WEATHER],
                              extra_body=GREEDY)
    assert auto.content and {b.type for b in auto.content} <= {"text", "tool_use"}
    assert auto.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_the_sdk_tool_runner_goes_on_without_a_message_thread(ac: anthropic.Anthropic,
                                                              server: ServerProcess) -> None:
    """The SDK's tool runner asks for a message thread first (``thread``, a beta): the
    answer is a 400 with ``thread_unsupported_request`` in ``error.details``, on which the
    runner sends the whole conversation without one, and runs the tool."""
    ran: list[str] = []

    @anthropic.beta_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"Sunny in {city}"

    runner = ac.beta.messages.tool_runner(
        model="default", max_tokens=200, extra_body=GREEDY, tools=[get_weather], max_iterations=2,
        tool_choice={"type": "any"}, messages=[{"role": "user", "content": "Paris weather?"}])
    replies = list(runner)
    assert replies and replies[0].stop_reason == "tool_use" and ran
    r = post(server, {"model": "default", "max_tokens": 4, "thread": {"type": "create"},
                      "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and "thread" in err["message"]
    assert err["details"] == {"error_code": "thread_unsupported_request", "unsupported": []}


def test_tool_result_errors_and_strings_are_accepted(ac: anthropic.Anthropic) -> None:
    turns: list[Any] = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "service down", "is_error": True}]}]
    m = ac.messages.create(model="default", max_tokens=4, messages=turns, tools=[WEATHER],
                           tool_choice={"type": "none"}, extra_body=GREEDY)
    assert m.content[0].type == "text"
    for empty in ([], ""):  # a tool that printed nothing
        turns[-1]["content"][0] = {"type": "tool_result", "tool_use_id": "toolu_1",
                                   "content": empty}
        m = ac.messages.create(model="default", max_tokens=4, messages=turns, tools=[WEATHER],
                               tool_choice={"type": "none"}, extra_body=GREEDY)
        assert m.content[0].type == "text"


# -- stop reasons ---------------------------------------------------------------------------


def test_max_tokens_stop_reason(ac: anthropic.Anthropic, server: ServerProcess) -> None:
    m = ac.messages.create(model="default", max_tokens=3, messages=STORY, extra_body=GREEDY)
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None
    assert m.usage.output_tokens == 3
    r = post(server, {"model": "default", "max_tokens": 3, "stream": True, "messages": STORY,
                      **GREEDY})
    delta = [d for k, d in sse_pairs(r.text) if k == "message_delta"]
    assert delta[0]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}


def test_stop_sequences_name_the_one_that_matched(ac: anthropic.Anthropic) -> None:
    # the JSON schema makes the key "answer" certain to be written: the stop string matches
    schema = {"type": "object", "properties": {"answer": {"type": "string"}},
              "required": ["answer"], "additionalProperties": False}
    body = {"model": "default", "max_tokens": 40, "stop_sequences": ["zzz-never", '"answer"'],
            "messages": [{"role": "user", "content": "Answer in JSON: what is 2+2?"}],
            "extra_body": {"output_config": {"format": {"type": "json_schema",
                                                        "schema": schema}}}}
    m = ac.messages.create(**body)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == '"answer"'
    assert text_of(m).strip() == "{"  # the stop string and what follows are cut
    with ac.messages.stream(**body) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == '"answer"'
    assert streamed == text_of(final) and '"answer"' not in streamed


def test_output_config_json_schema(ac: anthropic.Anthropic) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    m = ac.messages.create(model="default", max_tokens=60, messages=HI, extra_body={
        **GREEDY, "output_config": {"effort": "low",
                                    "format": {"type": "json_schema", "schema": schema}}})
    assert m.stop_reason == "end_turn"
    jsonschema.validate(json.loads(text_of(m)), schema)
    # a prefill would come before the whole JSON value: the two together do not parse
    with pytest.raises(anthropic.BadRequestError) as info:
        ac.messages.create(model="default", max_tokens=60, messages=[
            *HI, {"role": "assistant", "content": '{"n": '}], extra_body={
            "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert "prefilled" in info.value.message


# -- count_tokens ---------------------------------------------------------------------------


def test_count_tokens(ac: anthropic.Anthropic, server: ServerProcess) -> None:
    short = ac.messages.count_tokens(model="default", messages=HI, system="Be brief.")
    long = ac.messages.count_tokens(model="default", messages=HI,
                                    system="Be brief. " + "Answer kindly. " * 30)
    assert 0 < short.input_tokens < long.input_tokens
    m = ac.messages.create(model="default", max_tokens=2, messages=HI, system="Be brief.")
    assert short.input_tokens == total_input(m)
    with_tools = ac.messages.count_tokens(model="default", messages=HI, system="Be brief.",
                                          tools=[WEATHER])
    assert with_tools.input_tokens > short.input_tokens  # the tools are in the prompt
    r = post(server, {"model": "default", "max_tokens": 5, "messages": HI},
             "/v1/messages/count_tokens")
    assert "max_tokens" in anthropic_error(r, 400, "invalid_request_error")
    # the rest of a create body is taken (and does not change the count)
    r = post(server, {"model": "default", "messages": HI, "system": "Be brief.", "stream": True,
                      "temperature": 0.5, "stop_sequences": ["x"], "metadata": {"user_id": "u"}},
             "/v1/messages/count_tokens")
    assert r.status_code == 200 and r.json() == {"input_tokens": short.input_tokens}
    # Claude Code's beta fields (context editing, compaction) are taken and ignored
    managed = {"context_management": {"edits": [{"type": "clear_thinking_20251015",
                                                 "keep": "all"}]},
               "compaction": {"enabled": True}}
    r = post(server, {"model": "default", "messages": HI, "system": "Be brief.", **managed},
             "/v1/messages/count_tokens")
    assert r.status_code == 200 and r.json() == {"input_tokens": short.input_tokens}, r.text
    r = post(server, {"model": "default", "max_tokens": 2, "messages": HI, **managed})
    assert r.status_code == 200 and r.json()["type"] == "message", r.text


def test_a_prompt_over_the_context_is_worded_as_anthropic_words_it(server: ServerProcess
                                                                  ) -> None:
    """Claude Code compacts a conversation that outgrew the context only on Anthropic's
    wording ("prompt is too long: N tokens > M maximum"); the OpenAI one ended its run."""
    long = " ".join(f"Clause {i}: the tenant keeps the garden tidy." for i in range(1100))
    r = post(server, {"model": "default", "max_tokens": 5,
                      "messages": [{"role": "user", "content": long}]})
    message = anthropic_error(r, 400, "invalid_request_error")
    assert re.fullmatch(r"prompt is too long: \d+ tokens > 8191 maximum", message), message
    n = int(message.split()[4])
    assert n >= 8192
    huge = "word " * 600_000  # refused on its characters, before it is tokenized
    r = post(server, {"model": "default", "max_tokens": 5,
                      "messages": [{"role": "user", "content": huge}]})
    message = anthropic_error(r, 400, "invalid_request_error")
    assert re.fullmatch(r"prompt is too long: \d+ tokens > 8191 maximum", message), message
    assert int(message.split()[4]) >= 3_000_000 // 256


# -- models ---------------------------------------------------------------------------------


def test_models_list_and_retrieve_in_anthropic_shape(ac: anthropic.Anthropic,
                                                     server: ServerProcess) -> None:
    models = list(ac.models.list())  # the SDK pages through them
    ids = [m.id for m in models]
    assert "smollm2-135m-instruct" in ids and len(ids) == len(set(ids)) >= 3
    assert all(m.type == "model" and m.display_name and m.created_at for m in models)
    page = ac.models.list(limit=1)
    assert [m.id for m in page.data] == ids[:1] and page.has_more
    assert (page.first_id, page.last_id) == (ids[0], ids[0])
    after = ac.models.list(limit=5, after_id=ids[0])
    assert [m.id for m in after.data] == ids[1:6] and after.has_more == (len(ids) > 6)
    before = ac.models.list(before_id=ids[-1])
    assert [m.id for m in before.data] == ids[:-1] and not before.has_more
    one = ac.models.retrieve("default")  # an alias names its model
    assert (one.type, one.id) == ("model", "smollm2-135m-instruct")
    raw = httpx.get(f"{server.base_url}/v1/models/default",
                    headers={"anthropic-version": "2023-06-01"}).json()
    held = ModelInfo.model_validate(raw)  # validated: the SDK only constructs (lifecycle)
    assert held.lifecycle == "active" and held.max_input_tokens == 8192, raw
    with pytest.raises(anthropic.NotFoundError) as err:
        ac.models.retrieve("no-such-model")
    assert err.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        ac.models.list(limit=0)
    for odd in ("\u00b2", "\u0663"):  # digits that are not ASCII (int() refused one: a 500)
        r = httpx.get(f"{server.base_url}/v1/models", params={"limit": odd},
                      headers={"anthropic-version": "2023-06-01"})
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
    # the OpenAI shape for everyone else
    listed = httpx.get(f"{server.base_url}/v1/models").json()
    assert listed["object"] == "list" and listed["data"][0]["object"] == "model"


# -- errors ---------------------------------------------------------------------------------

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBORw0KGgo="}}
BAD_BODIES = {
    "missing max_tokens": ({"model": "default", "messages": HI}, "max_tokens"),
    "image block": ({"model": "default", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "what is it?"}, IMAGE]}]},
        "image"),
    "document block": ({"model": "default", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "document", "source": {
            "type": "text", "media_type": "text/plain", "data": "x"}}]}]}, "document"),
    "image in a tool result": ({"model": "default", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                      "content": [IMAGE]}]}]}, "image"),
    "server tool": ({"model": "default", "max_tokens": 4, "messages": HI, "tools": [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}]},
        "web_search_20250305"),
    "unknown field": ({"model": "default", "max_tokens": 4, "messages": HI, "frobnicate": 1},
                      "frobnicate"),
    "unknown block field": ({"model": "default", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "x", "colour": "red"}]}]},
        "colour"),
    "developer role": ({"model": "default", "max_tokens": 4, "messages": [
        {"role": "developer", "content": "be nice"}, *HI]}, "role"),
    "image in a system message": ({"model": "default", "max_tokens": 4, "messages": [
        {"role": "system", "content": [IMAGE]}, *HI]}, "image"),
    "tool role": ({"model": "default", "max_tokens": 4, "messages": [
        {"role": "tool", "content": "x"}]}, "role"),
    "temperature over 1": ({"model": "default", "max_tokens": 4, "messages": HI,
                            "temperature": 1.5}, "temperature"),
    "tool_choice names no tool": ({"model": "default", "max_tokens": 4, "messages": HI,
                                   "tools": [WEATHER],
                                   "tool_choice": {"type": "tool", "name": "nope"}},
                                  "tool_choice"),
    "any without tools": ({"model": "default", "max_tokens": 4, "messages": HI,
                           "tool_choice": {"type": "any"}}, "tool_choice"),
    "max_tokens zero": ({"model": "default", "max_tokens": 0, "messages": HI}, "max_tokens"),
    "empty messages": ({"model": "default", "max_tokens": 4, "messages": []}, "messages"),
    "bad thinking": ({"model": "default", "max_tokens": 4, "messages": HI,
                      "thinking": {"type": "sometimes"}}, "thinking"),
    "container": ({"model": "default", "max_tokens": 4, "messages": HI,
                   "container": "c-1"}, "container"),
    "not an object": ([1, 2], "object"),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_bad_input_is_an_anthropic_400(server: ServerProcess, ac: anthropic.Anthropic,
                                       case: str) -> None:
    body, mentioned = BAD_BODIES[case]
    message = anthropic_error(post(server, body), 400, "invalid_request_error")
    assert mentioned in message, message
    with pytest.raises(anthropic.BadRequestError) as err:
        ac.post("/v1/messages", cast_to=Message, body=body)
    assert err.value.status_code == 400
    assert isinstance(err.value.body, dict) and err.value.body["type"] == "error"
    assert err.value.body["error"]["type"] == "invalid_request_error"


FUZZ_BODY = {
    "model": "default", "max_tokens": 1, "system": [{"type": "text", "text": "s"}],
    "stop_sequences": ["zz"], "tools": [WEATHER], "tool_choice": {"type": "auto"},
    "metadata": {"user_id": "u"}, "thinking": {"type": "disabled"}, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1",
                                           "name": "get_weather", "input": {"city": "x"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "ok"}]}]}]}
FUZZ_FIELDS = [
    "model", "max_tokens", "system", "system.0", "system.0.text", "stop_sequences",
    "stop_sequences.0", "tools", "tools.0", "tools.0.input_schema", "tools.0.name",
    "tools.0.description", "tool_choice", "tool_choice.type", "metadata", "thinking",
    "messages", "messages.0", "messages.0.content", "messages.0.role", "messages.1.content",
    "messages.1.content.0", "messages.1.content.0.input", "messages.1.content.0.id",
    "messages.2.content", "messages.2.content.0.content", "messages.2.content.0.content.0",
    "messages.2.content.0.tool_use_id", "messages.2.content.0.is_error", "temperature",
    "top_k", "top_p", "stream", "output_config", "service_tier"]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_hostile_values_never_give_a_5xx(server: ServerProcess, path: str) -> None:
    from test_field_fuzz import HOSTILE, _with

    body = FUZZ_BODY if path == "/v1/messages" else {
        k: v for k, v in FUZZ_BODY.items() if k != "max_tokens"}
    for field in FUZZ_FIELDS:
        for raw in HOSTILE:
            r = httpx.post(f"{server.base_url}{path}", content=_with(body, field, raw),
                           timeout=120, headers={"content-type": "application/json"})
            assert r.status_code < 500, (path, field, raw[:40], r.status_code, r.text[:300])
            if r.status_code >= 400:
                anthropic_error(r, r.status_code, r.json()["error"]["type"])
    assert server.proc.poll() is None


def test_sdk_raises_bad_request_for_typed_calls(ac: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError):
        ac.messages.create(model="default", max_tokens=4, messages=HI,
                           tools=[{"type": "web_search_20250305", "name": "web_search"}])
    with pytest.raises(anthropic.BadRequestError):
        ac.messages.create(model="default", max_tokens=4, messages=HI,
                           extra_body={"unknown_thing": True})
    with pytest.raises(anthropic.BadRequestError, match="forces tool use"):  # as Anthropic's
        ac.messages.create(model="default", max_tokens=4, messages=HI, tools=[WEATHER],
                           tool_choice={"type": "any"},
                           thinking={"type": "enabled", "budget_tokens": 1024})
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        ac.messages.create(model="default", max_tokens=4, messages=HI,
                           thinking={"type": "enabled", "budget_tokens": -5})
    with pytest.raises(anthropic.BadRequestError):  # also when streaming: before the stream
        with ac.messages.stream(model="default", max_tokens=4, messages=[
                {"role": "user", "content": [IMAGE]}]) as stream:
            stream.until_done()


def test_unknown_model_is_not_found(ac: anthropic.Anthropic, server: ServerProcess) -> None:
    with pytest.raises(anthropic.NotFoundError) as err:
        ac.messages.create(model="claude-nonexistent", max_tokens=4, messages=HI)
    assert isinstance(err.value.body, dict)
    assert err.value.body["error"]["type"] == "not_found_error"
    r = post(server, {"model": "claude-nonexistent", "messages": HI},
             "/v1/messages/count_tokens")
    anthropic_error(r, 404, "not_found_error")


# -- the stream's rendering, on fake events --------------------------------------------------


async def _events(*items: Event) -> AsyncIterator[Event]:
    for e in items:
        yield e


def _stream_of(*items: Event, show_thinking: bool = True) -> bytes:
    async def run() -> list[dict[str, str]]:
        meta = MessageMeta("m", show_thinking)
        return [s async for s in sse_events(meta, _events(*items), 7, "/v1/messages")]

    return "".join(f"event: {s['event']}\ndata: {s['data']}\n\n"
                   for s in asyncio.run(run())).encode()


def _fake_client(payload: bytes) -> anthropic.Anthropic:
    """A client whose every request gets ``payload`` as a stream (this SDK uses httpx2)."""
    import httpx2

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=payload,
                               headers={"content-type": "text/event-stream"})

    return anthropic.Anthropic(base_url="http://fake", api_key="k", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def test_an_idle_stream_is_kept_alive_with_ping_events(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """While a long prompt is computed nothing else is sent: a ``ping`` event comes every
    PING_SECONDS, as from Anthropic's API (the other dialects' keep-alive is a comment)."""
    monkeypatch.setattr(respond, "PING_SECONDS", 1)

    async def events() -> AsyncIterator[dict[str, str]]:
        yield {"event": "message_start", "data": json.dumps({"type": "message_start"})}
        await asyncio.sleep(2.6)
        yield {"event": "message_stop", "data": json.dumps({"type": "message_stop"})}

    app = Starlette(routes=[Route("/s", lambda r: respond.sse(r, events(), ping=ping_event))])
    app.state.send_timeout = 30.0

    async def fetch() -> str:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://test") as c:
            return (await c.get("/s")).text
    pairs = sse_pairs(asyncio.run(fetch()))
    assert pairs[0][0] == "message_start" and pairs[-1][0] == "message_stop", pairs
    assert pairs[1:-1] and all(p == ("ping", {"type": "ping"}) for p in pairs[1:-1]), pairs


def test_error_mid_stream_is_an_error_event_the_sdk_raises() -> None:
    payload = _stream_of(TextDelta(0, "Hel"), ErrorEvent(Timeout("too slow", code="timeout")))
    pairs = sse_pairs(payload.decode())
    assert pairs[-1] == ("error", {"type": "error", "error": {"type": "timeout_error",
                                                              "message": "too slow"}})
    client = _fake_client(payload)
    seen = []
    with pytest.raises(anthropic.APIStatusError) as err:
        with client.messages.stream(model="m", max_tokens=5, messages=HI) as stream:
            seen.extend(stream.text_stream)
    assert seen == ["Hel"]
    assert isinstance(err.value.body, dict) and err.value.body["error"]["type"] == "timeout_error"


def test_reasoning_tool_calls_and_stop_words_render_as_anthropic_blocks() -> None:
    events = (ReasoningDelta(0, "think "), ReasoningDelta(0, "more"), TextDelta(0, " \n"),
              ToolCallDelta(0, 0, id="call_abc", name="get_weather"),
              ToolCallDelta(0, 0, arguments='{"city": '), ToolCallDelta(0, 0, arguments='"Rome"}'),
              Finish(0, "tool_calls", 9), UsageReport(7, 9, 3))
    client = _fake_client(_stream_of(*events))
    with client.messages.stream(model="m", max_tokens=5, messages=HI) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use"]  # blanks dropped
    assert final.content[0].type == "thinking" and final.content[0].thinking == "think more"
    call = final.content[1]
    assert call.type == "tool_use" and call.id == "toolu_abc" and call.input == {"city": "Rome"}
    assert final.stop_reason == "tool_use"
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens) == (4, 3)
    hidden = _fake_client(_stream_of(*events, show_thinking=False))
    with hidden.messages.stream(model="m", max_tokens=5, messages=HI) as stream:
        assert [b.type for b in stream.get_final_message().content] == ["tool_use"]
    stopped = _fake_client(_stream_of(TextDelta(0, "a"), Finish(0, "stop", 1, stop_word="END"),
                                      UsageReport(7, 1, 0)))
    with stopped.messages.stream(model="m", max_tokens=5, messages=HI) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "END")
    empty = _fake_client(_stream_of(TextDelta(0, "  "), Finish(0, "stop", 1),
                                    UsageReport(7, 1, 0)))
    with empty.messages.stream(model="m", max_tokens=5, messages=HI) as stream:
        final = stream.get_final_message()
    assert final.content == []  # no blank text block: Anthropic refuses one sent back
    assert final.stop_reason == "end_turn"


# -- API keys -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp: Path = tmp_path_factory.mktemp("anthropic-keys")
    keyfile = tmp / "keys.txt"
    keyfile.write_text("sk-ant-local-42\n")
    srv = start_server(tmp, "--api-key-file", str(keyfile), "--slots", "1", "--threads", "1")
    yield srv
    stop_server(srv)


def test_x_api_key_authenticates(keyed_server: ServerProcess) -> None:
    base = keyed_server.base_url
    anthropic_error(post(keyed_server, {"model": "default", "max_tokens": 2, "messages": HI}),
                    401, "authentication_error")
    anthropic_error(post(keyed_server, {"model": "default", "messages": HI},
                         "/v1/messages/count_tokens", headers={"x-api-key": "wrong"}),
                    401, "authentication_error")
    wrong = anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        wrong.messages.create(model="default", max_tokens=2, messages=HI)
    assert isinstance(err.value.body, dict)
    assert err.value.body["error"]["type"] == "authentication_error"
    good = anthropic.Anthropic(base_url=base, api_key="sk-ant-local-42", max_retries=0,
                               timeout=120)
    m = good.messages.create(model="default", max_tokens=2, messages=HI)
    assert m.usage.output_tokens > 0
    assert good.messages.count_tokens(model="default", messages=HI).input_tokens > 0
    assert "sk-ant-local-42" not in keyed_server.log.read_text()


def test_claude_sized_max_tokens_is_a_cap_and_request_ids_reach_the_sdk(
        ac: anthropic.Anthropic) -> None:
    """Clients made for Claude send max_tokens 32000 / 64000: more than a local context
    leaves is a cap (as llama-server and Ollama take it), not a 400; the SDK reads the
    request id from ``request-id``."""
    m = ac.messages.create(model="default", max_tokens=64000, stop_sequences=["."],
                           messages=[{"role": "user", "content": "Say hello."}],
                           extra_body=GREEDY)
    assert m.stop_reason in ("end_turn", "stop_sequence", "max_tokens") and m.content
    assert m._request_id and m._request_id.startswith("req_")  # type: ignore[attr-defined]


def test_routes_this_server_lacks_answer_the_anthropic_sdk_in_its_shape(
        server: ServerProcess) -> None:
    r = httpx.get(f"{server.base_url}/v1/files", headers={"anthropic-version": "2023-06-01"})
    anthropic_error(r, 404, "not_found_error")
    assert httpx.get(f"{server.base_url}/v1/files").json()["error"]["code"] == "not_found"
