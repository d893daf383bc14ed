"""llama.cpp's side of grammars: its JSON-schema converter, its GBNF parser, and
grammar samplers.

The prompt layer builds grammars; only this module hands them to llama.cpp. Call
``grammar_parses`` only with a grammar inside the grammar budget
(``edgeinfer.prompt.budget``): llama.cpp's parser can overflow the stack otherwise.
"""

from __future__ import annotations

import ctypes
import json
import re
from functools import lru_cache
from typing import Any

import llama_cpp
from llama_cpp.llama_grammar import PRIMITIVE_RULES, SchemaConverter

from edgeinfer.engine.handles import Sampler, SamplerPtr, VocabPtr


class _Converter(SchemaConverter):
    r"""llama-cpp-python's converter, its string literals escaped as llama.cpp's own
    converter escapes them. Its copy leaves a backslash as it is, so the JSON text of a
    ``const``, an ``enum`` value or a property name holding a quote (``"say \"hi\""``)
    ended the GBNF literal early (a grammar llama.cpp cannot parse), and one holding a
    backslash let the model write it unescaped (``"C:\temp"`` as a tab: another text)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._any: dict[str, str] | None = None  # the bounded any-value's rules, once written
        self._names: list[list[str]] = []  # the properties of the objects being written
        self._visited = False  # (the root is visited first)

    def visit(self, schema: Any, name: str) -> str:
        """(a property named "" of the root object is written under a name of its own:
        its rule took the name ``root``, and the whole answer was that property's value)"""
        if not name and self._visited:
            name = "empty-name"
        self._visited = True
        visited: str = super().visit(schema, name)  # type: ignore[no-untyped-call]
        return visited

    def _build_object_rule(self, properties: list[tuple[str, Any]], *args: Any) -> str:
        """(the names of ``properties`` kept while the object is written: a member beyond
        them must not take one, ``_add_rule``)"""
        self._names.append([name for name, _ in properties])
        try:
            built: str = super()._build_object_rule(properties, *args)
            return built
        finally:
            self._names.pop()

    def _format_literal(self, literal: str) -> str:
        return '"' + _LITERAL_ESCAPE.sub(lambda m: _LITERAL_ESCAPES[m.group(0)], literal) + '"'

    def _add_primitive(self, name: str, rule: Any) -> str:
        """The converter's any-object, any-array and any-value (``{"type": "object"}``
        without properties, an array without items) bounded as records are: at most
        ``ANY_DEPTH`` levels of nesting, ``MAX_EXTRA_MEMBERS`` members or items a level,
        strings and names of at most ``MAX_ANY_CHARS`` characters. The converter's own
        repeat without end, so a small model could run into max_tokens halfway."""
        kind = next((k for k in ("object", "array", "value") if rule is PRIMITIVE_RULES[k]),
                    None)
        if kind is None:
            added: str = super()._add_primitive(name, rule)
            return added
        if self._any is None:
            self._any = self._any_rules()
        return self._any[kind] if name == kind else self._add_rule(name, self._any[kind])

    def _any_rules(self) -> dict[str, str]:
        def primitive(name: str) -> str:
            return self._add_primitive(name, PRIMITIVE_RULES[name])
        primitive("char")
        text = self._add_rule("any-string", f'"\\"" char{{0,{MAX_ANY_CHARS}}} "\\"" space')
        scalar = self._add_rule("any-scalar", " | ".join(
            [text, *map(primitive, ("number", "boolean", "null"))]))
        n, inner, out = MAX_EXTRA_MEMBERS - 1, scalar, {}
        for depth in range(ANY_DEPTH, 0, -1):  # (the innermost level first)
            member = f'{text} ":" space {inner}'
            out = {"object": self._add_rule(f"any-object-{depth}", (
                       f'"{{" space ( {member} ( "," space {member} ){{0,{n}}} )? "}}" space')),
                   "array": self._add_rule(f"any-array-{depth}", (
                       f'"[" space ( {inner} ( "," space {inner} ){{0,{n}}} )? "]" space'))}
            inner = out["value"] = self._add_rule(
                f"any-value-{depth}", f'{out["object"]} | {out["array"]} | {scalar}')
        return out

    def _add_rule(self, name: str, rule: str) -> str:
        """An object's members beyond its properties (``additionalProperties``: zod's
        records) come at most MAX_EXTRA_MEMBERS times, their names at most MAX_KEY_CHARS
        characters long, as arrays and strings are bounded: a small model that keeps
        adding members (or writing a name) would otherwise run into max_tokens and leave
        JSON that does not parse. After an optional property they are optional, and come
        after a comma."""
        if name.endswith("-rest") and _EXTRA_MEMBERS.fullmatch(rule):
            rule = f'( "," space {rule} )?'  # (its copy wrote them with no comma, and
            # always: after an optional property, no JSON could follow; upstream mended)
        if name.endswith("additional-kvs") and rule.endswith(" )*"):
            rule = f"{rule[:-1]}{{0,{MAX_EXTRA_MEMBERS - 1}}}"
        if name.endswith("additional-kv") and rule.startswith("string "):  # their names too,
            # and not those of the properties (a member beyond them took an optional one's
            # name, with another value: {"b": 5} where "b" is a string)
            tail = super()._add_rule(  # type: ignore[no-untyped-call]
                "additional-key-tail", f'{RAW_CHAR}{{0,{MAX_KEY_CHARS}}} "\\""')
            key = super()._add_rule(  # type: ignore[no-untyped-call]
                "additional-key", other_names(self._names[-1] if self._names else [], tail))
            rule = f"{key}{rule[len('string'):]}"
        added: str = super()._add_rule(name, rule)  # type: ignore[no-untyped-call]
        return added


MAX_EXTRA_MEMBERS = 10
MAX_KEY_CHARS = 100
ANY_DEPTH = 4  # nesting of an any-value's objects and arrays (json_object mode's too)
MAX_ANY_CHARS = 200  # an any-value's strings (a string without maxLength's bound too)


def other_names(names: list[str], tail: str) -> str:
    """GBNF for a JSON string (an object member's name) that is none of ``names``: raw
    characters only (an escape could spell a name: ``"\\u0062"`` is ``"b"``), at most
    ``MAX_KEY_CHARS`` past the names' longest; a trie of the names, where each level
    either ends the string (unless a name ends there), takes a name's next character, or
    another character and then ``tail`` (a rule: any characters and the closing quote;
    written once, it keeps the grammar small). A name holding a character JSON escapes
    cannot be written raw, so it needs no exclusion."""
    raw = RAW_CHAR[:-1]
    trie: dict[str, Any] = {}
    for name in names:
        if all(ch >= " " and ch not in '"\\\x7f' for ch in name):
            node = trie
            for ch in name:
                node = node.setdefault(ch, {})
            node[""] = {}  # (a name ends here)

    def level(node: dict[str, Any]) -> str:
        kids = sorted(ch for ch in node if ch)
        alts = [] if "" in node else ['"\\""']
        alts += [f"[{gbnf_code(ord(ch))}] {level(node[ch])}" for ch in kids]
        alts.append(f'{raw}{"".join(gbnf_code(ord(ch)) for ch in kids)}] {tail}')
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"
    return f'"\\"" {level(trie)} space'


def gbnf_code(cp: int) -> str:
    """A character by its code, as GBNF (and the converter's regexes) take it in and out
    of classes."""
    return f"\\x{cp:02X}" if cp < 0x100 else f"\\u{cp:04X}" if cp < 0x10000 else \
        f"\\U{cp:08X}"


JSON_ESCAPED_ONLY = '"\\\\\\x7F\\x00-\\x1F'  # inside [^...]: what a raw JSON string char is not
RAW_CHAR = f"[^{JSON_ESCAPED_ONLY}]"  # a character a JSON string holds raw
_EXTRA_MEMBERS = re.compile(r"[A-Za-z0-9-]*additional-kvs[0-9]*")
_LITERAL_ESCAPE = re.compile(r'[\r\n"\\]')
_LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}


