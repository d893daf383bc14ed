"""Tool calls parsed in each format's own syntax: whole outputs, the same output cut at
every position while streaming, several calls, calls after text, malformed calls."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from edgeinfer.prompt.callparser import CallArgs, CallOpen, CallParser, Content
from edgeinfer.prompt.reasoning import Thought
from edgeinfer.prompt.toolformat import (
    APERTUS,
    APRIEL,
    COMMAND_R,
    COMMAND_R_PLUS,
    DEEPSEEK_R1,
    DEEPSEEK_V3,
    DSML,
    DSML_V4,
    FIREFUNCTION,
    FUNCTIONARY_V32,
    GEMMA4,
    GENERIC,
    GIGACHAT3,
    GIGACHAT3_1,
    GLM,
    GRANITE,
    HARMONY,
    HERMES,
    HY3,
    KIMI_K2,
    KIMI_K3,
    LFM2,
    LLAMA3,
    MINICPM5,
    MINIMAX,
    MINIMAX_M1,
    MINIMAX_M3,
    MISTRAL,
    MISTRAL_ARGS,
    MUSE_GLIMMER,
    NEMOTRON,
    QWEN3_CODER,
    SEED_OSS,
    SOLAR_OPEN,
    ToolFormat,
)
from edgeinfer.prompt.tools import call_parser

W = '{"city": "Paris", "opts": {"unit": "c", "note": "a } and \\" and ]"}}'
MUSE_CALL = ('<atem:function_calls>\n<atem:invoke name="get_weather">\n<atem:parameter name="city">'
                   'Paris</atem:parameter>\n<atem:parameter name="days">3</atem:parameter>\n'
                   '</atem:invoke>\n</atem:function_calls>')
CASES: list[tuple[ToolFormat, str, str, list[tuple[str, object]]]] = [
    (HERMES, f'Checking.\n<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>'
             '\n<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
     "Checking.", [("get_weather", json.loads(W)), ("add", {"a": 1})]),
    (GENERIC, "no call at all, <tool not a marker", "no call at all, <tool not a marker", []),
    (LLAMA3, f'{{"name": "get_weather", "parameters": {W}}}', "", [("get_weather", json.loads(W))]),
    (LLAMA3, '<|python_tag|>{"name": "f", "parameters": {}}', "", [("f", {})]),
    (LLAMA3, 'Plain text with {"name": "x"} inside', 'Plain text with {"name": "x"} inside', []),
    (MISTRAL, f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {W}, "id": "abc123XYZ"}}, '
              '{"name": "b", "arguments": {"k": [1, 2]}, "id": "def456uvw"}]',
     "", [("get_weather", json.loads(W)), ("b", {"k": [1, 2]})]),
    (GRANITE, '<|tool_call|>[{"name": "a", "arguments": {"s": "]}"}}]', "", [("a", {"s": "]}"})]),
    (NEMOTRON, 'Sure.\n<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
               '{"name": "add", "arguments": {"a": 1}}]</TOOLCALL> After.',
     "Sure.\n After.", [("get_weather", {"city": "Paris"}), ("add", {"a": 1})]),
    (NEMOTRON, "<TOOLCALL>oops</TOOLCALL>", "<TOOLCALL>oops</TOOLCALL>", []),
    (FIREFUNCTION, ' functools[{"name": "special_function", "arguments": {"arg1": 1}}]', "",
     [("special_function", {"arg1": 1})]),
    (HERMES, "<tool_call>not json</tool_call> after", "<tool_call>not json</tool_call> after", []),
    (MISTRAL, "[TOOL_CALLS]oops", "[TOOL_CALLS]oops", []),
    # an empty pair, or a marker that opens no call, is text as written (even after a call)
    (HERMES, "What does <tool_call></tool_call> mean?", "What does <tool_call></tool_call> mean?",
     []),
    (HERMES, "<tool_call> \n </tool_call>\nthen", "<tool_call> \n </tool_call>\nthen", []),
    (HERMES, '<tool_call>{"name": "f", "arguments": {}}</tool_call> and <tool_call>  not one',
     "and <tool_call>  not one", [("f", {})]),
    (HERMES, '<tool_call>{"arguments": {"a": 1}}</tool_call>',
     '<tool_call>{"arguments": {"a": 1}}</tool_call>', []),
    # named formats: the function name outside the arguments
    (MISTRAL_ARGS, f'[TOOL_CALLS]get_weather[ARGS]{W}[TOOL_CALLS]add[ARGS]{{"a": 1}}', "",
     [("get_weather", json.loads(W)), ("add", {"a": 1})]),
    (MISTRAL_ARGS, 'Sure.[TOOL_CALLS]get_weather[CALL_ID]abc123XYZ[ARGS]{"city": "Paris"}',
     "Sure.", [("get_weather", {"city": "Paris"})]),
    (MISTRAL_ARGS, "[TOOL_CALLS] not a call, [ARGS] {x}", "[TOOL_CALLS] not a call, [ARGS] {x}",
     []),
    (DEEPSEEK_V3, "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather"
                  f"<｜tool▁sep｜>{W}<｜tool▁call▁end｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>"
                  '{"a": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
     "Checking.", [("get_weather", json.loads(W)), ("add", {"a": 1})]),
    (DEEPSEEK_V3, "<｜tool▁calls▁begin｜>what?", "<｜tool▁calls▁begin｜>what?", []),
    (DEEPSEEK_R1, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
                  f"```json\n{W}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "", [("get_weather", json.loads(W))]),
    (QWEN3_CODER, "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                  "Paris\n<b>France</b>\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
                  '<parameter=opts>\n{"unit": "c"}\n</parameter>\n</function>\n</tool_call>\n'
                  "<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
     "Let me look.", [("get_weather", {"city": "Paris\n<b>France</b>", "days": 3,
                                       "opts": {"unit": "c"}}), ("get_time", {})]),
    (QWEN3_CODER, "<tool_call>\n<function=get_weather>\n<parameter=city>\n7\n</parameter>\n"
                  "</function>\n</tool_call>", "", [("get_weather", {"city": "7"})]),
    (QWEN3_CODER, "<tool_call> plain words", "<tool_call> plain words", []),
    (SEED_OSS, "Sure.\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris <b>"
               "</parameter>\n<parameter=days>3</parameter>\n</function>\n</seed:tool_call>",
     "Sure.", [("get_weather", {"city": "Paris <b>", "days": 3})]),
    # GLM 4.7 / Spark write the tags back to back, GLM 4.6 / Laguna with line breaks
    (GLM, '<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris\n"FR"</arg_value>'
          '<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>'
          "<tool_call>get_time</tool_call>",
     "", [("get_weather", {"city": 'Paris\n"FR"', "days": 3}), ("get_time", {})]),
    (GLM, "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris"
          '</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{"unit": "c"}</arg_value>\n'
          "</tool_call>",
     "Let me check.", [("get_weather", {"city": "Paris", "opts": {"unit": "c"}})]),
    (GLM, "Use <tool_call> tags, <tool_call>like this</tool_call>.",
     "Use <tool_call> tags, <tool_call>like this</tool_call>.", []),
    (MINIMAX, '\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">'
              'Paris</parameter>\n<parameter name="days">3</parameter>\n</invoke>\n'
              '<invoke name="get_time">\n</invoke>\n</minimax:tool_call>',
     "", [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]),
    (MINIMAX_M3, "Let me see.]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"get_weather\">"
                 "]<]minimax[>[<city>Paris</b>]<]minimax[>[</city>]<]minimax[>[<days>3"
                 "]<]minimax[>[</days>]<]minimax[>[<opts>]<]minimax[>[<opts>]<]minimax[>[<unit>c"
                 "]<]minimax[>[</unit>]<]minimax[>[</opts>]<]minimax[>[<list>]<]minimax[>[<item>1"
                 "]<]minimax[>[</item>]<]minimax[>[<item>]<]minimax[>[</item>]<]minimax[>[<item>x"
                 "]<]minimax[>[</item>]<]minimax[>[</list>]<]minimax[>[</opts>]<]minimax[>[</invoke>"
                 "\n]<]minimax[>[<invoke name=\"get_time\">]<]minimax[>[</invoke>\n"
                 "]<]minimax[>[</tool_call>",
     "Let me see.", [("get_weather", {"city": "Paris</b>", "days": 3, "opts": {
         "opts": {"unit": "c"}, "list": [1, None, "x"]}}), ("get_time", {})]),
    (SOLAR_OPEN, "<|tool_calls|><|tool_call:begin|>call_0<|tool_call:name|>get_weather"
                 '<|tool_call:args|>{"city": "Paris", "days": 3}<|tool_call:end|>'
                 "<|tool_call:begin|>x-1<|tool_call:name|>get_time<|tool_call:args|>{}"
                 "<|tool_call:end|>",
     "", [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]),
    # an id with a character no id holds: not a call
    (SOLAR_OPEN, "<|tool_call:begin|>a b<|tool_call:name|>get_time<|tool_call:args|>{}",
     "<|tool_call:begin|>a b<|tool_call:name|>get_time<|tool_call:args|>{}", []),
    (FUNCTIONARY_V32, 'all\nLet me check.>>>get_weather\n{"city": "Paris", "days": 3}'
                      ">>>get_time\n{}",
     "Let me check.", [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]),
    (FUNCTIONARY_V32, 'get_weather\n{"city": "Paris"}', "", [("get_weather", {"city": "Paris"})]),
    (FUNCTIONARY_V32, "all\nIt is 3 >>> 2, and a >>>b c.", "It is 3 >>> 2, and a >>>b c.", []),
    (FUNCTIONARY_V32, "Hello there, no recipient.", "Hello there, no recipient.", []),
    # a recipient that is no offered tool, or a message that is not JSON: text (a REPL)
    (FUNCTIONARY_V32, "all\nIn a REPL:\n>>>print\n(1)\n", "In a REPL:\n>>>print\n(1)", []),
    (FUNCTIONARY_V32, "all\nSee:\n>>>get_time\nnow", "See:\n>>>get_time\nnow", []),
    (FUNCTIONARY_V32, "python\nprint(1)", "python\nprint(1)", []),
    (FUNCTIONARY_V32, 'get_time\n{}>>>all\nIn a REPL:\n>>>print\n(1), 3 >>> 2.',
     "In a REPL:\n>>>print\n(1), 3 >>> 2.", [("get_time", {})]),  # (after a call too)
    (COMMAND_R_PLUS, 'I will look it up.\nAction:\n```json\n[\n    {\n        "tool_name": '
                     '"get_weather",\n        "parameters": {\n            "city": "Paris"\n'
                     '        }\n    },\n    {"tool_name": "get_time", "parameters": {}}\n]```\n',
     "I will look it up.", [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    # Muse Glimmer: messages to recipients (the prompt wrote the first "<|start|>assistant")
    (MUSE_GLIMMER, " to=user<|message|>Hello, world!<|eot|>", "Hello, world!", []),
    (MUSE_GLIMMER, " to=get_weather<|message|>" + MUSE_CALL, "",
     [("get_weather", {"city": "Paris", "days": 3})]),
    (MUSE_GLIMMER, " to=user<|message|>Let me check.<|eom|><|start|>assistant to=get_weather"
                   "<|message|>" + MUSE_CALL + "<|eom|><|start|>assistant to=get_time<|message|>"
                   '<atem:function_calls>\n<atem:invoke name="get_time">\n</atem:invoke>\n'
                   "</atem:function_calls>",
     "Let me check.", [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]),
    (MUSE_GLIMMER, "No header at all.", "No header at all.", []),
    # markup quoted in an answer is text; a message's start cut off is not
    (MUSE_GLIMMER, " to=user<|message|>You write:\n" + MUSE_CALL + "<|eot|>",
     "You write:\n" + MUSE_CALL, []),
    (MUSE_GLIMMER, " to=user <|message|>Hi<|eom|><|start|>", "Hi", []),
    (MUSE_GLIMMER, " to=user<|message|>a < b, so 1 <", "a < b, so 1 <", []),
    (MUSE_GLIMMER, " to=user<|message|>Hi<|eom|><|start|>assistant<|message|>" + MUSE_CALL,
     "Hi", [("get_weather", {"city": "Paris", "days": 3})]),  # (a header without recipient)
    (MUSE_GLIMMER, " to be sure.", "to be sure.", []),
    # its template's "directly-answer" action is no call
    (COMMAND_R_PLUS, 'Action:\n```json\n{"tool_name": "directly-answer", "parameters": {}}```',
     "", []),
    (COMMAND_R_PLUS, 'Action:\n```json\n[\n    {\n        "tool_name": "directly-answer",\n'
                     '        "parameters": {}\n    }\n]```\n', "", []),
    (COMMAND_R_PLUS, 'Action:\n```json\n[{"tool_name": "directly-answer", "parameters": {}}, '
                     '{"tool_name": "get_time", "parameters": {}}]```', "", [("get_time", {})]),
    # unless the request offers a tool of its own named so
    (COMMAND_R_PLUS.offering({"directly-answer", "get_time"}),
     'Action:\n```json\n[{"tool_name": "directly-answer", "parameters": {"text": "Hi"}}]```',
     "", [("directly-answer", {"text": "Hi"})]),
    (KIMI_K3, 'Hello!<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="get_weather" '
              'index="1"<|sep|><|open|>argument key="city" type="string"<|sep|>Paris'
              '<|close|>argument<|sep|><|open|>argument key="days" type="number"<|sep|>3'
              '<|close|>argument<|sep|><|open|>argument key="opts" type="object"<|sep|>'
              '{"unit": "c"}<|close|>argument<|sep|><|close|>call<|sep|><|open|>call '
              'tool="get_time" index="2"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>'
              '<|close|>message<|sep|>',
     "Hello!", [("get_weather", {"city": "Paris", "days": 3, "opts": {"unit": "c"}}),
                ("get_time", {})]),
    (KIMI_K3, "<|open|>response<|sep|>Just text.<|close|>response<|sep|><|close|>message<|sep|>",
     "Just text.", []),
    (GIGACHAT3, 'Sure.<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "get_weather", '
                '"arguments": {"city": "Paris", "days": 3}}',
     "Sure.", [("get_weather", {"city": "Paris", "days": 3})]),
    # the end of a message of text alone: not text
    (GIGACHAT3, "Hello.<|message_sep|>\n\n", "Hello.", []),
    (GIGACHAT3_1, 'Sure.<|function_call|>{"name": "get_time", "arguments": {}}',
     "Sure.", [("get_time", {})]),
    (MINICPM5, 'Sure.<function name="get_weather"><param name="city"><![CDATA[Paris <FR>\n'
               '& co]]></param><param name="days">3</param></function>'
               '<function name="get_time"></function>',
     "Sure.", [("get_weather", {"city": "Paris <FR>\n& co", "days": 3}), ("get_time", {})]),
    # a CDATA value of a parameter of no plain type is text
    (MINICPM5, '<function name="get_time"><param name="zone"><![CDATA[12\n]]></param></function>',
     "", [("get_time", {"zone": "12\n"})]),
    (MINICPM5, '<function name="get_weather"><param name="city">Paris</param>'
               "<param name=\"opts\">{'unit': 'c', 'x': None}</param></function>",
     "", [("get_weather", {"city": "Paris", "opts": {"unit": "c", "x": None}})]),
    (HY3, "<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n"
          "<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>Paris"
          "</arg_value:opensource>\n<arg_key:opensource>days</arg_key:opensource>\n"
          "<arg_value:opensource>3</arg_value:opensource>\n</tool_call:opensource>\n"
          "<tool_call:opensource>get_time<tool_sep:opensource>\n</tool_call:opensource>\n"
          "</tool_calls:opensource>",
     "", [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]),
    (COMMAND_R, '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", '
                '"parameters": {"city": "Paris", "days": 3}},\n    {"tool_call_id": "1", '
                '"tool_name": "get_time", "parameters": {}}\n]<|END_ACTION|>',
     "", [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]),
    # "name" is not Cohere's key: not a call
    (COMMAND_R, '<|START_ACTION|>[{"name": "get_time", "parameters": {}}]<|END_ACTION|>',
     '<|START_ACTION|>[{"name": "get_time", "parameters": {}}]<|END_ACTION|>', []),
    (APRIEL, 'Sure.\n<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}, '
             '"id": "call_1"}, {"name": "get_time", "arguments": {}}]</tool_calls>',
     "Sure.", [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    (MINIMAX_M1, '<tool_calls>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                 '{"name": "get_time", "arguments": {}}\n</tool_calls>',
     "", [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    (APERTUS, 'Ok.<|tools_prefix|>[{"get_weather": {"city": "Paris", "days": 3}}, '
              '{"get_time": {}}]<|tools_suffix|>',
     "Ok.", [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]),
    (APERTUS, '<|tools_prefix|>[{}]<|tools_suffix|>', '<|tools_prefix|>[{}]<|tools_suffix|>', []),
    # only an object is a call's arguments (unconstrained output)
    (APERTUS, '<|tools_prefix|>[{"f": 5}]<|tools_suffix|>',
     '<|tools_prefix|>[{"f": 5}]<|tools_suffix|>', []),
    # an empty name is no call
    (HERMES, '<tool_call>{"name": "", "arguments": {}}</tool_call>',
     '<tool_call>{"name": "", "arguments": {}}</tool_call>', []),
    (KIMI_K2, "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
              '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|>'
              "<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}"
              "<|tool_call_end|><|tool_calls_section_end|>",
     "Checking.", [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]),
    # a Kimi call without "functions." (or its index) is still read as a call
    (KIMI_K2, '<|tool_call_begin|>get_weather<|tool_call_argument_begin|>{"city": "Oslo"}'
              "<|tool_call_end|>", "", [("get_weather", {"city": "Oslo"})]),
    # DSML: string="true" values as written (a digit string stays a string), "false" JSON
    (DSML, 'Sure.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
           '<｜DSML｜parameter name="city" string="true">Paris <b> "FR"</｜DSML｜parameter>\n'
           '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
           '<｜DSML｜parameter name="zip" string="true">75001</｜DSML｜parameter>\n'
           '<｜DSML｜parameter name="opts" string="false">{"a": [1, null]}</｜DSML｜parameter>\n'
           '</｜DSML｜invoke>\n<｜DSML｜invoke name="get_time">\n</｜DSML｜invoke>\n'
           "</｜DSML｜function_calls>",
     "Sure.", [("get_weather", {"city": 'Paris <b> "FR"', "days": 3, "zip": "75001",
                                "opts": {"a": [1, None]}}), ("get_time", {})]),
    (DSML_V4, 'Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
              '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
              '</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
     "Sure.", [("get_weather", {"city": "Paris"})]),
    # a 128-character name (the most the APIs allow) after Kimi's "functions."
    (KIMI_K2, "<|tool_calls_section_begin|><|tool_call_begin|>functions." + "a" * 128
              + ":0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
     "", [("a" * 128, {})]),
    (GEMMA4, 'On it.<|tool_call>call:get_weather{city:<|"|>Paris, "FR" {x}]<|"|>,days:3,'
             'opts:{unit:<|"|>c<|"|>,list:[1,<|"|>a<|"|>,true]}}<tool_call|>'
             "<|tool_call>call:get_time{}<tool_call|>",
     "On it.", [("get_weather", {"city": 'Paris, "FR" {x}]', "days": 3,
                                 "opts": {"unit": "c", "list": [1, "a", True]}}),
                ("get_time", {})]),
    # LFM2: Python calls (and JSON literals, as llama.cpp reads them)
    (LFM2, 'Checking.<|tool_call_start|>[get_weather(city="Paris, (FR)", days=3), '
           "get_time(), toggle(on=True, off=false, v=None, cfg={'a': [1, -2.5, 'x)']}), "
           "run(code='def f():\\n    print(\\'hey\\')')]<|tool_call_end|> Done.",
     "Checking. Done.", [("get_weather", {"city": "Paris, (FR)", "days": 3}), ("get_time", {}),
                         ("toggle", {"on": True, "off": False, "v": None,
                                     "cfg": {"a": [1, -2.5, "x)"]}}),
                         ("run", {"code": "def f():\n    print('hey')"})]),
    (LFM2, "Use this format: [link text](url). See [Wikipedia](https://w.org).",
     "Use this format: [link text](url). See [Wikipedia](https://w.org).", []),
    (LFM2, "<|tool_call_start|>[not a call]<|tool_call_end|> <|tool_call_start|>x",
     "<|tool_call_start|>[not a call]<|tool_call_end|> <|tool_call_start|>x", []),
    (LFM2, "<|tool_call_start|>[f(__import__('os').system('x'))]<|tool_call_end|>",
     "<|tool_call_start|>[f(__import__('os').system('x'))]<|tool_call_end|>", []),
    (HARMONY, "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
              "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" + W,
     "", [("get_weather", json.loads(W))]),
    (HARMONY, "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final"
              "<|message|>Hello <there>", "Hello <there>", []),
    (HARMONY, '<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{"a": 1}',
     "", [("add", {"a": 1})]),
    (HARMONY, "Plain text from a model that forgot its channels.",
     "Plain text from a model that forgot its channels.", []),
]
TYPES = {"get_weather": {"city": "string", "days": "integer"}, "get_time": {}}


def parse(fmt: ToolFormat, pieces: list[str]) -> tuple[str, list[tuple[str, object]], list[str]]:
    p = call_parser(fmt, TYPES)
    events = [e for piece in pieces for e in p.feed(piece)] + p.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    opens = [e for e in events if isinstance(e, CallOpen)]
    args = [""] * len(opens)
    for k, e in enumerate(events):
        if isinstance(e, CallArgs):
            args[e.index] += e.text
            # a call's name is announced before any of its arguments
            assert any(isinstance(x, CallOpen) and x.index == e.index for x in events[:k])
    assert [o.index for o in opens] == list(range(len(opens)))
    if fmt.id_length:
        assert all(len(o.id) == fmt.id_length and o.id.isalnum() for o in opens)
    calls = [(o.name, json.loads(a)) for o, a in zip(opens, args, strict=True)]
    return content, calls, [o.id for o in opens]


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES)
def test_whole(fmt: ToolFormat, text: str, content: str, calls: list[tuple[str, object]]) -> None:
    got_content, got_calls, _ = parse(fmt, [text])
    assert got_content.strip() == content
    assert got_calls == calls


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), CASES)
def test_cut_anywhere(fmt: ToolFormat, text: str, content: str,
                      calls: list[tuple[str, object]]) -> None:
    for cut in range(1, len(text)):
        got_content, got_calls, _ = parse(fmt, [text[:cut], text[cut:]])
        assert (got_content.strip(), got_calls) == (content, calls), cut
    rng = random.Random(len(text))
    for _ in range(30):
        pieces, i = [], 0
        while i < len(text):
            n = rng.randint(1, 5)
            pieces.append(text[i:i + n])
            i += n
        got_content, got_calls, _ = parse(fmt, pieces)
        assert (got_content.strip(), got_calls) == (content, calls)


def test_no_marker_leaks_into_content_while_streaming() -> None:
    text = CASES[0][1]
    p = CallParser(HERMES)
    seen = "".join(e.text for ch in text for e in p.feed(ch) if isinstance(e, Content))
    assert "<" not in seen and seen.strip() == "Checking."


@pytest.mark.parametrize(("text", "calls"), [
    ('<tool_call>{"name": "f", "arguments": {}}</tool_', [("f", {})]),
    ('<tool_call>{"name": "f", "arguments": {}}\n</', [("f", {})]),
    ('<tool_call>{"name": "get_', []),
    ("<tool_call>\n{", []),
])
def test_output_that_ends_inside_call_markup_leaks_none_of_it(
        text: str, calls: list[tuple[str, object]]) -> None:
    for cut in range(1, len(text) + 1):  # as a stream ends (max_tokens), in any pieces
        assert parse(HERMES, [text[:cut], text[cut:]])[:2] == ("", calls)


def test_a_call_cut_off_keeps_its_partial_arguments() -> None:
    p = CallParser(HERMES)
    events = p.feed('<tool_call>{"name": "f", "arguments": {"a": "unfinis') + p.finish()
    assert isinstance(events[0], CallOpen) and p.num_calls == 1
    assert "".join(e.text for e in events if isinstance(e, CallArgs)) == '{"a": "unfinis'


def test_harmony_analysis_is_reasoning_and_never_content() -> None:
    text = CASES[-4][1]
    for cut in range(1, len(text)):
        p = call_parser(HARMONY)
        events = p.feed(text[:cut]) + p.feed(text[cut:]) + p.finish()
        assert "".join(e.text for e in events if isinstance(e, Thought)) == "Need the weather."
        assert not [e for e in events if isinstance(e, Content)], cut


@pytest.mark.parametrize("fmt", [MISTRAL_ARGS, DEEPSEEK_V3, QWEN3_CODER, SEED_OSS, GLM,
                                 MINIMAX, GEMMA4, LFM2, KIMI_K2, DSML])
def test_named_formats_hold_no_marker_in_content(fmt: ToolFormat) -> None:
    text = next(t for f, t, _, calls in CASES if f is fmt and calls)
    p = call_parser(fmt, TYPES)
    seen = "".join(e.text for ch in text for e in p.feed(ch) if isinstance(e, Content))
    for marker in fmt.markers:
        assert marker.strip() not in seen


@pytest.mark.parametrize("fmt", [COMMAND_R, NEMOTRON, APRIEL, APERTUS])
def test_output_cut_off_inside_a_listed_formats_closing_marker_gives_no_content(
        fmt: ToolFormat) -> None:
    """A whole call, then max_tokens ran out in ``]`` and the closing marker: the call,
    and none of the marker as content (it was ``]<|END_ACTION`` after Command R7B's)."""
    text = next(t for f, t, _, calls in CASES if f is fmt and calls)
    close = text.rindex(fmt.close)
    content = text[:text.index(fmt.open)].strip()
    for cut in range(text.rindex("]", 0, close) + 1, close + len(fmt.close)):
        p = call_parser(fmt, TYPES)
        events = p.feed(text[:cut]) + p.finish(cut=True)
        said = "".join(e.text for e in events if isinstance(e, Content))
        assert said.strip() == content, (fmt, cut)
        assert len([e for e in events if isinstance(e, CallOpen)]) == 2, (fmt, cut)


