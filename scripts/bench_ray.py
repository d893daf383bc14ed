#!/usr/bin/env python3
"""Prefix-aware routing against Ray Serve's default routing, ONE run, N replicas.

Deploys edgeinfer twice on a Ray cluster (the default model, ``--replicas`` engine
replicas each): once with the prefix-aware router at /prefix, once with Ray's default
power-of-two router at /pow2. Then sends the same shared-prefix workload to both:
``--requests`` chats over ``--prefixes`` distinct system prompts of about ``--tokens``
tokens, in a shuffled order, ``--concurrency`` at a time. Printed per router: prompt
tokens computed (against the ideal: each prefix once plus the suffixes), the cache hit
rate and the wall time.

Usage: .venv/bin/python scripts/bench_ray.py [--address ADDRESS] [--replicas 2]
       [--threads 1] [--prefixes 4] [--tokens 1000] [--requests 16] [--concurrency 4]
Without --address a local cluster is started for the run (pip install 'edgeinfer[ray]').
"""

from __future__ import annotations

import argparse
import socket
from dataclasses import replace

from edgeinfer.cluster import workload
from edgeinfer.cluster.app import ClusterOptions, build
from edgeinfer.config import load_config, override_model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--address", default=None)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prefixes", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()

    import ray
    from ray import serve

    if args.address:
        ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(num_cpus=2 * args.replicas * args.threads, include_dashboard=False,
                 log_to_driver=False)
    port = args.port or free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    cfg = load_config()
    models = tuple(override_model(m, slots=4, threads=args.threads, context=8192)
                   for m in cfg.models if "default" in m.names)
    try:
        for router in ("prefix", "pow2"):
            serve.run(build(replace(cfg, models=models), ClusterOptions(
                replicas=args.replicas, router=router)), name=f"bench-{router}",
                route_prefix=f"/{router}")
        chats = workload.requests(workload.prompts(args.prefixes, args.tokens),
                                  args.requests, seed=7)
        figures = {r: workload.run(f"http://127.0.0.1:{port}/{r}", chats, args.concurrency)
                   for r in ("prefix", "pow2")}
    finally:
        serve.shutdown()
        ray.shutdown()
    per = figures["prefix"].prompt_tokens / args.requests
    ideal = args.prefixes * per
    print(f"\n{args.requests} requests over {args.prefixes} system prompts of ~{args.tokens} "
          f"tokens, {args.replicas} replicas, {args.concurrency} at a time")
    print("| router | prompt tokens computed | ideal | cache hit rate | errors | seconds |")
    print("|---|---|---|---|---|---|")
    for name, f in figures.items():
        print(f"| {name} | {f.computed} of {f.prompt_tokens} | ~{ideal:.0f} | "
              f"{f.hit_rate:.0%} | {f.errors} | {f.seconds:.1f} |")
    print(f"pow2 / prefix computed tokens: "
          f"{figures['pow2'].computed / max(1, figures['prefix'].computed):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