def json_schema_to_gbnf(schema_json: str, prop_order: list[str]) -> str:
    """llama-cpp-python's converter (``llama_grammar.json_schema_to_gbnf``, with the
    literal escaping above): JSON schema text -> GBNF (root rule ``root``)."""
    make: Any = _Converter  # (llama-cpp-python's converter has no type annotations)
    converter = make(prop_order={name: i for i, name in enumerate(prop_order)},
                     allow_fetch=False, dotall=False, raw_pattern=False)
    converter.visit(converter.resolve_refs(json.loads(schema_json), "stdin"), "")
    gbnf: str = converter.format_grammar()
    return gbnf


def grammar_sampler(vocab: VocabPtr, gbnf: str, triggers: tuple[str, ...] = ()) -> Sampler:
    """A llama.cpp grammar sampler (lazy when trigger words are given), owned by the
    returned ``Sampler``; ValueError if llama.cpp cannot parse the grammar.

    A lazy grammar lets the model write freely until a trigger word appears;
    from the word on, the output follows the grammar.
    """
    smpl: SamplerPtr | None
    if not triggers:
        smpl = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    else:
        patterns = [r"[\s\S]*?(" + re.escape(t) + r")[\s\S]*" for t in triggers]
        pats = (ctypes.c_char_p * len(patterns))(*(p.encode() for p in patterns))
        smpl = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
            vocab, gbnf.encode(), b"root", pats, len(triggers), None, 0)
    return Sampler(smpl, ValueError("llama.cpp cannot parse the grammar"))


@lru_cache(maxsize=256)
def grammar_parses(vocab: VocabPtr, gbnf: str) -> bool:
    """Whether llama.cpp accepts ``gbnf`` (it returns a null sampler for one it cannot
    parse); the sampler made to find out is freed at once."""
    try:
        grammar_sampler(vocab, gbnf).close()
    except ValueError:
        return False
    return True
