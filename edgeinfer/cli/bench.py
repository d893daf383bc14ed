"""``edgeinfer bench``: throughput and time to first token of a running server."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

import httpx

from edgeinfer.cli.sse import delta_text, sse_json


async def _stream(client: httpx.AsyncClient, model: str, tokens: int, i: int
                  ) -> tuple[int, float]:
    body = {"model": model, "max_tokens": tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "messages": [{"role": "user", "content": f"Tell story {i}."}]}
    t0 = time.perf_counter()
    first, n = 0.0, 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for chunk in sse_json(r):
            if delta_text(chunk):
                n += 1
                first = first or time.perf_counter() - t0
    return n, first


async def _run(url: str, model: str, streams: int, tokens: int, api_key: str | None
               ) -> dict[str, float]:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600) as client:
        await _stream(client, model, 4, -1)  # warm-up
        t0 = time.perf_counter()
        results = await asyncio.gather(*(_stream(client, model, tokens, i)
                                         for i in range(streams)))
        wall = time.perf_counter() - t0
    ttfts = sorted(t for _, t in results)
    return {"streams": streams, "tokens": sum(n for n, _ in results),
            "tokens_per_second": round(sum(n for n, _ in results) / wall, 1),
            "ttft_p50_ms": round(statistics.median(ttfts) * 1000),
            "ttft_max_ms": round(ttfts[-1] * 1000)}


def run_bench(url: str, model: str, streams: list[int], tokens: int,
              api_key: str | None) -> int:
    """Print one line per concurrency level: aggregate tokens/s and TTFT."""
    for n in streams:
        try:
            r = asyncio.run(_run(url, model, n, tokens, api_key))
        except httpx.HTTPError as exc:
            sys.stderr.write(f"edgeinfer bench: {url}: {exc}\n")
            return 1
        sys.stdout.write(f"{n:3d} streams x {tokens} tokens: {r['tokens_per_second']:7.1f} "
                         f"tokens/s, first token p50 {r['ttft_p50_ms']} ms, "
                         f"max {r['ttft_max_ms']} ms\n")
        sys.stdout.flush()
    return 0