def test_a_string_parameter_streams_in_fragments() -> None:
    p = call_parser(QWEN3_CODER, TYPES)
    p.feed("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar")
    assert "".join(e.text for e in p.feed("is and mo") if isinstance(e, CallArgs)) == "is and mo"


@pytest.mark.parametrize("fmt", [HERMES, MISTRAL, MISTRAL_ARGS, DEEPSEEK_V3, QWEN3_CODER,
                                 SEED_OSS, GLM, MINIMAX, GEMMA4, HARMONY, LFM2, KIMI_K2,
                                 DSML])
def test_output_cut_off_inside_the_opening_marker_gives_no_content(fmt: ToolFormat) -> None:
    """max_tokens ran out while the model wrote the start of a call (a forced call's first
    tokens): none of the marker is content. Ended by the model instead, it is text."""
    text = next(t for f, t, _, calls in CASES if f is fmt and calls)
    marker = fmt.markers[0] if fmt.markers else ""
    start = text.index(marker.strip()) if marker.strip() in text else 0
    for end in range(start + 1, start + len(marker) + 1):
        p = call_parser(fmt, TYPES)
        events = p.feed(text[start:end]) + p.finish(cut=True)
        assert not [e for e in events if isinstance(e, Content | CallOpen)], (end, events)
    p = call_parser(HERMES, TYPES)
    assert p.feed("<tool") + p.finish() == [Content("<tool")]  # the model stopped there


