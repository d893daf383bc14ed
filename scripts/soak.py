#!/usr/bin/env python3
"""Soak test (on demand, not in CI): waves of concurrent streams against a small server for
--minutes, checking after each wave that every request completed or got 429 with
Retry-After, that no slot leaked, and how the server's memory moves.

Usage: .venv/bin/python scripts/soak.py --minutes 30 [--streams 64 --slots 4 --queue 16]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Server, free_port


async def wave(url: str, streams: int) -> dict[str, int]:
    counts = {"ok": 0, "429": 0, "other": 0}

    async def one(c: httpx.AsyncClient, i: int) -> None:
        body = {"model": "default", "max_tokens": 24, "stream": True,
                "messages": [{"role": "user", "content": f"Write about number {i}."}]}
        async with c.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            if r.status_code == 429 and int(r.headers.get("retry-after", "0")) >= 1:
                counts["429"] += 1
                return
            lines = [ln async for ln in r.aiter_lines()]
            ok = r.status_code == 200 and lines and lines[-1] == "data: [DONE]"
            counts["ok" if ok else "other"] += 1

    async with httpx.AsyncClient(timeout=300) as c:
        await asyncio.gather(*(one(c, i) for i in range(streams)))
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--queue", type=int, default=16)
    args = ap.parse_args()
    port = free_port()
    server = Server("edgeinfer", [sys.executable, "-m", "edgeinfer", "serve", "--port", str(port),
                                  "--model", "default", "--slots", str(args.slots),
                                  "--max-queue", str(args.queue), "--log-level", "warning"],
                    port, Path(tempfile.mkdtemp(prefix="edgeinfer-soak-")))
    failures = 0
    try:
        server.wait_ready()
        proc = psutil.Process(server.proc.pid)
        start_rss = None
        deadline = time.monotonic() + args.minutes * 60
        n = 0
        while time.monotonic() < deadline:
            counts = asyncio.run(wave(server.url, args.streams))
            stats = next(iter(httpx.get(f"{server.url}/health").json()["models"].values()))
            rss = proc.memory_info().rss >> 20
            start_rss = start_rss or rss
            n += 1
            leak = stats["slots_busy"] or stats["queued"]
            failures += counts["other"] + bool(leak)
            print(f"wave {n}: {counts}, slots busy {stats['slots_busy']}, queued "
                  f"{stats['queued']}, RSS {rss} MiB (first wave {start_rss} MiB)", flush=True)
    finally:
        server.stop()
    print("PASS" if failures == 0 else f"FAIL: {failures} problems")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
