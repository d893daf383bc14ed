"""edgeinfer on a local Ray cluster: the official SDKs through Ray Serve's proxy, prefix
routing against Ray's default routing in the same run, and a replica killed under load.

One cluster for the module (``conftest.cluster``): ``edgeinfer serve --ray`` with two
SmolLM2 replicas (one thread, four slots each) at ``/``; the routing test adds a second
application with Ray's default router at ``/pow2``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import httpx
from raycluster import SLOTS, RayCluster

from edgeinfer.cluster import workload

SHOUT = {"type": "function", "function": {
    "name": "shout", "description": "Say something loudly",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                   "required": ["text"]}}}


def test_openai_sdk_chat_stream_tools_and_schema(client: Any) -> None:
    r = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=16, temperature=0)
    assert r.choices[0].message.content and r.usage.prompt_tokens > 0

    pieces, usage = [], None
    for chunk in client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Count to five."}],
            max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        usage = chunk.usage or usage
    assert "".join(pieces) and usage is not None and usage.completion_tokens > 0

    r = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Shout hello."}],
        tools=[SHOUT], tool_choice={"type": "function", "function": {"name": "shout"}},
        max_tokens=48, temperature=0)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "shout" and "text" in json.loads(call.function.arguments)

    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    r = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "A city as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "city", "schema": schema, "strict": True}},
        max_tokens=48, temperature=0)
    assert set(json.loads(r.choices[0].message.content)) == {"city", "population"}


def test_every_dialect_health_and_metrics(cluster: RayCluster) -> None:
    from anthropic import Anthropic

    msg = Anthropic(base_url=cluster.url, api_key="unused", max_retries=0).messages.create(
        model="default", max_tokens=8, messages=[{"role": "user", "content": "Hi"}],
        extra_body={"temperature": 0})
    assert msg.content[0].type == "text"
    with httpx.Client(base_url=cluster.url, timeout=120) as http:
        r = http.post("/v1/responses", json={"model": "default", "input": "Hi",
                                             "max_output_tokens": 8})
        assert r.status_code == 200 and r.json()["object"] == "response"
        lines = http.post("/api/chat", json={"model": "default", "options": {"num_predict": 8},
                                             "messages": [{"role": "user", "content": "Hi"}]}
                          ).text.splitlines()
        assert json.loads(lines[-1])["done"] is True
        health = http.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert health.headers["x-edgeinfer-replica"]
        mine = http.get("/v1/models", headers={"x-request-id": "trace-42"})
        given = http.get("/v1/models")  # one id a response, the same in both headers
        assert mine.headers.get_list("x-request-id") == ["trace-42"]
        assert mine.headers["request-id"] == "trace-42"
        assert len(given.headers.get_list("x-request-id")) == 1
        assert given.headers["request-id"] == given.headers["x-request-id"]
        assert "edgeinfer_prompt_tokens_total" in http.get("/metrics").text
        err = http.post("/v1/messages", json={"model": "default"})
        assert err.status_code == 400 and err.json()["type"] == "error"


def test_a_second_serve_on_the_cluster_is_refused(cluster: RayCluster) -> None:
    """It replaced the first application (and deleted it for both when it stopped)."""
    import subprocess
    import sys
    from pathlib import Path

    r = subprocess.run(
        [str(Path(sys.executable).parent / "edgeinfer"), "serve", "--ray", cluster.address,
         "--port", str(cluster.port), "--model", "default", "--slots", "1"],
        capture_output=True, text=True, timeout=180)
    assert r.returncode == 2 and "already runs on this Ray cluster" in r.stderr, r.stderr[-2000:]
    with httpx.Client(base_url=cluster.url, timeout=120) as http:  # the first still serves
        r2 = http.post("/v1/chat/completions", json={
            "model": "default", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
        assert r2.status_code == 200 and r2.json()["choices"][0]["message"]["content"]


def _deploy_pow2(cluster: RayCluster) -> str:
    """The same two replicas with Ray's default router, as a second application."""
    from ray import serve

    from edgeinfer.cluster.app import ClusterOptions, build
    from edgeinfer.config import load_config, override_model

    cfg = load_config()
    models = tuple(override_model(m, slots=SLOTS, threads=1, context=8192)
                   for m in cfg.models if "default" in m.names)
    serve.run(build(replace(cfg, models=models), ClusterOptions(replicas=2, router="pow2")),
              name="edgeinfer-pow2", route_prefix="/pow2")
    return cluster.url + "/pow2"


