"""What a decode step costs by its number of rows, measured: the price of a draft token.

On a CPU a step of ``n`` rows costs nearly ``n`` times a step of one (measured here,
SmolLM2 Q4_1 on 2 cores: 1 row 5.3 ms, 2 rows 11.2, 4 rows 16.9, 8 rows 27, 16 rows
47), so a draft token pays only when it is likely to be accepted, and less so the more
streams already share the step. The engine notes the time of every step in which each
row is a generating sequence's token or draft (all with logits); ``seconds(n)`` is the
moving average for ``n`` rows, interpolated between measured neighbours. Pure Python.
"""

from __future__ import annotations

SMOOTHING = 0.2  # weight of a new measurement in the moving average


class StepCost:
    """Moving averages of generating steps' decode seconds, by row count."""

    def __init__(self) -> None:
        self._seconds: dict[int, float] = {}

    def note(self, rows: int, seconds: float) -> None:
        if rows <= 0 or seconds <= 0:
            return
        old = self._seconds.get(rows)
        self._seconds[rows] = seconds if old is None else (
            (1 - SMOOTHING) * old + SMOOTHING * seconds)

    def seconds(self, rows: int) -> float | None:
        """The expected seconds of a step of ``rows`` rows; None when no step of as many
        rows or more was measured yet (unknown: worth trying once)."""
        exact = self._seconds.get(rows)
        if exact is not None:
            return exact
        above = [r for r in self._seconds if r > rows]
        if not above:
            return None
        hi = min(above)
        lo = max((r for r in self._seconds if r < rows), default=0)
        lo_s, hi_s = self._seconds.get(lo, 0.0), self._seconds[hi]
        return lo_s + (hi_s - lo_s) * (rows - lo) / (hi - lo)
