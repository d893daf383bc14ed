"""Lazy grammars' trigger words, found in a stream of token pieces (pure Python)."""

from __future__ import annotations

import re

# What may follow a trigger word within the same token, so that the lazy grammar can take
# it (llama.cpp aborts the process on text its grammar cannot take). After the tool-call
# marker: the start of the call's JSON object (see prompt.grammar.tool_calls_gbnf); after
# any other word (the end of a reasoning block, see prompt.grammar.after_marker): blanks.
SAFE_AFTER = {
    b"<tool_call>": re.compile(rb'\n?(\{[ \t\n]*("(n(a(m(e"?)?)?)?)?)?)?\Z'),
    # a bare call object (Llama 3): the colon and the opening quote of the name
    b'{"name"': re.compile(rb'[ \t\n]*(:[ \t\n]*"?)?\Z'),
    # Command R+: its list of calls opens after the marker
    b"Action:\n```json\n": re.compile(rb"[ \t\n]*(\[[ \t\n]*)?\Z"),
}
BLANKS = re.compile(rb"[ \t\n]*\Z")


def safe_after(word: bytes, after: bytes) -> bool:
    """Whether ``after`` (what followed ``word`` in its token) is safe to show the grammar."""
    return SAFE_AFTER.get(word, BLANKS).match(after) is not None


class TriggerScan:
    """Finds the first of some trigger words in a stream of token pieces, looking only at
    the new bytes (plus a tail as long as the longest word): constant work per token.

    ``feed`` returns, once a word has appeared, the recent tokens from the one holding
    the word's first byte on (what a lazy grammar must be shown), the word, and the
    bytes that follow the word in them; else None.
    """

    def __init__(self, words: tuple[str, ...]) -> None:
        self._words = [w.encode() for w in words if w]
        self._keep = max((len(w) for w in self._words), default=1)
        self._recent: list[tuple[int, bytes]] = []  # tokens whose pieces cover the tail

    def feed(self, token: int, piece: bytes) -> tuple[list[int], bytes, bytes] | None:
        self._recent.append((token, piece))
        tail = b"".join(p for _, p in self._recent)
        hits = [(at, w) for w in self._words if (at := tail.find(w)) != -1]
        if not hits:
            # drop the tokens no later word could start in
            while len(self._recent) > 1 and sum(
                    len(p) for _, p in self._recent[1:]) >= self._keep - 1:
                self._recent.pop(0)
            return None
        start, word = min(hits)
        out, pos = [], 0
        for tok, p in self._recent:
            if pos + len(p) > start:
                out.append(tok)
            pos += len(p)
        return out, word, tail[start + len(word):]
