"""A JSON schema ``pattern`` made into one llama-cpp-python's converter turns into GBNF.

The converter takes a subset of regular expressions, anchored (``^...$``), and copies
what it does not know into the grammar, where llama.cpp then fails to parse it (``\\d``),
or where it lets a string hold characters JSON forbids raw (``.`` and ``[^...]`` admit
``"`` and control characters). ``json_pattern`` rewrites a pattern into that subset:

- shorthand classes become brackets: ``\\d`` ``[0-9]``, ``\\w`` ``[a-zA-Z0-9_]``, ``\\s`` a
  space (other blanks are escapes in JSON text), and their negations;
- ``.`` and negated classes never match ``"``, ``\\`` or a control character;
- ``(?:...)`` and named groups become plain groups, lazy quantifiers greedy ones;
- escaped punctuation (``\\.``) becomes its character code, which GBNF takes;
- ``*``, ``+`` and ``{m,}`` repeat at most ``MAX_REPEAT`` times, so that a model that
  repeats itself still ends the string (and the JSON) before max_tokens;
- JSON Schema patterns are not anchored: a side without ``^`` / ``$`` may have up to
  ``PAD`` more characters there.

What a grammar cannot express (lookarounds, back-references, word boundaries, anchors
inside the pattern, escaped control characters) gives None: the caller drops the pattern
and keeps the rest of the schema.
"""

from __future__ import annotations

import string

JSON_CHAR = '"\\\\\\x7F\\x00-\\x1F'  # inside [^...]: what a raw JSON string char is not
ANY = f"[^{JSON_CHAR}]"
PAD = 64  # characters an unanchored side may add
MAX_REPEAT = 200  # what ``*``, ``+`` and ``{m,}`` may repeat (as grammar.DEFAULT_MAX_LENGTH)
_SHORT = {"d": "0-9", "w": "a-zA-Z0-9_", "s": " "}
_UNSUPPORTED_ESCAPES = set("bBAZzGntrfv0123456789kpPQE")


def _escape(pattern: str, i: int, in_class: bool) -> tuple[str, int] | None:
    """The escape at ``pattern[i]`` (a backslash) as the converter's regex, and the index
    after it; None when it has no grammar form."""
    if i + 1 >= len(pattern):
        return None
    c = pattern[i + 1]
    if c in _SHORT:
        return (_SHORT[c] if in_class else f"[{_SHORT[c]}]"), i + 2
    if c.lower() in _SHORT:  # \D \W \S: no negation inside a class in GBNF
        return None if in_class else (f"[^{_SHORT[c.lower()]}{JSON_CHAR}]", i + 2)
    for lead, digits in (("x", 2), ("u", 4)):
        code = pattern[i + 2:i + 2 + digits]
        if c == lead and len(code) == digits and all(h in string.hexdigits for h in code):
            esc = f"\\{lead}{code}"
            return (esc if in_class else f"[{esc}]"), i + 2 + digits
    if c in _UNSUPPORTED_ESCAPES or c.isalnum():
        return None
    # punctuation: by its code (the converter copies "\." into GBNF, which refuses it)
    code = f"\\x{ord(c):02X}" if ord(c) < 0x100 else f"\\u{ord(c):04X}"
    return (code if in_class else f"[{code}]"), i + 2


def _bracket(pattern: str, i: int) -> tuple[str, int] | None:
    """The class starting at ``pattern[i]`` (``[``), rewritten; None if unsupported."""
    j, negated = i + 1, pattern.startswith("[^", i)
    out = "[^" if negated else "["
    j += negated
    if j < len(pattern) and pattern[j] == "]":  # a leading "]" is a literal
        out, j = out + "\\]", j + 1
    while j < len(pattern) and pattern[j] != "]":
        if pattern[j] == "\\":
            esc = _escape(pattern, j, in_class=True)
            if esc is None:
                return None
            out, j = out + esc[0], esc[1]
        elif pattern[j] == "[":  # POSIX classes, nested sets
            return None
        else:
            out, j = out + pattern[j], j + 1
    if j >= len(pattern):
        return None
    return out + (JSON_CHAR if negated else "") + "]", j + 1


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
            step = _escape(pattern, i, in_class=False)
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
        else:
            step = c, i + 1
        if step is None:
            return None
        out, i = out + step[0], step[1]
    return out


def json_pattern(pattern: str) -> str | None:
    """``pattern`` as an anchored regex in the converter's subset; None when a grammar
    cannot express it."""
    start = pattern.startswith("^")
    # a final "$" is an anchor unless escaped (an odd run of backslashes before it)
    end = pattern.endswith("$") and (len(pattern) - 1 - len(pattern[:-1].rstrip("\\"))) % 2 == 0
    body = _body(pattern[int(start):len(pattern) - int(end)])
    if body is None:
        return None
    pad = f"{ANY}{{0,{PAD}}}"
    return f"^{'' if start else pad}({body}){'' if end else pad}$"
