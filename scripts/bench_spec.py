#!/usr/bin/env python3
"""Speculative decoding (prompt-lookup drafts), ONE run: tokens/s with and without.

Workloads, each at 1 and 4 concurrent streams, greedy, 160 tokens at most:

- copy: answers that copy from the prompt (repeat a text exactly, fix one word in a
  text, a JSON object repeating the input's fields);
- free: answers with nothing to copy (the prompts of scripts/bench.py, end of
  generation suppressed).

edgeinfer with drafts (the default) against the same server with ``"speculative":
false`` per request (so both run in one process, alternating: the machine is noisy),
and, when LLAMA_SERVER_BIN points at llama.cpp's llama-server, llama-server with
``--spec-type ngram-simple`` (its n-gram mode) and without. Each comparison runs
--rounds times, in turn, the order reversed every other round; medians are printed, with
the draft acceptance rate. Every server first answers each workload once, unmeasured, so
that its prompts are cached and no measured run pays for computing them.

With ``--draft-model NAME`` (a configured model or a .gguf file), edgeinfer serves
``--target`` (default: the default model) drafted by that model (``serve --draft-model``),
against the same server without drafts and a second edgeinfer serving the target with
prompt-lookup drafts ("edgeinfer ngram").

Usage: .venv/bin/python scripts/bench_spec.py [--rounds 3] [--threads 2]
       [--target smollm2-135m-instruct-q8 --draft-model smollm2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import EOS_ID, PROMPTS, Server, free_port, llama_flags, llama_server_env, model_path

from edgeinfer.cli.sse import sse_json

TEXT = ("The keeper climbed the stairs of the lighthouse at dusk, trimmed the wick, wound the "
        "clockwork and watched the sea. Ships passed in the night, and the light turned and "
        "turned until the morning came grey over the water. In winter the storms came from "
        "the west, and the keeper wrote each one in the log: the hour, the wind, the height "
        "of the waves and the names of the ships that passed.")
COPY = [f"Repeat this text exactly, word for word:\n\n{TEXT}",
        f"Rewrite this text with 'keeper' replaced by 'guardian', nothing else changed:\n\n{TEXT}",
        'Return this record as JSON with the same fields and values: name "Ada Lovelace", '
        'born "10 December 1815", city "London", field "mathematics", known for '
        '"the first published algorithm for a computing machine".',
        f"Copy the second sentence of this text:\n\n{TEXT}"]
TOKENS = 160


async def stream(client: httpx.AsyncClient, url: str, model: str, prompt: str, free: bool,
                 speculative: bool | None) -> int:
    body: dict[str, object] = {"model": model, "messages": [{"role": "user", "content": prompt}],
                               "max_tokens": TOKENS, "temperature": 0, "stream": True}
    if free:
        body["logit_bias"] = {str(EOS_ID): -100}
    if speculative is not None:
        body["speculative"] = speculative
    n = 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for chunk in sse_json(r):
            for choice in chunk.get("choices", []):
                if (choice.get("delta") or {}).get("content"):
                    n += 1
    return n


async def measure(url: str, model: str, workload: str, streams: int,
                  speculative: bool | None) -> float:
    prompts = COPY if workload == "copy" else PROMPTS
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(stream(client, url, model, prompts[i % len(prompts)],
                                             workload == "free", speculative)
                                      for i in range(streams)))
        return sum(outs) / (time.perf_counter() - t0)


def acceptance(url: str) -> tuple[int, int]:
    stats = next(iter(httpx.get(f"{url}/health", timeout=5).json()["models"].values()))
    return int(stats["draft_tokens"]), int(stats["accepted_drafts"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", default="default", help="the model edgeinfer serves")
    ap.add_argument("--draft-model", default=None, help="draft with this model (see above)")
    ap.add_argument("--draft-min", type=int, default=None,
                    help="also run edgeinfer with this --draft-min (\"edgeinfer min N\")")
    ap.add_argument("--draft-max", type=int, default=None,
                    help="also run edgeinfer with this --draft-max (\"edgeinfer max N\")")
    args = ap.parse_args()
    gguf = model_path(args.target)
    logs = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-spec-"))
    servers: list[tuple[str, Server, str, list[bool | None]]] = []
    serve = [sys.executable, "-m", "edgeinfer", "serve", "--threads", str(args.threads),
             "--slots", "4", "--context", "8192", "--log-level", "warning", "--model",
             args.target]
    port = free_port()
    drafting = ["--draft-model", args.draft_model] if args.draft_model else []
    servers.append(("edgeinfer", Server("edgeinfer", [
        *serve, "--port", str(port), *drafting], port, logs), args.target, [True, False]))
    if args.draft_model:
        port = free_port()
        servers.append(("edgeinfer ngram", Server("edgeinfer-ngram", [
            *serve, "--port", str(port)], port, logs), args.target, [True]))
    for flag, value in (("min", args.draft_min), ("max", args.draft_max)):
        if value is not None:
            port = free_port()
            servers.append((f"edgeinfer {flag} {value}", Server(f"edgeinfer-{flag}", [
                *serve, "--port", str(port), f"--draft-{flag}", str(value)], port, logs),
                args.target, [True]))
    binary = os.environ.get("LLAMA_SERVER_BIN")
    if binary:
        for name, extra in (("llama-server ngram", ["--spec-type", "ngram-simple"]),
                            ("llama-server", [])):
            port = free_port()
            servers.append((name, Server(name.replace(" ", "-"), [
                binary, "-m", str(gguf), "-t", str(args.threads), "-np", "4", "-c", "8192",
                "--port", str(port), *extra, *llama_flags()], port, logs,
                llama_server_env(Path(binary))),
                str(gguf), [None]))
    try:
        for _, srv, model, _ in servers:
            srv.wait_ready()
            # warm-up, unmeasured: each workload's prompts are computed once here, so that
            # no measured run pays for them (the first of a round would, alone)
            for workload in ("copy", "free"):
                asyncio.run(measure(srv.url, model, workload, 4, None))
        table: dict[tuple[str, str, int], list[float]] = {}
        runs = [(name, srv, model, spec) for name, srv, model, modes in servers
                for spec in modes]
        for r in range(args.rounds):
            for workload in ("copy", "free"):
                for streams in (1, 4):
                    # the order turns round every round: the first measured after another
                    # process ran tends to measure lower
                    for name, srv, model, spec in (runs if r % 2 == 0 else runs[::-1]):
                        label = name if spec is not False else f"{name} (no drafts)"
                        tps = asyncio.run(measure(srv.url, model, workload, streams, spec))
                        table.setdefault((label, workload, streams), []).append(tps)
        drafted, accepted = acceptance(servers[0][1].url)
    finally:
        for _, srv, _, _ in servers:
            srv.stop()
    report(table, drafted, accepted)
    return 0


def report(table: dict[tuple[str, str, int], list[float]], drafted: int, accepted: int) -> None:
    med = {k: statistics.median(v) for k, v in table.items()}
    print("| server | workload | streams | tokens/s (median) | rounds |")
    print("|---|---|---|---|---|")
    for (label, workload, streams), v in table.items():
        print(f"| {label} | {workload} | {streams} | {med[(label, workload, streams)]:.1f} | "
              f"{', '.join(f'{x:.1f}' for x in v)} |")
    print()
    for workload in ("copy", "free"):
        for streams in (1, 4):
            base = med[("edgeinfer (no drafts)", workload, streams)]
            line = (f"{workload} x{streams}: drafts / no drafts "
                    f"{med[('edgeinfer', workload, streams)] / base:.2f}x")
            for label in [k[0] for k in med if k[0].startswith(("edgeinfer min", "edgeinfer max"))
                          and k[1:] == (workload, streams)]:
                line += (f"; {label} / no drafts "
                         f"{med[(label, workload, streams)] / base:.2f}x")
            if ("edgeinfer ngram", workload, streams) in med:
                line += (f"; draft model / ngram "
                         f"{med[('edgeinfer', workload, streams)] / med[('edgeinfer ngram', workload, streams)]:.2f}x")  # noqa: E501
            if ("llama-server ngram", workload, streams) in med:
                line += (f"; edgeinfer / llama-server ngram "
                         f"{med[('edgeinfer', workload, streams)] / med[('llama-server ngram', workload, streams)]:.2f}x"  # noqa: E501
                         f"; llama-server ngram / plain "
                         f"{med[('llama-server ngram', workload, streams)] / med[('llama-server', workload, streams)]:.2f}x")  # noqa: E501
            print(line)
    rate = accepted / drafted if drafted else 0.0
    print(f"edgeinfer drafts: {drafted} proposed, {accepted} accepted ({rate:.0%})")


if __name__ == "__main__":
    raise SystemExit(main())
