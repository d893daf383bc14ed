"""Integers in a range as a grammar: the digit patterns of every integer in [lo, hi];
and numbers within bounds (``range_gbnf``).

llama-cpp-python's schema converter ignores minimum / maximum; this module
supplies the grammar for bounded integers and numbers (pure Python, tested by brute
force).
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

from edgeinfer.prompt.intersection import exclusive_numbers, numbers

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


BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
SIGNIFICANT = 15  # digits a decimal text keeps through a double (more: 99.9999999999999999
# reads as 100.0, which an exclusive maximum of 100 refuses)


def _fraction(lo: Any, lo_x: bool, hi: Any, hi_x: bool) -> str:
    """A fraction in (0, 1): its last digit is not 0, so "n.f" lies strictly between n and
    the next integer. Beside an exclusive bound the text keeps to ``SIGNIFICANT`` digits,
    so that it is not read as the bound (elsewhere, read as the integer next to it, it is
    still within the bounds)."""
    near = [abs(b) for b, x in ((lo, lo_x), (hi, hi_x)) if x and b is not None]
    digits = len(str(int(max(near)))) if near else 0
    return f'"." [0-9]{{0,{max(0, SIGNIFICANT - 1 - max(1, digits))}}} [1-9]'


def _limits(node: dict[str, Any]) -> tuple[Any, bool, Any, bool]:
    """(lower bound, whether it is exclusive, upper bound, whether it is exclusive), the
    tighter of each pair; None where unbounded."""
    node = exclusive_numbers(node)  # (draft 4's boolean form as the number one)
    lo, lo_x, hi, hi_x = None, False, None, False
    if numbers(node.get("minimum"), 0):
        lo = node["minimum"]
    if numbers(x := node.get("exclusiveMinimum"), 0) and (lo is None or x >= lo):
        lo, lo_x = x, True
    if numbers(node.get("maximum"), 0):
        hi = node["maximum"]
    if numbers(x := node.get("exclusiveMaximum"), 0) and (hi is None or x <= hi):
        hi, hi_x = x, True
    return lo, lo_x, hi, hi_x


def _whole(lo: Any, lo_x: bool, hi: Any, hi_x: bool) -> tuple[int | None, int | None]:
    """The least and greatest integers within the bounds."""
    a = None if lo is None else math.floor(lo) + 1 if lo_x and lo == math.floor(lo) \
        else math.ceil(lo)
    b = None if hi is None else math.ceil(hi) - 1 if hi_x and hi == math.ceil(hi) \
        else math.floor(hi)
    return a, b


def range_gbnf(node: dict[str, Any]) -> str | None:
    """A GBNF expression for the integers (``"type": "integer"``) or the numbers within
    ``node``'s bounds; ValueError when none is (or past 16 digits). Numbers are written
    without an exponent: an integer within the bounds, or ``n.f`` (``f`` not ending in 0)
    where every value between ``n`` and the next integer away from 0 lies within them;
    None for a number range no such text fits (0.2 to 0.3: the caller drops it)."""
    lo, lo_x, hi, hi_x = _limits(node)
    if lo is not None and hi is not None and (lo > hi or lo == hi and (lo_x or hi_x)):
        raise ValueError(f"empty range [{lo}, {hi}]")
    a, b = _whole(lo, lo_x, hi, hi_x)
    whole = a is None or b is None or a <= b
    if node.get("type") == "integer":
        if not whole:
            raise ValueError(f"no integer in [{lo}, {hi}]")
        return int_range_gbnf(a, b)
    limit = 10 ** MAX_DIGITS
    if lo is not None and lo >= limit or hi is not None and hi <= -limit:
        return None  # (past 16 digits: the caller drops the bounds, logged)
    alts = [int_range_gbnf(a, b)] if whole else []
    fraction = _fraction(lo, lo_x, hi, hi_x)
    low = None if lo is None else math.ceil(lo)
    top = None if hi is None else math.floor(hi)
    up = (max(0, low if low is not None else 0), None if top is None else top - 1)
    if up[1] is None or up[0] <= up[1]:  # n.f, n >= 0: within (n, n + 1)
        alts.append(f"{int_range_gbnf(*up)} {fraction}")
    down = (None if low is None else low + 1, -1 if top is None else min(-1, top))
    if down[0] is None or down[0] <= down[1]:  # -m.f: within (-m - 1, -m)
        alts.append(f"{int_range_gbnf(*down)} {fraction}")
    if (lo is None or lo <= -1) and (hi is None or hi >= 0):
        alts.append(f'"-0" {fraction}')
    return "(" + " | ".join(alts) + ")" if alts else _decimals(lo, lo_x, hi, hi_x)


MAX_PLACES = 6  # decimal places a narrow number range is written with, at most


def _decimals(lo: Any, lo_x: bool, hi: Any, hi_x: bool) -> str | None:
    """Numbers of a range too narrow for ``n.f`` (0.1 to 0.2): the decimals of the fewest
    places (up to ``MAX_PLACES``) within it, ``m / 10**k`` for an integer ``m``, written
    with exactly ``k`` places; None when none fits or a bound is open."""
    if lo is None or hi is None:
        return None
    low, high = Decimal(repr(lo)), Decimal(repr(hi))
    for places in range(1, MAX_PLACES + 1):
        scale = Decimal(10) ** places
        a, b = low * scale, high * scale
        first = int(a.to_integral_value(ROUND_FLOOR)) + 1 if lo_x and a == a.to_integral_value() \
            else int(a.to_integral_value(ROUND_CEILING))
        last = int(b.to_integral_value(ROUND_CEILING)) - 1 if hi_x and b == b.to_integral_value() \
            else int(b.to_integral_value(ROUND_FLOOR))
        if first <= last:
            try:
                alts = int_range_alternatives(first, last)
            except ValueError:
                return None
            return "(" + " | ".join(_placed(neg, p, places) for neg, p in alts) + ")"
    return None


def _placed(negative: bool, digits: Pattern, places: int) -> str:
    """The digit pattern of an integer ``m`` as the text of ``m / 10**places``."""
    digits = ["0"] * (places + 1 - len(digits)) + digits  # (0.05: "0" "." "0" "5")
    whole, fraction = digits[:-places], digits[-places:]
    parts = (['"-"'] if negative else []) + [f'"{c}"' if len(c) == 1 else c for c in whole]
    return " ".join([*parts, '"."', *(f'"{c}"' if len(c) == 1 else c for c in fraction)])