def test_prefix_routing_beats_default_routing(cluster: RayCluster) -> None:
    systems = workload.prompts(4, tokens=1000)
    chats = workload.requests(systems, 16, seed=7)
    pow2_url = _deploy_pow2(cluster)
    try:
        aware = workload.run(cluster.url, chats, concurrency=4)
        default = workload.run(pow2_url, chats, concurrency=4)
    finally:
        from ray import serve
        serve.delete("edgeinfer-pow2")
    assert aware.errors == 0 and default.errors == 0
    per_request = aware.prompt_tokens / len(chats)
    ideal = 4 * per_request  # each prefix computed once; suffixes are a few tokens
    for name, f in (("prefix-aware", aware), ("ray default (pow2)", default)):
        print(f"\n{name}: {f.computed} prompt tokens computed of {f.prompt_tokens} "
              f"(ideal ~{ideal:.0f}), cache hit rate {f.hit_rate:.0%}, {f.seconds:.1f} s")
    # close to each prefix once (a hot prefix may spill to the other replica when its own
    # is busier by more than the router's imbalance bound: 1.02-1.27x measured alone, 1.51x
    # once in a full-suite run on two busy cores)
    # (bounds with room: pow2 breaks ties at random, 0.63x of it in the README's benchmark)
    assert aware.computed <= 1.75 * ideal
    assert aware.computed < 0.85 * default.computed


def _engine_pids() -> list[int]:
    """The engine replicas' processes (Ray titles them after their deployment)."""
    import psutil

    title = "ServeReplica:edgeinfer:EdgeInferEngine"
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if title in cmd and proc.status() != psutil.STATUS_ZOMBIE:
            out.append(proc.pid)
    return out


def _ask(url: str, i: int, stream: bool) -> str:
    """One request: 'ok' if it completed, 'error <status>' if it ended with a clean error."""
    body = {"model": "default", "max_tokens": 48, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": f"Request {i}: tell a long story."}]}
    with httpx.Client(timeout=150) as http:
        if not stream:
            r = http.post(url + "/v1/chat/completions", json=body)
            return "ok" if r.status_code == 200 else f"error {r.status_code}"
        with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return f"error {r.status_code}"
            lines = [x for x in r.iter_lines() if x.startswith("data: ")]
    if lines and lines[-1] == "data: [DONE]":
        return "ok"
    assert lines and "error" in json.loads(lines[-1][6:]), lines[-3:]
    return "error in stream"


def _replicas_running() -> int:
    from ray import serve

    app = serve.status().applications["edgeinfer"]
    engine = app.deployments["EdgeInferEngine"]
    return int(engine.replica_states.get("RUNNING", 0)) if app.status == "RUNNING" else 0


def test_a_replica_killed_under_load(cluster: RayCluster) -> None:
    pids = _engine_pids()
    assert len(pids) == 2
    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(_ask, cluster.url, i, i % 2 == 0) for i in range(8)]
        time.sleep(2.0)
        os.kill(pids[0], signal.SIGKILL)
        outcomes = [f.result(timeout=200) for f in futures]  # nothing hangs
    print(f"\noutcomes after killing replica pid {pids[0]}: {outcomes} "
          f"({time.monotonic() - start:.1f} s)")
    assert all(o == "ok" or o.startswith("error") for o in outcomes)
    deadline = time.monotonic() + 180
    while _replicas_running() < 2:
        assert time.monotonic() < deadline, "the killed replica was not replaced in 180 s"
        time.sleep(1.0)
    print(f"two replicas running again {time.monotonic() - start:.1f} s after the kill")
    assert pids[0] not in _engine_pids()
    assert _ask(cluster.url, 99, False) == "ok"


def test_the_proxy_check_tells_ray_serve_from_another_program() -> None:
    """``serve --ray`` stops when Serve's proxy does not answer on the asked port (Serve
    ran there with other HTTP options, or another program holds it): before, its READY
    line named a port nothing served."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from edgeinfer.cluster.launch import _listening

    class Fake(BaseHTTPRequestHandler):
        status, body = 404, b"not found"

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(self.status)
            self.end_headers()
            self.wfile.write(self.body)

        def log_message(self, *args: Any) -> None:
            pass

    for status, body, serve_like in ((404, b"not found", False), (200, b"success", True),
                                     (503, b"Route table is not populated yet.", True),
                                     (200, b"hello", False)):
        Fake.status, Fake.body = status, body
        httpd = HTTPServer(("127.0.0.1", 0), Fake)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        try:
            assert _listening(f"http://127.0.0.1:{httpd.server_port}", tries=2) is serve_like
        finally:
            httpd.shutdown()
            httpd.server_close()
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert _listening(f"http://127.0.0.1:{port}", tries=1) is False
