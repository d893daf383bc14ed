"""A JSON schema ``pattern`` made into one llama-cpp-python's converter turns into GBNF.

The converter takes a subset of regular expressions, anchored (``^...$``), and copies
what it does not know into the grammar, where llama.cpp then fails to parse it (``\\d``),
or where it lets a string hold characters JSON forbids raw (``.`` and ``[^...]`` admit
``"`` and control characters). ``json_pattern`` rewrites a pattern into that subset:

- shorthand classes become brackets: ``\\d`` ``[0-9]``, ``\\w`` ``[a-zA-Z0-9_]``, ``\\s`` a
  space (other blanks are escapes in JSON text), and their negations;
- ``.`` and negated classes never match ``"``, ``\\`` or a control character;
- the pattern matches the decoded string, the grammar writes JSON text: a ``"``, a
  backslash or a control character the pattern asks for (a literal, an escape such as
  ``\\n``, or inside a positive class, ``[ -~]`` holds both) is written as its JSON escape
  (``\\"``), not raw, which ended the string early or made an escape of the next
  character; other characters are written by code (``\\x2D``), so a ``-`` last in a
  class stays a ``-`` beside the characters added after it;
- ``(?:...)`` and named groups become plain groups, lazy quantifiers greedy ones;
- escaped punctuation (``\\.``) becomes its character code, which GBNF takes;
- ``*``, ``+`` and ``{m,}`` repeat at most ``MAX_REPEAT`` times, so that a model that
  repeats itself still ends the string (and the JSON) before max_tokens;
- JSON Schema patterns are not anchored: a side without ``^`` / ``$`` may have up to
  ``PAD`` more characters there.

What a grammar cannot express (lookarounds, back-references, word boundaries, anchors
inside the pattern, ``\\cX`` control escapes) gives None: the caller drops the pattern
and keeps the rest of the schema.

``with_lengths`` folds a string's ``minLength`` / ``maxLength`` into its pattern (the
converter ignores them beside one): kept as it is where the pattern's own lengths lie
within them, else its counts bounded to fit (a pattern with groups or alternatives: its
repeats, ``repeatcaps``).
"""

from __future__ import annotations

import json
import math
import re
import string

from edgeinfer.engine.grammar_check import JSON_ESCAPED_ONLY, RAW_CHAR, gbnf_code
from edgeinfer.prompt.repeatcaps import (
    UNSUPPORTED_ESCAPES,
    atom_at,
    capped,
    count_at,
    regex_width,
)

ANY = RAW_CHAR
PAD = 64  # characters an unanchored side may add
MAX_REPEAT = 200  # what ``*``, ``+`` and ``{m,}`` may repeat (as grammar.DEFAULT_MAX_LENGTH)
_SHORT = {"d": [(0x30, 0x39)], "w": [(0x61, 0x7A), (0x41, 0x5A), (0x30, 0x39), (0x5F, 0x5F)],
          "s": [(0x20, 0x20)]}
_CONTROL = {"t": 0x09, "n": 0x0A, "r": 0x0D, "f": 0x0C, "v": 0x0B}


_HEX4 = "[0-9a-fA-F]{2}"
_PAIR = re.compile(r"(?<!\\)((?:\\\\)*)\\u([dD][89abAB]" + _HEX4 + r")\\u([dD][c-fC-F]"
                   + _HEX4 + ")")
_ASTRAL = re.compile(r"\[\\u[dD]800-\\u[dD][bB][fF][fF]\]\[\\u[dD][cC]00-\\u[dD][fF][fF][fF]\]")
_LONE = re.compile(r"\\u[dD][89a-fA-F]" + _HEX4)


