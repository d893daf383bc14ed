from __future__ import annotations

import random
import re

import pytest

from edgeinfer.prompt.intrange import int_range_gbnf, int_range_regex, range_gbnf


def members(lo: int | None, hi: int | None, probe: range) -> set[int]:
    rx = re.compile(int_range_regex(lo, hi))
    return {v for v in probe if rx.match(str(v))}


@pytest.mark.parametrize(("lo", "hi"), [(1, 7), (0, 0), (0, 9), (10, 99), (7, 1234), (-5, 5),
                                        (-120, -3), (95, 105), (0, 100000), (-1, 0)])
def test_exact_ranges(lo: int, hi: int) -> None:
    probe = range(lo - 300, hi + 300)
    assert members(lo, hi, probe) == set(range(lo, hi + 1)) & set(probe)


def test_random_ranges_and_one_sided_bounds() -> None:
    rng = random.Random(1)
    for _ in range(300):
        lo = rng.randint(-3000, 3000)
        hi = lo + rng.randint(0, 4000)
        probe = range(lo - 200, hi + 200)
        assert members(lo, hi, probe) == set(range(lo, hi + 1))
    probe = range(-500, 500)
    assert members(18, None, probe) == set(range(18, 500))
    assert members(None, -7, probe) == set(range(-500, -6))
    rx = re.compile(int_range_regex(0, None))
    assert rx.match("9" * 16) and not rx.match("9" * 17) and not rx.match("012")


def test_gbnf_form() -> None:
    assert int_range_gbnf(1, 7) == "([1-7])"
    assert int_range_gbnf(-2, 12) == '("-" [1-2] | [0-9] | "1" [0-2])'


def number_regex(node: dict[str, object]) -> re.Pattern[str]:
    """``range_gbnf``'s expression as a Python regex (its literals, classes and counts)."""
    expr = range_gbnf(node)
    assert expr is not None
    return re.compile(expr.replace('"."', r"\.").replace('"', "").replace(" ", ""))


def within(v: float, node: dict[str, object]) -> bool:
    def get(key: str) -> float | None:
        x = node.get(key)
        return x if isinstance(x, int | float) and not isinstance(x, bool) else None
    lo, hi, above, below = map(get, ("minimum", "maximum", "exclusiveMinimum",
                                     "exclusiveMaximum"))
    return ((lo is None or v >= lo) and (hi is None or v <= hi) and (above is None or v > above)
            and (below is None or v < below))


@pytest.mark.parametrize("node", [
    {"minimum": -5, "maximum": -4}, {"minimum": 0, "maximum": 1},
    {"exclusiveMinimum": 0, "exclusiveMaximum": 1}, {"minimum": 0.5, "maximum": 2.5},
    {"minimum": -2.5, "exclusiveMaximum": 3}, {"minimum": 0}, {"maximum": -1.5},
    {"exclusiveMinimum": -1}, {"minimum": -10, "maximum": 10}, {"minimum": 3, "maximum": 3},
])
def test_numbers_written_lie_within_the_bounds(node: dict[str, object]) -> None:
    """Every number text the grammar takes (probed on a grid of quarters and thousandths)
    lies within the bounds; an integer and a fraction inside them are taken."""
    node = {"type": "number", **node}
    rx = number_regex(node)
    probes = [k / 4 for k in range(-60, 61)] + [k / 1000 for k in range(-3000, 3001, 7)]
    texts = {repr(v) if v != int(v) else str(int(v)) for v in probes}
    taken = [t for t in texts if rx.fullmatch(t)]
    assert taken and all(within(float(t), node) for t in taken), taken
    inside = [t for t in texts if within(float(t), node)]
    assert len(taken) >= len(inside) // 4, (len(taken), len(inside))  # (a fair share)


@pytest.mark.parametrize("node", [
    {"minimum": 0.1, "maximum": 0.2}, {"minimum": 0.001, "exclusiveMaximum": 0.002},
    {"exclusiveMinimum": 3.14159, "exclusiveMaximum": 3.1416},
    {"exclusiveMinimum": 0, "exclusiveMaximum": 0.001}, {"exclusiveMinimum": 2.5, "maximum": 2.75},
    {"minimum": -0.2, "maximum": -0.1},
])
def test_narrow_number_ranges_are_decimals_within_them(node: dict[str, object]) -> None:
    """Ranges no ``n.f`` fits in (pydantic's ``confloat(ge=1e-3, lt=2e-3)``) are written
    as decimals of a few places: every one taken lies within the bounds."""
    node = {"type": "number", **node}
    rx = number_regex(node)
    texts = {f"{k / 10 ** 7:.{p}f}" for k in range(-40_000_000, 40_000_001, 997)
             for p in (1, 2, 3, 6)}
    texts |= {"0.1", "0.2", "0.0015", "3.141595", "0.0005", "2.6", "2.75", "-0.15"}
    taken = [t for t in texts if rx.fullmatch(t)]
    assert taken and all(within(float(t), node) for t in taken), taken


def test_number_bounds_no_text_fits_are_none_and_empty_ones_refused() -> None:
    assert range_gbnf({"type": "number", "exclusiveMinimum": 0.2,
                       "exclusiveMaximum": 0.2000001}) is None
    assert range_gbnf({"type": "number", "minimum": 1e20}) is None
    with pytest.raises(ValueError):
        range_gbnf({"type": "number", "minimum": 2, "maximum": 1})
    with pytest.raises(ValueError):
        range_gbnf({"type": "integer", "minimum": 1.2, "maximum": 1.8})
    assert range_gbnf({"type": "integer", "minimum": 1, "exclusiveMinimum": True,
                       "maximum": 3}) == "([2-3])"  # (draft 4)