@pytest.mark.parametrize("fmt", [HERMES, MISTRAL, LLAMA3, GRANITE, NEMOTRON])
def test_output_cut_off_after_the_name_is_a_call_without_arguments(fmt: ToolFormat) -> None:
    """max_tokens ran out after a JSON call's name, before its arguments: the call, named,
    its arguments "" (as OpenAI returns a cut call; it was dropped: an empty answer)."""
    text, calls = next((t, k) for f, t, _, k in CASES if f is fmt and k)
    name = calls[0][0]
    end = text.index(f'"{name}"') + len(name) + 2
    p = call_parser(fmt, TYPES)
    events = p.feed(text[:end]) + p.finish(cut=True)
    assert [e.name for e in events if isinstance(e, CallOpen)] == [name], (text[:end], events)
    said = "".join(e.text for e in events if isinstance(e, Content)).strip()
    assert said == text[:text.index(fmt.open) if fmt.open and fmt.open in text else 0].strip()
    assert "".join(e.text for e in events if isinstance(e, CallArgs)) in ("", "{}")
    p = call_parser(fmt, TYPES)  # cut inside the name: no call
    assert not [e for e in p.feed(text[:end - 2]) + p.finish(cut=True)
                if isinstance(e, CallOpen)]


@pytest.mark.parametrize("fmt", [DEEPSEEK_V3, DEEPSEEK_R1, KIMI_K2, MISTRAL_ARGS, QWEN3_CODER,
                                 GLM, SOLAR_OPEN, HARMONY])
