"""llama-server's own completion endpoint (/completion, /completions), in its native
shape, as its tools and SillyTavern's llama.cpp source call it."""

from __future__ import annotations

import json
import math

import httpx
from serverproc import ServerProcess


def _post(server: ServerProcess, body: dict[str, object], path: str = "/completion"
          ) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=60)


def test_whole_answer_has_llama_servers_fields(server: ServerProcess) -> None:
    r = _post(server, {"prompt": "Once upon a time", "n_predict": 8, "temperature": 0,
                       "n_probs": 2})  # no model: the first configured one
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["stop"] is True and body["stop_type"] == "limit"
    assert body["tokens_predicted"] == 8 and body["tokens_evaluated"] > 0
    assert body["content"] and body["timings"]["predicted_n"] == 8
    probs = body["completion_probabilities"]
    assert len(probs) == 8 and "".join(p["token"] for p in probs) == body["content"]
    for p in probs:
        assert len(p["top_logprobs"]) == 2 and p["top_logprobs"][0]["logprob"] == p["logprob"]
        assert sum(math.exp(t["logprob"]) for t in p["top_logprobs"]) <= 1 + 1e-6
        assert bytes(p["bytes"]).decode() == p["token"]
    same = _post(server, {"model": "default", "prompt": "Once upon a time", "n_predict": 8,
                          "max_tokens": 2, "temperature": 0, "tfs_z": 1.0, "penalize_nl": False,
                          "min_keep": 0}, "/completions").json()  # n_predict first, as there
    assert same["content"] == body["content"] and "completion_probabilities" not in same


def test_stream_stop_word_and_schema(server: ServerProcess) -> None:
    body = {"prompt": "1, 2, 3,", "n_predict": 30, "temperature": 0, "stream": True,
            "stop": [", 7"]}
    with httpx.stream("POST", f"{server.base_url}/completion", json=body, timeout=60) as r:
        events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]
    assert all(not e["stop"] for e in events[:-1]) and events[-1]["stop"] is True
    text = "".join(e["content"] for e in events)
    whole = _post(server, {**body, "stream": False}).json()
    assert text == whole["content"] and ", 7" not in text
    assert whole["stop_type"] == events[-1]["stop_type"] == "word"
    assert whole["stopping_word"] == ", 7"
    typed = _post(server, {"prompt": "A city record:", "n_predict": 60, "temperature": 0,
                           "json_schema": {"type": "object", "properties": {
                               "name": {"type": "string", "maxLength": 20}},
                               "required": ["name"]}}).json()
    assert isinstance(json.loads(typed["content"])["name"], str)


def test_several_prompts_answer_each_in_order_whole_and_streamed(server: ServerProcess) -> None:
    """A list of prompts: an array of answers with their ``index`` (as llama-server); each
    the answer the prompt gets alone."""
    prompts = ["1, 2, 3,", "Once upon a time", [16, 28, 30]]
    base = {"n_predict": 6, "temperature": 0, "cache_prompt": False}
    alone = [_post(server, {**base, "prompt": p}).json() for p in prompts]
    r = _post(server, {**base, "prompt": prompts})
    assert r.status_code == 200, r.text
    many = r.json()
    assert isinstance(many, list) and [m["index"] for m in many] == [0, 1, 2]
    for one, m in zip(alone, many, strict=True):
        assert m["stop"] is True and m["tokens_predicted"] == one["tokens_predicted"] == 6
        assert m["tokens_evaluated"] == one["tokens_evaluated"]
        assert m["timings"]["predicted_n"] == 6  # each its own timings
        assert m["timings"]["prompt_n"] + m["tokens_cached"] == m["tokens_evaluated"]
    assert many[1]["content"].strip() and many[0]["content"] != many[1]["content"]
    with httpx.stream("POST", f"{server.base_url}/completion", timeout=60,
                      json={**base, "prompt": prompts, "stream": True}) as s:
        events = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: ")]
    for i, m in enumerate(many):
        mine = [e for e in events if e["index"] == i]
        assert [e["stop"] for e in mine].count(True) == 1 and mine[-1]["stop"] is True
        assert mine[-1]["tokens_predicted"] == 6
        assert mine[-1]["tokens_evaluated"] == m["tokens_evaluated"]
        assert len("".join(e["content"] for e in mine)) > 0


