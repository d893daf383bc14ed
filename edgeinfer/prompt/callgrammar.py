"""GBNF of tool calls in any format's own syntax (``edgeinfer.prompt.toolformat``).

JSON formats come from ``grammar.tool_calls_gbnf``; this module adds the named formats
(the function name outside the arguments: Mistral ``[ARGS]``, DeepSeek's tokens,
Qwen3-Coder's XML parameters, Gemma 4's ``call:NAME{...}``) and gpt-oss's Harmony
commentary messages. Arguments follow the tool's JSON schema: as JSON where the format
writes JSON, parameter by parameter (required ones in schema order, optional ones
optional) where it does not. Every grammar starts with the format's trigger word, as
a lazy grammar must.
"""

from __future__ import annotations

import json
from typing import Any

from edgeinfer.prompt.grammar import _rename_rules, lit, schema_to_gbnf
from edgeinfer.prompt.grammar import tool_calls_gbnf as json_calls_gbnf
from edgeinfer.prompt.toolformat import GENERIC, MINIMAX_NS, TAGS, Tags, ToolFormat

MAX_NESTING = 4  # M3's objects and lists nested this deep as elements, deeper as JSON
HARMONY_CALL = "<|channel|>commentary to=functions."
HARMONY_ARGS = " <|constrain|>json<|message|>"
# text values of the XML and Gemma formats: no "<" (it would start a closing marker)
_TEXT = '[^<]{{{lo},{hi}}}'
_GEMMA_VALUE = r'''g-val ::= g-str | g-num | ("true" | "false" | "null") | g-obj | g-arr
g-str ::= "<|\"|>" [^<]{0,200} "<|\"|>"
g-num ::= "-"? [0-9]{1,16} ("." [0-9]{1,16})?
g-obj ::= "{" (g-key ":" g-val ("," g-key ":" g-val){0,16})? "}"
g-arr ::= "[" (g-val ("," g-val){0,16})? "]"
g-key ::= [a-zA-Z_] [a-zA-Z0-9_]{0,63}
'''


def _text_rule(prop: dict[str, Any]) -> str:
    lo = int(prop.get("minLength", 0) or 0)
    hi = int(prop.get("maxLength", 200) or 200)
    return _TEXT.format(lo=min(lo, hi), hi=hi)


def _is_text(prop: dict[str, Any]) -> bool:
    return prop.get("type") == "string" and not {"enum", "const", "pattern", "format"} & set(prop)


def _with_defs(prop: Any, parameters: dict[str, Any]) -> dict[str, Any]:
    """One parameter's schema (``{}`` for a boolean one), with the definitions of the whole
    parameters schema its ``$ref`` may point into."""
    prop = prop if isinstance(prop, dict) else {}
    defs: dict[str, Any] = {k: parameters[k] for k in ("$defs", "definitions") if k in parameters}
    return {**prop, **defs} if defs and "$ref" in json.dumps(prop) else prop


def _string_enum(prop: dict[str, Any]) -> bool:
    return prop.get("type") == "string" and isinstance(prop.get("enum"), list) and all(
        isinstance(v, str) for v in prop["enum"])


def _value(prefix: str, prop: dict[str, Any], param: str, gemma: bool) -> tuple[str, str]:
    """(expression, rules) of one parameter's value."""
    if _is_text(prop):
        text = _text_rule(prop)
        return (f'"<|\\"|>" {text} "<|\\"|>"' if gemma else text), ""
    if _string_enum(prop):
        alts = " | ".join(lit(v) for v in prop["enum"])
        return (f'"<|\\"|>" ({alts}) "<|\\"|>"' if gemma else f"({alts})"), ""
    if gemma and prop.get("type") not in ("integer", "number", "boolean", "null"):
        return "g-val", ""  # objects and lists in Gemma's own syntax
    rules = _rename_rules(schema_to_gbnf(prop, param), prefix)
    return f"{prefix}root", rules


def _sequence(items: list[tuple[str, bool]], prefix: str, sep: str) -> list[str]:
    """Rules for ``items`` (expression, required) in order, optional ones optional,
    separated by ``sep``: ``{prefix}start`` is the whole sequence."""
    rules = []
    k = len(items)
    rules.append(f'{prefix}start{k} ::= ""')
    rules.append(f'{prefix}rest{k} ::= ""')
    for i in range(k - 1, -1, -1):
        expr, required = items[i]
        follow = f" {lit(sep)}" if sep else ""
        if required:
            rules.append(f"{prefix}rest{i} ::={follow} {expr} {prefix}rest{i + 1}")
            rules.append(f"{prefix}start{i} ::= {expr} {prefix}rest{i + 1}")
        else:
            rules.append(f"{prefix}rest{i} ::= ({follow} {expr})? {prefix}rest{i + 1}")
            rules.append(f"{prefix}start{i} ::= {expr} {prefix}rest{i + 1} | {prefix}start{i + 1}")
    rules.append(f"{prefix}start ::= {prefix}start0")
    return rules