def test_output_cut_off_between_a_name_and_its_marker_is_a_call(fmt: ToolFormat) -> None:
    """max_tokens ran out after a named format's call name, before the marker that ends it
    (Kimi K2's index, DeepSeek's separator, Harmony's header end): the call, named, its
    arguments "". Cut inside the name, or on a name that is not offered: no call."""
    text = next(t for f, t, _, k in CASES if f is fmt and k and k[0][0] == "get_weather")
    end = text.index("get_weather") + len("get_weather")
    for more in ("", {KIMI_K2: ":0", HARMONY: " <|constrain|>json"}.get(fmt, "")):
        p = call_parser(fmt, TYPES)
        events = p.feed(text[:end] + more) + p.finish(cut=True)
        assert [e.name for e in events if isinstance(e, CallOpen)] == ["get_weather"], (
            more, events)
        assert not [e for e in events if isinstance(e, CallArgs)]
    p = call_parser(fmt, TYPES)  # cut inside the name
    assert not [e for e in p.feed(text[:end - 2]) + p.finish(cut=True)
                if isinstance(e, CallOpen)]
    p = call_parser(fmt, {"get_weather": {}, "get_weather_now": {}})  # maybe a longer one
    assert not [e for e in p.feed(text[:end]) + p.finish(cut=True) if isinstance(e, CallOpen)]
    p = call_parser(fmt, TYPES)  # the model stopped there: no call
    assert not [e for e in p.feed(text[:end]) + p.finish() if isinstance(e, CallOpen)]


