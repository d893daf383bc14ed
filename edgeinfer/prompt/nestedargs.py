"""MiniMax M3's call arguments: parameters as elements, objects and lists nested.

Each tag follows the namespace token ``]<]minimax[>[`` (``NS``)::

    NS<city>Paris NS</city> NS<opts> NS<unit>c NS</unit> NS<list> NS<item>1 NS</item>
    NS<item>x NS</item> NS</list> NS</opts>

(without the blanks) becomes ``{"city": "Paris", "opts": {"unit": "c", "list": [1, "x"]}}``.
An element whose children are all ``item`` is a list, one with other children an object;
a leaf is typed by its parameter's type at the top (``xmlargs.json_value``), below it as
JSON (or a Python literal) when it parses, else as text. The template leaves out
parameters that are null and writes a null item as an empty one. The arguments are read
whole, once the call's end is written (they are not streamed).
"""

from __future__ import annotations

import json
from typing import Any

from edgeinfer.prompt.xmlargs import json_value

NS = "]<]minimax[>["
MAX_DEPTH = 16


class NestedArgs:
    """``ArgsReader`` (``edgeinfer.prompt.namedcalls``) of MiniMax M3's parameters."""

    def __init__(self, types: dict[str, str], end: str) -> None:
        self.types = types
        self.end = end  # the call's end (``NS</invoke>``), left for the call parser

    def feed(self, buf: str) -> tuple[str, int, bool]:
        at = buf.find(self.end)
        if at == -1:
            return "", 0, False
        members = _children(buf[:at], 0)
        if members is None:  # text, not parameters: a call without arguments
            if buf[:at].strip():
                raise ValueError("not parameters")
            members = []
        args = {key: _typed(text_or_children, self.types.get(key), top=True)
                for key, text_or_children in members}
        return json.dumps(args, ensure_ascii=False), at, True

    def finish(self) -> str:
        return ""  # cut before the call's end: the arguments stay unfinished


Node = str | list[tuple[str, Any]]  # a leaf's text, or (tag, node) children


def _children(text: str, depth: int) -> list[tuple[str, Node]] | None:
    """The elements ``text`` is made of (None: it is a leaf's text)."""
    if depth > MAX_DEPTH:
        raise ValueError("parameters nested too deep")
    rest = text.strip(" \t\r\n")
    if not rest.startswith(NS + "<") or rest.startswith(NS + "</"):
        return None
    out: list[tuple[str, Node]] = []
    while rest:
        if not rest.startswith(NS + "<"):
            raise ValueError("text between parameters")
        close_at = rest.find(">", len(NS) + 1)
        tag = rest[len(NS) + 1:close_at] if close_at != -1 else ""
        if not tag or tag.startswith("/") or "<" in tag or len(tag) > 256:
            raise ValueError("bad parameter tag")
        body_start = close_at + 1
        end = _matching_close(rest, tag, body_start)
        body = rest[body_start:end]
        inner = _children(body, depth + 1)
        out.append((tag, body if inner is None else inner))
        rest = rest[end + len(f"{NS}</{tag}>"):].lstrip(" \t\r\n")
    return out


def _matching_close(text: str, tag: str, start: int) -> int:
    """Where the element opened before ``start`` closes (elements of the same tag may
    nest inside it)."""
    opening, closing = f"{NS}<{tag}>", f"{NS}</{tag}>"
    depth, i = 1, start
    while True:
        close = text.find(closing, i)
        if close == -1:
            raise ValueError(f"parameter {tag!r} is not closed")
        nested = text.find(opening, i, close)
        if nested != -1:
            depth, i = depth + 1, nested + len(opening)
            continue
        depth -= 1
        if depth == 0:
            return close
        i = close + len(closing)


def _typed(node: Node, kind: str | None, top: bool = False, in_list: bool = False) -> Any:
    if isinstance(node, str):
        if not node and in_list:
            return None  # the template writes a null item as an empty one
        return json.loads(json_value(node, kind if top else None))
    if node and all(tag == "item" for tag, _ in node):
        return [_typed(child, None, in_list=True) for _, child in node]
    return {tag: _typed(child, None) for tag, child in node}
