"""What a generation step costs by its rows, as measured: the price of a draft.

llama.cpp's CPU kernels charge rows very differently by quantization (README "Speculative
decoding": on this CPU a second row costs as much as the first for both SmolLM2 files, and
each row past four costs Q8_0 almost nothing but Q4_1 about 2 ms). Drafted rows pay only
when the tokens they are expected to add are worth more than they cost.

``StepCost`` keeps a moving average of the seconds of generation steps (no prompt piece
in them) for each row count. ``bar(streams, rows, k)`` is the share of ``k`` drafted rows,
added to a step of ``rows`` rows with ``streams`` generating sequences, that must be
accepted for the step to yield tokens at least as cheaply as a step without drafts:
``(cost(rows + k) - cost(rows)) / k`` against ``cost(streams) / streams``. A row count's
average counts once it has ``MIN_SAMPLES`` measurements, until ``STALE`` generation steps
pass without one (then drafts that need it measure it again: a cost measured long ago, or
one slow step, does not rule drafts out for good); other counts are interpolated, or
extrapolated along the widest span measured; with fewer than two counts the bar is 0
(draft, and so measure).

A lone stream's bar is fixed (``LONE_BAR``), never measured: a lone row without drafts goes
through another ggml kernel than a step of several rows once the KV view passes 512 cells,
so whether it drafts can move its numbers in their last bits, and a measured bar would make
the same request's greedy answer depend on the machine's timing. Beside other streams a
sequence's rows get the same logits whatever else is in the step (flash attention), so the
measured bar decides there. Pure Python.
"""

from __future__ import annotations

MAX_ROWS = 512
ALPHA = 0.2  # weight of a new measurement in the moving average
MIN_SAMPLES = 2  # measurements of a row count before its average is used
STALE = 2000  # generation steps after which a row count's average is measured again
# a lone stream's bar: what its measured 3- to 7-token drafts asked here (SmolLM2 Q4_1 0.66
# to 0.52, Q8_0 0.74 to 0.41); it admits prompt matches, resyncs and predictions, not
# matches into the output alone (whole ones, 0.6, about break even on Q4_1: a risk with
# nothing to gain; see ``drafts.PRIOR``)
LONE_BAR = 0.6


class StepCost:
    def __init__(self) -> None:
        self._seconds: dict[int, float] = {}
        self._samples: dict[int, int] = {}
        self._seen: dict[int, int] = {}  # row count -> the step it was last measured at
        self._steps = 0

    def note(self, rows: int, seconds: float) -> None:
        """A generation step of ``rows`` rows took ``seconds``."""
        if 0 < rows <= MAX_ROWS and seconds > 0:
            self._steps += 1
            old = self._seconds.get(rows)
            self._seconds[rows] = seconds if old is None else old + ALPHA * (seconds - old)
            self._samples[rows] = self._samples.get(rows, 0) + 1
            self._seen[rows] = self._steps

    def estimate(self, rows: int) -> float | None:
        """The seconds of a step of ``rows`` rows, from the row counts measured at least
        ``MIN_SAMPLES`` times and lately: interpolated between the two nearest, or outside
        them extrapolated along the line through the fewest and the most rows measured (the
        widest span, the least noise); None with fewer than two such counts."""
        known = [r for r in sorted(self._seconds) if self._samples[r] >= MIN_SAMPLES
                 and self._steps - self._seen[r] < STALE]
        if rows in known:
            return self._seconds[rows]
        if len(known) < 2:
            return None
        below = [r for r in known if r < rows]
        above = [r for r in known if r > rows]
        lo, hi = (below[-1], above[0]) if below and above else (known[0], known[-1])
        slope = (self._seconds[hi] - self._seconds[lo]) / (hi - lo)
        return max(0.0, self._seconds[lo] + slope * (rows - lo))

    def bar(self, streams: int, rows: int, k: int, share: float = 1.0) -> float:
        """The share of ``k`` draft rows that must be accepted for them to pay when
        ``share`` of the ``streams`` draft (see ``shared``): 0.0 where a row count it needs
        is not known (draft, and so measure it), ``LONE_BAR`` for a lone stream."""
        if streams == 1:
            return LONE_BAR
        base, before, after = (self.estimate(streams), self.estimate(rows),
                               self.estimate(rows + k))
        if base is None or before is None or after is None or base <= 0 or k <= 0:
            return 0.0
        return shared(max(0.0, after - before) / k / (base / streams), share)


def shared(bar: float, share: float) -> float:
    """The bar of drafts when only ``share`` of a step's streams draft and nothing waits.

    ``bar`` values an accepted token at a stream's share of the step, ``cost(streams) /
    streams``: its own row, ``b``, and a part of what the step costs whatever its rows,
    ``a / streams``. A stream that gets ahead saves its rows, but the steps go on, at that
    fixed cost, until the streams that do not draft are done too (when requests wait, the
    slot it frees takes one of them, and the whole share counts). So only ``share`` of the
    fixed part is counted: ``b / (b + share * a / streams)``, that is ``bar / (bar + share *
    (1 - bar))``; 1.0 where no stream gains."""
    if share >= 1.0 or not 0.0 < bar < 1.0:
        return bar
    return bar / (bar + max(0.0, share) * (1.0 - bar))