def test_harmony_recipient_in_the_role_header_survives_any_cut() -> None:
    """gpt-oss may address a call before its channel (`` to=functions.f<|channel|>...``),
    and writes " to" as a token of its own: held until the header is known."""
    text = ' to=functions.special_function<|channel|>analysis<|message|>{"arg1": 1}'
    for cut in range(1, len(text)):
        p = call_parser(HARMONY)
        events = p.feed(text[:cut]) + p.feed(text[cut:]) + p.finish()
        opens = [e.name for e in events if isinstance(e, CallOpen)]
        args = "".join(e.text for e in events if isinstance(e, CallArgs))
        assert (opens, json.loads(args)) == (["special_function"], {"arg1": 1}), cut
        assert not [e for e in events if isinstance(e, Content)], cut


def test_every_format_can_be_set_in_models_toml() -> None:
    from edgeinfer.config import TOOL_FORMATS
    from edgeinfer.prompt.toolformat import FORMATS
    assert set(TOOL_FORMATS) == set(FORMATS) | {"auto"}


def _whole_and_streamed(fmt: ToolFormat, text: str, types: dict[str, dict[str, str]]
                        ) -> list[tuple[str, object]]:
    """The calls of ``text``, checked to be the same fed whole and a character at a time."""
    results = []
    for pieces in ([text], list(text)):
        p = call_parser(fmt, types)
        events = [e for piece in pieces for e in p.feed(piece)] + p.finish()
        opens = [e for e in events if isinstance(e, CallOpen)]
        args = ["".join(e.text for e in events if isinstance(e, CallArgs) and e.index == k)
                for k in range(len(opens))]
        results.append([(o.name, json.loads(a)) for o, a in zip(opens, args, strict=True)])
    assert results[0] == results[1]
    return results[0]


