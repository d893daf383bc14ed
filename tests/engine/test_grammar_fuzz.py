"""Fuzz the grammar pipeline (schema -> GBNF -> grammar budget -> llama.cpp's parser) with
hypothesis, each input compiled in a child process: any signal, hang or exception other
than a 400 fails the test, with the input that caused it."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vocab_worker import VOCAB

WORKER = VOCAB + r"""
from edgeinfer.errors import InvalidRequest
from edgeinfer.prompt.grammar import check_gbnf, check_generated, schema_to_gbnf, tool_calls_gbnf

print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    try:
        if job["kind"] == "schema":
            check_generated(vocab, schema_to_gbnf(job["value"], "schema"), "schema")
        elif job["kind"] == "tools":
            check_generated(vocab, tool_calls_gbnf([("f", job["value"])], 2), "tools")
        else:
            check_gbnf(vocab, job["value"])
        out = {"ok": True}
    except InvalidRequest as exc:
        out = {"refused": exc.message}
    except Exception as exc:
        out = {"error": repr(exc)[:300]}
    print(json.dumps(out), flush=True)
"""

TIMEOUT = 60.0  # (a hang it guards against lasts minutes or hours)


class Worker:
    """A child process compiling grammars; restarted after a crash."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == {"ready": True}
        return proc

    def run(self, kind: str, value: Any) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"kind": kind, "value": value}) + "\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT)
        if not ready:
            proc.kill()
            self.proc = None
            return {"hang": True}
        line = proc.stdout.readline()
        if not line:
            code = proc.wait(10)
            self.proc = None
            return {"died": code}
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    w = Worker()
    yield w
    w.close()


def check(worker: Worker, kind: str, value: Any) -> dict[str, Any]:
    out = worker.run(kind, value)
    assert "ok" in out or "refused" in out, (kind, json.dumps(value)[:500], out)
    return out


# -- the inputs that used to crash the server, explicitly ----------------------------------

@pytest.mark.parametrize(("kind", "value", "named"), [
    ("schema", {"type": "string", "minLength": 30000}, "minLength"),
    ("schema", {"type": "string", "pattern": "^a{0,30000}$"}, "pattern"),
    ("tools", {"type": "object", "properties": {"a": {"type": "array", "minItems": 30000}}},
     "minItems"),
    ("schema", {"type": "string", "minLength": 1_500_000}, "minLength"),
    ("gbnf", "root ::= " + '("a" ' * 30000 + ")?" * 30000, "larger than"),
    ("gbnf", "root ::= " + '("a" ' * 5000 + ")?" * 5000, "nests"),
    ("gbnf", 'root ::= "a"{0,30000}', "1000"),
])
def test_known_crashers_are_refused_by_name(worker: Worker, kind: str, value: Any,
                                            named: str) -> None:
    out = check(worker, kind, value)
    assert "refused" in out and named in out["refused"], out


@pytest.mark.parametrize(("kind", "value"), [
    ("schema", {"type": "string", "maxLength": 30000}),
    ("tools", {"type": "object", "properties": {"a": {"type": "string", "maxLength": 30000}}}),
])
def test_an_upper_count_that_crashed_is_written_within_the_budget(worker: Worker, kind: str,
                                                                  value: Any) -> None:
    """maxLength 30000 made the converter write 30000 nested groups (SIGSEGV in llama.cpp's
    parser); it was refused, now it is written as the budget's 1,000, which compiles."""
    assert check(worker, kind, value) == {"ok": True}


# -- hypothesis: schema shapes -------------------------------------------------------------

COUNTS = st.one_of(st.integers(0, 50), st.integers(900, 1100), st.integers(20_000, 40_000),
                   st.sampled_from([1.5, -1, True]))
NUMBERS = st.one_of(st.integers(-(10**25), 10**25), st.floats(allow_nan=False,
                                                               allow_infinity=False))


def _string() -> st.SearchStrategy[dict[str, Any]]:
    quant = st.builds(lambda lo, hi, atom, nest: (f"({atom}{{{lo},{hi}}})" if nest
                                                   else f"{atom}{{{lo},{hi}}}"),
                      st.integers(0, 40), st.integers(40, 40_000),
                      st.sampled_from(["a", "[a-z]", r"\d", "(ab)", "(a{0,50})"]), st.booleans())
    pattern = st.lists(quant, min_size=1, max_size=3).map(lambda p: "^" + "".join(p) + "$")
    return st.fixed_dictionaries({"type": st.just("string")}, optional={
        "minLength": COUNTS, "maxLength": COUNTS, "pattern": pattern,
        "enum": st.lists(st.text(max_size=8), min_size=1, max_size=3)})


def _leaf() -> st.SearchStrategy[dict[str, Any]]:
    integer = st.fixed_dictionaries({"type": st.just("integer")}, optional={
        "minimum": NUMBERS, "maximum": NUMBERS, "exclusiveMaximum": NUMBERS})
    return st.one_of(_string(), integer, st.just({"type": "boolean"}),
                     st.just({"type": "number", "minimum": 0}))


def _extend(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    array = st.fixed_dictionaries({"type": st.just("array"), "items": children},
                                  optional={"minItems": COUNTS, "maxItems": COUNTS})
    obj = st.builds(lambda props: {"type": "object", "properties": props,
                                   "required": list(props)[:1]},
                    st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), children,
                                    min_size=1, max_size=12))
    return st.one_of(array, obj, st.builds(lambda a: {"anyOf": a},
                                           st.lists(children, min_size=1, max_size=3)))


SCHEMAS = st.recursive(_leaf(), _extend, max_leaves=12)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(schema=SCHEMAS, as_tool=st.booleans())
def test_schema_shapes_never_crash_or_hang(worker: Worker, schema: dict[str, Any],
                                           as_tool: bool) -> None:
    if as_tool:
        check(worker, "tools", {"type": "object", "properties": {"x": schema}})
    else:
        check(worker, "schema", schema)


# -- hypothesis: raw GBNF shapes ----------------------------------------------------------

def _gbnf() -> st.SearchStrategy[str]:
    nested = st.integers(1, 20_000).map(lambda n: "root ::= " + '("a" ' * n + ")?" * n)
    repeat = st.tuples(st.integers(0, 3000), st.integers(0, 40_000)).map(
        lambda t: f'root ::= ("a" | "b"){{{t[0]},{max(t)}}}')
    many = st.integers(1, 2000).map(
        lambda n: "root ::= " + " ".join(f'"x{i}"{{0,50}}' for i in range(n)))
    flat = st.integers(1, 200_000).map(lambda n: "root ::= " + '"a" ' * n)
    garbage = st.text(max_size=200).map(lambda t: "root ::= " + t)
    return st.one_of(nested, repeat, many, flat, garbage)


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(gbnf=_gbnf())
def test_gbnf_shapes_never_crash_or_hang(worker: Worker, gbnf: str) -> None:
    check(worker, "gbnf", gbnf)
