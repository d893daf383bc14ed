#!/usr/bin/env python3
"""What a request that offers tools costs the other streams, in ONE run.

Starts edgeinfer on 127.0.0.1 and measures a bystander stream's mean inter-token
latency (ITL) twice, alternating, --rounds times:
  * beside a plain streaming request, and
  * beside a request that offers one tool with tool_choice "auto" (a lazy tool
    grammar that waits for the model to open a call; EOS is suppressed, so it
    keeps writing text),
each companion generating as many tokens as the bystander. Prints both ITLs and
their ratio (1.0: the tools request costs the bystander nothing extra).

Usage: .venv/bin/python scripts/bench_tools.py [--tokens 200] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from edgeinfer.cli.sse import sse_json

ROOT = Path(__file__).resolve().parent.parent
EOS_ID = 2  # SmolLM2's <|im_end|>
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def stream(client: httpx.AsyncClient, body: dict[str, Any]) -> list[float]:
    """Arrival times of the tokens of one streamed chat completion."""
    times: list[float] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for chunk in sse_json(r):
            delta = chunk.get("choices") or [{}]
            if (delta[0].get("delta") or {}).get("content") or (
                    delta[0].get("delta") or {}).get("tool_calls"):
                times.append(time.perf_counter())
    return times


async def one_round(base: str, tokens: int, with_tools: bool) -> float:
    common = {"model": "default", "max_tokens": tokens, "stream": True, "temperature": 0.8,
              "seed": 1, "logit_bias": {str(EOS_ID): -100}}
    bystander = {**common, "messages": [{"role": "user", "content": "Describe the sea."}]}
    companion: dict[str, Any] = {
        **common, "messages": [{"role": "user", "content": "Tell me about bread."}]}
    if with_tools:
        companion.update(tools=[TOOL], tool_choice="auto")
    async with httpx.AsyncClient(base_url=base, timeout=300) as client:
        times, _ = await asyncio.gather(stream(client, bystander), stream(client, companion))
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return statistics.mean(gaps) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="bench-tools-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "edgeinfer", "serve", "--port", str(port),
                             "--threads", str(args.threads), "--log-level", "warning"],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        asyncio.run(one_round(base, 16, False))  # warm-up
        plain, tools = [], []
        for _ in range(args.rounds):
            plain.append(asyncio.run(one_round(base, args.tokens, False)))
            tools.append(asyncio.run(one_round(base, args.tokens, True)))
        p, t = statistics.median(plain), statistics.median(tools)
        print(f"bystander ITL beside a plain stream:   {p:6.1f} ms  (rounds: "
              f"{', '.join(f'{x:.1f}' for x in plain)})")
        print(f"bystander ITL beside a tools request:  {t:6.1f} ms  (rounds: "
              f"{', '.join(f'{x:.1f}' for x in tools)})")
        print(f"ratio (tools / plain): {t / p:.2f}x  ({args.tokens} tokens each, "
              f"{args.threads} threads, server log {Path(log.name)})")
    finally:
        proc.terminate()
        proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
