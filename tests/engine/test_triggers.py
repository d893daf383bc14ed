"""Every tool-call format's lazy grammar (tool_choice auto) starts with its own trigger
word: llama.cpp shows a lazy grammar the text from the trigger word on, and aborts the
process when the grammar cannot take it (Llama 3's ``<|python_tag|>`` once did). Run in a
child process, so an abort fails the test instead of ending the suite."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from vocab_worker import VOCAB

from edgeinfer.prompt.toolformat import FORMATS

# the vocabulary, the formats and the service's grammar for a constraint
TOOLING = VOCAB + r"""
from edgeinfer.prompt.toolformat import FORMATS
from edgeinfer.prompt.tools import ToolSpec
from edgeinfer.service.constraint import grammar_for
from edgeinfer.service.request import Constraint
"""

WORKER = TOOLING + r"""
from edgeinfer.engine.sampler import SamplerChain
from edgeinfer.engine.sequence import SamplingParams

def piece(t):
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, t, buf, 256, 0, True)
    return buf.raw[:n]

fmt = FORMATS[sys.argv[1]]
weather = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
tools = (ToolSpec("get_weather", "", weather), ToolSpec("get_time", "", {"type": "object"}))
gbnf, triggers = grammar_for(vocab, Constraint(tools=tools, tool_choice="auto"), None, fmt)
text = ("Let me check. " + sys.argv[2]).encode()
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


@pytest.mark.parametrize(("name", "word"), [  # (Functionary's triggers: >>>NAME per tool,
    # Muse Glimmer's a message header per tool)
    (n, ">>>get_weather" if FORMATS[n].text_name else FORMATS[n].header("get_weather")
     if FORMATS[n].messages else w) for n in sorted(FORMATS) for w in FORMATS[n].triggers])
