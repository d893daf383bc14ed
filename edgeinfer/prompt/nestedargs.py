"""MiniMax M3's call arguments: parameters as elements, objects and lists nested.

Each tag follows the namespace token ``]<]minimax[>[`` (``NS``)::

    NS<city>Paris NS</city> NS<opts> NS<unit>c NS</unit> NS<list> NS<item>1 NS</item>
    NS<item>x NS</item> NS</list> NS</opts>

(without the blanks) becomes ``{"city": "Paris", "opts": {"unit": "c", "list": [1, "x"]}}``.
Values are typed by the tool's JSON schema, level by level, as llama.cpp reads them: a
value that may be a string is the text as written (the whole element's text, tags and
all, where the schema also allows structure), an array's children are its items and an
object's its members (an empty element: ``[]`` / ``{}``), anything else JSON (or a Python
literal) when it parses. Where the schema says nothing, an element of ``item`` children
is a list, one of other children an object, and a leaf JSON when it parses, else text.
The template leaves out null parameters and writes a null item empty. The arguments
stream a member at a time, each once its element closes; reading stops at what is not
such elements (text beside them, mismatched tags, nesting past ``MAX_DEPTH``), and at the
call's end the members read so far are the arguments (an unclosed element is left out).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from edgeinfer.prompt.toolformat import MINIMAX_NS
from edgeinfer.prompt.xmlargs import json_value

NS = MINIMAX_NS
MAX_DEPTH = 16
_TAG = re.compile(re.escape(NS) + r"<(/?)([^<>/\s][^<>]{0,255})>")


@dataclass(slots=True)
class _Element:
    tag: str
    text: str  # everything between its tags
    children: list[_Element]


class NestedArgs:
    """``ArgsReader`` (``edgeinfer.prompt.namedcalls``) of MiniMax M3's parameters."""

    def __init__(self, types: dict[str, str], end: str,
                 schema: dict[str, Any] | None = None) -> None:
        self.types = types  # the top level's plain types, where no schema was given
        self.schema = schema if isinstance(schema, dict) else {}
        self.end = end  # the call's end (``NS</invoke>``), left for the call parser
        self._scanned = 0  # the end is not in the buffer before this
        self._sent = False  # a member was passed on
        self._bad = False  # what follows cannot be members: read no more
        self._blank = True  # nothing but blanks after the members passed on
        self._stack: list[list[Any]] = []  # open elements scanned: [tag, has children]
        self._pos = 0  # where the scan of the buffer resumes (after its last whole tag)

    def feed(self, buf: str) -> tuple[str, int, bool]:
        at = buf.find(self.end, self._scanned)
        region = buf if at == -1 else buf[:at]
        if at == -1:  # (the end may start in the last characters)
            self._scanned = max(0, len(buf) - len(self.end) + 1)
        cut = 0 if self._bad else self._closed(region)
        out = self._members(region[:cut]) if cut else ""
        self._scanned = max(0, self._scanned - cut)
        self._pos -= cut  # (the scan resumes where it stopped)
        self._blank = not region[cut:].strip()
        if at == -1:
            return out, cut, False
        self._blank = True  # the call's end: the members read are the arguments
        return out + self.finish(), at, True

    def finish(self) -> str:
        """The object's end: after whole members (the call's end, or the output's after
        them); cut inside a member, nothing (the arguments stay unfinished)."""
        if not (self._blank or self._bad):
            return ""
        self._blank = False  # (once)
        return "}" if self._sent else "{}"

    def _closed(self, text: str) -> int:
        """Where the last whole top-level element of ``text`` ends (0: none yet); at what
        cannot be elements (see ``_elements``), reading stops for good (``_bad``)."""
        stack, pos, cut = self._stack, self._pos, 0  # (resumed: each tag is scanned once)
        for m in _TAG.finditer(text, pos):
            between = text[pos:m.start()].strip()
            if m.group(1):  # a closing tag: of the innermost open element, no text after
                # its children
                if not stack or m.group(2) != stack[-1][0] or stack[-1][1] and between:
                    self._bad = True
                    return cut
                stack.pop()
            else:  # no text beside an element, and not too deep
                if between or len(stack) >= MAX_DEPTH:
                    self._bad = True
                    return cut
                if stack:
                    stack[-1][1] = True
                stack.append([m.group(2), False])
            pos = m.end()
            if not stack:
                cut = pos
        self._pos = pos
        return cut

    def _members(self, text: str) -> str:
        """JSON text of the whole members in ``text``, typed by the schema."""
        props = self.schema.get("properties")
        props = props if isinstance(props, dict) else {}
        out = []
        for e in _elements(text):
            schema = props.get(e.tag)
            value = _typed(e, schema) if isinstance(schema, dict) else _typed(
                e, None, self.types.get(e.tag))
            out.append(("{" if not self._sent else ", ") + json.dumps(e.tag, ensure_ascii=False)
                       + ": " + json.dumps(value, ensure_ascii=False))
            self._sent = True
        return "".join(out)


