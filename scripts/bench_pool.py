#!/usr/bin/env python3
"""Model-pool benchmark, ONE run of edgeinfer with the default models.toml:

- the same chat load (4 concurrent streams of 128 tokens) on SmolLM2 Q4_1 and on its
  Q8_0 variant: aggregate tokens/s and the memory each takes (weights + KV cache);
- time to first token of a cold model (not loaded: load on demand) against a
  preloaded one.

Usage: .venv/bin/python scripts/bench_pool.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import PROMPTS, Server, free_port, one_stream, script_parser

Q4, Q8, COLD = "smollm2-135m-instruct", "smollm2-135m-instruct-q8", "gemma-3-270m"


async def load(url: str, model: str, streams: int = 4, tokens: int = 128) -> float:
    async with httpx.AsyncClient(timeout=600) as c:
        await one_stream(c, url, "Hello", 4, model)  # loads it if needed, warms up
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(one_stream(c, url, PROMPTS[i], tokens, model)
                                      for i in range(streams)))
        return sum(n for n, _ in outs) / (time.perf_counter() - t0)


async def ttft(url: str, model: str) -> float:
    async with httpx.AsyncClient(timeout=600) as c:
        t0 = time.perf_counter()
        r = await c.post(f"{url}/v1/completions", json={"model": model, "prompt": "The sea",
                                                         "max_tokens": 1})
        r.raise_for_status()
        return time.perf_counter() - t0


def main() -> int:
    script_parser(__doc__).parse_args()
    port = free_port()
    log_dir = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-pool-"))
    server = Server("edgeinfer", [sys.executable, "-m", "edgeinfer", "serve", "--port", str(port),
                                  "--log-level", "warning"], port, log_dir)
    try:
        server.wait_ready()
        url = server.url
        httpx.post(f"{url}/v1/models/{COLD}/unload")
        warm = asyncio.run(ttft(url, Q4))
        cold = asyncio.run(ttft(url, COLD))
        rows = []
        for model in (Q4, Q8):
            tps = asyncio.run(load(url, model))
            meta = httpx.get(f"{url}/v1/models/{model}").json()["meta"]
            rows.append((model, tps, meta["memory_bytes"] / 2**20, meta["size_bytes"] / 2**20))
    finally:
        server.stop()
    print("\n| model | tokens/s (4 streams x 128) | memory (MiB, weights + KV) | weights (MiB) |")
    print("|---|---|---|---|")
    for model, tps, mem, size in rows:
        print(f"| {model} | {tps:.1f} | {mem:.0f} | {size:.0f} |")
    print(f"\nQ8_0 / Q4_1 throughput: {rows[1][1] / rows[0][1]:.2f}x")
    print(f"time to first token: preloaded {Q4} {warm * 1000:.0f} ms; cold {COLD} "
          f"(loaded on demand) {cold * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
