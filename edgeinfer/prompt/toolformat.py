"""The tool-call formats models are trained on, and which one a chat template speaks.

JSON formats (``syntax = "json"``) write calls as JSON objects ``{"name": ...,
"arguments": {...}}`` (the arguments key differs) around their own markers:

- ``hermes``: Hermes 2 Pro / 3, Qwen 2.5, Qwen3, Granite 4: each call in
  ``<tool_call> ... </tool_call>``.
- ``llama3``: Llama 3.1 / 3.2 / 3.3: one bare ``{"name": ..., "parameters": ...}`` object,
  or the ``<|python_tag|>`` form.
- ``mistral``: Mistral Nemo and the v3 tokenizer models: ``[TOOL_CALLS][{...}, ...]``
  with a 9-character ``id`` in each call.
- ``granite``: Granite 3.x: ``<|tool_call|>[{...}, ...]``.
- ``nemotron``: Nemotron Nano 2: ``<TOOLCALL>[{...}, ...]</TOOLCALL>``.
- ``firefunction``: FireFunction v2: `` functools[{...}, ...]``.
- ``apriel``: Apriel 1.5 / 1.6: ``<tool_calls>[{...}, ...]</tool_calls>``.
- ``apertus``: Apertus: ``<|tools_prefix|>[{"NAME": {...}}, ...]<|tools_suffix|>`` (each
  call an object whose one key is the name, its value the arguments).
- ``minimax_m1``: MiniMax M1: ``<tool_calls>`` and one ``{...}`` per line, then
  ``</tool_calls>``.
- ``command_r``: Command R7B, Command A (Cohere2): ``<|START_ACTION|>[{"tool_call_id":
  "0", "tool_name": ..., "parameters": {...}}, ...]<|END_ACTION|>``.
- ``gigachat3``: GigaChat 3: one call, a message of its own after the answer's:
  ``<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": ..., "arguments": {...}}``;
  ``gigachat3_1``: GigaChat 3.1: ``<|function_call|>{...}`` after the answer.
- ``command_r_plus``: Command R+ (its tool_use template): ``Action:`` and a json code
  fence around ``[{"tool_name": ..., "parameters": {...}}, ...]``; its template asks for
  a ``directly-answer`` action when no tool is needed, which is no call.
- ``generic``: any other template: the tools go in a system message and the calls in
  the Hermes syntax (the model was not trained on it; a grammar keeps calls valid).

Named formats (``syntax = "named"``, ``edgeinfer.prompt.namedcalls``) write the function
name outside the arguments, ``call_open NAME name_end ARGUMENTS call_close``, optionally
inside ``block_open ... block_close``:

- ``mistral_args``: Mistral Small 3.2, Devstral, Ministral 3 / Magistral (v11+ tokenizers):
  ``[TOOL_CALLS]get_weather[ARGS]{...}`` (Small 3.2 may put ``[CALL_ID]id`` before ``[ARGS]``).
- ``deepseek_v3``: DeepSeek V3.1 / V3.2: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME
  <｜tool▁sep｜>{...}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>``.
- ``deepseek_r1``: DeepSeek R1 (and its distills): the same tokens, ``function<｜tool▁sep｜>NAME``
  and the arguments in a ```` ```json ```` fence.
- ``qwen3_coder``: Qwen3-Coder / Qwen3.5: ``<tool_call><function=NAME><parameter=KEY>
  value</parameter></function></tool_call>`` (``edgeinfer.prompt.xmlargs`` reads these
  tagged parameters, and the next three formats' own).
- ``seed_oss``: ByteDance Seed-OSS: Qwen3-Coder's parameters, without line breaks around
  the values, in ``<seed:tool_call> ... </seed:tool_call>``.
- ``glm``: GLM 4.5 / 4.6 / 4.7, Laguna, Ling 3.0, Spark: ``<tool_call>NAME<arg_key>city
  </arg_key><arg_value>Paris</arg_value></tool_call>`` (line breaks between the tags as
  each template writes them).
- ``hy3``: Hunyuan 3: GLM's layout in ``:opensource`` tags, ``<tool_calls:opensource>
  <tool_call:opensource>NAME<tool_sep:opensource><arg_key:opensource>city</arg_key:opensource>
  <arg_value:opensource>Paris</arg_value:opensource></tool_call:opensource>
  </tool_calls:opensource>``.
- ``minimax``: MiniMax M2: ``<minimax:tool_call><invoke name="NAME"><parameter
  name="city">Paris</parameter></invoke></minimax:tool_call>``.
- ``minicpm5``: MiniCPM5: ``<function name="NAME"><param name="city">Paris</param>
  </function>`` (a text value with ``<``, ``&`` or a line break in ``<![CDATA[ ... ]]>``).
- ``minimax_m3``: MiniMax M3: ``<tool_call><invoke name="NAME"><city>Paris</city><opts>
  <unit>c</unit></opts></invoke></tool_call>``, each tag after the token ``]<]minimax[>[``
  (objects and lists nested as elements, ``edgeinfer.prompt.nestedargs``).
- ``kimi_k2``: Kimi K2 (Instruct, Thinking): ``<|tool_calls_section_begin|><|tool_call_begin|>
  functions.NAME:0<|tool_call_argument_begin|>{...}<|tool_call_end|>...
  <|tool_calls_section_end|>`` (the name after ``functions.``, a call index after ``:``).
- ``kimi_k3``: Kimi K3: tags ``<|open|>NAME attrs<|sep|> ... <|close|>NAME<|sep|>``: the
  answer in ``response``, calls in ``tools``, ``call tool="NAME" index="1"`` and
  ``argument key="city" type="string"`` (other types: JSON values).
- ``dsml``: DeepSeek V3.2: MiniMax's layout in ``｜DSML｜`` tags, ``<｜DSML｜parameter
  name="city" string="true">Paris</｜DSML｜parameter>`` (``string="false"``: a JSON value),
  in ``<｜DSML｜function_calls>``; ``dsml_v4``: DeepSeek V4, the same in
  ``<｜DSML｜tool_calls>``.
- ``solar_open``: Solar Open: ``<|tool_calls|><|tool_call:begin|>ID<|tool_call:name|>NAME
  <|tool_call:args|>{...}<|tool_call:end|>`` (the id first; ``<|calls|>`` ends the turn).
- ``functionary_v32``: Functionary v3.2: messages to recipients, ``>>>all\nTEXT`` the
  answer and ``>>>NAME\n{...}`` a call (the generation prompt writes the first ``>>>``).
- ``gemma4``: Gemma 4: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>``
  (``edgeinfer.prompt.gemmaargs``).
- ``muse_glimmer``: Muse Glimmer: messages ``<|start|>assistant to=RECIPIENT<|message|>
  ...<|eom|>`` (the generation prompt writes the first ``<|start|>assistant``): ``self``
  is reasoning, ``user`` the answer, and a call is a message to its tool, MiniMax's layout
  in ``atem:`` tags (``<atem:function_calls>``, ``<atem:invoke name=..>``).

``lfm2`` (LFM2, LFM2.5; ``syntax = "python"``, ``edgeinfer.prompt.pythoncalls``) writes
Python calls in a list: ``<|tool_call_start|>[get_weather(city='Paris')]<|tool_call_end|>``.

``harmony`` (gpt-oss, ``edgeinfer.prompt.harmony``) reads channels: ``analysis`` is
reasoning, ``final`` the answer, ``commentary to=functions.NAME`` a call.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Tags:
    """The markers of one tagged-parameter syntax (``edgeinfer.prompt.xmlargs``)."""

    key_open: str  # before a parameter's name
    key_close: str  # after it
    value_open: str  # before its value (after optional blanks)
    value_close: str  # after its value
    end: str  # after the call's last parameter (left for the call parser)
    newlines: bool  # a value sits on lines of its own (one line break each side dropped)
    # after the name of a parameter that is not a string, when that differs (DeepSeek's
    # ``string="false"``, Kimi K3's type="number" ...; ``key_close`` is then the string
    # parameters' ``string="true"`` / type="string")
    key_close_others: tuple[str, ...] = ()
    cdata: bool = False  # a value may be wrapped in ``<![CDATA[ ... ]]>`` (MiniCPM5)

    @property
    def key_closes(self) -> tuple[str, ...]:
        return (self.key_close, *self.key_close_others)

    @property
    def markers(self) -> tuple[str, ...]:
        return tuple(m for m in (self.key_open, *self.key_closes, self.value_open,
                                 self.value_close, self.end) if m and m != ">")


TAGS = {
    "xml": Tags("<parameter=", ">", "", "</parameter>", "</function>", True),
    "seed": Tags("<parameter=", ">", "", "</parameter>", "</function>", False),
    "glm": Tags("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "</tool_call>", False),
    "minimax": Tags('<parameter name="', '">', "", "</parameter>", "</invoke>", False),
    "atem": Tags('<atem:parameter name="', '">', "", "</atem:parameter>", "</atem:invoke>",
                 False),
    "hy3": Tags("<arg_key:opensource>", "</arg_key:opensource>", "<arg_value:opensource>",
                "</arg_value:opensource>", "</tool_call:opensource>", False),
    "minicpm5": Tags('<param name="', '">', "", "</param>", "</function>", False, cdata=True),
    "dsml": Tags('<｜DSML｜parameter name="', '" string="true">', "", "</｜DSML｜parameter>",
                 "</｜DSML｜invoke>", False, ('" string="false">',)),
    "k3": Tags('<|open|>argument key="', '" type="string"<|sep|>', "", "<|close|>argument<|sep|>",
               "<|close|>call<|sep|>", False, tuple(f'" type="{t}"<|sep|>' for t in (
                   "number", "boolean", "object", "array", "null"))),
}


@dataclass(frozen=True, slots=True)
class ToolFormat:
    name: str
    open: str  # the marker before the call(s) ("" for none)
    close: str = ""  # the marker after each call ("": none)
    args_key: str = "arguments"
    name_key: str = "name"
    index_key: str = ""  # a first key whose value is the call's index as text (Cohere)
    listed: bool = False  # the calls are one JSON list after ``open``
    joined: bool = False  # the calls share one ``open`` ... ``close``, one per line
    keyed: bool = False  # a call is ``{NAME: ARGUMENTS}`` (no name or arguments keys)
    bare: bool = False  # an output that starts with ``{`` is a call, without a marker
    native: bool = True  # the template renders tools, calls and results itself
    id_length: int = 0  # calls carry an "id" of this many letters and digits (0: none)
    max_calls: int = 4  # calls one answer may hold
    syntax: str = "json"  # json | named | harmony | python
    args: str = "json"  # how named formats write arguments: json | gemma | nested | TAGS
    block_open: str = ""  # named: before the calls
    block_close: str = ""  # named: after the calls
    call_open: str = ""  # named: before each call's name
    name_end: str = ""  # named: between the name and the arguments
    call_close: str = ""  # named: after each call's arguments
    id_marker: str = ""  # named: a call id may follow the name after this marker
    id_first: bool = False  # named: the call's id comes first, ``id_marker`` after it
    name_prefix: str = ""  # named: written before the name (read without it too)
    block_each: bool = False  # named: each call in a block of its own
    # named: the generation prompt opens the first call (``opening``): the output starts
    # with a name (Functionary) or inside a message header (Muse Glimmer); a prompt that
    # does not (an assistant prefill) gets the format with this off
    prompt_opens: bool = False
    # named: a message to this name is the answer's text, not a call (Functionary's "all")
    text_name: str = ""
    message_end: str = ""  # json: what ends the model's message, not text (GigaChat 3)
    decline: str = ""  # json: a call to this name answers without tools (not a call)
    indented: bool = False  # json: the template writes the calls' JSON indented
    name_rest: str = ""  # named: what ends a call's header after the name (Kimi K3's)
    noise: tuple[str, ...] = ()  # named: markup around the answer's text, dropped from it
    # named (Muse Glimmer): (the end of a message others follow, a message header's
    # opening, its closing): a header (its recipient) is dropped, the output starts in one
    messages: tuple[str, ...] = ()
    thought_to: str = ""  # named (Muse Glimmer): a message to this recipient is reasoning

    def header(self, recipient: str) -> str:
        """(``messages``) The header of a message to ``recipient``, after its opening: a
        message to a tool is a call (one to ``user`` the answer, to ``self`` reasoning)."""
        return f" to={recipient}{self.messages[2]}"

    def offering(self, names: Collection[str]) -> ToolFormat:
        """This format for a request that offers tools of these ``names``: where one is
        named as the decline (Command R+'s ``directly-answer``), it is that tool, and its
        calls are calls."""
        return replace(self, decline="") if self.decline in names else self

    @property
    def opening(self) -> str:
        """(``prompt_opens``) What the generation prompt ends with."""
        return self.messages[1] if self.messages else self.call_open

    @property
    def always_read(self) -> bool:
        """The answer's text is in the format's markup: read with or without tools."""
        return bool(self.text_name or self.noise)

    @property
    def trigger(self) -> str:
        """The word that starts a call in free text (a lazy grammar's trigger)."""
        if self.syntax == "named":
            return self.block_open or self.call_open
        if self.syntax == "harmony":
            return "<|channel|>commentary to=functions."
        return self.open or '{"name"'

    @property
    def triggers(self) -> tuple[str, ...]:
        """The words that start calls in free text: the trigger, and for a named format
        with a block around its calls also a call's own opening (a model may leave the
        block out)."""
        if self.syntax == "named" and self.block_open and self.call_open:
            return self.block_open, self.call_open
        return (self.trigger,)

    @property
    def markers(self) -> tuple[str, ...]:
        """The format's markers (a model may have them as special tokens: their text
        must show in the output for the parser to see them)."""
        found = [self.open, self.close, self.block_open, self.block_close, self.call_open,
                 self.name_end, self.call_close, self.id_marker, self.name_rest, *self.noise,
                 *self.messages]
        if self.syntax == "harmony":
            found += ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>"]
        if self.args == "gemma":
            found.append('<|"|>')
        if self.args in TAGS:
            found += TAGS[self.args].markers
        return tuple(dict.fromkeys(m for m in found if m))


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>")
GENERIC = ToolFormat("generic", "<tool_call>", "</tool_call>", native=False)
LLAMA3 = ToolFormat("llama3", "<|python_tag|>", args_key="parameters", bare=True, max_calls=1)
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", listed=True, id_length=9)
GRANITE = ToolFormat("granite", "<|tool_call|>", listed=True)
NEMOTRON = ToolFormat("nemotron", "<TOOLCALL>", "</TOOLCALL>", listed=True)
FIREFUNCTION = ToolFormat("firefunction", "functools", listed=True)
APRIEL = ToolFormat("apriel", "<tool_calls>", "</tool_calls>", listed=True)
APERTUS = ToolFormat("apertus", "<|tools_prefix|>", "<|tools_suffix|>", listed=True,
                     keyed=True)
MINIMAX_M1 = ToolFormat("minimax_m1", "<tool_calls>", "</tool_calls>", joined=True)
COMMAND_R = ToolFormat("command_r", "<|START_ACTION|>", "<|END_ACTION|>", listed=True,
                       name_key="tool_name", args_key="parameters", index_key="tool_call_id")
GIGACHAT3 = ToolFormat("gigachat3", "<|message_sep|>\n\nfunction call<|role_sep|>\n",
                       max_calls=1, message_end="<|message_sep|>")
GIGACHAT3_1 = ToolFormat("gigachat3_1", "<|function_call|>", max_calls=1)
COMMAND_R_PLUS = ToolFormat("command_r_plus", "Action:\n```json\n", "```", listed=True,
                            name_key="tool_name", args_key="parameters",
                            decline="directly-answer", indented=True)
MISTRAL_ARGS = ToolFormat("mistral_args", "", syntax="named", call_open="[TOOL_CALLS]",
                          name_end="[ARGS]", id_marker="[CALL_ID]", id_length=9)
_DS = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
       "<｜tool▁sep｜>", "<｜tool▁call▁end｜>")
DEEPSEEK_V3 = ToolFormat("deepseek_v3", "", syntax="named", block_open=_DS[0],
                         block_close=_DS[1], call_open=_DS[2], name_end=_DS[3],
                         call_close=_DS[4])
DEEPSEEK_R1 = ToolFormat("deepseek_r1", "", syntax="named", block_open=_DS[0],
                         block_close=_DS[1], call_open=_DS[2] + "function" + _DS[3],
                         name_end="\n```json\n", call_close="\n```" + _DS[4])
QWEN3_CODER = ToolFormat("qwen3_coder", "", syntax="named", args="xml",
                         block_open="<tool_call>", block_close="</tool_call>",
                         call_open="<function=", name_end=">", call_close="</function>",
                         block_each=True)
SEED_OSS = ToolFormat("seed_oss", "", syntax="named", args="seed",
                      block_open="<seed:tool_call>", block_close="</seed:tool_call>",
                      call_open="<function=", name_end=">", call_close="</function>",
                      block_each=True)
GLM = ToolFormat("glm", "", syntax="named", args="glm", call_open="<tool_call>",
                 call_close="</tool_call>")
MINIMAX = ToolFormat("minimax", "", syntax="named", args="minimax",
                     block_open="<minimax:tool_call>", block_close="</minimax:tool_call>",
                     call_open='<invoke name="', name_end='">', call_close="</invoke>")
KIMI_K2 = ToolFormat("kimi_k2", "", syntax="named", block_open="<|tool_calls_section_begin|>",
                     block_close="<|tool_calls_section_end|>", call_open="<|tool_call_begin|>",
                     name_prefix="functions.", id_marker=":",
                     name_end="<|tool_call_argument_begin|>", call_close="<|tool_call_end|>")
DSML = ToolFormat("dsml", "", syntax="named", args="dsml",
                  block_open="<｜DSML｜function_calls>", block_close="</｜DSML｜function_calls>",
                  call_open='<｜DSML｜invoke name="', name_end='">', call_close="</｜DSML｜invoke>")
DSML_V4 = replace(DSML, name="dsml_v4", block_open="<｜DSML｜tool_calls>",
                  block_close="</｜DSML｜tool_calls>")
GEMMA4 = ToolFormat("gemma4", "", syntax="named", args="gemma", call_open="<|tool_call>call:",
                    name_end="{", call_close="<tool_call|>")
HY3 = ToolFormat("hy3", "", syntax="named", args="hy3", block_open="<tool_calls:opensource>",
                block_close="</tool_calls:opensource>", call_open="<tool_call:opensource>",
                name_end="<tool_sep:opensource>", call_close="</tool_call:opensource>")
MINICPM5 = ToolFormat("minicpm5", "", syntax="named", args="minicpm5",
                     call_open='<function name="', name_end='">', call_close="</function>")
MINIMAX_NS = "]<]minimax[>["  # MiniMax M3's namespace token, before each of its tags
MINIMAX_M3 = ToolFormat("minimax_m3", "", syntax="named", args="nested",
                        block_open=MINIMAX_NS + "<tool_call>",
                        block_close=MINIMAX_NS + "</tool_call>",
                        call_open=MINIMAX_NS + '<invoke name="', name_end='">',
                        call_close=MINIMAX_NS + "</invoke>")
FUNCTIONARY_V32 = ToolFormat("functionary_v32", "", syntax="named", call_open=">>>",
                             name_end="\n", prompt_opens=True, text_name="all")
KIMI_K3 = ToolFormat("kimi_k3", "", syntax="named", args="k3",
                     block_open="<|open|>tools<|sep|>", block_close="<|close|>tools<|sep|>",
                     call_open='<|open|>call tool="', name_end='"', name_rest="<|sep|>",
                     call_close="<|close|>call<|sep|>",
                     noise=("<|open|>response<|sep|>", "<|close|>response<|sep|>",
                            "<|close|>message<|sep|>"))
MUSE_GLIMMER = ToolFormat("muse_glimmer", "", syntax="named", args="atem",
                          block_open="<atem:function_calls>",
                          block_close="</atem:function_calls>",
                          call_open='<atem:invoke name="', name_end='">',
                          call_close="</atem:invoke>", noise=("<|eom|>", "<|eot|>"),
                          prompt_opens=True, thought_to="self",
                          messages=("<|eom|>", "<|start|>assistant", "<|message|>"))
SOLAR_OPEN = ToolFormat("solar_open", "", syntax="named", block_open="<|tool_calls|>",
                        call_open="<|tool_call:begin|>", id_marker="<|tool_call:name|>",
                        id_first=True, name_end="<|tool_call:args|>",
                        call_close="<|tool_call:end|>")
HARMONY = ToolFormat("harmony", "", syntax="harmony", max_calls=1)
LFM2 = ToolFormat("lfm2", "<|tool_call_start|>", "<|tool_call_end|>", syntax="python")
FORMATS = {f.name: f for f in (HERMES, GENERIC, LLAMA3, MISTRAL, GRANITE, MISTRAL_ARGS,
                               DEEPSEEK_V3, DEEPSEEK_R1, QWEN3_CODER, SEED_OSS, GLM, MINIMAX,
                               GEMMA4, HARMONY, LFM2, NEMOTRON,
                               FIREFUNCTION, KIMI_K2, DSML, DSML_V4, COMMAND_R, APRIEL,
                               MINIMAX_M1, APERTUS, HY3, MINICPM5, GIGACHAT3,
                               GIGACHAT3_1, SOLAR_OPEN, MINIMAX_M3, FUNCTIONARY_V32,
                               COMMAND_R_PLUS, KIMI_K3, MUSE_GLIMMER)}


# (markers a template writes, all of them, -> its format), tried in order after the
# families that need more than that (see ``detect``)
SIGNS: tuple[tuple[tuple[str, ...], ToolFormat], ...] = (
    (("<tool_sep{}>", ":opensource"), HY3),  # Hunyuan 3 (its markers made by format())
    (("Tool usage guidelines:", '<param name="'), MINICPM5),
    (("<|role_sep|>", "<|message_sep|>", "<|function_call|>"), GIGACHAT3_1),
    (("<|role_sep|>", "<|message_sep|>"), GIGACHAT3),
    (("<|tool_call:begin|>", "<|tool_call:name|>"), SOLAR_OPEN),
    (("<|open|>", "<|close|>", "<|end_of_msg|>"), KIMI_K3),
    (("<atem:function_calls>", "<|eom|>"), MUSE_GLIMMER),
    ((">>>all", ">>>${recipient}"), FUNCTIONARY_V32),
    ((MINIMAX_NS, "<invoke name="), MINIMAX_M3),
    (("<|tool_calls_section_begin|>", "<|tool_call_begin|>"), KIMI_K2),
    (("<|tool_call>call:",), GEMMA4),
    (("<|tool_list_start|>",), LFM2),
    (("List of tools: [",), LFM2),
    (("<seed:tool_call>",), SEED_OSS),
    (("<minimax:tool_call>", "<invoke name="), MINIMAX),
    (("<arg_key>", "<tool_call>"), GLM),
    (("[TOOL_CALLS]", "[ARGS]"), MISTRAL_ARGS),
    (("[TOOL_CALLS]",), MISTRAL),
    (("<|tools_prefix|>",), APERTUS),
    (("<tool_calls>[",), APRIEL),  # (Apriel 1.5's instructions name <tool_call> too)
    (("<tool_calls>",), MINIMAX_M1),
    (("Action:\\n```json", '"tool_name"'), COMMAND_R_PLUS),  # Command R+ (tool_use)
    (("<|START_ACTION|>", '"tool_name"'), COMMAND_R),
    (("<|tool_call|>",), GRANITE),
    (("<TOOLCALL>[",), NEMOTRON),
    (("functools[",), FIREFUNCTION),
    (("<tool_call>", "<function="), QWEN3_CODER),
    (("<tool_call>",), HERMES),
    (("<|python_tag|>",), LLAMA3),
    (('"parameters": ', "ipython"), LLAMA3),
)


def detect(template_source: str) -> ToolFormat:
    """The format a chat template speaks, from the markers it writes; ``GENERIC`` for a
    template without tool support or with a format not covered here."""
    src = template_source
    if "<|channel|>" in src and "<|call|>" in src:
        return HARMONY
    if "｜DSML｜" in src:  # DeepSeek V3.2 (function_calls) / V4 (tool_calls)
        return DSML if "function_calls" in src else DSML_V4
    if "tool▁sep" in src:  # DeepSeek's templates render calls, but not the tools
        return DEEPSEEK_R1 if "```json" in src else DEEPSEEK_V3
    if "tools" not in src:
        return GENERIC
    return next((fmt for signs, fmt in SIGNS if all(m in src for m in signs)), GENERIC)


def choose(setting: str, template_source: str) -> ToolFormat:
    """The format for a model: ``setting`` from models.toml ("auto": detect it)."""
    if setting == "auto":
        return detect(template_source)
    return FORMATS[setting]
