"""Integers in a range as a grammar: the digit patterns of every integer in [lo, hi].

llama-cpp-python's schema converter ignores minimum / maximum; this module
supplies the grammar for bounded integers (pure Python, tested by brute force).
"""

from __future__ import annotations

MAX_DIGITS = 16  # an unbounded side stops at 16 digits, as the converter's integers do

Pattern = list[str]  # one digit class per position: "7", "[3-5]" or "[0-9]"


def _cls(a: str, b: str) -> str:
    return a if a == b else ("[0-9]" if (a, b) == ("0", "9") else f"[{a}-{b}]")


def _same_length(a: str, b: str) -> list[Pattern]:
    """Patterns for the digit strings from a to b, both of the same length, a <= b."""
    if not a:
        return [[]]
    if a[0] == b[0]:
        return [[a[0], *p] for p in _same_length(a[1:], b[1:])]
    rest = len(a) - 1
    if a[1:] == "0" * rest and b[1:] == "9" * rest:
        return [[_cls(a[0], b[0]), *["[0-9]"] * rest]]
    out = [[a[0], *p] for p in _same_length(a[1:], "9" * rest)]
    if int(b[0]) - int(a[0]) > 1:
        out.append([_cls(str(int(a[0]) + 1), str(int(b[0]) - 1)), *["[0-9]"] * rest])
    out += [[b[0], *p] for p in _same_length("0" * rest, b[1:])]
    return out


def non_negative_patterns(lo: int, hi: int) -> list[Pattern]:
    """Digit patterns (no leading zeros) of the integers in [lo, hi], 0 <= lo <= hi."""
    out: list[Pattern] = []
    for digits in range(len(str(lo)), len(str(hi)) + 1):
        a = max(lo, 10 ** (digits - 1) if digits > 1 else 0)
        b = min(hi, 10 ** digits - 1)
        if a <= b:
            out += _same_length(str(a), str(b))
    return out


def int_range_alternatives(lo: int | None, hi: int | None) -> list[tuple[bool, Pattern]]:
    """(negative sign, digit pattern) alternatives of the integers in [lo, hi]."""
    limit = 10 ** MAX_DIGITS - 1
    if (lo is not None and lo > limit) or (hi is not None and hi < -limit):
        raise ValueError(f"integers of more than {MAX_DIGITS} digits are not supported")
    lo = -limit if lo is None else max(lo, -limit)
    hi = limit if hi is None else min(hi, limit)
    if lo > hi:
        raise ValueError(f"empty integer range [{lo}, {hi}]")
    alts: list[tuple[bool, Pattern]] = []
    if lo < 0:
        alts += [(True, p) for p in non_negative_patterns(max(1, -min(hi, -1)), -lo)]
    if hi >= 0:
        alts += [(False, p) for p in non_negative_patterns(max(lo, 0), hi)]
    return alts


def int_range_gbnf(lo: int | None, hi: int | None) -> str:
    """A GBNF expression (a parenthesised alternation) matching exactly [lo, hi]."""
    def render(neg: bool, p: Pattern) -> str:
        parts = (['"-"'] if neg else []) + [f'"{c}"' if len(c) == 1 else c for c in p]
        return " ".join(parts)
    return "(" + " | ".join(render(n, p) for n, p in int_range_alternatives(lo, hi)) + ")"


def int_range_regex(lo: int | None, hi: int | None) -> str:
    """The same set as a Python regular expression (for tests)."""
    return "^(?:" + "|".join(("-" if n else "") + "".join(p)
                             for n, p in int_range_alternatives(lo, hi)) + ")$"