def test_tagged_values_are_json_that_any_parser_reads() -> None:
    """A date (format) or patterned string is read without the quotes its grammar writes;
    a number too large for a double, or NaN, stays text (JSON has no Infinity); Python's
    None from a template's repr is null."""
    from edgeinfer.prompt.tools import ToolSpec, parameter_types
    schema = {"type": "object", "properties": {
        "d": {"type": "string", "format": "date"}, "p": {"type": "string", "pattern": "^a+$"},
        "n": {"type": "number"}, "m": {"type": "number"}, "o": {"type": "object"}}}
    types = parameter_types([ToolSpec("f", "", schema)])
    text = ('<tool_call>f<arg_key>d</arg_key><arg_value>"2024-01-05"</arg_value>'
            "<arg_key>p</arg_key><arg_value>aaa</arg_value><arg_key>n</arg_key>"
            "<arg_value>1e999</arg_value><arg_key>m</arg_key><arg_value>NaN</arg_value>"
            "<arg_key>o</arg_key><arg_value>{'a': None, 'b': [True]}</arg_value></tool_call>")
    assert _whole_and_streamed(GLM, text, types) == [("f", {
        "d": "2024-01-05", "p": "aaa", "n": "1e999", "m": "NaN", "o": {"a": None, "b": [True]}})]


