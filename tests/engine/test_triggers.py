"""Every tool-call format's lazy grammar (tool_choice auto) starts with its own trigger
word: llama.cpp shows a lazy grammar the text from the trigger word on, and aborts the
process when the grammar cannot take it (Llama 3's ``<|python_tag|>`` once did). Run in a
child process, so an abort fails the test instead of ending the suite."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgeinfer.prompt.toolformat import FORMATS

WORKER = r"""
import json, sys, ctypes
import llama_cpp
from edgeinfer.config import load_config
from edgeinfer.engine.sampler import SamplerChain
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.models.source import resolve_model_path
from edgeinfer.prompt.toolformat import FORMATS
from edgeinfer.prompt.tools import ToolSpec
from edgeinfer.service.constraint import grammar_for
from edgeinfer.service.request import Constraint

cfg = load_config(None).models[0]
llama_cpp.llama_backend_init()
mp = llama_cpp.llama_model_default_params()
mp.vocab_only = True
model = llama_cpp.llama_model_load_from_file(str(resolve_model_path(cfg)).encode(), mp)
vocab = llama_cpp.llama_model_get_vocab(model)

def piece(t):
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, t, buf, 256, 0, True)
    return buf.raw[:n]

fmt = FORMATS[sys.argv[1]]
weather = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
tools = (ToolSpec("get_weather", "", weather), ToolSpec("get_time", "", {"type": "object"}))
gbnf, triggers = grammar_for(vocab, Constraint(tools=tools, tool_choice="auto"), None, fmt)
text = ("Let me check. " + fmt.trigger).encode()
arr = (llama_cpp.llama_token * (len(text) + 8))()
n = llama_cpp.llama_tokenize(vocab, text, len(text), arr, len(arr), False, True)
chain = SamplerChain(SamplingParams(grammar=gbnf, grammar_triggers=triggers),
                     llama_cpp.llama_vocab_n_tokens(vocab), vocab=vocab, piece=piece)
for tok in arr[:n]:
    if chain.lazily_constrained:
        break
    chain._watch(tok)
print(json.dumps({"triggers": list(triggers), "constrained": chain.lazily_constrained}))
chain.close()
"""


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_formats_lazy_grammar_takes_its_trigger_word(name: str) -> None:
    r = subprocess.run([sys.executable, "-c", WORKER, name], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"{name}: exit {r.returncode}\n{r.stderr[-1500:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["triggers"] and out["constrained"], out