def test_a_formats_lazy_grammar_takes_its_trigger_word(name: str, word: str) -> None:
    r = subprocess.run([sys.executable, "-c", WORKER, name, word], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, f"{name}: exit {r.returncode}\n{r.stderr[-1500:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["triggers"] and out["constrained"], out


ACCEPT = TOOLING + r"""
fmt, text = FORMATS[sys.argv[1]], sys.argv[2]
weather = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}
tools = (ToolSpec("get_weather", "", weather), ToolSpec("get_time", "", {"type": "object"}))
choice = sys.argv[3] if len(sys.argv) > 3 else "required"  # auto: the lazy grammar
gbnf, _ = grammar_for(vocab, Constraint(tools=tools, tool_choice=choice), None, fmt)
smpl = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
raw = text.encode()
arr = (llama_cpp.llama_token * (len(raw) + 8))()
n = llama_cpp.llama_tokenize(vocab, raw, len(raw), arr, len(arr), False, True)

def allowed(tok):  # checked before it is accepted: llama.cpp aborts on a rejected token
    d = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(tok, 0.0, 0.0))
    a = llama_cpp.llama_token_data_array(d, 1, -1, False)
    llama_cpp.llama_sampler_apply(smpl, ctypes.byref(a))
    return d[0].logit != float("-inf")

for k, tok in enumerate(arr[:n]):
    if not allowed(tok):
        print(json.dumps({"rejected_at": k}))
        sys.exit(0)
    llama_cpp.llama_sampler_accept(smpl, tok)
print(json.dumps({"whole": allowed(llama_cpp.llama_vocab_eos(vocab))}))
"""
_W = '"name": "get_weather", "arguments": {"city": "%s"}'
_DS = ("<\uff5ctool\u2581calls\u2581begin\uff5c>", "<\uff5ctool\u2581call\u2581begin\uff5c>",
       "<\uff5ctool\u2581sep\uff5c>", "<\uff5ctool\u2581call\u2581end\uff5c>",
       "<\uff5ctool\u2581calls\u2581end\uff5c>")


def _r1(city: str) -> str:
    return f'{_DS[1]}function{_DS[2]}get_weather\n```json\n{{"city": "{city}"}}\n```{_DS[3]}'


# parallel calls (the same tool twice) as the models' own templates write them
WRITTEN = [
    ("hermes", "".join(f"<tool_call>{{{_W % c}}}</tool_call>" for c in ("Paris", "Oslo"))),
    ("hermes", "\n".join(f"<tool_call>\n{{{_W % c}}}\n</tool_call>" for c in ("Paris", "Oslo"))),
    ("deepseek_r1", _DS[0] + _r1("Paris") + "\n" + _r1("Oslo") + _DS[4]),
    ("deepseek_r1", _DS[0] + _r1("Paris") + _r1("Oslo") + _DS[4]),
    ("mistral_args", '[TOOL_CALLS]get_weather[CALL_ID]abcdefgh0[ARGS]{"city": "Paris"}'
                     '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}'),
    ("qwen3_coder", "".join(f"<tool_call>\n<function=get_weather>\n<parameter=city>\n{c}\n"
                            "</parameter>\n</function>\n</tool_call>" for c in ("Paris", "Oslo"))),
    ("seed_oss", "".join(f"\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>{c}"
                         "</parameter>\n</function>\n</seed:tool_call>" for c in ("Paris", "Oslo"))
     .lstrip()),
    ("glm", "".join(f"<tool_call>get_weather<arg_key>city</arg_key><arg_value>{c}</arg_value>"
                    "</tool_call>" for c in ("Paris", "Oslo"))),  # GLM 4.7, Spark
    ("glm", "\n".join(f"<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>{c}"
                      "</arg_value>\n</tool_call>" for c in ("Paris", "Oslo"))),  # GLM 4.6
    ("glm", "".join(f"<tool_call>get_weather<arg_key>city</arg_key>\n<arg_value>{c}"
                    "</arg_value>\n</tool_call>" for c in ("Paris", "Oslo"))),  # Ling 3.0
    ("glm", "<tool_call>get_time\n\n</tool_call>"),  # Ling 3.0, a call without arguments
    ("minimax", "<minimax:tool_call>\n" + "".join(
        f'<invoke name="get_weather">\n<parameter name="city">{c}</parameter>\n</invoke>\n'
        for c in ("Paris", "Oslo")) + "</minimax:tool_call>"),
    ("nemotron", "<TOOLCALL>[" + ", ".join("{" + _W % c + "}" for c in ("Paris", "Oslo"))
     + "]</TOOLCALL>"),
    ("firefunction", "functools[" + ", ".join("{" + _W % c + "}" for c in ("Paris", "Oslo"))
     + "]"),
    ("lfm2", '<|tool_call_start|>[get_weather(city="Paris"), get_weather(city="Oslo")]'
             "<|tool_call_end|>"),
    ("command_r", "<|START_ACTION|>[\n" + ",\n".join(
        f'    {{"tool_call_id": "{k}", "tool_name": "get_weather", "parameters": {{"city": '
        f'"{c}"}}}}' for k, c in enumerate(("Paris", "Oslo"))) + "\n]<|END_ACTION|>"),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, '
                '"id": "abcdefgh0"}, {"name": "get_weather", "arguments": {"city": "Oslo"}, '
                '"id": "abcdefgh1"}]'),
    ("apriel", "<tool_calls>[" + ", ".join("{" + _W % c + "}" for c in ("Paris", "Oslo"))
     + "]</tool_calls>"),
    ("apertus", "<|tools_prefix|>[" + ", ".join(f'{{"get_weather": {{"city": "{c}"}}}}'
                                                for c in ("Paris", "Oslo")) + "]<|tools_suffix|>"),
    ("minimax_m1", "<tool_calls>\n" + "".join("{" + _W % c + "}\n" for c in ("Paris", "Oslo"))
     + "</tool_calls>"),
    ("kimi_k2", "<|tool_calls_section_begin|>" + "".join(
        f'<|tool_call_begin|>functions.get_weather:{k}<|tool_call_argument_begin|>{{"city": '
        f'"{c}"}}<|tool_call_end|>' for k, c in enumerate(("Paris", "Oslo")))
     + "<|tool_calls_section_end|>"),
    ("dsml_v4", "<｜DSML｜tool_calls>\n" + "".join(
        f'<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">{c}'
        "</｜DSML｜parameter>\n</｜DSML｜invoke>\n" for c in ("Paris", "Oslo"))
     + "</｜DSML｜tool_calls>"),
    ("dsml", "<｜DSML｜function_calls>\n" + "".join(
        f'<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">{c}'
        "</｜DSML｜parameter>\n</｜DSML｜invoke>\n" for c in ("Paris", "Oslo"))
     + "</｜DSML｜function_calls>"),
    ("command_r_plus", "Action:\n```json\n[\n" + ",\n".join(  # indented, as its template
        f'    {{\n        "tool_name": "get_weather",\n        "parameters": {{\n'
        f'            "city": "{c}"\n        }}\n    }}' for c in ("Paris", "Oslo")) + "\n]```"),
    ("muse_glimmer", "<|eom|><|start|>assistant".join(  # a message to the tool each
        f' to=get_weather<|message|><atem:function_calls>\n<atem:invoke name="get_weather">\n'
        f'<atem:parameter name="city">{c}</atem:parameter>\n</atem:invoke>\n'
        "</atem:function_calls>" for c in ("Paris", "Oslo"))),
    ("muse_glimmer", " to=self<|message|>The user wants the weather; a < b, so I call it."
                     "<|eom|><|start|>assistant to=get_weather<|message|><atem:function_calls>\n"
                     '<atem:invoke name="get_weather">\n<atem:parameter name="city">Paris'
                     "</atem:parameter>\n</atem:invoke>\n</atem:function_calls>"),
]


