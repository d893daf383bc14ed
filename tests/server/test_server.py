"""The server as a client sees it: a real process, the real model, the official SDK."""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import httpx
import openai
import pytest
from serverproc import ServerProcess, start_server, stop_server

HELLO = [{"role": "user", "content": "Say hello in one short sentence."}]


def test_chat_non_streaming(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="default", messages=HELLO, max_tokens=40,
                                       temperature=0)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    assert r.model == "smollm2-135m-instruct"
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage is not None
    assert r.usage.prompt_tokens > 5 and 0 < r.usage.completion_tokens <= 40
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streaming_shape(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="default", messages=HELLO, max_tokens=12, stream=True, temperature=0,
        stream_options={"include_usage": True})
    chunks = list(stream)
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].usage.completion_tokens <= 12


def test_raw_stream_ends_with_done(server: ServerProcess) -> None:
    body = {"model": "default", "messages": HELLO, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body,
                      timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert all(json.loads(ln[6:])["object"] == "chat.completion.chunk" for ln in lines[:-1])


def test_the_bare_address_serves_the_openai_paths_too(server: ServerProcess) -> None:
    """A client given the address without /v1 chats (llama-server serves both; its
    /completions there is its own shape, see test_llama_native), with or without a model
    (the first configured answers, as llama-server's one)."""
    bare = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    assert "default" in {m.id for m in bare.models.list()} | {
        a for m in bare.models.list() for a in (m.model_extra or {}).get("aliases", [])}
    r = bare.chat.completions.create(model="default", messages=HELLO, max_tokens=3)
    assert r.object == "chat.completion" and r.choices[0].message.content is not None
    bad = httpx.post(f"{server.base_url}/chat/completions", json={"messages": HELLO,
                                                                  "model": 5})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "model"
    anyone = httpx.post(f"{server.base_url}/chat/completions", timeout=60, json={
        "messages": HELLO, "max_tokens": 2})  # no model (llama-server's clients): the first
    assert anyone.status_code == 200 and anyone.json()["model"] == "smollm2-135m-instruct"


def test_text_completion(client: openai.OpenAI) -> None:
    r = client.completions.create(model="default", prompt="The capital of France is",
                                  max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.usage is not None and r.usage.completion_tokens <= 8
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="default", prompt="The capital of France is", max_tokens=8, temperature=0,
        stream=True) if c.choices)
    assert streamed == r.choices[0].text


def test_echo_puts_each_prompt_before_its_completion(client: openai.OpenAI,
                                                     server: ServerProcess) -> None:
    """``echo`` (OpenAI's legacy completions): the prompt, then the completion, whole and
    streamed (the prompt first); a prompt of token ids is echoed as its text."""
    prompts = ["The capital of France is", "1, 2, 3,"]
    plain = client.completions.create(model="default", prompt=prompts, max_tokens=4,
                                      temperature=0)
    r = client.completions.create(model="default", prompt=prompts, max_tokens=4,
                                  temperature=0, echo=True, n=2)
    texts = {c.index: c.text for c in r.choices}
    for c in plain.choices:
        for k in range(2):
            assert texts[c.index * 2 + k] == prompts[c.index] + c.text
    parts: dict[int, list[str]] = {0: [], 1: []}
    for chunk in client.completions.create(model="default", prompt=prompts[0], max_tokens=4,
                                           temperature=0, echo=True, n=2, stream=True):
        for ch in chunk.choices:
            parts[ch.index].append(ch.text)
    assert [p[0] for p in parts.values()] == [prompts[0]] * 2
    assert ["".join(p) for p in parts.values()] == [texts[0]] * 2
    tokens = httpx.post(f"{server.base_url}/tokenize",
                        json={"content": "The capital of"}).json()["tokens"]
    ids = client.completions.create(model="default", prompt=[tokens], max_tokens=2, echo=True)
    assert ids.choices[0].text.startswith("The capital of"), ids.choices[0].text
    wide = "Café 日本 🙂"  # characters whose bytes span tokens: decoded whole
    tokens = httpx.post(f"{server.base_url}/tokenize", json={"content": wide}).json()["tokens"]
    back = client.completions.create(model="default", prompt=[tokens], max_tokens=1, echo=True)
    assert back.choices[0].text.startswith(wide), back.choices[0].text