def joined_surrogates(pattern: str) -> str:
    """``pattern`` with each UTF-16 pair of escapes (``\\ud83d\\ude00``, as JavaScript
    spells U+1F600) made the one character it stands for, and JavaScript's "any astral
    character" (``[\\uD800-\\uDBFF][\\uDC00-\\uDFFF]``) that range; ValueError for a
    surrogate left alone outside a class (an escape, or raw), which no text holds (in a
    class, ``_positive`` leaves the surrogates out of its ranges)."""
    out = _ASTRAL.sub("[\U00010000-\U0010FFFF]", pattern)
    out = _PAIR.sub(lambda m: m[1] + chr(0x10000 + ((int(m[2], 16) - 0xD800) << 10)
                                         + int(m[3], 16) - 0xDC00), out)
    depth, i = 0, 0
    while i < len(out):
        c = out[i]
        if c == "\\" and depth == 0 and _LONE.match(out, i) or 0xD800 <= ord(c) < 0xE000 \
                and depth == 0:
            raise ValueError(f"the pattern {pattern[:100]!r} holds a UTF-16 surrogate that "
                             "is not half of a pair: no text holds one")
        if c == "[" and depth == 0:  # (a class; its first "]" is a character)
            depth, i = 1, i + (2 if out.startswith("[^", i) else 1)
            i += out.startswith("]", i)
            continue
        depth = 0 if c == "]" and depth else depth
        i += 2 if c == "\\" else 1
    return out


def _literal(ch: str) -> str:
    """One character of the decoded string, as the JSON text that holds it: itself, or
    its escape (``"`` is ``\\"``, a backslash ``\\\\``, a newline ``\\n``) as a group."""
    text = json.dumps(ch, ensure_ascii=False)[1:-1]
    if text == ch:
        return f"[{gbnf_code(ord(ch))}]"
    return "(" + "".join(f"[{gbnf_code(ord(c))}]" for c in text) + ")"


def _escape_ranges(pattern: str, i: int) -> tuple[list[tuple[int, int]], bool, int] | None:
    """The escape at ``pattern[i]`` (a backslash): the code ranges it matches, whether it
    is one character (a range's end may be one), and the index after it; None when it has
    no grammar form (a negated shorthand inside a class is one: GBNF has no negation
    there, the caller says)."""
    if i + 1 >= len(pattern):
        return None
    c = pattern[i + 1]
    if c in _SHORT:
        return _SHORT[c], False, i + 2
    for lead, digits in (("x", 2), ("u", 4)):
        code = pattern[i + 2:i + 2 + digits]
        if c == lead and len(code) == digits and all(h in string.hexdigits for h in code):
            cp = int(code, 16)
            return [(cp, cp)], True, i + 2 + digits
    if c in _CONTROL:
        return [(_CONTROL[c], _CONTROL[c])], True, i + 2
    if c in UNSUPPORTED_ESCAPES or c.isalnum():
        return None
    return [(ord(c), ord(c))], True, i + 2  # punctuation (``\.``): that character


def _escape(pattern: str, i: int) -> tuple[str, int] | None:
    """The escape at ``pattern[i]`` (a backslash), outside a class, as the converter's
    regex, and the index after it; None when it has no grammar form."""
    c = pattern[i + 1:i + 2]
    if c and c.lower() in _SHORT and c not in _SHORT:  # \D \W \S
        return _negated(_SHORT[c.lower()]), i + 2  # (negation: raw characters only)
    if (esc := _escape_ranges(pattern, i)) is None:
        return None
    ranges, single, after = esc
    return (_literal(chr(ranges[0][0])) if single else _positive(ranges)), after


def _class_ranges(pattern: str, i: int) -> tuple[list[tuple[int, int]], int] | None:
    """The code ranges of the class body starting at ``pattern[i]`` (after ``[`` or
    ``[^``), and the index after its ``]``; None if unsupported."""
    ranges: list[tuple[int, int]] = []
    j = i
    while j < len(pattern) and (pattern[j] != "]" or j == i):
        if pattern[j] == "[":  # POSIX classes, nested sets
            return None
        if pattern[j] == "\\":
            if (esc := _escape_ranges(pattern, j)) is None:
                return None
            got, single, j = esc
        else:
            got, single, j = [(ord(pattern[j]), ord(pattern[j]))], True, j + 1
        if single and pattern.startswith("-", j) and j + 1 < len(pattern) and \
                pattern[j + 1] != "]":  # a range
            if pattern[j + 1] == "\\":
                if (end := _escape_ranges(pattern, j + 1)) is None or not end[1]:
                    return None
                high, j = end[0][0][0], end[2]
            elif pattern[j + 1] == "[":
                return None
            else:
                high, j = ord(pattern[j + 1]), j + 2
            if high < got[0][0]:
                return None
            got = [(got[0][0], high)]
        ranges += got
    return (ranges, j + 1) if j < len(pattern) else None


# what a JSON string holds only as an escape (strict parsers refuse a raw control char)
_JSON_ESCAPED = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]
_SHORT_ESCAPES = {0x08, 0x09, 0x0A, 0x0C, 0x0D, 0x22, 0x5C}


