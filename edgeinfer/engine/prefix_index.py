"""A token-level radix tree of what the KV cache holds, and for which sequence.

Pure Python, no llama calls. A *holder* is a llama sequence id whose KV cells
cover the tokens on the path from the root to the holder's end point: a slot
of a running request, or a cache sequence kept after a request finished. Cells
are shared between holders (``llama_memory_seq_cp`` in a unified KV cache), so
a node's tokens occupy cells once however many holders it has.

Contract: the engine calls ``extend`` after every decode that put tokens of a
holder into the cache, ``remove`` when a holder's cells are removed, and
``rename`` when they move to another sequence id. ``match`` may be called at
any time and never changes what is held.
"""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    step = 64
    while i + step <= n and a[i:i + step] == b[i:i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


class _Node:
    __slots__ = ("children", "holders", "key", "parent")

    def __init__(self, key: list[int], parent: _Node | None) -> None:
        self.key = key
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.holders: set[int] = set()


class PrefixIndex:
    """Radix tree over token ids; see the module docstring for the contract."""

    def __init__(self) -> None:
        self._root = _Node([], None)
        self._ends: dict[int, tuple[_Node, int]] = {}  # holder -> (end node, length)
        self._tokens = 0  # tokens held by at least one holder (= distinct KV cells)

    # -- queries -----------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return self._tokens

    def holders(self) -> list[int]:
        return list(self._ends)

    def tokens_held_by(self, holders: set[int]) -> int:
        """Distinct tokens (KV cells) held by at least one of ``holders``.

        Safe to call off the engine thread: it walks copies of each node's children and
        never raises on a tree that changes meanwhile (a gauge's figure, not an invariant).
        A node's holders are a subset of its parent's, so an unheld node's subtree is skipped.
        """
        total = 0
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.holders & holders:
                total += len(node.key)
                stack.extend(list(node.children.values()))
        return total

    def length(self, holder: int) -> int:
        end = self._ends.get(holder)
        return end[1] if end else 0

    def match(self, tokens: Sequence[int], exclude: int | None = None) -> tuple[int, int | None]:
        """Longest prefix of tokens held by some holder (not ``exclude``): (length, holder)."""
        node, matched = self._root, 0
        best: tuple[int, int | None] = (0, None)
        while matched < len(tokens):
            child = node.children.get(tokens[matched])
            if child is None:
                break
            n = common_prefix(child.key, tokens[matched:matched + len(child.key)])
            holder = next((h for h in child.holders if h != exclude), None)
            if holder is None:
                break
            best = (matched + n, holder)
            if n < len(child.key):
                break
            matched += n
            node = child
        return best

    # -- updates -------------------------------------------------------------
    def extend(self, holder: int, tokens: Sequence[int]) -> None:
        """The holder now also holds ``tokens`` right after what it held."""
        if not tokens:
            return
        node, length = self._ends.get(holder, (self._root, 0))
        i = 0
        while i < len(tokens):
            if not node.children and node is not self._root and node.holders == {holder}:
                node.key.extend(tokens[i:])  # the holder's own tip: grow it in place
                self._tokens += len(tokens) - i
                i = len(tokens)
                break
            child = node.children.get(tokens[i])
            if child is None:
                child = _Node(list(tokens[i:]), node)
                node.children[tokens[i]] = child
                child.holders.add(holder)
                self._tokens += len(child.key)
                node, i = child, len(tokens)
                break
            n = common_prefix(child.key, tokens[i:i + len(child.key)])
            if n < len(child.key):
                child = self._split(child, n)
            child.holders.add(holder)
            node, i = child, i + n
        self._ends[holder] = (node, length + len(tokens))

    def remove(self, holder: int) -> None:
        """The holder's cells are gone; nodes nobody holds any more are dropped."""
        end = self._ends.pop(holder, None)
        if end is None:
            return
        node: _Node | None = end[0]
        while node is not None and node is not self._root:
            node.holders.discard(holder)
            parent = node.parent
            if not node.holders:
                assert not node.children, "a child is held only by holders of its parent"
                assert parent is not None
                del parent.children[node.key[0]]
                self._tokens -= len(node.key)
            node = parent

    def truncate(self, holder: int, length: int) -> None:
        """The holder keeps only its first ``length`` tokens."""
        tokens = self.tokens_of(holder)
        if length >= len(tokens):
            return
        self.remove(holder)
        self.extend(holder, tokens[:length])

    def rename(self, old: int, new: int) -> None:
        """The cells of ``old`` now belong to ``new`` (which held nothing)."""
        assert new not in self._ends
        end = self._ends.pop(old, None)
        if end is None:
            return
        node: _Node | None = end[0]
        while node is not None and node is not self._root:
            node.holders.discard(old)
            node.holders.add(new)
            node = node.parent
        self._ends[new] = end

    def tokens_of(self, holder: int) -> list[int]:
        end = self._ends.get(holder)
        if end is None:
            return []
        parts = []
        node: _Node | None = end[0]
        while node is not None and node is not self._root:
            parts.append(node.key)
            node = node.parent
        return [t for part in reversed(parts) for t in part]

    def _split(self, node: _Node, n: int) -> _Node:
        """Cut node's key after n tokens; returns the new upper node."""
        assert 0 < n < len(node.key) and node.parent is not None
        upper = _Node(node.key[:n], node.parent)
        upper.holders = set(node.holders)
        node.parent.children[upper.key[0]] = upper
        node.key = node.key[n:]
        node.parent = upper
        upper.children[node.key[0]] = node
        return upper