@pytest.mark.parametrize(("fmt", "text"), [
    (GLM, "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
          "<arg_key>bad\nkey</arg_key><arg_value>x</arg_value></tool_call>"),
    (MINIMAX, '<minimax:tool_call><invoke name="get_weather"><parameter name="city">Paris'
              '</parameter><parameter name="">x</parameter></invoke></minimax:tool_call>'),
    (DSML, '<｜DSML｜function_calls><｜DSML｜invoke name="get_weather"><｜DSML｜parameter '
           'name="city" string="true">Paris</｜DSML｜parameter><｜DSML｜parameter name="" '
           'string="true">x</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>'),
    (QWEN3_CODER, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                  "<parameter=>\nx\n</parameter>\n</function>\n</tool_call>"),
])
def test_a_bad_parameter_name_after_good_ones_ends_the_arguments(fmt: ToolFormat,
                                                                 text: str) -> None:
    assert _whole_and_streamed(fmt, text, TYPES) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), [
    # keys as the grammar writes them (not Python names), JSON escapes, surrogate pairs
    (LFM2, '<|tool_call_start|>[translate(from="en", to="fr", max-results=5, '
           'p="x\\/y", e="hi \\ud83d\\ude00 \\ud800")]<|tool_call_end|>',
     "", [("translate", {"from": "en", "to": "fr", "max-results": 5, "p": "x/y",
                         "e": "hi \U0001f600 \ufffd"})]),
    (LFM2, "See <|tool_call_start|>[] here", "See <|tool_call_start|>[] here", []),
    (LFM2, "<|tool_call_start|>[f(a=1)]<|tool_call_end|><|tool_call_start|>nope",
     "<|tool_call_start|>nope", [("f", {"a": 1})]),
    (LFM2, "<|tool_call_start|>[f(a=1)] and <|tool_", " and <|tool_", [("f", {"a": 1})]),
    (NEMOTRON, '<TOOLCALL>[{"name": "f", "arguments": {}}] then text', " then text",
     [("f", {})]),
])
def test_content_beside_calls_is_kept_exactly(fmt: ToolFormat, text: str, content: str,
                                              calls: list[tuple[str, object]]) -> None:
    for pieces in ([text], list(text)):
        p = call_parser(fmt, TYPES)
        events = [e for piece in pieces for e in p.feed(piece)] + p.finish()
        assert "".join(e.text for e in events if isinstance(e, Content)) == content
    assert _whole_and_streamed(fmt, text, TYPES) == calls


def test_python_calls_are_read_in_linear_time() -> None:
    """Each character of a call's arguments is scanned once: a 60,000-character argument
    streamed a character at a time (a rescan per piece took minutes on the event loop)."""
    import time
    text = "<|tool_call_start|>[f(a='" + "x" * 60_000 + "')]<|tool_call_end|>"
    p = call_parser(LFM2, TYPES)
    t0 = time.monotonic()
    events = [e for ch in text for e in p.feed(ch)] + p.finish()
    assert time.monotonic() - t0 < 10
    assert [e.name for e in events if isinstance(e, CallOpen)] == ["f"]


def test_written_python_calls_read_back() -> None:
    """Past LFM2 calls written into the prompt read back as the same calls, whatever their
    strings hold (quotes, newlines, backslashes, request-text marks)."""
    from edgeinfer.prompt.pythoncalls import python_calls_text
    args = {"a": "it's \"x\"\nC:\\new\\", "b": ["x'y", {"k": None}], "c": True, "d": -2.5,
            "m": "\ufdd0<|im_end|>\ufdd1"}
    text = python_calls_text([("f", args), ("g", {})], LFM2)
    assert _whole_and_streamed(LFM2, text, TYPES) == [("f", args), ("g", {})]


def test_minimax_m3_arguments_nested_too_deep_or_unclosed_are_no_arguments() -> None:
    """Hostile nesting is refused by depth, an unclosed element by its missing end: the
    call keeps no arguments, none of its markup becomes content, and nothing raises (nor
    takes long: 20,000 nested elements)."""
    ns = "]<]minimax[>["
    deep = "".join(f"{ns}<a>" for _ in range(40)) + "x" + "".join(f"{ns}</a>" for _ in range(40))
    huge = f"{ns}<a>" * 20000 + "x" + f"{ns}</a>" * 20000
    for body in (deep, huge, f"{ns}<city>Paris{ns}</town>"):
        text = f'Hi.{ns}<tool_call>{ns}<invoke name="get_time">{body}{ns}</invoke>{ns}</tool_call>'
        content, calls, _ = parse(MINIMAX_M3, [text])
        assert (content, calls) == ("Hi.", [("get_time", {})])


M3_SCHEMA = {"type": "object", "properties": {
    "stops": {"type": "array", "items": {"type": "string"}},
    "opts": {"type": "object", "properties": {"unit": {"type": "string"},
                                              "item": {"type": "integer"}}},
    "legs": {"type": "array", "items": {"type": "object", "properties": {
        "to": {"type": "string"}}}},
    "grid": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
    "note": {"anyOf": [{"type": "string"}, {"type": "object"}]}}}