def test_stop_string_ends_generation(client: openai.OpenAI) -> None:
    free = client.completions.create(model="default", prompt="1, 2, 3, 4,", max_tokens=20,
                                     temperature=0).choices[0].text
    assert " 6" in free, free  # the model counts on; stop just before 6
    r = client.completions.create(model="default", prompt="1, 2, 3, 4,", max_tokens=20,
                                  temperature=0, stop=[" 6"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == free[: free.index(" 6")]


def test_eight_concurrent_streams_are_served_together(aclient: openai.AsyncOpenAI) -> None:
    topics = ["the sea", "a cat", "rain", "the moon", "bread", "trains", "music", "winter"]

    async def one(topic: str) -> tuple[str, float, float]:
        stream = await aclient.chat.completions.create(
            model="default", messages=[{"role": "user", "content": f"Write about {topic}."}],
            max_tokens=48, stream=True, extra_body={"ignore_eos": True})
        first = last = 0.0
        parts = []
        async for c in stream:
            if c.choices and c.choices[0].delta.content:
                last = time.monotonic()
                first = first or last
                parts.append(c.choices[0].delta.content)
        return "".join(parts), first, last

    async def main() -> list[tuple[str, float, float]]:
        return await asyncio.gather(*(one(t) for t in topics))

    results = asyncio.run(main())
    assert all(text.strip() for text, _, _ in results)
    # Served at once, not one after another: every stream had begun before any ended.
    assert max(f for _, f, _ in results) < min(last for _, _, last in results)


def test_greedy_request_alone_and_among_others(aclient: openai.AsyncOpenAI) -> None:
    """Greedy decoding is deterministic for the same batch shapes.

    llama.cpp's CPU kernels are not guaranteed invariant to batch shape (the
    reduction order of a matrix product depends on it): decoding beside other sequences may
    move logits
    slightly, so after some tokens a greedy text may part from the lone run.
    What holds, and is tested: the lone run is reproducible exactly, and the
    batched run agrees with it on the opening of the text. The prefix cache is
    off here (cache_prompt false): a cache hit computes the prompt in other
    pieces, another batch shape.
    """
    ask = [{"role": "user", "content": "List three colors of the rainbow."}]

    async def run(messages: list[dict[str, str]]) -> str:
        r = await aclient.chat.completions.create(model="default", messages=messages,
                                                  max_tokens=32, temperature=0,
                                                  extra_body={"cache_prompt": False})
        return r.choices[0].message.content or ""

    async def main() -> tuple[str, str, list[str]]:
        alone1 = await run(ask)
        alone2 = await run(ask)
        others = [[{"role": "user", "content": f"Tell me a fact about the number {i}."}]
                  for i in range(7)]
        batched = await asyncio.gather(run(ask), *(run(m) for m in others))
        return alone1, alone2, batched

    alone1, alone2, batched = asyncio.run(main())
    assert alone1 and alone1 == alone2
    assert batched[0][:12] == alone1[:12], (alone1, batched[0])
    assert all(batched)


def test_deterministic_request_through_the_openai_client(
        aclient: openai.AsyncOpenAI, client: openai.OpenAI) -> None:
    """``"deterministic": true`` (engine.lane): 128 greedy tokens and their
    log-probabilities are the same alone, among 7 other streams, and from the cache, on
    the suite's shared server, whatever the other tests left in its KV cache."""
    _deterministic_checks(aclient, client)


def _deterministic_checks(aclient: openai.AsyncOpenAI, client: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "Tell a long story about a lighthouse keeper."}]

    async def run(messages: list[dict[str, str]], det: bool, cache: bool = True
                  ) -> tuple[str, list[object]]:
        r = await aclient.chat.completions.create(
            model="default", messages=messages, max_tokens=128, temperature=0, logprobs=True,
            top_logprobs=2, extra_body={"deterministic": det, "ignore_eos": True,
                                        "cache_prompt": cache})
        lp = r.choices[0].logprobs
        assert lp is not None and lp.content is not None
        return r.choices[0].message.content or "", [t.model_dump() for t in lp.content]

    async def main() -> tuple[object, object, object]:
        alone = await run(ask, True)
        others = [[{"role": "user", "content": f"Write about the number {i}. " * (i + 1)}]
                  for i in range(7)]
        busy = await asyncio.gather(*(run(m, False) for m in others), run(ask, True, False))
        cached = await run(ask, True)
        return alone, busy[-1], cached

    alone, busy, cached = asyncio.run(main())
    assert busy == alone
    assert cached == alone
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="default", messages=ask, max_tokens=1,
                                       extra_body={"deterministic": "yes"})