def _positive(ranges: list[tuple[int, int]]) -> str:
    """A class matching ``ranges``: the characters JSON holds raw in one class, each of
    the others as its escape (an alternative; control characters only those with a
    two-character escape, ``\\n``); ``[]`` when none is left."""
    raw: list[tuple[int, int]] = []
    special: list[int] = []
    ranges = [r for lo, hi in ranges for r in ((lo, min(hi, 0xD7FF)), (max(lo, 0xE000), hi))
              if r[0] <= r[1]]  # (lone surrogates: no UTF-8 text holds one)
    for lo, hi in ranges:
        for cut_lo, cut_hi in _JSON_ESCAPED:
            if lo <= cut_hi and hi >= cut_lo:  # (of the control characters, only those
                special += [cp for cp in range(max(lo, cut_lo), min(hi, cut_hi) + 1)
                            if cp in _SHORT_ESCAPES]  # JSON escapes in two characters)
        points = sorted({lo, hi + 1, *(b for a, z in _JSON_ESCAPED for b in (a, z + 1)
                                       if lo < b <= hi)})
        for a, b in zip(points, points[1:], strict=False):
            if not any(x <= a <= y for x, y in _JSON_ESCAPED):
                raw.append((a, b - 1))
    parts = [f"[{_ranges_text(raw)}]"] if raw else []
    parts += [_literal(chr(cp)) for cp in sorted(set(special))]
    return "[]" if not parts else parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _ranges_text(ranges: list[tuple[int, int]]) -> str:
    return "".join(gbnf_code(a) if a == b else f"{gbnf_code(a)}-{gbnf_code(b)}" for a, b in ranges)


def _negated(ranges: list[tuple[int, int]]) -> str:
    """A class of the characters not in ``ranges`` and not what JSON holds only escaped."""
    return f"[^{_ranges_text(ranges)}{JSON_ESCAPED_ONLY}]"


def _bracket(pattern: str, i: int) -> tuple[str, int] | None:
    """The class starting at ``pattern[i]`` (``[``), rewritten: its characters by code;
    a negated one never matches what JSON holds only escaped, a positive one holds those
    as their escapes; None if unsupported (or if it matches nothing)."""
    negated = pattern.startswith("[^", i)
    if (got := _class_ranges(pattern, i + 1 + negated)) is None or not got[0]:
        return None
    ranges, after = got
    out = _negated(ranges) if negated else _positive(ranges)
    return (out, after) if out != "[]" else None


def _group(pattern: str, i: int) -> tuple[str, int] | None:
    """A group's opening at ``pattern[i]`` (``(``) as a plain ``(``; None for lookarounds."""
    if not pattern.startswith("(?", i):
        return "(", i + 1
    if pattern.startswith("(?:", i):
        return "(", i + 3
    for named in ("(?P<", "(?<"):
        if pattern.startswith(named, i) and not pattern.startswith(("(?<=", "(?<!"), i):
            end = pattern.find(">", i)
            return ("(", end + 1) if end != -1 else None
    return None


def _body(pattern: str) -> str | None:
    """The pattern (anchors removed) in the converter's subset."""
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        step: tuple[str, int] | None
        if c == "\\":
            step = _escape(pattern, i)
        elif c == "[":
            step = _bracket(pattern, i)
        elif c == "(":
            step = _group(pattern, i)
        elif c == ".":
            step = ANY, i + 1
        elif c in "^$":
            return None
        elif c in "*+":  # bounded, as strings without maxLength are
            step = f"{{{int(c == '+')},{MAX_REPEAT}}}", i + 1
        elif c == "{" and (close := pattern.find("}", i)) != -1 and pattern[
                i + 1:close].rstrip().endswith(","):
            low = pattern[i + 1:close].split(",")[0].strip() or "0"
            if not low.isdigit():
                return None
            step = f"{{{low},{max(int(low), MAX_REPEAT)}}}", close + 1
        elif c == "?" and out and out[-1] in "?}":
            step = "", i + 1  # lazy: matches the same strings
        elif c == '"' or ord(c) < 0x20:  # (as JSON text holds it: escaped)
            step = _literal(c), i + 1
        else:
            step = c, i + 1
        if step is None:
            return None
        out, i = out + step[0], step[1]
    return out


