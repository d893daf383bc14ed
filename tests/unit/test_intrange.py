from __future__ import annotations

import random
import re

import pytest

from edgeinfer.prompt.intrange import int_range_gbnf, int_range_regex


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