def _params(prefix: str, parameters: dict[str, Any], param: str, args: str) -> list[str]:
    """Rules of the parameters of one call (``{prefix}start``)."""
    gemma = args == "gemma"
    props = parameters.get("properties") or {}
    required = set(parameters.get("required") or [])
    names = sorted(props) if gemma else list(props)  # Gemma's template sorts the keys
    items, rules = [], []
    for j, key in enumerate(names):
        prop = _with_defs(props[key], parameters)
        if args == "k3" and prop.get("type") == "string":  # Kimi K3 writes any string raw,
            # type="string" (a pattern's or format's text is not checked; a const is kept)
            const = prop.get("const")
            prop = {k: v for k, v in prop.items() if k not in ("pattern", "format", "const")}
            if isinstance(const, str):
                prop["enum"] = [const]
        expr, more = _value(f"{prefix}v{j}-", prop, param, gemma)
        rules.append(more)
        if gemma:
            items.append((f"{lit(key + ':')} {expr}", key in required))
        else:
            # DSML's string="true": a value written as raw text (the others, quoted
            # strings of a pattern or format included, are JSON: string="false")
            text = _is_text(prop) or _string_enum(prop)
            if TAGS[args].cdata and _is_text(prop):  # MiniCPM5: text with "<" in CDATA
                inner = _text_rule(prop).replace("<", "\\]")  # no "]" inside
                expr = f'({expr} | "<![CDATA[" {inner} "]]>")'
            items.append((_tagged(TAGS[args], key, expr, text), key in required))
    return _sequence(items, prefix, "," if gemma else "") + [r for r in rules if r]


def _nested(prefix: str, parameters: dict[str, Any], param: str, depth: int) -> list[str]:
    """Rules of an object's members as MiniMax M3's elements (``{prefix}start``): required
    ones in schema order, optional ones optional, objects and lists nested."""
    props = parameters.get("properties") or {}
    required = set(parameters.get("required") or [])
    items, rules = [], []
    for j, key in enumerate(props):
        prop = _with_defs(props[key], parameters)
        expr, more = _nested_value(f"{prefix}v{j}-", prop, param, depth)
        rules += more
        items.append((f"{lit(f'{MINIMAX_NS}<{key}>')} {expr} {lit(f'{MINIMAX_NS}</{key}>')}",
                      key in required))
    return _sequence(items, prefix, "") + rules


def _nested_value(prefix: str, prop: dict[str, Any], param: str, depth: int
                  ) -> tuple[str, list[str]]:
    """(expression, rules) of one MiniMax M3 value: an object with properties as its
    elements, a list as ``item`` elements (a few levels deep), anything else as text or
    JSON like the other tagged formats."""
    kind, items = prop.get("type"), prop.get("items")
    if depth < MAX_NESTING and kind == "object" and isinstance(prop.get("properties"), dict) \
            and prop["properties"]:
        return f"{prefix}start", _nested(prefix, prop, param, depth + 1)
    if depth < MAX_NESTING and kind == "array" and isinstance(items, dict):
        item_schema = _with_defs(items, prop)
        if _is_text(item_schema):  # an empty item reads as null (the template writes a
            # null item empty): a text item has a character at least
            shortest = item_schema.get("minLength")
            item_schema = {**item_schema, "minLength": max(
                1, shortest if isinstance(shortest, int) else 0)}
        item, more = _nested_value(f"{prefix}i-", item_schema, param, depth + 1)
        top, least = prop.get("maxItems"), prop.get("minItems")
        hi = max(0, min(top, 16)) if isinstance(top, int) else 16
        lo = max(0, min(least, hi)) if isinstance(least, int) else 0
        tag = f"{lit(f'{MINIMAX_NS}<item>')} {item} {lit(f'{MINIMAX_NS}</item>')}"
        return f"({tag}){{{lo},{hi}}}", more
    expr, rules = _value(prefix, prop, param, False)
    return expr, [rules] if rules else []


