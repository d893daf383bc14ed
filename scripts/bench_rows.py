#!/usr/bin/env python3
"""What a verified draft can gain at most, ONE run, in-process: the time of one decode
step of one sequence with k draft tokens (k + 1 rows, each with its logits, after a
400-token prompt), for SmolLM2 at Q4_1 (the default) and Q8_0, 2 threads, median of 25.

Printed per k: the step's time, and the ceiling of speculation (k + 1 tokens in that
step, every draft accepted, against k + 1 steps of one token). The speed-up a workload
sees is below it: drafts that miss, prompt time, the HTTP path. On this 2-core CPU a
second row costs Q4_1 almost a whole step (no fast batched kernel for Q4_1 here), so the
ceiling stays low for short drafts; Q8_0's batched rows are cheaper.

Usage: .venv/bin/python scripts/bench_rows.py [--threads 2]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import model_path, script_parser

from edgeinfer.config import ModelConfig
from edgeinfer.engine.batch import Run
from edgeinfer.engine.native import LlamaRuntime

DRAFTS = (0, 1, 2, 3, 4, 8, 16)
PROMPT = 400
REPEATS = 25


def step_times(path: Path, threads: int) -> dict[int, float]:
    """Median seconds of one step with k drafts, for each k in DRAFTS."""
    rt = LlamaRuntime(ModelConfig(id="rows", path=path, context=2048, slots=1,
                                  threads=threads), path)
    try:
        text = "The quick brown fox jumps over the lazy dog. " * 60
        toks = rt.tokenize(text, add_special=False, parse_special=False)[:PROMPT]
        for start in range(0, PROMPT, rt.max_step):
            rt.decode([Run(0, start, toks[start:start + rt.max_step], True)])
        out = {}
        for k in DRAFTS:
            times = []
            for _ in range(REPEATS):
                t = time.perf_counter()
                rt.decode([Run(0, PROMPT, toks[:1 + k], True, k)])
                times.append(time.perf_counter() - t)
                rt.seq_rm(0, PROMPT, -1)
            out[k] = statistics.median(times)
        return out
    finally:
        rt.close()


def main() -> int:
    ap = script_parser(__doc__)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    print("| model | drafts k | step ms | ceiling (k+1) x t(0) / t(k) |")
    print("|---|---|---|---|")
    for name in ("smollm2-135m-instruct", "smollm2-135m-instruct-q8"):
        times = step_times(model_path(name), args.threads)
        for k, t in times.items():
            print(f"| {name} | {k} | {t * 1000:.1f} | {(k + 1) * times[0] / t:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
