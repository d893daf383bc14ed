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
plain path: between 2 and ``MAX_ROWS`` rows (a lone row gets a pad row of a scratch
sequence, removed right after), shared only with other streams' next tokens (other
prompts' chunks go in a call of their own), and its prompt in pieces of at most 62
tokens (the scheduler's ``DETERMINISTIC_PIECE``). Its cells are laid out in position
order as long as the cache has no free cells before them (llama.cpp fills the lowest
free cell from its head; a removal moves the head back to the freed cells), which holds
in normal serving: finished requests stay cached, rejected drafts are refilled at once.
A prefix from the cache is taken only as far as it was itself computed this way
(``PrefixCache.attach``). The cost: one more llama_decode in a step that also computes
other prompts, and prompts in smaller pieces (scripts/bench_determinism.py measures
both).
"""

from __future__ import annotations

from edgeinfer.engine.batch import Run
from edgeinfer.engine.scheduler import Chunk

# below ggml's tiled flash-attention threshold (GGML_FA_TILE_Q = 64 query rows)
MAX_ROWS = 63


def calls(chunks: list[Chunk]) -> list[list[Chunk]]:
    """The llama_decode calls of one step: one, as planned, when no deterministic sequence
    is in it; else the deterministic sequences' chunks with the other streams' next tokens
    (and drafts) in calls of at most ``MAX_ROWS`` rows, and the other sequences' prompt
    chunks in a call of their own (so a step of streams alone stays one call)."""
    if not any(c.seq.deterministic for c in chunks):
        return [chunks]
    prompts = [c for c in chunks if not c.seq.deterministic and c.start < c.seq.num_prompt]
    small = [c for c in chunks if c not in prompts]
    out: list[list[Chunk]] = []
    rows = MAX_ROWS
    # deterministic rows first: the cells the others' rejected drafts free then lie after
    # them, and are refilled in order
    for chunk in sorted(small, key=lambda c: not c.seq.deterministic):
        if rows + len(chunk.tokens) > MAX_ROWS:
            out.append([])
            rows = 0
        out[-1].append(chunk)
        rows += len(chunk.tokens)
    return out + [prompts] if prompts else out


def pad(runs: list[Run], chunks: list[Chunk], scratch: int) -> bool:
    """Add a pad row (token 0 of the ``scratch`` sequence) to a deterministic call of one
    row, so that it takes the same kernel as a call of several; True when added (the
    caller removes the scratch sequence's cell after the decode)."""
    if sum(len(r.tokens) for r in runs) != 1 or not chunks[0].seq.deterministic:
        return False
    runs.append(Run(scratch, 0, [0], False))
    return True
