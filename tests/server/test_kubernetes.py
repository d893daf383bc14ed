"""Ready for Kubernetes, against real server processes: /ready says 503 while the start-up
model loads (held by a model package whose assembly waits for the test) and while a
SIGTERM drain lets an in-flight stream finish; /metrics has the load figures an
inference gateway's endpoint picker reads; the probes need no API key."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from serverproc import ServerProcess, smollm2_file, start_server, stop_server

CHAT = "/v1/chat/completions"
KEY = "sk-kubernetes-test"

GATED_PACKAGE = '''
import os, shutil, time
from pathlib import Path

def assemble(path, overwrite=True):
    """Write the model once the test creates the gate file (or give up after 120 s)."""
    gate = Path(os.environ["EDGEINFER_TEST_GATE"])
    deadline = time.monotonic() + 120
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.copyfile(os.environ["EDGEINFER_TEST_GGUF"], path)
'''


def test_ready_is_503_while_the_start_up_model_loads(tmp_path: Path) -> None:
    package = tmp_path / "pkgs" / "gated_model"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(GATED_PACKAGE)
    cfg = tmp_path / "models.toml"
    cfg.write_text('[server]\nserve_while_loading = true\n\n[[models]]\nid = "gated"\n'
                   'aliases = ["default"]\nsource = { package = "gated_model", assemble = true }\n'
                   "context = 1024\nslots = 2\nbatch = 64\nthreads = 2\n")
    gate = tmp_path / "gate"
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "pkgs"),
                                          *filter(None, [os.environ.get("PYTHONPATH")])]),
           "EDGEINFER_CACHE": str(tmp_path / "cache"), "EDGEINFER_TEST_GATE": str(gate),
           "EDGEINFER_TEST_GGUF": str(smollm2_file())}
    srv = start_server(tmp_path, "--config", str(cfg), env=env)  # /health: 200 while loading
    try:
        r = httpx.get(f"{srv.base_url}/ready", timeout=10)
        assert r.status_code == 503, r.text
        body = r.json()
        assert body["status"] == "loading" and body["reasons"] == ["model 'gated' is loading"]
        assert body["models"]["gated"] in ("unloaded", "loading")
        health = httpx.get(f"{srv.base_url}/health", timeout=10)
        assert health.status_code == 200 and health.json()["status"] == "loading"
        gate.touch()
        deadline = time.monotonic() + 60
        while (r := httpx.get(f"{srv.base_url}/ready", timeout=10)).status_code != 200:
            assert r.status_code == 503 and time.monotonic() < deadline, r.text
            time.sleep(0.1)
        assert r.json()["status"] == "ready" and r.json()["models"] == {"gated": "loaded"}
        assert httpx.get(f"{srv.base_url}/health", timeout=10).json()["status"] == "ok"
        done = httpx.post(f"{srv.base_url}{CHAT}", timeout=60, json={
            "model": "default", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2})
        assert done.status_code == 200, done.text
    finally:
        stop_server(srv)


def test_ready_is_503_during_a_sigterm_drain_while_a_stream_finishes(tmp_path: Path) -> None:
    srv = start_server(tmp_path, "--slots", "2", "--threads", "1", "--drain-delay", "5",
                       "--shutdown-grace", "120")
    assert httpx.get(f"{srv.base_url}/ready", timeout=10).status_code == 200
    body = {"model": "default", "messages": [{"role": "user", "content": "Count to 1000."}],
            "max_tokens": 200, "ignore_eos": True, "temperature": 0, "stream": True}
    first = threading.Event()
    seen: dict[str, object] = {}

    def probe() -> None:
        first.wait(60)
        srv.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 4  # within the 5 s drain delay
        while time.monotonic() < deadline:
            r = httpx.get(f"{srv.base_url}/ready", timeout=5)
            if r.status_code == 503:
                seen["ready"], seen["at"] = r.json(), time.monotonic()
                break
            time.sleep(0.05)
        seen["health"] = httpx.get(f"{srv.base_url}/health", timeout=5).json()["status"]
        r = httpx.post(f"{srv.base_url}{CHAT}", timeout=30, json={  # still served
            "model": "default", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2})
        seen["new_request"] = r.status_code

    prober = threading.Thread(target=probe)
    prober.start()
    arrivals: list[tuple[float, str]] = []
    try:
        with httpx.stream("POST", f"{srv.base_url}{CHAT}", json=body, timeout=180) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    arrivals.append((time.monotonic(), line[6:]))
                    first.set()
        prober.join(60)
        assert srv.proc.wait(120) == 0
    finally:
        first.set()
        if srv.proc.poll() is None:
            srv.proc.kill()
    ready = seen.get("ready")
    assert isinstance(ready, dict), seen
    assert ready["status"] == "draining"
    assert ready["reasons"] == ["draining: the server is shutting down"]
    assert seen["health"] == "draining"  # alive: no restart wanted while draining
    assert seen["new_request"] == 200  # the drain delay serves as before
    after = [data for t, data in arrivals if t > float(seen["at"])]  # type: ignore[arg-type]
    assert len(after) >= 5, "the stream was not in flight when /ready said 503"
    events = [json.loads(d) for _, d in arrivals[:-1]]
    assert arrivals[-1][1] == "[DONE]" and not [e for e in events if "error" in e], events[-3:]
    assert events[-1]["choices"][0]["finish_reason"] == "length"  # finished, not cut


def scrape(srv: ServerProcess) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = httpx.get(f"{srv.base_url}/metrics", timeout=10).text  # no key: --open-metrics
    return {f.name: [(s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(text)}


def value(fams: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    [(labels, v)] = fams[name]
    assert labels == {}
    return v


def test_metrics_for_an_endpoint_picker_and_open_probes(tmp_path: Path) -> None:
    srv = start_server(tmp_path, "--slots", "2", "--threads", "1", "--open-metrics",
                       env={"EDGEINFER_API_KEYS": KEY})
    auth = {"authorization": f"Bearer {KEY}"}
    try:
        assert httpx.get(f"{srv.base_url}/v1/models", timeout=10).status_code == 401
        assert httpx.get(f"{srv.base_url}/ready", timeout=10).status_code == 200
        idle = scrape(srv)
        assert value(idle, "edgeinfer_requests_waiting") == 0
        assert value(idle, "edgeinfer_kv_cache_usage_ratio") == 0
        body = {"model": "default", "messages": [{"role": "user", "content": "Count."}],
                "max_tokens": 40, "ignore_eos": True, "temperature": 0}

        def chat(i: int) -> int:
            return httpx.post(f"{srv.base_url}{CHAT}", json=body, headers=auth,
                              timeout=180).status_code

        busy = None
        with ThreadPoolExecutor(5) as pool:
            futures = [pool.submit(chat, i) for i in range(5)]  # 5 requests, 2 slots
            deadline = time.monotonic() + 120
            while busy is None and time.monotonic() < deadline:
                fams = scrape(srv)
                ratio = value(fams, "edgeinfer_kv_cache_usage_ratio")
                assert 0 <= ratio <= 1
                if value(fams, "edgeinfer_requests_waiting") > 0 and ratio > 0:
                    busy = fams  # two generating, the others queued
                time.sleep(0.05)
            assert [f.result() for f in futures] == [200] * 5
        assert busy is not None, "no scrape saw requests waiting while others held KV cells"
        assert value(busy, "edgeinfer_requests_running") == 2
        [(labels, per_model)] = busy["edgeinfer_model_kv_cache_usage_ratio"]
        assert labels == {"model": "smollm2-135m-instruct"}
        assert per_model == value(busy, "edgeinfer_kv_cache_usage_ratio")
        # two requests of ~40 prompt + <= 40 generated tokens in 8192 cells, and up to three
        # waiting for a slot with their ~40-token prompts computed ahead (prefill_ahead)
        assert 0 < per_model * 8192 <= 2 * 100 + 3 * 50
        done = scrape(srv)
        assert value(done, "edgeinfer_requests_waiting") == 0
        assert value(done, "edgeinfer_requests_running") == 0
        # finished requests' cells stay as cached prefixes: used, but free for new work
        assert value(done, "edgeinfer_kv_cache_usage_ratio") == 0
        [(_, cached)] = done["edgeinfer_kv_cells_used"]
        assert cached > 0
        assert not any("lora" in name for name in done)
    finally:
        stop_server(srv)