def test_a_mixed_prompt_is_its_token_ids_and_texts_in_order(server: ServerProcess) -> None:
    """llama-server's mixed prompt (token ids and strings in one list) is one prompt: the
    ids as they are and each text tokenized, alone or in a list of prompts."""
    def ids(text: str) -> list[int]:
        return httpx.post(f"{server.base_url}/tokenize", timeout=30, json={
            "content": text, "add_special": False}).json()["tokens"]
    head, tail = ids("Once upon a time"), ids(" there was")
    base = {"n_predict": 6, "temperature": 0, "cache_prompt": False}
    want = _post(server, {**base, "prompt": [*head, *tail, *head]}).json()
    mixed = [*head, " there was", *head]
    got = _post(server, {**base, "prompt": mixed}).json()
    assert (got["content"], got["tokens_evaluated"]) == (want["content"],
                                                         want["tokens_evaluated"])
    both = _post(server, {**base, "prompt": [mixed, "Hello"]}).json()
    assert [b["index"] for b in both] == [0, 1] and both[0]["content"] == want["content"]
    for bad in ([*head, " x", -1], [*head, " x", True], [*head, " x", None]):
        r = _post(server, {**base, "prompt": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


def test_a_body_labelled_as_a_form_is_read_as_json(server: ServerProcess) -> None:
    """``curl -d`` labels the body a form; llama-server reads it as JSON all the same."""
    r = httpx.post(f"{server.base_url}/completion", timeout=60,
                   content=json.dumps({"prompt": "Hi", "n_predict": 2}),
                   headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 2


def test_bad_bodies_are_a_400(server: ServerProcess) -> None:
    for body, param in (({"prompt": "x", "n_predict": "many"}, "n_predict"),
                        ({"prompt": "x", "post_sampling_probs": True}, "post_sampling_probs"),
                        ({"prompt": "x", "return_tokens": True}, "return_tokens"),
                        ({"prompt": "x", "json_schema": 3}, "json_schema"),
                        ({"prompt": "x", "json_schema": {"type": "hiccup"}}, "json_schema"),
                        ({"prompt": ["a"] * 17}, "prompt"),
                        ({"prompt": "x", "nonsense": 1}, "nonsense")):
        r = _post(server, body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    assert server.health()["status"] == "ok"


def test_props_describe_the_model(server: ServerProcess) -> None:
    props = httpx.get(f"{server.base_url}/props", timeout=30).json()
    assert props["default_generation_settings"]["n_ctx"] > 0 and props["total_slots"] >= 1
    assert "<|im_start|>" in props["chat_template"] and props["model_path"].endswith(".gguf")
    assert props["modalities"] == {"vision": False, "video": False, "audio": False}
    named = httpx.get(f"{server.base_url}/props", params={"model": "default"}, timeout=30)
    assert named.json()["model_alias"] == props["model_alias"]
    assert httpx.get(f"{server.base_url}/props", params={"model": "nope"}).status_code == 404
    # a model not loaded is described from models.toml and its file, and stays unloaded
    running = {m["model"] for m in httpx.get(f"{server.base_url}/api/ps").json()["models"]}
    other = httpx.get(f"{server.base_url}/props", params={"model": "gemma3"}, timeout=30).json()
    assert other["model_alias"] == "gemma-3-270m" and other["default_generation_settings"]
    assert other["loaded"] == ("gemma-3-270m:latest" in running)
    q8 = httpx.get(f"{server.base_url}/props", params={"model": "smollm2-q8"}, timeout=30).json()
    if not q8["loaded"] and q8["model_path"]:  # its tokens read from the file's header
        assert (q8["bos_token"], q8["eos_token"]) == (props["bos_token"], props["eos_token"])
        assert props["eos_token"] == "<|im_end|>"
    assert {m["model"] for m in httpx.get(f"{server.base_url}/api/ps").json()["models"]} == running


def test_logit_bias_as_llama_servers_pairs(server: ServerProcess) -> None:
    """``[[id, bias]]`` and ``[[id, false]]`` (never that token), as llama-server takes them,
    act as the object form does."""
    url = f"{server.base_url}/completion"
    ask = {"prompt": "1, 2, 3, 4,", "n_predict": 1, "temperature": 0, "n_probs": 1}
    first = httpx.post(url, json=ask, timeout=60).json()
    top = first["completion_probabilities"][0]["id"]
    for bias in ([[top, False]], [[top, -100]], {str(top): -100}):
        other = httpx.post(url, json={**ask, "logit_bias": bias}, timeout=60)
        assert other.status_code == 200, other.text
        assert other.json()["completion_probabilities"][0]["id"] != top, bias
    bad = httpx.post(url, json={**ask, "logit_bias": [[" the ", -100]]}, timeout=60)
    assert bad.status_code == 400 and "token id" in bad.json()["error"]["message"]


def test_n_predict_zero_evaluates_the_prompt_into_the_cache(server: ServerProcess) -> None:
    """llama-server's cache warming: ``n_predict`` 0 returns no token (whole or streamed),
    and the next request on that prompt finds it cached."""
    prompt = "Warm me: " + " ".join(f"word{i}" for i in range(40))
    body = {"prompt": prompt, "n_predict": 0, "temperature": 0}
    r = _post(server, body)
    assert r.status_code == 200, r.text
    warm = r.json()
    assert warm["content"] == "" and warm["tokens_predicted"] == 0 and warm["stop"] is True
    assert warm["stop_type"] == "limit" and warm["tokens_evaluated"] > 40
    assert warm["generation_settings"]["n_predict"] == 0
    assert warm["timings"]["predicted_n"] == 0
    after = _post(server, {**body, "n_predict": 2}).json()
    assert after["tokens_predicted"] == 2 and after["content"]
    assert after["tokens_cached"] >= warm["tokens_evaluated"] - 1
    with httpx.stream("POST", f"{server.base_url}/completion", json={
            **body, "prompt": prompt + " more", "stream": True}, timeout=60) as s:
        events = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: ")]
    assert len(events) == 1 and events[0]["stop"] is True and events[0]["content"] == ""
    assert events[0]["tokens_predicted"] == 0
    for bad in (-3, 1.5, "0"):
        r = _post(server, {**body, "n_predict": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n_predict", bad