def _wait_idle(server: ServerProcess, timeout: float = 10.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    stats = server.engine_stats()
    while time.monotonic() < deadline and (stats["slots_busy"] or stats["queued"]):
        time.sleep(0.05)
        stats = server.engine_stats()
    return stats


def test_disconnected_stream_frees_its_slot(server: ServerProcess) -> None:
    body = {"model": "default", "messages": HELLO, "max_tokens": 4000, "stream": True,
            "ignore_eos": True}
    baseline = _wait_idle(server)["generated_tokens"]  # a counter over the server's life
    assert isinstance(baseline, int)
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body,
                      timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
        assert server.engine_stats()["slots_busy"] == 1
    stats = _wait_idle(server)
    assert stats["slots_busy"] == 0
    ours = stats["generated_tokens"]
    assert isinstance(ours, int)
    assert 1 <= ours - baseline < 3000  # this stream's tokens: stopped long before max_tokens
    time.sleep(0.5)
    assert server.engine_stats()["generated_tokens"] == ours  # and nothing runs on


def test_disconnected_non_streaming_request_frees_its_slot(server: ServerProcess) -> None:
    body = {"model": "default", "messages": HELLO, "max_tokens": 4000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=1.0)
    assert _wait_idle(server)["slots_busy"] == 0


def test_errors_are_openai_shaped(client: openai.OpenAI, server: ServerProcess) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="no-such-model", messages=HELLO)
    assert nf.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="default", messages=HELLO, temperature=5)
    assert bad.value.body["param"] == "temperature"  # type: ignore[index]
    long_prompt = "word " * 9000
    with pytest.raises(openai.BadRequestError) as big:
        client.chat.completions.create(model="default",
                                       messages=[{"role": "user", "content": long_prompt}])
    assert big.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    r = httpx.post(f"{server.base_url}/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(f"{server.base_url}/v1/nowhere").status_code == 404
    assert httpx.get(f"{server.base_url}/v1/completions").status_code == 405
    wrong = httpx.get(f"{server.base_url}/v1/models/default/load")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    nan = httpx.post(f"{server.base_url}/v1/chat/completions", content=b'{"temperature": NaN}',
                     headers={"content-type": "application/json"})
    assert nan.status_code == 400 and nan.json()["error"]["param"] == "temperature"
    assert server.health()["status"] == "ok"


def test_models_endpoint(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == ["smollm2-135m-instruct", "smollm2-135m-instruct-q8",
                                      "gemma-3-270m"]
    assert models[0].state == "loaded"  # type: ignore[attr-defined]
    assert client.models.retrieve("smollm2-135m-instruct").id == "smollm2-135m-instruct"


def test_unloaded_models_have_a_creation_time_and_404s_have_openai_types(
        client: openai.OpenAI, server: ServerProcess) -> None:
    httpx.post(f"{server.base_url}/v1/models/gemma-3-270m/unload", timeout=30)  # if loaded
    models = {m.id: m for m in client.models.list().data}
    assert models["gemma-3-270m"].state == "unloaded"  # type: ignore[attr-defined]
    assert all(abs(m.created - time.time()) < 86400 for m in models.values())
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("no-such-model")
    assert err.value.body["type"] == "invalid_request_error"  # type: ignore[index]


def test_every_response_has_a_request_id(client: openai.OpenAI, server: ServerProcess) -> None:
    r = client.chat.completions.create(model="default", messages=HELLO, max_tokens=4)
    assert r._request_id and r._request_id.startswith("req_")  # the SDK reads x-request-id
    other = client.chat.completions.create(model="default", messages=HELLO, max_tokens=4)
    assert other._request_id != r._request_id
    mine = httpx.get(f"{server.base_url}/v1/models", headers={"x-request-id": "trace-42"})
    assert mine.headers["x-request-id"] == "trace-42"  # a plain id of the client's is kept
    odd = httpx.get(f"{server.base_url}/nope", headers={"x-request-id": "a b\tc"})
    assert odd.status_code == 404 and odd.headers["x-request-id"].startswith("req_")


def test_seed_makes_sampling_reproducible(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        # like with like: no cache hit, which would compute the prompt in other pieces
        r = client.chat.completions.create(model="default", messages=HELLO, max_tokens=24,
                                           temperature=1.0, seed=seed,
                                           extra_body={"cache_prompt": False})
        return r.choices[0].message.content or ""

    a, b = sample(1234), sample(1234)
    assert a == b
    assert any(sample(s) != a for s in (1, 2, 3))


SYSTEM = ("You are a careful assistant for a lighthouse museum. " * 30).strip()


def test_shared_system_prompt_is_served_from_the_cache(client: openai.OpenAI,
                                                      server: ServerProcess) -> None:
    def ask(question: str) -> int:
        r = client.chat.completions.create(
            model="default", max_tokens=4,
            messages=[{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": question}])
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        return r.usage.prompt_tokens_details.cached_tokens or 0

    ask("When was the first lighthouse built?")
    assert ask("Who kept the lights?") > 300  # the whole system prompt was reused
    stats = httpx.get(f"{server.base_url}/v1/cache").json()["data"][0]
    # the time the cache saved: reused tokens at the measured prompt rate (> 0.01 s for
    # 300 tokens unless the rate were over 30,000 tokens/s)
    assert stats["mode"] == "kv" and stats["time_saved_s"] > 0.01
    metrics = httpx.get(f"{server.base_url}/metrics").text
    assert 'edgeinfer_prefix_cache_time_saved_seconds_total{model=' in metrics


def test_pin_a_system_prompt(client: openai.OpenAI, server: ServerProcess) -> None:
    system = "You answer in French, briefly. " * 20
    r = httpx.post(f"{server.base_url}/v1/cache/pin", json={
        "model": "default", "messages": [{"role": "system", "content": system}]})
    assert r.status_code == 200, r.text
    pinned = r.json()["tokens"]
    assert pinned > 100
    stats = httpx.get(f"{server.base_url}/v1/cache").json()["data"][0]
    assert stats["pinned"] >= 1 and stats["cells_used"] >= pinned
    chat = client.chat.completions.create(
        model="default", max_tokens=2, messages=[{"role": "system", "content": system},
                                                 {"role": "user", "content": "Bonjour"}])
    assert chat.usage is not None and chat.usage.prompt_tokens_details is not None
    assert chat.usage.prompt_tokens_details.cached_tokens == pinned
    assert httpx.post(f"{server.base_url}/v1/cache/pin", json={"model": "default"}
                      ).status_code == 400
    unnamed = httpx.delete(f"{server.base_url}/v1/cache/pins")
    assert unnamed.status_code == 400 and unnamed.json()["error"]["param"] == "model"
    r = httpx.delete(f"{server.base_url}/v1/cache/pins", params={"model": "default"})
    assert r.status_code == 200
    deadline = time.monotonic() + 10  # the engine thread unpins at its next step
    while httpx.get(f"{server.base_url}/v1/cache").json()["data"][0]["pinned"]:
        assert time.monotonic() < deadline, "the pin is still there"
        time.sleep(0.05)


def test_logprobs_chat_and_completions(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="default", messages=HELLO, max_tokens=5,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and len(content) <= 5
    for item in content:
        assert len(item.top_logprobs) == 3 and item.logprob <= 0
        assert sum(math.exp(t.logprob) for t in item.top_logprobs) <= 1 + 1e-6  # a distribution
        # greedy: the sampled token is the most likely one
        assert item.top_logprobs[0].logprob == item.logprob
    assert "".join(i.token for i in content) == r.choices[0].message.content
    c = client.completions.create(model="default", prompt="Once upon a", max_tokens=3,
                                  temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    assert lp is not None and lp.tokens and len(lp.top_logprobs or []) == len(lp.tokens)
    assert "".join(lp.tokens) == c.choices[0].text
    # a stop string's tokens are not the answer's: its logprobs end with the content
    for stop in (["4."], [". 4"], "\n"):
        r = client.chat.completions.create(
            model="default", temperature=0, max_tokens=40, logprobs=True, stop=stop,
            messages=[{"role": "user", "content": "Count from 1 to 10 separated by commas"}])
        text = r.choices[0].message.content or ""
        tokens = "".join(i.token for i in r.choices[0].logprobs.content or [])  # type: ignore
        assert r.choices[0].finish_reason == "stop" and text.startswith(tokens), (stop, text,
                                                                                 tokens)
    # asked, but the stop string ended the answer inside its first token: empty, not null
    first = client.completions.create(model="default", prompt="1, 2, 3,", max_tokens=5,
                                      temperature=0, logprobs=2)
    head = first.choices[0].text[:2]
    cut = client.completions.create(model="default", prompt="1, 2, 3,", max_tokens=5,
                                    temperature=0, logprobs=2, stop=[head[1:]])
    lp = cut.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and "".join(lp.tokens) in ("", head[:1])


def test_streamed_logprobs_are_the_streamed_texts_tokens(client: openai.OpenAI) -> None:
    """Streamed, each token's logprob comes once its text is sent, and a stop string's
    tokens never come: the tokens join up to the content, and completions' text_offset
    are the whole answer's."""
    ask = [{"role": "user", "content": "Count from 1 to 10 separated by commas"}]
    for stop in (["4."], [", 4"], "\n", None):
        kw = {"stop": stop} if stop else {}
        chunks = list(client.chat.completions.create(
            model="default", temperature=0, max_tokens=30, logprobs=True, top_logprobs=1,
            messages=ask, stream=True, **kw))  # type: ignore[call-overload]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        items = [i for c in chunks if c.choices and c.choices[0].logprobs
                 for i in c.choices[0].logprobs.content or []]
        assert "".join(i.token for i in items) == text, (stop, text)
        whole = client.chat.completions.create(model="default", temperature=0, max_tokens=30,
                                               logprobs=True, messages=ask, **kw)
        assert whole.choices[0].message.content == text
        prompt = "1, 2, 3,"
        parts = list(client.completions.create(model="default", prompt=prompt, max_tokens=20,
                                               temperature=0, logprobs=1, stream=True, **kw))
        once = client.completions.create(model="default", prompt=prompt, max_tokens=20,
                                         temperature=0, logprobs=1, **kw)
        tokens = [t for p in parts if p.choices[0].logprobs
                  for t in p.choices[0].logprobs.tokens or []]
        offsets = [o for p in parts if p.choices[0].logprobs
                   for o in p.choices[0].logprobs.text_offset or []]
        assert once.choices[0].logprobs is not None
        assert tokens == once.choices[0].logprobs.tokens, stop
        assert offsets == once.choices[0].logprobs.text_offset, stop
        assert "".join(tokens) == "".join(p.choices[0].text for p in parts)


def test_streamed_logprobs_of_characters_split_over_tokens(client: openai.OpenAI) -> None:
    """Emoji and accents split over tokens: every content chunk carries a logprobs list
    (empty while its token's other bytes are still to come, never null), and the tokens'
    bytes join up to the content."""
    ask = [{"role": "user",
            "content": "Repeat exactly: 東京タワー 🗼🎉 São Paulo — naïve café 😀👍🏽"}]
    chunks = list(client.chat.completions.create(
        model="default", temperature=0, seed=1, max_tokens=60, logprobs=True,
        messages=ask, stream=True))  # type: ignore[call-overload]
    texts = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert texts and all(c.choices[0].logprobs is not None for c in texts)
    items = [i for c in chunks if c.choices and c.choices[0].logprobs
             for i in c.choices[0].logprobs.content or []]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert bytes(b for i in items for b in i.bytes or []) == content.encode()
    assert any(i.token.endswith("\ufffd") for i in items)  # a split character was there


def test_n_choices_share_one_prompt_computation(client: openai.OpenAI,
                                                server: ServerProcess) -> None:
    messages = [{"role": "user", "content": "Invent a name for a cat. " + "x" * 40}]
    before = server.engine_stats()["prompt_tokens"]
    r = client.chat.completions.create(model="default", messages=messages, n=4, max_tokens=8,
                                       temperature=1.0, seed=11)
    computed = int(server.engine_stats()["prompt_tokens"]) - int(before)  # type: ignore[arg-type]
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert len({c.message.content for c in r.choices}) > 1  # each choice samples on its own
    assert r.usage is not None
    assert 4 <= r.usage.completion_tokens <= 32
    assert computed < r.usage.prompt_tokens + 8  # the prompt was computed once, not 4 times


def test_streamed_choices_and_multiple_prompts(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model="default", messages=HELLO, n=2, max_tokens=6, stream=True,
        stream_options={"include_usage": True}))
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 12
    r = client.completions.create(model="default", prompt=["Red is a", "The sky is"],
                                  max_tokens=4, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    alone = client.completions.create(model="default", prompt="The sky is", max_tokens=4,
                                      temperature=0, extra_body={"cache_prompt": False})
    assert r.usage is not None and alone.usage is not None
    assert r.usage.prompt_tokens > alone.usage.prompt_tokens


def test_embeddings(client: openai.OpenAI, aclient: openai.AsyncOpenAI) -> None:
    texts = ["The cat sat on the mat.", "A cat was sitting on a rug.", "Stock prices fell today."]
    r = client.embeddings.create(model="default", input=texts)
    vecs = [d.embedding for d in r.data]
    assert [d.index for d in r.data] == [0, 1, 2] and len(vecs[0]) == 576
    assert all(abs(sum(x * x for x in v) - 1) < 1e-6 for v in vecs)  # unit length
    short = client.embeddings.create(model="default", input=texts[0], dimensions=64).data[0]
    assert len(short.embedding) == 64 and abs(sum(x * x for x in short.embedding) - 1) < 1e-6
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="default", input="x", dimensions=577)

    def cos(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cos(vecs[0], vecs[1]) > cos(vecs[0], vecs[2])  # similar sentences are closer
    assert r.usage.prompt_tokens == r.usage.total_tokens > 10
    # the SDK asked for base64 above (its default) and decoded it; floats give the same vector
    one = asyncio.run(aclient.embeddings.create(model="default", input=texts[0],
                                                encoding_format="float"))
    assert max(abs(a - b) for a, b in zip(one.data[0].embedding, vecs[0], strict=True)) < 1e-6
    toks = client.embeddings.create(model="default", input=[[1, 2, 3]])
    assert len(toks.data) == 1
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="default", input=[])


def test_batches_of_embeddings_as_rag_libraries_send_them(server: ServerProcess,
                                                          client: openai.OpenAI) -> None:
    """LangChain's OpenAIEmbeddings sends 512 texts a request, the Vercel AI SDK up to
    2,048 (OpenAI's limit), Ollama's clients all of a document's chunks at once: over 256
    was a 400 (a few past it here: ~30 ms a text on this CPU)."""
    texts = [f"chunk {i} of the manual" for i in range(260)]
    r = client.embeddings.create(model="default", input=texts)
    assert [d.index for d in r.data] == list(range(260))
    ollama = httpx.post(f"{server.base_url}/api/embed", timeout=300,
                        json={"model": "default", "input": texts[::-1]})
    assert ollama.status_code == 200 and len(ollama.json()["embeddings"]) == 260
    with pytest.raises(openai.BadRequestError, match="2048"):
        client.embeddings.create(model="default", input=["x"] * 2049)


def test_tokenize_and_detokenize(server: ServerProcess) -> None:
    r = httpx.post(f"{server.base_url}/tokenize", json={"content": "Hello world"})
    tokens = r.json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    back = httpx.post(f"{server.base_url}/detokenize", json={"tokens": tokens}).json()
    assert back["content"] == "Hello world"
    pieces = httpx.post(f"{server.base_url}/tokenize",
                        json={"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] for p in pieces) == "Hello world"
    # a piece that is part of a character comes as its bytes, as llama-server gives it
    text = "媽🤗 ok"
    pieces = httpx.post(f"{server.base_url}/tokenize",
                        json={"content": text, "with_pieces": True}).json()["tokens"]
    assert any(isinstance(p["piece"], list) for p in pieces)
    raw = b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode()
                   for p in pieces)
    assert raw.decode() == text
    bad = httpx.post(f"{server.base_url}/detokenize", json={"tokens": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_api_key_server(tmp_path_factory: pytest.TempPathFactory) -> None:

    tmp = tmp_path_factory.mktemp("keys")
    keyfile = tmp / "keys.txt"
    keyfile.write_text("# local keys\nsk-local-123\n")
    srv = start_server(tmp, "--api-key-file", str(keyfile), "--slots", "2")
    try:
        base = f"{srv.base_url}/v1"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
        good = openai.OpenAI(base_url=base, api_key="sk-local-123", max_retries=0)
        assert good.models.list().data
        assert "sk-local-123" not in srv.log.read_text()  # never logged
    finally:
        stop_server(srv)


def test_openapi_describes_every_route(server: ServerProcess) -> None:
    spec = httpx.get(f"{server.base_url}/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models",
                 "/tokenize", "/detokenize", "/health"):
        assert path in spec["paths"]
    chat = spec["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]
    props = chat["application/json"]["schema"]["properties"]
    from edgeinfer.api.openai_chat import FIELDS as CHAT_FIELDS
    from edgeinfer.api.openai_completions import FIELDS as COMPLETION_FIELDS
    assert set(props) == CHAT_FIELDS  # the spec and the parser accept the same fields
    text = spec["paths"]["/v1/completions"]["post"]["requestBody"]["content"]
    assert set(text["application/json"]["schema"]["properties"]) == COMPLETION_FIELDS


def test_too_long_prompt_is_a_plain_400_even_when_streaming(server: ServerProcess) -> None:
    body = {"model": "default", "stream": True,
            "messages": [{"role": "user", "content": "word " * 9000}]}
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body,
                      timeout=60) as r:
        assert r.status_code == 400
        assert r.headers["content-type"].startswith("application/json")
        err = json.loads(r.read())["error"]
    assert err["code"] == "context_length_exceeded" and "8192" in err["message"]


def test_logit_bias_and_penalties_change_the_output(client: openai.OpenAI) -> None:
    prompt = "1, 2, 3, 4,"
    base = client.completions.create(model="default", prompt=prompt, max_tokens=12,
                                     temperature=0, logprobs=1)
    assert base.choices[0].logprobs is not None
    first_token = base.choices[0].logprobs.tokens[0]  # type: ignore[index]
    tok_id = httpx.post(f"{str(client.base_url).removesuffix('/v1/')}/tokenize",
                        json={"content": first_token}).json()["tokens"]
    assert len(tok_id) == 1
    banned = client.completions.create(model="default", prompt=prompt, max_tokens=12,
                                       temperature=0, logprobs=1,
                                       logit_bias={str(tok_id[0]): -100})
    assert banned.choices[0].logprobs is not None
    assert banned.choices[0].logprobs.tokens[0] != first_token  # type: ignore[index]
    penalized = client.completions.create(model="default", prompt=prompt, max_tokens=12,
                                          temperature=0, frequency_penalty=2.0,
                                          presence_penalty=2.0)
    assert penalized.choices[0].text != base.choices[0].text


def test_what_openai_and_llama_server_clients_send_by_default_is_taken(
        server: ServerProcess) -> None:
    """Explicit nulls, Predicted Outputs, cache hints, an earlier refusal part, llama-server's
    sampler fields and hints: accepted (the samplers change the answer, a seed repeats it);
    wrong types still get a 400 naming the field."""
    base = {"model": "default", "max_tokens": 12, "seed": 7, "temperature": 0.9,
            "messages": [{"role": "user", "content": "Name a colour."},
                         {"role": "assistant", "content": [{"type": "refusal",
                                                            "refusal": "I cannot."}]},
                         {"role": "user", "content": "Name a fruit."}]}
    extras = {"modalities": None, "audio": None, "functions": None, "function_call": None,
              "web_search_options": None, "prediction": {"type": "content", "content": "x"},
              "prompt_cache_options": {"mode": "explicit"}, "metadata": {"k": "v"},
              "service_tier": "auto", "timings_per_token": True, "id_slot": -1,
              "samplers": ["top_k", "temperature"], "return_progress": False}
    url = f"{server.base_url}/v1/chat/completions"
    plain = httpx.post(url, json={**base, **extras}, timeout=60)
    assert plain.status_code == 200, plain.text
    samplers = {"mirostat": 2, "mirostat_tau": 3.0, "typical_p": 0.5, "dry_multiplier": 0.8,
                "xtc_probability": 0.5, "dynatemp_range": 0.5, "top_n_sigma": 1.0}
    texts = set()
    for name, value in samplers.items():
        r = httpx.post(url, json={**base, name: value}, timeout=60)
        assert r.status_code == 200, (name, r.text)
        again = httpx.post(url, json={**base, name: value}, timeout=60)
        assert again.json()["choices"][0]["message"] == r.json()["choices"][0]["message"]
        texts.add(r.json()["choices"][0]["message"]["content"])
    assert len(texts | {plain.json()["choices"][0]["message"]["content"]}) > 1
    capped = httpx.post(url, json={**base, "max_tokens": None, "n_predict": 3}, timeout=60)
    assert capped.json()["usage"]["completion_tokens"] <= 3
    for bad in ({"metadata": {"k": 5}}, {"service_tier": 5}, {"user": 5}, {"store": "yes"},
                {"prediction": {"type": "other"}}, {"typical_p": 2}, {"id_slot": "x"}):
        r = httpx.post(url, json={**base, **bad}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(bad)), r.text
    suffix = httpx.post(f"{server.base_url}/v1/completions", json={
        "model": "default", "prompt": "a", "suffix": "", "max_tokens": 2}, timeout=60)
    assert suffix.status_code == 200, suffix.text


def test_the_llama_cpp_web_uis_default_request_is_taken(server: ServerProcess) -> None:
    """What llama.cpp's web UI sends by default (tools/server/webui: no ``model``,
    ``max_tokens: -1`` for no limit, ``typ_p``, ``backend_sampling``, its hints): answered
    by the first configured model (each was a 400); /v1/completions takes no model too."""
    body = {"messages": [{"role": "user", "content": "Say hi."}], "stream": True,
            "max_tokens": -1, "typ_p": 1, "backend_sampling": False, "cache_prompt": True,
            "samplers": "edkypmxt", "timings_per_token": True, "return_progress": True,
            "temperature": 0.8, "dry_multiplier": 0, "n_predict": 8}
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body,
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert lines[0]["model"] == "smollm2-135m-instruct"
    assert lines[-1]["choices"] == [] or lines[-1]["choices"][0]["finish_reason"]
    done = httpx.post(f"{server.base_url}/v1/completions", timeout=60, json={
        "prompt": "1, 2, 3,", "n_predict": 4, "typ_p": 1.0})
    assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] <= 4
    bad = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "x"}], "max_tokens": -3})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"


def test_n_choices_give_the_same_output_with_and_without_speculation(
        client: openai.OpenAI) -> None:
    """Choices of one request share the KV cache: one's rejected drafts leave cells the
    other takes, in another order than without drafts, so they do not draft, and a seeded
    n = 2 answers as without speculation, bit for bit (it differed in its logprobs)."""
    text = ("The quick brown fox jumps over the lazy dog near the river bank. Every morning "
            "the baker opens his shop at six and sells fresh bread to the village.")
    ask: dict[str, Any] = {
        "model": "default", "max_tokens": 40, "temperature": 0.9, "seed": 1, "n": 2,
        "logprobs": True, "messages": [{"role": "user", "content": f"Repeat exactly: {text}"}]}

    def answers(**extra: Any) -> list[tuple[str | None, list[float]]]:
        body = {"cache_prompt": False, **extra}  # (a cached prompt is pieced otherwise)
        r = client.chat.completions.create(**ask, extra_body=body)
        return [(c.message.content, [t.logprob for t in c.logprobs.content or []])
                for c in r.choices if c.logprobs is not None]
    plain = answers(speculative=False)
    assert len(plain) == 2 and answers() == plain
    assert answers(prediction={"type": "content", "content": text}) == plain


def test_predicted_outputs_draft_the_answer_and_leave_it_unchanged(
        client: openai.OpenAI) -> None:
    """OpenAI's ``prediction``: the expected answer (a file being edited) is drafted from
    where the output is in it; the answer is the one without it, token for token."""
    ask = {"model": "default", "temperature": 0, "max_tokens": 64,
           "messages": [{"role": "user", "content": "Write a short poem about the sea."}]}
    plain = client.chat.completions.create(**ask, extra_body={"speculative": False})
    text = plain.choices[0].message.content or ""
    assert plain.usage is not None and plain.usage.completion_tokens > 20
    words = text.split(" ")
    edited = " ".join(words[:3] + ["harbour"] + words[4:])  # a prediction with an edit
    for predicted in (text, edited):
        r = client.chat.completions.create(
            **ask, prediction={"type": "content", "content": predicted})
        assert r.choices[0].message.content == text
        timings = (r.model_extra or {}).get("timings") or {}
        assert timings.get("draft_n_accepted", 0) >= plain.usage.completion_tokens // 2, timings
    off = client.chat.completions.create(**ask, extra_body={"speculative": False},
                                         prediction={"type": "content", "content": text})
    assert "draft_n" not in ((off.model_extra or {}).get("timings") or {})
