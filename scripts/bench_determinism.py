#!/usr/bin/env python3
"""What the deterministic mode costs, ONE run, in-process (SmolLM2 Q4_1, 2 threads, 8 slots,
prefix cache not used): each workload with every request normal and with the mode on,
alternating, 3 rounds, median.

- 8 streams of 128 tokens: total tokens/s, all normal vs all deterministic (which run
  one at a time, in the lane: ``engine.lane``);
- 1 deterministic stream among 7 normal ones: total tokens/s vs all 8 normal (the step
  then makes two llama_decode calls, one in the lane);
- a cold 1,500-token prompt: time to its first token (deterministic prompts go in
  62-token pieces).

It also checks the mode's promise on the way: the deterministic stream's text is the same
in every round, alone or among the others.

Usage: .venv/bin/python scripts/bench_determinism.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

from edgeinfer.config import load_config, override_model
from edgeinfer.engine.delta import Delta
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.models.served import ServedModel, load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import script_parser

STREAM = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
LONG = ("The harbour master kept a ledger of every ship: its name, its cargo, its crew and "
        "the weather on the day it sailed. ") * 60


async def _one(served: ServedModel, text: str, params: SamplingParams) -> tuple[str, float]:
    prompt = served.chat_prompt([{"role": "user", "content": text}])
    t0 = time.perf_counter()
    first = 0.0
    parts = []
    gen: AsyncIterator[Delta] = served.engine.generate(f"b{time.monotonic_ns()}", prompt,
                                                       params, use_cache=False)
    async for d in gen:
        first = first or time.perf_counter() - t0
        parts.append(d.text)
    return "".join(parts), first


async def streams(served: ServedModel, det: list[bool]) -> tuple[float, str]:
    """len(det) streams at once; total tokens/s, and the first stream's text."""
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(
        _one(served, f"Tell me a story about the number {i}.",
             replace(STREAM, deterministic=d)) for i, d in enumerate(det)))
    return len(det) * STREAM.max_tokens / (time.perf_counter() - t0), outs[0][0]  # type: ignore[operator]


def main() -> int:
    script_parser(__doc__).parse_args()
    cfg = override_model(load_config().models[0], context=8192, slots=8, threads=2)
    served = load_model(cfg)
    loop = asyncio.new_event_loop()
    served.engine.start(loop)
    run = loop.run_until_complete
    cases = {
        "8 streams, tokens/s": ([False] * 8, [True] * 8),
        "1 deterministic among 7, tokens/s": ([False] * 8, [True] + [False] * 7),
    }
    texts: set[str] = set()
    print("| workload | normal | deterministic | ratio |")
    print("|---|---|---|---|")
    for name, (plain, det) in cases.items():
        got: dict[bool, list[float]] = {False: [], True: []}
        for r in range(3):
            for mode in ((False, True) if r % 2 == 0 else (True, False)):
                rate, text = run(streams(served, det if mode else plain))
                got[mode].append(rate)
                if mode:
                    texts.add(text)
        a, b = statistics.median(got[False]), statistics.median(got[True])
        print(f"| {name} | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
    texts.add(run(_one(served, "Tell me a story about the number 0.",
                       replace(STREAM, deterministic=True)))[0])
    ttft: dict[bool, list[float]] = {False: [], True: []}
    for r in range(3):
        for mode in ((False, True) if r % 2 == 0 else (True, False)):
            params = SamplingParams(temperature=0, max_tokens=1, deterministic=mode)
            ttft[mode].append(run(_one(served, LONG, params))[1])
    a, b = statistics.median(ttft[False]), statistics.median(ttft[True])
    n = len(served.chat_prompt([{"role": "user", "content": LONG}]))
    print(f"| cold {n}-token prompt, first token (s) | {a:.2f} | {b:.2f} | {b / a:.2f}x slower |")
    print(f"\ndeterministic stream's text: {len(texts)} distinct over 7 runs "
          "(alone and among others; 1 is the promise)")
    served.engine.stop()
    loop.close()
    return 0 if len(texts) == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
