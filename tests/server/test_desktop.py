"""The workstation and desktop-app experience: CLI, chat page, metrics, slots, ready signal,
parent watch, in-process use."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from serverproc import ROOT, ServerProcess, start_server, stop_server


def cli(*args: str, timeout: float = 120, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgeinfer", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          **kw)  # type: ignore[call-overload]


@pytest.mark.parametrize("command", ["serve", "models", "pull", "quantize", "bench", "chat"])
def test_every_command_explains_itself(command: str) -> None:
    r = cli(command, "--help")
    assert r.returncode == 0 and "usage: edgeinfer " + command in r.stdout
    assert "--log-level" in r.stdout


def test_models_quantize_and_serve_the_q8_variant(tmp_path: Path) -> None:
    listed = json.loads(cli("models", "--json").stdout)
    assert listed[0]["arch"] == "llama" and listed[0]["quant"] == "Q4_1"
    assert listed[0]["memory_mib"] > listed[0]["size_mib"] > 50
    dst = tmp_path / "smollm2-q8.gguf"
    r = cli("quantize", "default", str(dst), "--type", "q8_0")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "quantizing to q8_0" in r.stderr and dst.stat().st_size > 100 << 20
    cfg = tmp_path / "models.toml"
    cfg.write_text(f'[[models]]\nid = "q8"\naliases = ["default"]\npath = "{dst}"\n'
                   "context = 1024\nslots = 2\nbatch = 64\n")
    assert json.loads(cli("models", "--json", "--config", str(cfg)).stdout)[0]["quant"] == "Q8_0"
    srv = start_server(tmp_path, "--config", str(cfg))
    try:
        c = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="x", max_retries=0)
        r2 = c.chat.completions.create(model="q8", max_tokens=8,
                                       messages=[{"role": "user", "content": "Hi"}])
        assert r2.choices[0].message.content
    finally:
        stop_server(srv)


def test_port_0_ready_line_ready_file_and_parent_watch(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    ready = tmp_path / "ready.json"
    (tmp_path / "ready.tmp").write_text("mine")  # (was taken as the ready file's draft)
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgeinfer", "serve", "--port", "0", "--ready-file", str(ready),
         "--parent-pid", str(parent.pid), "--slots", "2"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the server answers
        assert line.startswith("EDGEINFER_READY ")
        info = json.loads(line.split(" ", 1)[1])
        assert json.loads(ready.read_text()) == info and info["pid"] == proc.pid
        assert re.match(r"http://127\.0\.0\.1:\d+$", info["url"])
        assert httpx.get(f"{info['url']}/health").status_code == 200
        parent.kill()  # the desktop app died: the server follows
        assert proc.wait(30) == 0
        assert not ready.exists() and (tmp_path / "ready.tmp").read_text() == "mine"
        assert not list(tmp_path.glob(".ready.json.*"))
        summary = (tmp_path / "server.log").read_text()
        assert "ready at http://127.0.0.1" in summary and "smollm2-135m-instruct" in summary
    finally:
        parent.kill()
        if proc.poll() is None:
            proc.kill()


def _scrape(server: ServerProcess) -> dict[str, float]:
    text = httpx.get(f"{server.base_url}/metrics").text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_metrics_move_as_requests_are_served(server: ServerProcess,
                                             client: openai.OpenAI) -> None:
    model = 'model="smollm2-135m-instruct"'
    before = _scrape(server)
    client.chat.completions.create(model="default", max_tokens=8,
                                   messages=[{"role": "user", "content": "Count to five."}])
    after = _scrape(server)
    gen = f"edgeinfer_generated_tokens_total{{{model}}}"
    assert after[gen] > before.get(gen, 0)
    ok = 'edgeinfer_http_requests_total{route="/v1/chat/completions",status="200"}'
    assert after[ok] == before.get(ok, 0) + 1
    ttft = f"edgeinfer_time_to_first_token_seconds_count{{{model}}}"
    itl = f"edgeinfer_inter_token_latency_seconds_count{{{model}}}"
    assert after[ttft] > before.get(ttft, 0) and after[itl] > before.get(itl, 0)
    for gauge in ("edgeinfer_queue_depth", "edgeinfer_slots_busy", "edgeinfer_kv_cells_used",
                  "edgeinfer_prefix_cache_hits_total"):
        assert f"{gauge}{{{model}}}" in after


def test_slots_show_a_running_request(server: ServerProcess) -> None:
    body = {"model": "default", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body,
                      timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
        data = httpx.get(f"{server.base_url}/slots").json()["data"][0]
        states = [s["state"] for s in data["slots"]]
    assert "generating" in states and len(states) == 8
    busy = next(s for s in data["slots"] if s["state"] == "generating")
    assert busy["generated_tokens"] > 0 and busy["request_id"].startswith("chatcmpl-")


def test_chat_page_is_served(server: ServerProcess) -> None:
    r = httpx.get(f"{server.base_url}/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "<title>edgeinfer chat</title>" in r.text and "/v1/chat/completions" in r.text
    assert "http://" not in r.text.replace("http://127", "")  # no external assets


def test_terminal_chat(server: ServerProcess) -> None:
    # an answer of at most 48 tokens: a sampled answer of this model can loop until the
    # context is full (minutes on 2 cores)
    r = cli("chat", "--url", server.base_url, "--max-tokens", "48", input="Say hi\n\n",
            timeout=120)
    assert r.returncode == 0 and "assistant> " in r.stdout
    assert len(r.stdout.split("assistant> ", 1)[1].strip()) > 0


def test_embedded_example_runs() -> None:
    r = subprocess.run([sys.executable, "examples/embedded.py"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    answers = [line.split(" -> ", 1)[1] for line in r.stdout.splitlines() if " -> " in line]
    assert len(answers) == 4 and all(a.strip() for a in answers), r.stdout
    assert "mounted API -> " in r.stdout


def test_pull_knows_the_default_model_is_here() -> None:
    r = cli("pull")
    assert r.returncode == 0 and "already here" in r.stderr


def test_bench_against_the_running_server(server: ServerProcess) -> None:
    r = cli("bench", "--url", server.base_url, "--streams", "2", "--tokens", "16")
    assert r.returncode == 0, r.stderr[-2000:]
    line = r.stdout.strip()
    assert line.startswith("2 streams x 16 tokens:") and float(line.split()[5]) > 1


def test_refuses_network_bind_without_keys() -> None:
    r = subprocess.run([sys.executable, "-m", "edgeinfer", "serve", "--host", "0.0.0.0"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "without API keys" in r.stderr


def test_a_port_in_use_is_one_line_before_any_model_loads() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "edgeinfer", "serve", "--port", str(port)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr
    assert "Traceback" not in r.stderr and "loading" not in r.stderr.split("cannot listen")[1]
    assert time.monotonic() - t0 < 20  # no model was loaded first
