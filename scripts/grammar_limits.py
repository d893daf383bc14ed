"""Where llama.cpp's grammar code breaks: nesting depth and repetition size, each tried in a
child process (a crash there is a signal, not a crashed benchmark).

    .venv/bin/python scripts/grammar_limits.py

Prints, per shape and size: the outcome (ok, refused, or the signal), the time to compile
the grammar plus 50 sampling steps over a 256-token candidate list, and the child's peak
RSS growth. The grammar budget in edgeinfer/grammar_budget.py stays far inside these.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import script_parser


def _nested(n: int) -> str:
    return 'root ::= ' + '("a" ' * n + ')?' * n + "\n"


def _repeat(n: int) -> str:
    return f'root ::= ("a" | "b"){{0,{n}}}\n'


def _many_repeats(n: int) -> str:
    return "root ::= " + " ".join(f'("x{i}"){{0,1000}}' for i in range(n)) + "\n"


def _flat(n: int) -> str:
    return "root ::= " + ' "a"' * n + "\n"


SHAPES = {"nested groups": _nested, "repetition {0,n}": _repeat,
          "n repetitions of 1000": _many_repeats, "flat sequence": _flat}


def _child(shape: str, n: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    import ctypes

    import llama_cpp
    import numpy as np

    from edgeinfer.config import load_config
    from edgeinfer.models.source import resolve_model_path

    cfg = load_config(None).models[0]
    llama_cpp.llama_backend_init()
    mp_ = llama_cpp.llama_model_default_params()
    mp_.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(resolve_model_path(cfg)).encode(), mp_)
    vocab = llama_cpp.llama_model_get_vocab(model)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    gbnf = SHAPES[shape](n)
    t0 = time.perf_counter()
    smpl = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    if not smpl:
        out.put(("refused", time.perf_counter() - t0, 0))
        return
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    dt = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
    arr = np.zeros(256, dtype=dt)
    a = llama_cpp.llama_tokenize(vocab, b"a", 1, (llama_cpp.llama_token * 4)(), 4, False, False)
    assert a > 0
    for _ in range(50):
        arr["id"] = np.arange(256) % n_vocab
        arr["logit"] = 1.0
        cur = llama_cpp.llama_token_data_array(
            data=arr.ctypes.data_as(llama_cpp.llama_token_data_p), size=256, selected=-1,
            sorted=False)
        llama_cpp.llama_sampler_apply(smpl, ctypes.byref(cur))
        ok = np.isfinite(arr["logit"])
        if not ok.any():
            break
        llama_cpp.llama_sampler_accept(smpl, int(arr["id"][np.argmax(ok)]))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    out.put(("ok", time.perf_counter() - t0, rss // 1024))


def trial(shape: str, n: int, timeout: float = 60.0) -> str:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    p = ctx.Process(target=_child, args=(shape, n, q))
    p.start()
    p.join(timeout)
    if p.is_alive():
        p.kill()
        p.join()
        return f"hang (> {timeout:.0f} s)"
    if p.exitcode and p.exitcode < 0:
        return f"killed by {signal.Signals(-p.exitcode).name}"
    if q.empty():
        return f"exit {p.exitcode}"
    what, seconds, rss_mb = q.get()
    return f"{what}: {seconds * 1000:.0f} ms, +{rss_mb} MB peak RSS"


def main() -> None:
    script_parser(__doc__).parse_args()
    sizes = {"nested groups": [1000, 2000, 5000, 10000, 20000, 30000],
             "repetition {0,n}": [100, 1000, 2000, 2001],
             "n repetitions of 1000": [10, 100, 1000],
             "flat sequence": [1000, 100_000, 1_500_000]}
    for shape, ns in sizes.items():
        for n in ns:
            print(f"{shape:24s} n={n:<9d} {trial(shape, n)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
