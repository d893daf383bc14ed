#!/usr/bin/env python3
"""Predicted Outputs (OpenAI's ``prediction``), ONE run: tokens/s of answers whose expected
text the request gives, against the same requests without it.

edgeinfer serves the default model (4 slots, 2 threads). Each prompt of scripts/bench.py is
answered once without drafts (greedy, 160 tokens, end of generation suppressed): that
answer is the prediction. Then, alternating over --rounds rounds, at 1 and 4 concurrent
streams: no drafts (``"speculative": false``), prompt-lookup drafts alone (the default),
drafts with the exact answer as ``prediction``, and with an edited one (every tenth word
replaced, as when a client predicts the file it asks to edit). One stream's answers are
checked to be the same in every mode (four streams decoded together may differ in their
last bits from one alone, so their answers may depart from the prediction).

Usage: .venv/bin/python scripts/bench_prediction.py [--rounds 3]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import EOS_ID, PROMPTS, Server, free_port, script_parser

TOKENS = 160
MODES = ("no drafts", "drafts", "exact prediction", "edited prediction")


async def answer(client: httpx.AsyncClient, url: str, prompt: str, mode: str,
                 predicted: dict[str, str]) -> str:
    body: dict[str, object] = {
        "model": "default", "messages": [{"role": "user", "content": prompt}],
        "max_tokens": TOKENS, "temperature": 0, "logit_bias": {str(EOS_ID): -100},
        "speculative": mode != "no drafts", "cache_prompt": False}
    if mode == "exact prediction":
        body["prediction"] = {"type": "content", "content": predicted[prompt]}
    elif mode == "edited prediction":
        words = predicted[prompt].split(" ")
        body["prediction"] = {"type": "content", "content": " ".join(
            "harbour" if i % 10 == 5 else w for i, w in enumerate(words))}
    r = await client.post(f"{url}/v1/chat/completions", json=body)
    r.raise_for_status()
    return str(r.json()["choices"][0]["message"]["content"])


async def measure(url: str, mode: str, streams: int, predicted: dict[str, str],
                  offset: int) -> tuple[float, list[str]]:
    prompts = [PROMPTS[(offset + i) % len(PROMPTS)] for i in range(streams)]
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        texts = await asyncio.gather(*(answer(client, url, p, mode, predicted)
                                       for p in prompts))
        return streams * TOKENS / (time.perf_counter() - t0), list(texts)


def main() -> int:
    ap = script_parser(__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    port = free_port()
    srv = Server("edgeinfer", [sys.executable, "-m", "edgeinfer", "serve", "--port", str(port),
                               "--threads", "2", "--slots", "4", "--context", "8192",
                               "--log-level", "warning"],
                 port, Path(tempfile.mkdtemp(prefix="edgeinfer-bench-prediction-")))
    table: dict[tuple[str, int], list[float]] = {}
    try:
        srv.wait_ready()
        predicted: dict[str, str] = {}
        for prompt in PROMPTS:
            predicted[prompt] = asyncio.run(measure(srv.url, "no drafts", 1, {}, PROMPTS.index(
                prompt)))[1][0]
        for r in range(args.rounds):
            for streams in (1, 4):
                for mode in MODES if r % 2 == 0 else tuple(reversed(MODES)):
                    tps, texts = asyncio.run(measure(srv.url, mode, streams, predicted, r))
                    prompts = [PROMPTS[(r + i) % len(PROMPTS)] for i in range(streams)]
                    if streams == 1:
                        assert texts == [predicted[p] for p in prompts], f"{mode}: changed"
                    table.setdefault((mode, streams), []).append(tps)
    finally:
        srv.stop()
    print("| mode | streams | tokens/s (median) | vs no drafts | rounds |")
    print("|---|---|---|---|---|")
    for (mode, streams), v in table.items():
        base = statistics.median(table[("no drafts", streams)])
        print(f"| {mode} | {streams} | {statistics.median(v):.1f} | "
              f"{statistics.median(v) / base:.2f}x | {', '.join(f'{x:.1f}' for x in v)} |")
    print("\none stream's answers: the same in every mode")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
