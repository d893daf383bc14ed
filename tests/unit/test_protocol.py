from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from edgeinfer.api import openai_chat, openai_completions
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.errors import InvalidRequest
from edgeinfer.service.request import ChatPrompt, GenerateRequest, TextPrompts

V = 1000  # token ids are checked against the model's vocabulary by the service


@dataclass
class Parsed:
    req: GenerateRequest
    stream: bool
    include_usage: bool
    echo: bool = False  # (completions only)

    @property
    def params(self) -> SamplingParams:
        return self.req.params

    @property
    def messages(self) -> tuple[dict[str, Any], ...]:
        assert isinstance(self.req.prompt, ChatPrompt)
        return self.req.prompt.messages

    @property
    def prompts(self) -> tuple[str | list[int], ...]:
        assert isinstance(self.req.prompt, TextPrompts)
        return self.req.prompt.prompts


def parse_chat(body: object, _vocab: int) -> Parsed:
    return Parsed(*openai_chat.parse(body, {}))


def parse_completion(body: object, _vocab: int) -> Parsed:
    return Parsed(*openai_completions.parse(body, {}))
MSG = [{"role": "user", "content": "hi"}]


def chat(**kw: object) -> dict[str, object]:
    return {"model": "m", "messages": MSG, **kw}


def test_chat_defaults_and_fields() -> None:
    r = parse_chat(chat(temperature=0, max_completion_tokens=5, stop="x", seed=3,
                        logit_bias={"5": -100}, stream=True,
                        stream_options={"include_usage": True}), V)
    p = r.params
    assert p.is_greedy and p.max_tokens == 5 and p.stop == ("x",) and p.seed == 3
    assert p.logit_bias == ((5, -100.0),)
    assert r.stream and r.include_usage


@pytest.mark.parametrize(("body", "limit"), [
    ({"max_completion_tokens": -1}, None), ({"max_tokens": -1}, None),
    ({"max_completion_tokens": -1, "max_tokens": 7}, 7), ({"max_completion_tokens": 9}, 9),
    ({"max_completion_tokens": 9, "max_tokens": 7}, 9), ({"max_completion_tokens": -2}, None)])
def test_a_limit_of_minus_one_is_no_limit_in_either_field(body: dict[str, object],
                                                          limit: int | None) -> None:
    """Roo Code sends max_completion_tokens -1 for a model without a maximum: no limit of
    its own, as max_tokens -1 (llama-server's), not a 400."""
    assert parse_chat(chat(**body), V).params.max_tokens == limit


@pytest.mark.parametrize("value", [0, -3, 1.5, True, "9"])
def test_other_max_completion_tokens_are_400(value: object) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_chat(chat(max_completion_tokens=value), V)
    assert err.value.param == "max_completion_tokens"


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", 2.5), ("temperature", "hot"), ("top_p", -0.1), ("max_tokens", 0),
    ("max_tokens", 1.5), ("presence_penalty", 3), ("frequency_penalty", float("nan")),
    ("stop", [1]), ("stop", ["a"] * 17), ("logit_bias", {"99999999": 1}),
    ("logit_bias", {"1": 500}), ("logit_bias", {" 12 ": 1}), ("logit_bias", {"1_0": 1}),
    ("logit_bias", {"١٢": 1}), ("n", 17), ("n", 0), ("top_k", -1), ("seed", True),
    ("stream_options", {"include_usage": True}), ("tools", {"type": "function"}),
    ("tool_choice", "required"), ("response_format", {"type": "xml"}), ("grammar", 5),
    ("logprobs", "yes"), ("top_logprobs", 3), ("bogus_field", 1),
])
def test_bad_fields_are_named(field: str, value: object) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat(chat(**{field: value}), V)
    assert info.value.param == field
    assert info.value.status == 400


def test_a_tool_strict_that_is_no_boolean_is_named() -> None:
    tools = [{"type": "function", "function": {"name": "f", "strict": "yes"}}]
    with pytest.raises(InvalidRequest) as info:
        parse_chat(chat(tools=tools), V)
    assert info.value.param == "tools[0].function.strict"


@pytest.mark.parametrize("messages", [[], "hi", [{"role": "robot", "content": "x"}],
                                      [{"role": "user"}], [{"role": "user", "content": 5}],
                                      [{"role": "user", "content": [{"type": "image_url"}]}]])