def _elements(text: str) -> list[_Element]:
    """The top-level elements ``text`` is made of (ValueError: it is not elements)."""
    top = _Element("", text, [])
    stack: list[tuple[_Element, int]] = [(top, 0)]  # open elements, where their text starts
    pos = 0
    for m in _TAG.finditer(text):
        element, start = stack[-1]
        between = text[pos:m.start()]
        if m.group(1):  # a closing tag: of the innermost open element, else not elements
            if len(stack) == 1 or m.group(2) != element.tag:
                raise ValueError("a closing tag of no open element")
            if element.children and between.strip():
                raise ValueError("text after an element's children")
            element.text = text[start:m.start()]
            stack.pop()
        else:
            if between.strip():
                raise ValueError("text beside an element")
            if len(stack) > MAX_DEPTH:
                raise ValueError("parameters nested too deep")
            child = _Element(m.group(2), "", [])
            element.children.append(child)
            stack.append((child, m.end()))
        pos = m.end()
    if len(stack) > 1 or text[pos:].strip():
        raise ValueError("an unclosed element, or text after the parameters")
    return top.children


def _types(schema: dict[str, Any]) -> set[str]:
    """The JSON types a schema allows (empty: not said), unions included."""
    kind = schema.get("type")
    found = {kind} if isinstance(kind, str) else {k for k in kind if isinstance(k, str)} if (
        isinstance(kind, list)) else set()
    for key in ("anyOf", "oneOf"):
        for alt in schema.get(key) or ():
            if isinstance(alt, dict):
                found |= _types(alt) or {"any"}
    enum = schema.get("enum")
    values = enum if isinstance(enum, list) else [schema["const"]] if "const" in schema else []
    found |= {"string" if isinstance(v, str) else "other" for v in values}
    return found


def _typed(e: _Element, schema: dict[str, Any] | None, kind: str | None = None,
           in_list: bool = False) -> Any:
    """An element's value, by its schema (None: guessed; ``kind``: a plain type known)."""
    if schema is not None:
        types = _types(schema)
        if "string" in types or "any" in types:
            return e.text  # a string (or possibly one): as written
        if "array" in types and (e.children or not e.text.strip()):
            items = schema.get("items")
            return [_typed(c, items if isinstance(items, dict) else None, in_list=True)
                    for c in e.children]
        if "object" in types and (e.children or not e.text.strip()):
            props = schema.get("properties")
            props = props if isinstance(props, dict) else {}
            return {c.tag: _typed(c, props.get(c.tag) if isinstance(props.get(c.tag), dict)
                                  else None) for c in e.children}
        if e.children:
            return _guessed(e)
        kind = next(iter(types)) if len(types) == 1 else None
    if e.children:
        return _guessed(e)
    if not e.text and in_list:
        return None  # the template writes a null item as an empty one
    return json.loads(json_value(e.text, kind))


def _guessed(e: _Element) -> Any:
    """Children without a schema: ``item`` children a list, others an object."""
    if all(c.tag == "item" for c in e.children):
        return [_typed(c, None, in_list=True) for c in e.children]
    return {c.tag: _typed(c, None) for c in e.children}