@pytest.mark.parametrize(("name", "text"), WRITTEN)
def test_a_forced_grammar_takes_parallel_calls_as_templates_write_them(name: str,
                                                                       text: str) -> None:
    r = subprocess.run([sys.executable, "-c", ACCEPT, name, text], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, f"{name}: exit {r.returncode}\n{r.stderr[-1500:]}"
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"whole": True}, (name, text)


SCHEMAS = TOOLING + r"""
schema = {"$defs": {"City": {"type": "object", "properties": {"name": {"type": "string"}},
                             "required": ["name"]}},
          "type": "object", "properties": {"city": {"$ref": "#/$defs/City"}},
          "required": ["city"]}
boolean = {"type": "object", "properties": {"any": True}}
out = {}
for name, fmt in FORMATS.items():
    for kind, params in (("defs", schema), ("boolean", boolean)):
        try:
            grammar_for(vocab, Constraint(tools=(ToolSpec("get_weather", "", params),),
                                          tool_choice="required"), None, fmt)
            out[f"{name} {kind}"] = "ok"
        except Exception as exc:
            out[f"{name} {kind}"] = type(exc).__name__
print(json.dumps(out))
"""


def test_every_format_takes_pydantic_style_schemas() -> None:
    """A tool's parameters with ``$defs`` / ``$ref`` (what pydantic writes) and a boolean
    property schema: every format's forced grammar is made and parsed by llama.cpp (the
    tagged-parameter formats turned each property into a grammar alone, without the
    definitions: a 400; a boolean schema raised)."""
    r = subprocess.run([sys.executable, "-c", SCHEMAS], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-1500:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert {k: v for k, v in out.items() if k.endswith(" defs")} == {
        f"{name} defs": "ok" for name in FORMATS}
    # a boolean property schema: a grammar, or a clear 400 (llama.cpp's converter refuses
    # it in the JSON formats), never a crash
    assert all(out[f"{name} boolean"] in ("ok", "InvalidRequest") for name in FORMATS), out


@pytest.mark.parametrize(("name", "text"), [
    ("qwen3_coder", "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>"),
    ("seed_oss", "<function=get_weather>\n<parameter=city>Paris</parameter>\n</function>"),
    ("minimax", '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
                "</invoke>"),
    ("kimi_k2", '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
                '{"city": "Paris"}<|tool_call_end|>'),
    ("dsml", '<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" '
             'string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>'),
])
def test_a_call_without_its_block_is_constrained_too(name: str, text: str) -> None:
    """A model that leaves out the block (``<tool_call>`` before ``<function=``) still
    gets a lazy grammar: the call's own opening is a trigger word too, so an unoffered
    name or broken arguments cannot slip through as a call."""
    assert FORMATS[name].triggers[1] == FORMATS[name].call_open
    r = subprocess.run([sys.executable, "-c", ACCEPT, name, text, "auto"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{name}: exit {r.returncode}\n{r.stderr[-1500:]}"
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"whole": True}, (name, text)
