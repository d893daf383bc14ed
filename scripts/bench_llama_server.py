#!/usr/bin/env python3
"""edgeinfer against llama.cpp's llama-server, ONE run, alternating, medians of --rounds.

Both servers run at once on 127.0.0.1 with the same SmolLM2 Q4_1 file, 2 threads, 8
slots, an 8,192-token context shared by the slots (llama-server ``-kvu``, as edgeinfer's
unified cache; each idles while the other is measured); every round
runs each measure on both servers back to back, the order alternating from one measure
to the next and between rounds, and the short measures (streams, the cold prompt, deep
streams) twice, A B B A, so neither server is always the one measured second (this
machine drifts by 10 % within minutes):

- 1, 4 and 8 concurrent streamed chats of 128 tokens (end of generation suppressed):
  tokens/s (one stream: the median of 3 chats);
- a cold ~1,500-token prompt (a new one every time): time to first token, and the
  tokens/s of its 64-token answer after it (one stream generating 1,500 tokens deep);
- 4 streams on new ~800-token prompts at once: tokens/s from the moment all four
  generate (streams deep in a context, as a long chat is);
- 16 mixed arrivals, one every 0.5 s, prompts of about 20 to 150 tokens, answers of 64
  to 160 tokens (the load of the issue's table: about 130-180 tokens/s, every request
  admitted soon after it arrives on the CPU it was set for; on a slower one, such as a
  2-core Xeon that computes 8 streams at ~135 tokens/s, they queue for the 8 slots): makespan,
  tokens/s and first-token p95;
- the same 16 arrivals paced to such a CPU, one every 1.0 s (each request holds a slot for
  ~7 s there, so fewer than 8 run at once and each is admitted on arrival, as the issue's
  load was where it was measured): makespan, tokens/s and first-token p95;
- 16 arrivals in overload, one every 0.25 s, prompts of about 20 to 430 tokens, answers of
  16 to 128 tokens: prompts arrive twice as fast as this CPU computes them, so the
  first-token p95 is time spent queued behind earlier prompts and for a slot, on any
  server: makespan, tokens/s and first-token p95.

Printed: the medians, the rounds, and edgeinfer / llama-server ratios.

Usage: LLAMA_SERVER_BIN=/path/to/llama-server .venv/bin/python scripts/bench_llama_server.py
       [--rounds 3] [--threads 2] [--edgeinfer-arg=--flash-attn=off ...]
The binary: build tools/server of the llama.cpp that the pinned llama-cpp-python vendors
(README "Benchmarks" says how).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import EOS_ID, PROMPTS, Server, free_port, llama_flags, llama_server_env, model_path

from edgeinfer.cli.sse import sse_json

CLAUSE = "Clause {k}: the tenant keeps the garden tidy and pays the rent on the first."


def long_prompt(seed: str, clauses: int = 95) -> str:
    return f"Document {seed}. " + " ".join(CLAUSE.format(k=k) for k in range(clauses))


async def chat(client: httpx.AsyncClient, url: str, model: str, prompt: str, tokens: int,
               times: list[float] | None = None) -> tuple[int, float]:
    """(tokens received, time to the first one) of one streamed chat; each token's arrival
    (perf_counter) is appended to ``times``."""
    t0 = time.perf_counter()
    first, n = 0.0, 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json={
            "model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": tokens, "temperature": 0, "stream": True,
            "logit_bias": {str(EOS_ID): -100}}) as r:
        r.raise_for_status()
        async for chunk in sse_json(r):
            for choice in chunk.get("choices", []):
                if (choice.get("delta") or {}).get("content"):
                    n += 1
                    first = first or time.perf_counter() - t0
                    if times is not None:
                        times.append(time.perf_counter())
    return n, first


async def streams(url: str, model: str, level: int) -> float:
    async with httpx.AsyncClient(timeout=600) as c:
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(chat(c, url, model, PROMPTS[i % len(PROMPTS)], 128)
                                      for i in range(level)))
        return sum(n for n, _ in outs) / (time.perf_counter() - t0)


async def cold(url: str, model: str, seed: str) -> tuple[float, float]:
    """(time to the first token, tokens/s after it) of a new ~1,500-token prompt and a
    64-token answer: a stream generating 1,500 tokens deep."""
    async with httpx.AsyncClient(timeout=600) as c:
        times: list[float] = []
        _, first = await chat(c, url, model, long_prompt(seed), 64, times)
        return first, (len(times) - 1) / (times[-1] - times[0])


async def deep(url: str, model: str, seed: str, level: int = 4) -> float:
    """Tokens/s of ``level`` streams generating together about 800 tokens deep: from the
    moment the last of them has its first token (each has a new ~800-token prompt)."""
    async with httpx.AsyncClient(timeout=600) as c:
        lists: list[list[float]] = [[] for _ in range(level)]
        await asyncio.gather(*(chat(c, url, model, long_prompt(f"{seed}-{i}", clauses=42), 96,
                                    lists[i]) for i in range(level)))
    start = max(ts[0] for ts in lists)
    after = [t for ts in lists for t in ts if t > start]
    return len(after) / (max(after) - start)


# workload: (seconds between arrivals, clauses of the 4 kinds of prompt, their max_tokens)
WORKLOADS = {"mixed": (0.5, (1, 2, 4, 8), (64, 128, 96, 160)),
             "paced": (1.0, (1, 2, 4, 8), (64, 128, 96, 160)),
             "overload": (0.25, (1, 4, 10, 25), (16, 48, 128, 64))}


async def mixed(url: str, model: str, seed: str, workload: str
                ) -> tuple[float, float, float]:
    """(makespan, tokens/s, first-token p95) of 16 staggered arrivals."""
    gap, clauses, answers = WORKLOADS[workload]

    async def one(c: httpx.AsyncClient, i: int) -> tuple[int, float]:
        await asyncio.sleep(gap * i)
        prompt = long_prompt(f"{seed}-{i}", clauses=clauses[i % 4])
        return await chat(c, url, model, prompt, answers[i % 4])
    async with httpx.AsyncClient(timeout=600) as c:
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(one(c, i) for i in range(16)))
        span = time.perf_counter() - t0
    firsts = sorted(f for _, f in outs)
    return span, sum(n for n, _ in outs) / span, firsts[round(0.95 * (len(firsts) - 1))]


Measure = Callable[[str, str], dict[str, float]]


def measures(r: int) -> dict[str, tuple[Measure, bool]]:
    """Round ``r``'s measures: each a function of (url, model) that returns its numbers,
    and whether it runs twice a round (A B B A: the short ones, whose rounds swing most)."""
    def cold_m(url: str, model: str) -> dict[str, float]:
        first, tps = asyncio.run(cold(url, model, f"cold-{r}-{time.monotonic()}"))
        return {"cold TTFT s": first, "x1 deep tok/s": tps}

    def workload(name: str) -> Measure:
        def run(url: str, model: str) -> dict[str, float]:
            span, tps, p95 = asyncio.run(mixed(url, model, f"{name}-{r}-{model[-8:]}", name))
            return {f"{name} makespan s": span, f"{name} tok/s": tps,
                    f"{name} TTFT p95 s": p95}
        return run
    out: dict[str, tuple[Measure, bool]] = {
        f"x{level}": ((lambda url, model, level=level: {f"x{level} tok/s": statistics.median(
            asyncio.run(streams(url, model, level)) for _ in range(3 if level == 1 else 1))}),
            True) for level in (1, 4, 8)}
    out["cold"] = cold_m, True
    out["deep"] = (lambda url, model: {
        "x4 deep tok/s": asyncio.run(deep(url, model, f"deep-{r}-{time.monotonic()}"))}), True
    out.update({name: (workload(name), False) for name in WORKLOADS})
    return out


def run_round(servers: dict[str, tuple[Server, str]], r: int) -> dict[str, dict[str, float]]:
    """One round: each measure on both servers back to back, the order alternating from
    one measure to the next and between rounds; a measure run twice is the mean of both."""
    rows: dict[str, dict[str, float]] = {name: {} for name in servers}
    for k, (fn, twice) in enumerate(measures(r).values()):
        order = list(servers) if (r + k) % 2 == 0 else list(reversed(servers))
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
        for name in order + order[::-1] if twice else order:
            srv, model = servers[name]
            runs[name].append(fn(srv.url, model))
        for name, got in runs.items():
            rows[name].update({key: statistics.mean(g[key] for g in got) for key in got[0]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--edgeinfer-arg", action="append", default=[],
                    help="a flag for edgeinfer serve (repeat it), e.g. --edgeinfer-arg=-fa=off")
    args = ap.parse_args()
    binary = os.environ.get("LLAMA_SERVER_BIN")
    if not binary:
        print("set LLAMA_SERVER_BIN to llama.cpp's llama-server binary", file=sys.stderr)
        return 2
    gguf, logs = model_path(), Path(tempfile.mkdtemp(prefix="edgeinfer-bench-ls-"))
    p1, p2 = free_port(), free_port()
    servers = {
        "edgeinfer": (Server("edgeinfer", [
            sys.executable, "-m", "edgeinfer", "serve", "--port", str(p1), "--threads",
            str(args.threads), "--slots", "8", "--context", "8192", "--log-level", "warning",
            *args.edgeinfer_arg],
            p1, logs), "default"),
        "llama-server": (Server("llama-server", [
            binary, "-m", str(gguf), "-t", str(args.threads), "-np", "8", "-c", "8192", "-kvu",
            "--port", str(p2), *llama_flags()], p2, logs, llama_server_env(Path(binary))),
            str(gguf)),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
    try:
        for srv, model in servers.values():
            srv.wait_ready()
            asyncio.run(streams(srv.url, model, 1))  # warm-up
        for r in range(args.rounds):
            rows = run_round(servers, r)
            for name in servers:
                results[name].append(rows[name])
                print(f"round {r + 1} {name}: " + ", ".join(
                    f"{k} {v:.2f}" for k, v in rows[name].items()), flush=True)
    finally:
        for srv, _ in servers.values():
            srv.stop()
    report(results)
    return 0


def report(results: dict[str, list[dict[str, float]]]) -> None:
    keys = list(results["edgeinfer"][0])
    med = {n: {k: statistics.median(r[k] for r in rs) for k in keys} for n, rs in results.items()}
    print("\n| measure | edgeinfer | llama-server | edgeinfer / llama-server |")
    print("|---|---|---|---|")
    for k in keys:
        e, ls = med["edgeinfer"][k], med["llama-server"][k]
        print(f"| {k} | {e:.2f} | {ls:.2f} | {e / ls:.2f}x |")
    print("(tok/s: higher is better; s: lower is better)")


if __name__ == "__main__":
    raise SystemExit(main())