def test_bad_messages(messages: object) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat({"model": "m", "messages": messages}, V)
    assert str(info.value.param).startswith("messages")


def test_content_parts_and_developer_role() -> None:
    r = parse_chat({"model": "m", "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."},
                                          {"type": "text", "text": "Be kind."}]}]}, V)
    # text parts join with a line break, as llama.cpp and vLLM join them
    assert r.messages == ({"role": "system", "content": "Be brief.\nBe kind."},)


def test_completion_prompt_forms() -> None:
    def prompts(p: object) -> tuple[object, ...]:
        return parse_completion({"model": "m", "prompt": p}, V).prompts

    assert prompts("abc") == ("abc",)
    assert prompts([1, 2]) == ([1, 2],)
    assert prompts(["abc"]) == ("abc",)
    assert prompts(["a", [3, 4]]) == ("a", [3, 4])
    assert parse_completion({"model": "m", "prompt": "x"}, V).params.max_tokens == 16
    for bad in (None, 5, [-1], [[-1]], [1 << 30], [], [[]], ["a"] * 17, [True]):
        with pytest.raises(InvalidRequest):
            parse_completion({"model": "m", "prompt": bad}, V)
    with pytest.raises(InvalidRequest) as info:
        parse_completion({"model": "m", "prompt": ["a"] * 4, "n": 5}, V)
    assert info.value.param == "n"


def test_body_must_be_object() -> None:
    with pytest.raises(InvalidRequest):
        parse_chat([1, 2], V)


def test_logprobs_fields() -> None:
    assert parse_chat(chat(logprobs=True, top_logprobs=5), V).params.logprobs == 5
    assert parse_chat(chat(logprobs=True), V).params.logprobs == 0
    assert parse_chat(chat(), V).params.logprobs is None
    with pytest.raises(InvalidRequest):
        parse_chat(chat(logprobs=True, top_logprobs=21), V)
    assert parse_completion({"model": "m", "prompt": "x", "logprobs": 3}, V).params.logprobs == 3


def test_reasoning_fields_reach_the_request() -> None:
    msgs = [{"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "two and two"},
            {"role": "user", "content": "3+3?"}]
    p = parse_chat(chat(messages=msgs, reasoning_format="none", reasoning_budget=5,
                        chat_template_kwargs={"enable_thinking": True},
                        reasoning_effort="low"), V)
    assert p.messages[1]["reasoning_content"] == "two and two"  # for templates that use it
    assert p.req.reasoning_format == "none" and p.req.reasoning_budget == 5
    assert p.req.template_kwargs == {"enable_thinking": True, "reasoning_effort": "low"}
    for bad in ({"reasoning_format": "x"}, {"reasoning_budget": -1},
                {"chat_template_kwargs": "x"}, {"reasoning_effort": "max"}):
        with pytest.raises(InvalidRequest):
            parse_chat(chat(**bad), V)


def test_a_mixed_prompt_of_token_ids_and_texts_is_one_prompt() -> None:
    """llama-server's mixed prompt: ids and strings in one list are one prompt, alone or in
    a list of prompts; a list of strings alone is a list of prompts; anything else in the
    list (a boolean, null, a negative id) is a 400."""
    from edgeinfer.service.request import MixedPrompt

    def prompts(value: object) -> tuple[object, ...]:
        p = parse_completion({"model": "m", "prompt": value}, V).req.prompt
        assert isinstance(p, TextPrompts)
        return p.prompts
    assert prompts([12, "text", 34]) == (MixedPrompt((12, "text", 34)),)
    assert prompts([[12, "a"], "b", [3, 4]]) == (MixedPrompt((12, "a")), "b", [3, 4])
    assert prompts(["a", "b"]) == ("a", "b")
    for bad in ([1, "a", True], [1, "a", None], [[1, "a", -1]]):
        with pytest.raises(InvalidRequest):
            prompts(bad)


def test_completions_echo_is_taken_but_not_with_logprobs() -> None:
    assert parse_completion({"model": "m", "prompt": "hi", "echo": True}, V).echo
    assert not parse_completion({"model": "m", "prompt": "hi"}, V).echo
    for bad in ({"echo": True, "logprobs": 2}, {"echo": "yes"}, {"suffix": "x"}):
        with pytest.raises(InvalidRequest) as err:
            parse_completion({"model": "m", "prompt": "hi", **bad}, V)
        assert err.value.param in ("echo", "suffix")
