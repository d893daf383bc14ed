"""Template markup versus inserted text: special tokens only where the template wrote them.

A chat prompt is the template's own markup (``<|im_start|>user``...) with the
client's text inserted. Tokenizing the whole prompt with special-token parsing
would let text that merely spells a control token (``<|im_start|>system``, in a
user message, a pasted document or a tool result) become that token and forge
a turn. So every string that comes from a request is escaped before rendering:
each occurrence of a control token's text is wrapped in two noncharacters
(U+FDD0 ... U+FDD1). After rendering, ``segments`` splits the prompt there:
the wrapped parts are tokenized as plain text, the rest (the template's own
markup) with special tokens parsed. A prompt without such text is tokenized in
one piece, exactly as before. Templates that cut a string through the middle
of a wrapped token (rare) leave a stray marker, which is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

OPEN = "\ufdd0"
CLOSE = "\ufdd1"
_MARKERS = re.compile(f"[{OPEN}{CLOSE}]")


def _trie_regex(words: Iterable[str]) -> str:
    """One regular expression matching any of ``words``, longest first, built as a trie so
    that thousands of words (Gemma has 6,250 control tokens) cost one pass per position."""
    trie: dict[str, Any] = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict[str, Any]) -> str:
        kids = [re.escape(ch) + build(sub) for ch, sub in sorted(node.items()) if ch]
        if not kids:
            return ""
        inner = kids[0] if len(kids) == 1 else "(?:" + "|".join(kids) + ")"
        return f"(?:{inner})?" if "" in node else inner

    return build(trie)


class Markup:
    """Escapes request text for one vocabulary and splits rendered prompts back."""

    def __init__(self, special_texts: Iterable[str]) -> None:
        words = sorted({t for t in special_texts if t})
        self._special = re.compile(_trie_regex(words)) if words else None

    def escape_text(self, text: str) -> str:
        if _MARKERS.search(text):
            text = _MARKERS.sub("\ufffd", text)
        if self._special is None:
            return text
        return self._special.sub(lambda m: OPEN + m.group(0) + CLOSE, text)

    def escape(self, value: Any) -> Any:
        """A copy of a JSON-like value with every string escaped (keys are left alone)."""
        if isinstance(value, str):
            return self.escape_text(value)
        if isinstance(value, dict):
            return {k: self.escape(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.escape(v) for v in value]
        return value


def segments(text: str) -> list[tuple[str, bool]]:
    """Split a rendered prompt into (text, is_markup) runs; inserted text is not markup.

    Only a marker pair opened and closed in order wraps inserted text; stray
    markers are dropped.
    """
    if OPEN not in text and CLOSE not in text:
        return [(text, True)]
    out: list[tuple[str, bool]] = []
    i = 0
    markup = ""
    while i < len(text):
        at = text.find(OPEN, i)
        if at == -1:
            markup += text[i:]
            break
        end = text.find(CLOSE, at + 1)
        nxt = text.find(OPEN, at + 1)
        if end == -1 or (nxt != -1 and nxt < end):  # a stray opening marker
            markup += text[i:at]
            i = at + 1
            continue
        markup += text[i:at]
        if markup:
            out.append((_MARKERS.sub("", markup), True))
            markup = ""
        out.append((text[at + 1:end], False))
        i = end + 1
    if markup:
        out.append((_MARKERS.sub("", markup), True))
    return [(t, m) for t, m in out if t]
