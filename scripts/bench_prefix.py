#!/usr/bin/env python3
"""Prefix-cache benchmark: a long shared system prompt, edgeinfer against its peers, ONE run.

For each server, with a ~1,500-token system prompt (SmolLM2 Q4_1, same threads):
  cold   one request, nothing cached: time to first token
  warm   the same system prompt, another question: time to first token
  8 warm 8 simultaneous requests sharing the cached system prompt: TTFT p50 / max
  8 cold 8 simultaneous requests sharing a system prompt nobody has cached: TTFT p50 / max
and, for edgeinfer, the prompt tokens it computed and the KV cells in use.

Usage: .venv/bin/python scripts/bench_prefix.py   (LLAMA_SERVER_BIN adds llama-server)
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import (
    Server,
    ensure_peer_venv,
    free_port,
    llama_flags,
    llama_server_env,
    model_path,
    peer_command,
    script_parser,
    sse_json,
)

RULES = ("Rule {i}: when a visitor asks about the lighthouse, answer politely, cite the museum "
         "guide, mention opening hours from nine to five, and never invent dates or names. ")


def system_prompt(seed: str) -> str:
    return f"You are the assistant of the {seed} museum. " + "".join(
        RULES.format(i=i) for i in range(42))


async def ttft(client: httpx.AsyncClient, url: str, model: str, system: str,
               question: str) -> tuple[float, dict[str, object]]:
    body = {"model": model, "stream": True, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question}]}
    t0 = time.perf_counter()
    first = 0.0
    extra: dict[str, object] = {}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for chunk in sse_json(r):
            if not first and any((c.get("delta") or {}).get("content")
                                 for c in chunk.get("choices", [])):
                first = time.perf_counter() - t0
            if "timings" in chunk:
                extra = chunk["timings"]
    return first or (time.perf_counter() - t0), extra


def stats(url: str) -> dict[str, object] | None:
    try:
        models = httpx.get(f"{url}/health", timeout=5).json()["models"]
        return dict(next(iter(models.values())))
    except (httpx.HTTPError, KeyError, ValueError, StopIteration):
        return None


async def scenario(server: Server, model: str) -> dict[str, object]:
    out: dict[str, object] = {}
    warm_sys, cold_sys = system_prompt("harbour"), system_prompt("mountain")
    async with httpx.AsyncClient(timeout=900) as client:
        url = server.url
        await ttft(client, url, model, "Be brief.", "Hi")  # load / warm-up, tiny prompt
        before = stats(url)
        out["cold"], timings = await ttft(client, url, model, warm_sys, "What is the museum?")
        out["prompt_n"] = timings.get("prompt_n", "")
        out["warm"], _ = await ttft(client, url, model, warm_sys, "When does it open?")
        many = await asyncio.gather(*(ttft(client, url, model, warm_sys, f"Question {i}?")
                                      for i in range(8)))
        out["warm8"] = [t for t, _ in many]
        peak = stats(url)
        many = await asyncio.gather(*(ttft(client, url, model, cold_sys, f"Question {i}?")
                                      for i in range(8)))
        out["cold8"] = [t for t, _ in many]
        after = stats(url)
        if before and after and peak:
            out["computed_cold8"] = int(after["prompt_tokens"]) - int(peak["prompt_tokens"])
            cache = after["prefix_cache"]
            assert isinstance(cache, dict)
            out["cells"] = cache["cells_used"]
    return out


def main() -> int:
    ap = script_parser(__doc__)
    ap.add_argument("--skip-peer", action="store_true",
                    help="leave llama-cpp-python's server out")
    skip_peer = ap.parse_args().skip_peer
    gguf = model_path()
    log_dir = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-prefix-"))
    specs: list[tuple[str, list[str], dict[str, str] | None]] = []
    p = free_port()
    specs.append(("edgeinfer", [sys.executable, "-m", "edgeinfer", "serve", "--port", str(p),
                                "--threads", "2", "--slots", "8", "--context", "8192",
                                "--log-level", "warning"], None))
    if not skip_peer:
        p2 = free_port()
        specs.append(("llama-cpp-python", [*peer_command(ensure_peer_venv()),
                                           "--model", str(gguf), "--n_threads", "2", "--n_ctx",
                                           "4096", "--port", str(p2),
                                           "--interrupt_requests", "False"], None))
    binary = os.environ.get("LLAMA_SERVER_BIN")
    if binary:
        p3 = free_port()
        specs.append(("llama-server", [binary, "-m", str(gguf), "-t", "2", "-np", "8", "-c",
                                       "16384", "--port", str(p3), *llama_flags()],
                      llama_server_env(Path(binary))))
    rows = []
    for name, cmd, env in specs:
        port = int(cmd[cmd.index("--port") + 1])
        server = Server(name, cmd, port, log_dir, env)
        try:
            server.wait_ready()
            res = asyncio.run(scenario(server, "default" if name == "edgeinfer" else str(gguf)))
        finally:
            server.stop()
        rows.append((name, res))
        print(name, json.dumps(res), flush=True)

    print("\nSmolLM2-135M Q4_1, 2 threads, a system prompt of ~1,500 tokens; logs in", log_dir)
    print("\n| server | cold TTFT (s) | warm TTFT (s) | 8 warm: TTFT p50 / max (s) | "
          "8 cold: TTFT p50 / max (s) |")
    print("|---|---|---|---|---|")
    for name, r in rows:
        w8, c8 = r["warm8"], r["cold8"]
        assert isinstance(w8, list) and isinstance(c8, list)
        print(f"| {name} | {r['cold']:.2f} | {r['warm']:.2f} | {statistics.median(w8):.2f} / "
              f"{max(w8):.2f} | {statistics.median(c8):.2f} / {max(c8):.2f} |")
    ours = dict(rows)["edgeinfer"]
    if "computed_cold8" in ours:
        print(f"\nedgeinfer, 8 cold requests sharing a new system prompt: {ours['computed_cold8']} "
              f"prompt tokens computed (one prompt is {ours['prompt_n']} tokens); "
              f"{ours['cells']} KV cells in use after the run")
    for name, r in rows:
        if name != "edgeinfer":
            warm = float(ours['warm']) / float(r['warm'])
            print(f"ratios edgeinfer/{name}: warm TTFT {warm:.2f}x"
                  f", 8-warm max TTFT {max(ours['warm8']) / max(r['warm8']):.2f}x"  # type: ignore
                  f", 8-cold max TTFT {max(ours['cold8']) / max(r['cold8']):.2f}x")  # type: ignore
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
