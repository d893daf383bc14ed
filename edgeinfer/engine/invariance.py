"""Deterministic mode: a sequence's numbers do not depend on what else the engine runs.

llama.cpp's CPU kernels give a token's logits bit for bit whatever other rows share its
batch (each matrix row is its own dot products; flash attention skips the cells other
sequences own), except where a kernel is chosen by the shape of the whole batch:

- flash attention takes a tiled path when a batch has 64 query rows or more, and a
  KV-split path (partial sums per thread over the KV view, whose length other sequences
  set) when it has exactly one row and the view is 512 cells or longer;
- so the same token, computed in a big prompt step, beside one other stream, or alone,
  can come out with different rounding, and a greedy answer parts after a few tokens.

A deterministic sequence's tokens therefore go in llama_decode calls that always take the
plain path: up to ``MAX_ROWS`` rows (a lone row whose view is long enough for the
KV-split path gets a pad row of a scratch sequence, removed right after), and its prompt
in pieces of at most 62 tokens (the
scheduler's ``DETERMINISTIC_PIECE``). Those calls go to a context of their own, the
lane (``engine.lane``), which holds the sequence at cells equal to its positions (the
order of its cells also moves the numbers) and keeps the previous deterministic
request's tokens as a prefix for the next. The cost: one more llama_decode per step
while a deterministic request runs, deterministic requests one at a time, prompts in
smaller pieces, and a second KV cache (scripts/bench_determinism.py measures the time).
"""

from __future__ import annotations

from edgeinfer.engine.batch import Run
from edgeinfer.engine.scheduler import ATTENTION_TILE, Chunk

MAX_ROWS = ATTENTION_TILE - 1  # below ggml's tiled flash-attention threshold
# ggml's KV-split path takes one query row over a view of this many cells or more;
# llama.cpp pads the view to a multiple of VIEW_PAD cells
SPLIT_VIEW, VIEW_PAD = 512, 256


def calls(chunks: list[Chunk]) -> list[list[Chunk]]:
    """The llama_decode calls of one step: the shared context's (as planned), then the
    deterministic sequence's, in the lane (``engine.lane``; one runs at a time)."""
    det = [c for c in chunks if c.seq.deterministic]
    rest = [c for c in chunks if not c.seq.deterministic]
    return [call for call in (rest, det) if call]


def pad(runs: list[Run], scratch: int) -> bool:
    """Add a pad row (token 0 of the ``scratch`` sequence) to a call of one row in the lane
    whose KV view would take the KV-split path, so that it takes the same kernel as a call
    of several; True when added (the caller removes the scratch sequence's cell after the
    decode). In the lane a token at position p lies in cell p, so the view is ``p + 1``
    cells padded to ``VIEW_PAD``: split from p = ``SPLIT_VIEW - VIEW_PAD`` on."""
    if sum(len(r.tokens) for r in runs) != 1 or runs[0].start < SPLIT_VIEW - VIEW_PAD:
        return False
    runs.append(Run(scratch, 0, [0], False))
    return True
