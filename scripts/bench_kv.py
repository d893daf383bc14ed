#!/usr/bin/env python3
"""KV cache types, ONE run, in-process (SmolLM2 Q4_1, 2 threads, an 8,192-token context):
for f16, q8_0 and q4_0 K/V, the KV cache's size (edgeinfer's figure, which is what
llama.cpp allocates), the KL divergence of the first token's distribution from f16's
(over f16's top 20, for 4 prompts, the largest printed), and one stream's tokens/s over
128 tokens (3 alternating rounds, median).

Usage: .venv/bin/python scripts/bench_kv.py
"""

from __future__ import annotations

import asyncio
import math
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

from edgeinfer.config import load_config, override_model
from edgeinfer.engine.loop import Delta
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.models.served import ServedModel, load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import script_parser

KINDS = ("f16", "q8_0", "q4_0")
PROMPTS = ["What does a lighthouse keeper do in winter?", "Explain how rain forms.",
           "Write a short poem about bread.", "Why is the sky blue?"]


async def drain(gen: AsyncIterator[Delta]) -> list[Delta]:
    return [d async for d in gen]


def run(served: ServedModel, loop: asyncio.AbstractEventLoop, text: str,
        params: SamplingParams) -> list[Delta]:
    prompt = served.chat_prompt([{"role": "user", "content": text}])
    return loop.run_until_complete(drain(served.engine.generate(
        f"b{time.monotonic_ns()}", prompt, params, use_cache=False)))


def main() -> int:
    script_parser(__doc__).parse_args()
    base = load_config().models[0]
    loop = asyncio.new_event_loop()
    models = {}
    for kind in KINDS:
        cfg = override_model(base, context=8192, slots=2, threads=2, cache_type_k=kind,
                             cache_type_v=kind)
        models[kind] = load_model(cfg)
        models[kind].engine.start(loop)
    first = SamplingParams(temperature=0, max_tokens=1, logprobs=20)
    tops = {k: [run(m, loop, p, first)[0].logprob for p in PROMPTS] for k, m in models.items()}
    speed: dict[str, list[float]] = {k: [] for k in KINDS}
    for r in range(3):
        for kind in (KINDS if r % 2 == 0 else tuple(reversed(KINDS))):
            t0 = time.perf_counter()
            out = run(models[kind], loop, PROMPTS[0], SamplingParams(
                temperature=0, max_tokens=128, ignore_eos=True))
            speed[kind].append(sum(len(d.tokens) for d in out) / (time.perf_counter() - t0))
    print("| K/V type | KV cache (MiB, 8,192 cells) | vs f16 | first-token KL vs f16 (max "
          "of 4) | same top token | 1 stream tokens/s |")
    print("|---|---|---|---|---|---|")
    f16_kv = models["f16"].runtime.memory_bytes() - models["f16"].runtime.info.size_bytes
    for kind, m in models.items():
        kv = m.runtime.memory_bytes() - m.runtime.info.size_bytes
        kls, same = [], 0
        for p, q in zip(tops["f16"], tops[kind], strict=True):
            assert p is not None and q is not None
            qd = dict(q.top)
            floor = min(qd.values())
            kls.append(sum(math.exp(lp) * (lp - qd.get(t, floor)) for t, lp in p.top))
            same += p.top[0][0] == q.top[0][0]
        print(f"| {kind} | {kv / 2**20:.1f} | {kv / f16_kv:.2f}x | {max(kls):.5f} | "
              f"{same}/{len(PROMPTS)} | {statistics.median(speed[kind]):.1f} |")
    for m in models.values():
        m.engine.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
