"""A pattern with groups or alternatives made to hold a string's ``minLength`` /
``maxLength``, by bounding its repeats (``pattern.with_lengths`` does this for patterns
of single characters; pydantic's ``constr(pattern=r"^[a-z0-9]+(?:-[a-z0-9]+)*$",
max_length=20)`` is a common one with a group).

Every repeat gets an upper count such that the longest string the pattern then matches
is within ``maxLength``: first one cap for all (the largest that fits), then each repeat,
in order, as far above it as still fits (in a pattern of at most ``MAX_RAISED`` repeats:
a hostile one of hundreds would take seconds). ``minLength`` raises the lower count of repeats
of one character outside any group, when the pattern has no alternatives there. The
strings the result matches are some of those the pattern and both bounds allow (not all:
``(-[a-z]{1,3}){0,3}`` leaves out a word of four letters after a hyphen).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

MAX_RAISED = 12  # repeats raised one by one above the common cap (each: ~10 parses)
MAX_DEPTH = 16  # groups within groups
UNSUPPORTED_ESCAPES = set("bBAZzG0123456789kpPQE")  # no character: \\b, back-references...
_GROUP = re.compile(r"\((?:\?(?::|P?<[A-Za-z_]\w*>))?")
_COUNT = re.compile(r"(\*|\+|\?|\{(\d+)(,(\d*))?\})\??")
_ATOM = re.compile(r"\[\^?\]?(?:\\.|[^\]\\])*\]|\\u[0-9a-fA-F]{4}|\\x[0-9a-fA-F]{2}|\\."
                   r"|[^\\^$()|*+?{}\[]")


def atom_at(body: str, i: int) -> re.Match[str] | None:
    """The one-character atom at ``body[i]`` (a class, an escape, a character); None for
    anything else (a group, an anchor, an escape that is no character)."""
    atom = _ATOM.match(body, i)
    if atom is None or atom.group()[0] == "\\" and atom.group()[1] in UNSUPPORTED_ESCAPES:
        return None
    return atom


def count_at(body: str, i: int) -> tuple[int, int, float] | None:
    """The count at ``body[i]`` (``*``, ``+``, ``?``, ``{m}``, ``{m,}``, ``{m,n}``, lazy
    too): (the index after it, its least, its most); None when there is none."""
    count = _COUNT.match(body, i)
    if count is None:
        return None
    q = count.group(1)
    low = {"*": 0, "+": 1, "?": 0}.get(q[0], 0) if q[0] != "{" else int(count.group(2))
    high = (1.0 if q[0] == "?" else math.inf if q[0] in "*+" else
            low if count.group(3) is None else
            int(count.group(4)) if count.group(4) else math.inf)
    return count.end(), low, high


@dataclass(slots=True)
class _Repeat:
    low: int
    high: float
    raisable: bool  # one character outside any group, no alternatives beside it


def _read(body: str) -> tuple[list[str], list[_Repeat]] | None:
    """The pattern (the caller's body in a group: its top level is at depth 1) as text
    pieces with a repeat between each two; None when it holds what this does not read
    (anchors inside, lookarounds, stray braces)."""
    texts, repeats, depth, branched = [""], [], 0, False
    i = 0
    while i < len(body):
        if body[i] == "(":
            group = _GROUP.match(body, i)
            if group is None or depth >= MAX_DEPTH:  # (lookarounds and the like; nesting
                return None  # that makes each of the ~100 re-reads below slow)
            texts[-1] += "("
            depth, i = depth + 1, group.end()
            continue
        if body[i] == "|":
            branched |= depth <= 1
            texts[-1], i = texts[-1] + "|", i + 1
            continue
        single = body[i] != ")"
        if single:
            atom = atom_at(body, i)
            if atom is None:
                return None
            texts[-1], i = texts[-1] + atom.group(), atom.end()
        else:
            texts[-1], i, depth = texts[-1] + ")", i + 1, depth - 1
            if depth < 0:
                return None
        if count := count_at(body, i):
            i, low, high = count
            repeats.append(_Repeat(low, high, single and depth <= 1))
            texts.append("")
    if depth:
        return None
    if branched:
        for r in repeats:
            r.raisable = False
    return texts, repeats


def _text(texts: list[str], repeats: list[_Repeat], caps: list[float]) -> str:
    out = texts[0]
    for r, cap, after in zip(repeats, caps, texts[1:], strict=True):
        high = min(r.high, max(r.low, cap))
        out += (f"{{{r.low}}}" if high == r.low else
                f"{{{r.low},{'' if high == math.inf else int(high)}}}") + after
    return out


def regex_width(pattern: str) -> tuple[int, float]:
    """The fewest and most characters a regular expression matches, as Python's regex
    parser reads it (0 and no bound when it cannot: ECMA-only syntax)."""
    try:
        lo, hi = re._parser.parse(pattern).getwidth()  # type: ignore[attr-defined]
    except (re.error, AttributeError, RecursionError, OverflowError):
        return 0, math.inf
    return lo, math.inf if hi >= 1 << 30 else hi


def capped(start: bool, end: bool, body: str, min_length: int, max_length: float) -> str:
    """The anchored pattern (see the module); ValueError when it cannot be done."""
    whole = ("" if start else ".*") + f"({body})" + ("" if end else ".*")
    read = _read(whole)
    if read is None:
        raise ValueError(f"'minLength' / 'maxLength' beside the 'pattern' {body[:100]!r} "
                         "cannot be enforced: put the length in the pattern ({m,n})")
    texts, repeats = read
    need = min_length - regex_width(_text(texts, repeats, [math.inf] * len(repeats)))[0]
    for r in repeats:  # (the one-character repeats outside any group: in order)
        if need > 0 and r.raisable:
            more = int(min(need, r.high - r.low))
            r.low, need = r.low + more, need - more
    if need > 0:
        raise ValueError(f"'minLength' {min_length} beside the 'pattern' {body[:100]!r} "
                         "cannot be enforced: put the length in the pattern ({m,n})")
    if max_length == math.inf:
        return "^" + _text(texts, repeats, [math.inf] * len(repeats)) + "$"

    def fits(caps: list[float]) -> bool:
        return regex_width(_text(texts, repeats, caps))[1] <= max_length
    shortest, longest = regex_width(_text(texts, repeats, [0] * len(repeats)))
    if longest > max_length:  # (no string, or an alternative longer than the bound)
        raise ValueError(f"no string matches the 'pattern' {body[:100]!r} with "
                         f"'minLength' {min_length} and 'maxLength' {max_length}"
                         if shortest > max_length else
                         f"'maxLength' {max_length} beside the 'pattern' {body[:100]!r} "
                         "cannot be enforced (an alternative in it is longer): put the "
                         "length in the pattern ({m,n})")
    caps: list[float] = [_largest(lambda c: fits([c] * len(repeats)), 0, int(max_length))]
    caps *= len(repeats)  # one cap for all, then each repeat as far as it still fits
    for k in range(len(repeats) if len(repeats) <= MAX_RAISED else 0):
        def alone(cap: int, k: int = k) -> bool:
            return fits([*caps[:k], cap, *caps[k + 1:]])
        caps[k] = _largest(alone, int(caps[k]), int(min(repeats[k].high, max_length)))
    return "^" + _text(texts, repeats, caps) + "$"


def _largest(fits: Callable[[int], bool], low: int, high: int) -> int:
    """The largest value in [low, high] that fits (``low`` does; fitting is monotone)."""
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low