def _tagged(tags: Tags, key: str, expr: str, text: bool = True) -> str:
    """One tagged parameter: Qwen3-Coder's values on lines of their own, the others'
    inline, with the optional line breaks their templates write between the tags
    (``text``: a string parameter, which DeepSeek's DSML marks ``string="true"``)."""
    # DSML's string="false", Kimi K3's type="number" ...: a value that is not text
    closes = tags.key_close_others if not text and tags.key_close_others else (tags.key_close,)
    if len(closes) > 1:
        alts = " | ".join(lit(c) for c in closes)
        return f'"\\n"? {lit(tags.key_open + key)} ({alts}) {expr} {lit(tags.value_close)}'
    close = closes[0]
    if tags.newlines:
        return (f"{lit(tags.key_open + key + close + chr(10))} {expr} "
                f"{lit(chr(10) + tags.value_close + chr(10))}")
    value_open = f' "\\n"? {lit(tags.value_open)}' if tags.value_open else ""
    return (f'"\\n"? {lit(tags.key_open + key + close)}{value_open} {expr} '
            f"{lit(tags.value_close)}")


def _call(i: int, name: str, parameters: dict[str, Any], fmt: ToolFormat, param: str
          ) -> list[str]:
    """Rules of one tool's call after the format's ``call_open`` (``t{i}-call``)."""
    p = f"t{i}-"
    if fmt.args == "json":
        args = _rename_rules(schema_to_gbnf(parameters, param), p)
        name = fmt.name_prefix + name
        if fmt.id_length:  # Mistral Small 3.2 may write a call id before the arguments
            named = (f"{lit(name)} ({lit(fmt.id_marker)} [a-zA-Z0-9]{{{fmt.id_length}}})? "
                     f"{lit(fmt.name_end)}")
            return [f"{p}call ::= {named} {p}root", args]
        if fmt.id_marker and not fmt.id_first:  # Kimi K2: the call's index, always
            named = f"{lit(name + fmt.id_marker)} [0-9]{{1,3}} {lit(fmt.name_end)}"
            return [f"{p}call ::= {named} {p}root", args]
        return [f"{p}call ::= {lit(name + fmt.name_end)} {p}root", args]
    if fmt.args == "nested":  # MiniMax M3: the first element right after the name
        return [f"{p}call ::= {lit(name + fmt.name_end)} {p}start",
                *_nested(p, parameters, param, 0)]
    rules = _params(p, parameters, param, fmt.args)
    if fmt.args == "gemma":
        body = f'{p}start "}}"'  # Gemma: name_end is the "{"
    elif TAGS[fmt.args].newlines:
        body = f'"\\n" {p}start'
    else:  # Ling writes a line break after the name and another before the close
        body = f'{p}start "\\n"{{0,2}}'
    head = lit(name + fmt.name_end)
    if fmt.name_rest:  # Kimi K3: the call's index, then the end of its header
        head += f' (" index=\\"" [1-9] [0-9]{{0,2}} "\\"")? {lit(fmt.name_rest)}'
    return [f"{p}call ::= {head} {body}", *rules]


def named_calls_gbnf(tools: list[tuple[str, dict[str, Any]]], max_calls: int,
                     fmt: ToolFormat, param: str = "tools", lazy: bool = False) -> str:
    """One to ``max_calls`` calls of ``tools`` in a named format. ``lazy``: a format with
    a block around its calls may also be started by a call without the block (a model
    that leaves out ``<tool_call>`` before ``<function=``): both are trigger words."""
    n = max(1, min(max_calls, fmt.max_calls))
    rules: list[str] = []
    for i, (name, parameters) in enumerate(tools):
        rules += _call(i, name, parameters, fmt, param)
    alts = " | ".join(f"t{i}-call" for i in range(len(tools)))
    close = f" {lit(fmt.call_close)}" if fmt.call_close else ""
    call_id = f' [a-zA-Z0-9_-]{{1,40}} {lit(fmt.id_marker)}' if fmt.id_first else ""
    rules.append(f"inner ::= {lit(fmt.call_open)}{call_id} ({alts}){close}")
    bare = f'inner ("\\n"? inner){{0,{n - 1}}}'
    if fmt.messages:  # Muse Glimmer: each call a message to its tool, headed " to=NAME"
        end, head_open = fmt.messages[:2]
        rules.append("head ::= " + " | ".join(lit(fmt.header(name)) for name, _ in tools))
        rules.append(f'call ::= {lit(fmt.block_open)} "\\n"? inner "\\n"? '
                     f"{lit(fmt.block_close)}")
        more = f"({lit(end + head_open)} head call){{0,{n - 1}}}"
        # (the prompt opened the first message; a lazy grammar starts at a tool's header,
        # a forced one may first write a message of reasoning, to ``thought_to``)
        first = "" if fmt.prompt_opens or lazy else f"{lit(end + head_open)} "
        if fmt.thought_to and not lazy:
            rules.append(f"thought ::= {lit(fmt.header(fmt.thought_to))} "
                         f'([^<] | "<" [^|])* {lit(end + head_open)}')
            first += "thought? "
        calls = f"{first}head call {more}"
    elif fmt.block_each:  # Qwen3-Coder, Seed-OSS: each call in its own block
        rules.append(f"call ::= {lit(fmt.block_open + chr(10))} inner "
                     f"{lit(chr(10) + fmt.block_close)}")
        calls = f'call ("\\n"? call){{0,{n - 1}}}'
    elif fmt.block_open:  # DeepSeek, MiniMax: line breaks as their templates write them
        calls = f'{lit(fmt.block_open)} "\\n"? {bare} "\\n"? {lit(fmt.block_close)}'
    else:
        calls = bare  # GLM 4.6: a line break before each call
    if fmt.prompt_opens and not fmt.messages and not lazy:  # Functionary: the prompt wrote
        # the first ">>>"
        rules.append(f"first ::= ({alts}){close}")
        calls = f"first inner{{0,{n - 1}}}"
    if fmt.noise and fmt.name_rest and not lazy:  # Kimi K3: the template's empty answer
        # before the calls
        calls = f"{lit(fmt.noise[0] + fmt.noise[1])}? {calls}"
    if lazy and len(fmt.triggers) > 1 and not fmt.messages:
        calls = f"({calls}) | {bare}"
    extra = _GEMMA_VALUE if fmt.args == "gemma" else ""
    return "\n".join([f"root ::= {calls}", *rules]) + "\n" + extra