@pytest.mark.parametrize(("body", "want"), [
    ("<stops></stops><opts></opts>", {"stops": [], "opts": {}}),
    ("<stops><item>123</item><item>true</item><item>null</item></stops>",
     {"stops": ["123", "true", "null"]}),
    ("<opts><unit>5</unit><item>7</item></opts>", {"opts": {"unit": "5", "item": 7}}),
    ("<legs><item></item><item><to>Oslo</to></item></legs>", {"legs": [{}, {"to": "Oslo"}]}),
    ("<grid><item></item><item><item>1</item></item></grid>", {"grid": [[], [1]]}),
    ("<note><a>1</a></note>", {"note": "]<]minimax[>[<a>1]<]minimax[>[</a>"}),
])
def test_minimax_m3_arguments_are_typed_by_the_schema_level_by_level(
        body: str, want: dict[str, object]) -> None:
    """As llama.cpp reads them: empty elements are empty lists and objects, string items
    stay strings, a union with a string keeps the text as written."""
    ns = "]<]minimax[>["
    tagged = body.replace("</", "\x00").replace("<", ns + "<").replace("\x00", ns + "</")
    text = f'{ns}<tool_call>{ns}<invoke name="plan">{tagged}{ns}</invoke>{ns}</tool_call>'
    for pieces in ([text], list(text)):
        p = call_parser(MINIMAX_M3, {}, {"plan": M3_SCHEMA})
        events = [e for piece in pieces for e in p.feed(piece)] + p.finish()
        args = "".join(e.text for e in events if isinstance(e, CallArgs))
        assert json.loads(args) == want
        assert not [e for e in events if isinstance(e, Content) and e.text.strip()]


@pytest.mark.parametrize(("fmt", "call"), [
    (HERMES, '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'),
    (QWEN3_CODER, "<tool_call>\n<function=get_time>\n</function>\n</tool_call>"),
    (MINIMAX, '<minimax:tool_call>\n<invoke name="get_time">\n</invoke>\n</minimax:tool_call>'),
    (KIMI_K2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0"
              "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"),
])
def test_line_breaks_after_the_calls_go_streamed_or_whole(fmt: ToolFormat, call: str) -> None:
    """The line breaks right after the calls' closing marker are dropped whether they
    come with it or in later pieces (streamed and whole answers agree)."""
    for tail, want in (("\n\nAfter.", "Before.\nAfter."), ("\n", "Before.\n")):
        text = "Before.\n" + call + tail
        whole = parse(fmt, [text])[:2]
        assert whole == parse(fmt, list(text))[:2] == (want, [("get_time", {})])


def test_functionary_after_an_assistant_prefill_continues_its_text() -> None:
    """Functionary's generation prompt opens a recipient (``>>>``), so its output starts with
    a name; a prompt that ends inside a prefilled assistant message does not, and what
    follows is the message's text (it was read as a call to the first word)."""
    text = 'get_weather\n{"city": "Paris"}'
    p = call_parser(replace(FUNCTIONARY_V32, prompt_opens=False), TYPES)
    events = p.feed(text) + p.finish()
    assert "".join(e.text for e in events if isinstance(e, Content)) == text
    assert not [e for e in events if isinstance(e, CallOpen)]
    assert parse(FUNCTIONARY_V32, [text])[1] == [("get_weather", {"city": "Paris"})]


def test_kimi_k3_string_values_are_read_as_written() -> None:
    """Kimi K3 writes every string raw with type="string", one with a pattern too: its text
    is the value as written (it was read as JSON where it parsed as a quoted string)."""
    p = call_parser(KIMI_K3, {"f": {"d": "quoted"}})
    text = ('<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|open|>argument '
            'key="d" type="string"<|sep|>"a\\u0041"<|close|>argument<|sep|><|close|>call<|sep|>'
            '<|close|>tools<|sep|>')
    events = p.feed(text) + p.finish()
    args = "".join(e.text for e in events if isinstance(e, CallArgs))
    assert json.loads(args) == {"d": '"a\\u0041"'}


def test_minimax_m3_arguments_stream_a_member_at_a_time() -> None:
    """Each top-level member is passed on once its element closes (the arguments came
    whole at the call's end); what cannot be members ends the reading, streamed and whole
    alike, and a call cut off inside a member keeps unfinished arguments."""
    ns = "]<]minimax[>["
    head = f'{ns}<tool_call>{ns}<invoke name="get_weather">'
    p = call_parser(MINIMAX_M3, TYPES)
    seen = p.feed(f"{head}{ns}<city>Paris{ns}</city>{ns}<da")
    assert "".join(e.text for e in seen if isinstance(e, CallArgs)) == '{"city": "Paris"'
    more = p.feed(f"ys>3{ns}</days>") + p.feed(f"{ns}</invoke>{ns}</tool_call>") + p.finish()
    assert "".join(e.text for e in more if isinstance(e, CallArgs)) == ', "days": 3}'
    for body, want in ((f"{ns}<city>Paris{ns}</city>junk{ns}<days>3{ns}</days>",
                        {"city": "Paris"}),
                       (f"{ns}<city>Paris{ns}</city>{ns}<days>3", {"city": "Paris"})):
        text = f"{head}{body}{ns}</invoke>{ns}</tool_call>"
        assert _whole_and_streamed(MINIMAX_M3, text, TYPES) == [("get_weather", want)]
    cut = call_parser(MINIMAX_M3, TYPES)
    events = cut.feed(f"{head}{ns}<city>Paris{ns}</city>{ns}<days>3") + cut.finish(cut=True)
    assert "".join(e.text for e in events if isinstance(e, CallArgs)) == '{"city": "Paris"'


def test_minimax_m3_a_large_member_streams_in_one_pass() -> None:
    """A member with many children, fed a character at a time, is read as fed whole (each
    tag is scanned once: the reading resumes where it stopped, it used to start over)."""
    ns = "]<]minimax[>["
    body = f"{ns}<stops>" + "".join(f"{ns}<item>s{k}{ns}</item>" for k in range(1500)) + (
        f"{ns}</stops>")
    text = f'{ns}<tool_call>{ns}<invoke name="plan">{body}{ns}</invoke>{ns}</tool_call>'
    for pieces in ([text], list(text)):
        p = call_parser(MINIMAX_M3, {}, {"plan": M3_SCHEMA})
        events = [e for piece in pieces for e in p.feed(piece)] + p.finish()
        args = json.loads("".join(e.text for e in events if isinstance(e, CallArgs)))
        assert args == {"stops": [f"s{k}" for k in range(1500)]}