def json_pattern(pattern: str) -> str | None:
    """``pattern`` as an anchored regex in the converter's subset; None when a grammar
    cannot express it."""
    start, end, body_in = _anchors(pattern)
    body = _body(body_in)
    if body is None:
        return None
    pad = f"{ANY}{{0,{PAD}}}"
    return f"^{'' if start else pad}({body}){'' if end else pad}$"


def _anchors(pattern: str) -> tuple[bool, bool, str]:
    """(anchored at the start, at the end, the pattern between)."""
    start = pattern.startswith("^")
    # a final "$" is an anchor unless escaped (an odd run of backslashes before it)
    end = pattern.endswith("$") and (len(pattern) - 1 - len(pattern[:-1].rstrip("\\"))) % 2 == 0
    return start, end, pattern[int(start):len(pattern) - int(end)]


def _pieces(body: str) -> list[tuple[str, int, float]] | None:
    """A pattern of single-character atoms, each with its count range (atom, min, max);
    None for anything else (groups, alternatives)."""
    out: list[tuple[str, int, float]] = []
    i = 0
    while i < len(body):
        atom = atom_at(body, i)
        if atom is None:
            return None  # (\b is no character; back-references, \A, ...)
        i, lo, hi = atom.end(), 1, 1.0
        if count := count_at(body, i):
            i, lo, hi = count
        out.append((atom.group(), lo, hi))
    return out


def _width(body: str, pieces: list[tuple[str, int, float]] | None) -> tuple[int, float]:
    """The fewest and most characters ``body`` (read into ``pieces``) matches (0 and no
    bound when unknown)."""
    if pieces is not None:
        return sum(p[1] for p in pieces), sum(p[2] for p in pieces)
    return regex_width(body)  # groups and alternatives


def with_lengths(pattern: str, min_length: int = 0, max_length: int | None = None) -> str:
    """``pattern``, made to hold a string's length bounds too; ValueError when no string
    satisfies both, or when this cannot be done (a ``minLength`` beyond what a pattern
    with groups or alternatives holds, ``repeatcaps``). Otherwise the result is anchored (it
    matches whole strings, which also match the pattern: a side without an anchor gets a
    count of any characters) and its counts are bounded: what ``minLength`` asks goes to
    the widest counts first, the room ``maxLength`` leaves is shared as equally as the
    counts take it. The strings it matches are some of those both bounds allow."""
    start, end, body = _anchors(pattern)
    pieces = _pieces(body)
    lo, hi = _width(body, pieces)
    top = math.inf if max_length is None else max_length
    if lo > top or min_length > top or (start and end and hi < min_length):
        raise ValueError(f"no string matches the 'pattern' {pattern[:100]!r} with "
                         f"'minLength' {min_length} and 'maxLength' {max_length}")
    if start and end and lo >= min_length and hi <= top:
        return pattern
    if pieces is None:  # groups or alternatives: their repeats bounded
        return capped(start, end, body, min_length, top)
    pads = [(".", 0, math.inf)]  # the pattern's own counts come first, then these
    pieces = [*([] if start else pads), *pieces, *([] if end else pads)]
    lows = [p[1] for p in pieces]
    highs = [p[2] for p in pieces]
    padded = {k for k in (0, len(pieces) - 1) if pieces[k] is pads[0]}
    need = min_length - sum(lows)
    for k in sorted(range(len(pieces)), key=lambda k: (k in padded, lows[k] - highs[k])):
        more = int(max(0, min(need, highs[k] - lows[k])))  # widest first
        lows[k], need = lows[k] + more, need - more
    room = top - sum(lows)
    for group in ([k for k in range(len(pieces)) if k not in padded], sorted(padded)):
        variable = sorted((k for k in group if highs[k] > lows[k]),
                          key=lambda k: highs[k] - lows[k])  # narrowest first: water-filling
        for n, k in enumerate([] if room == math.inf else variable):
            share = int(room) // (len(variable) - n)
            highs[k] = lows[k] + min(highs[k] - lows[k], share)
            room -= highs[k] - lows[k]
    return "^" + "".join(atom + ("" if (x, y) == (1, 1) else f"{{{x}}}" if x == y else
                                 f"{{{x},{'' if y == math.inf else int(y)}}}")
                         for (atom, _, _), x, y in zip(pieces, lows, highs, strict=True)
                         if y > 0) + "$"