def python_calls_gbnf(tools: list[tuple[str, dict[str, Any]]], max_calls: int,
                      fmt: ToolFormat, param: str = "tools") -> str:
    """One to ``max_calls`` LFM2 calls: ``<|tool_call_start|>[NAME(key=VALUE, ...), ...]
    <|tool_call_end|>``, each value JSON (strings and numbers as Python writes them too)."""
    n = max(1, min(max_calls, fmt.max_calls))
    rules = []
    for i, (name, parameters) in enumerate(tools):
        p = f"t{i}-"
        props = parameters.get("properties") or {}
        required = set(parameters.get("required") or [])
        items = []
        for j, key in enumerate(props):
            schema = _with_defs(props[key], parameters)
            rules.append(_rename_rules(schema_to_gbnf(schema, param), f"{p}v{j}-"))
            items.append((f"{lit(key + '=')} {p}v{j}-root", key in required))
        rules += _sequence(items, p, ", ")
        rules.append(f'{p}call ::= {lit(name + "(")} {p}start ")"')
    alts = " | ".join(f"t{i}-call" for i in range(len(tools)))
    root = (f'root ::= {lit(fmt.open + "[")} call (", " call){{0,{n - 1}}} '
            f'{lit("]" + fmt.close)}')
    return "\n".join([root, f"call ::= {alts}", *rules]) + "\n"


def harmony_gbnf(tools: list[tuple[str, dict[str, Any]]], param: str = "tools") -> str:
    """One gpt-oss call: ``<|channel|>commentary to=functions.NAME <|constrain|>json
    <|message|>{...}`` (``<|call|>``, an end-of-generation token, follows)."""
    rules = []
    for i, (name, parameters) in enumerate(tools):
        rules.append(f"t{i}-call ::= {lit(name + HARMONY_ARGS)} t{i}-root")
        rules.append(_rename_rules(schema_to_gbnf(parameters, param), f"t{i}-"))
    alts = " | ".join(f"t{i}-call" for i in range(len(tools)))
    return "\n".join([f"root ::= {lit(HARMONY_CALL)} ({alts})", *rules]) + "\n"


def tool_calls_gbnf(tools: list[tuple[str, dict[str, Any]]], max_calls: int,
                    param: str = "tools", fmt: ToolFormat = GENERIC, lazy: bool = False) -> str:
    """GBNF of one to ``max_calls`` calls of ``tools`` in ``fmt``'s own syntax. ``lazy``:
    for a grammar started by ``fmt.trigger``, which it must then begin with."""
    if fmt.syntax == "named":
        return named_calls_gbnf(tools, max_calls, fmt, param, lazy)
    if fmt.syntax == "harmony":
        return harmony_gbnf(tools, param)
    if fmt.syntax == "python":
        return python_calls_gbnf(tools, max_calls, fmt, param)
    return json_calls_gbnf(tools, max_calls, param, fmt, lazy)
