#!/usr/bin/env python3
"""What any scheduling order could give on bench_llama_server.py's overload workload.

A model of one engine on this 2-core CPU, not a measurement: a step costs 2 ms plus 3 ms
per prompt token and 4.7 ms per generating stream (fitted to the measured 1-stream,
8-stream and cold-prompt rates). The workload is the benchmark's: 16 arrivals, one every
0.25 s, prompts of 25 / 75 / 170 / 430 tokens, answers of 16 / 48 / 128 / 64. For each
policy (admission: first come or shortest prompt first; prompt pieces: oldest first or
shortest remaining first; the step's token budget; the slot count) it prints the makespan
and the first-token p95 and mean, so that a goal on the p95 can be weighed against what
the order of work can change at all.

Usage: python3 scripts/sim_overload.py
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

PROMPTS = (25, 75, 170, 430)
ANSWERS = (16, 48, 128, 64)
STEP, PER_PROMPT, PER_STREAM = 0.002, 0.003, 0.0047


@dataclass
class Req:
    arrival: float
    prompt: int
    answer: int
    computed: int = 0
    generated: int = 0
    first: float | None = None
    done: float | None = None


def run(admit: str, order: str, budget: int, slots: int) -> tuple[float, float, float]:
    """(makespan, first-token p95, first-token mean) of one policy."""
    reqs = [Req(0.25 * i, PROMPTS[i % 4], ANSWERS[i % 4]) for i in range(16)]
    t, running, waiting, nxt = 0.0, [], [], 0
    while True:
        while nxt < len(reqs) and reqs[nxt].arrival <= t + 1e-9:
            waiting.append(reqs[nxt])
            nxt += 1
        while waiting and len(running) < slots:
            pick = min(waiting, key=lambda r: r.prompt) if admit == "shortest" else waiting[0]
            waiting.remove(pick)
            running.append(pick)
        if not running:
            if nxt >= len(reqs):
                break
            t = reqs[nxt].arrival
            continue
        streams = [r for r in running if r.computed >= r.prompt]
        prefilling = [r for r in running if r.computed < r.prompt]
        if order == "shortest":
            prefilling.sort(key=lambda r: r.prompt - r.computed)
        left, pieces = budget - len(streams), []
        for r in prefilling:
            if left <= 0:
                break
            n = min(left, r.prompt - r.computed)
            pieces.append((r, n))
            left -= n
        t += STEP + PER_PROMPT * sum(n for _, n in pieces) + PER_STREAM * len(streams)
        for r, n in pieces:
            r.computed += n
            if r.computed >= r.prompt:
                r.first, r.generated = t, 1
        for r in streams:
            r.generated += 1
        for r in [r for r in running if r.first is not None and r.generated >= r.answer]:
            r.done = t
            running.remove(r)
    firsts = sorted((r.first or 0.0) - r.arrival for r in reqs)
    return (max(r.done or 0.0 for r in reqs), firsts[round(0.95 * (len(firsts) - 1))],
            sum(firsts) / len(firsts))


def main() -> None:
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    print("| slots | admission | prompt pieces | budget | makespan (s) | p95 (s) | mean (s) |")
    print("|---|---|---|---|---|---|---|")
    for slots in (8, 16):
        for admit in ("first come", "shortest"):
            for order in ("oldest", "shortest"):
                for budget in (256, 512, 2048):
                    span, p95, mean = run(admit, order, budget, slots)
                    print(f"| {slots} | {admit} | {order} | {budget} | {span:.2f} | "
                          f"{p95:.2f} | {mean:.2f} |")


if __name__ == "__main__":
    main()
