"""The engine in-process on the real model: KV exhaustion, aborts, determinism."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from edgeinfer.config import load_config, override_model
from edgeinfer.engine.loop import Delta
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.models.served import ServedModel, load_model


@contextlib.contextmanager
def _model(**overrides: Any) -> Iterator[ServedModel]:
    """SmolLM2 with ``overrides`` (a model of the caller's own), its engine stopped after."""
    served = load_model(override_model(load_config().models[0], **overrides))
    try:
        yield served
    finally:
        served.engine.stop()


@pytest.fixture(scope="module")
def small() -> Iterator[ServedModel]:
    """SmolLM2 with a deliberately tiny KV cache: 256 cells for 4 slots."""
    with _model(context=256, slots=4, batch=64, threads=2) as served:
        yield served


async def _run(served: ServedModel, rid: str, prompt: list[int], params: SamplingParams
               ) -> tuple[str, Delta]:
    parts = []
    last: Delta | None = None
    async for d in served.engine.generate(rid, prompt, params):
        parts.append(d.text)
        last = d
    assert last is not None
    return "".join(parts), last


def test_full_kv_cache_stops_only_the_newest_request(small: ServedModel) -> None:
    prompt = small.tokenize_chat(small.template.render(
        [{"role": "user", "content": "Count to one thousand."}]))
    long_run = SamplingParams(temperature=0, ignore_eos=True)  # until the context is full

    async def main() -> list[Delta]:
        small.engine.start(asyncio.get_running_loop())
        try:
            results = await asyncio.gather(
                *(_run(small, f"kv{i}", prompt, long_run) for i in range(4)))
            # the engine still serves afterwards
            _, last = await _run(small, "after", prompt,
                                    SamplingParams(temperature=0, max_tokens=5))
            assert last.finish_reason == "length" and last.completion_tokens == 5
            return [d for _, d in results]
        finally:
            small.engine.stop()

    finals = asyncio.run(main())
    assert small.engine.stats.decode_errors >= 1  # llama_decode really returned 1
    # 4 x (prompt + up to 256 - prompt) tokens cannot fit in 256 cells: some requests were
    # stopped early as "length", none failed, and the last survivor used the whole context.
    assert all(d.finish_reason == "length" for d in finals), finals
    generated = sorted(d.completion_tokens for d in finals)
    room = 256 - len(prompt)
    assert generated[0] < room
    assert generated[-1] == room


def test_prompts_the_kv_cache_cannot_hold_together_wait_their_turn() -> None:
    """Four ~100-token prompts in 256 cells: the prompts that do not fit beside the
    others wait (their cells freed) until a running request ends, then run; every request
    gets its whole answer, none an error (this was a "KV cache full" error mid-stream)."""
    with _model(context=256, slots=4, batch=64, threads=2) as served:
        prompts = [served.tokenize_chat(served.template.render([{
            "role": "user", "content": f"Story {k}: " + " ".join(
                f"the {w} walked to the market on day {k}." for w in
                ("fox", "owl", "cat", "dog", "hen", "elk", "ram", "bee"))}]))
            for k in range(4)]
        assert all(90 <= len(p) < 128 for p in prompts), [len(p) for p in prompts]
        params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=12)

        async def main() -> list[tuple[str, Delta]]:
            served.engine.start(asyncio.get_running_loop())
            try:
                return await asyncio.gather(*(_run(served, f"p{k}", p, params)
                                              for k, p in enumerate(prompts)))
            finally:
                served.engine.stop()

        results = asyncio.run(main())
        assert served.engine.stats.decode_errors >= 1  # the cache really ran out
        for _, last in results:
            assert last.finish_reason == "length" and last.completion_tokens == 12, last
        stats = served.engine.stats_snapshot()
        assert stats["queued"] == 0 and stats["slots_busy"] == 0


def test_a_request_ended_early_finishes_as_a_stop_with_its_last_delta() -> None:
    """abort(stop=True) (a repeated tool call ends the answer) finishes the request as
    a stop: its finishing delta comes, with the counts, and frees the slot; a late one
    does nothing. (Its own model: the module's is stopped by the test before.)"""
    with _model(context=256, slots=2, batch=64, threads=2) as small:
        _end_early(small)


def _end_early(small: ServedModel) -> None:
    prompt = small.tokenize_chat(small.template.render(
        [{"role": "user", "content": "Count to one thousand."}]))
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=200)

    async def main() -> tuple[list[Delta], int]:
        small.engine.start(asyncio.get_running_loop())
        try:
            got = []
            async for d in small.engine.generate("early", prompt, params):
                got.append(d)
                if len(got) == 3:
                    small.engine.abort("early", stop=True)
            small.engine.abort("early", stop=True)  # after the end: nothing happens
            _, after = await _run(small, "next", prompt, SamplingParams(max_tokens=2))
            assert after.finish_reason == "length"
            return got, len(small.engine.scheduler.running)
        finally:
            small.engine.stop()

    got, running = asyncio.run(main())
    last = got[-1]
    assert last.finish_reason == "stop" and last.stop_word is None
    assert 3 <= last.completion_tokens < 200 and last.prompt_tokens == len(prompt)
    assert all(d.finish_reason is None for d in got[:-1]) and running == 0


def test_format_markers_that_are_special_tokens_show_in_the_output() -> None:
    """A format's markers that the model has as control tokens render as their text (as
    llama-server's preserved tokens do); other control tokens and end-of-generation stay
    hidden, and plain-text markers are left as they are."""
    with _model(context=256, slots=1, batch=64, threads=1) as served:
        _check_markers(served)


def _check_markers(served: ServedModel) -> None:
    rt = served.runtime
    start = rt.tokenize("<|im_start|>", add_special=False, parse_special=True)
    assert len(start) == 1 and rt.piece(start[0]) == b""  # hidden by default
    eog = rt.tokenize("<|im_end|>", add_special=False, parse_special=True)
    assert rt.show_markers(("<|im_start|>", "<|im_end|>", "[TOOL_CALLS]")) == ["<|im_start|>"]
    assert rt.piece(start[0]) == b"<|im_start|>"
    assert rt.is_eog(eog[0]) and rt.piece(eog[0]) == b""


def test_a_lone_prompt_is_computed_in_prefill_sized_pieces() -> None:
    """Adaptive prefill: with no stream generating, a step takes up to prefill_batch
    tokens (not batch), and the answer is the same kind of answer."""
    steps = {}
    for prefill in (64, 256):
        served = load_model(override_model(load_config().models[0], context=1024, slots=2,
                                           batch=64, prefill_batch=prefill, threads=2))
        prompt = served.runtime.tokenize("The lighthouse keeper wrote in his log. " * 60,
                                         add_special=False, parse_special=False)[:500]

        async def main(s: ServedModel = served, p: list[int] = prompt) -> Delta:
            s.engine.start(asyncio.get_running_loop())
            try:
                return (await _run(s, "long", p, SamplingParams(temperature=0, max_tokens=2)))[1]
            finally:
                s.engine.stop()

        last = asyncio.run(main())
        assert last.finish_reason == "length" and last.completion_tokens == 2
        steps[prefill] = served.engine.stats.steps
    assert steps[64] == 8 + 1 and steps[256] == 2 + 1  # 500 prompt tokens, then 1 decode


def test_a_short_prompt_is_answered_before_a_long_one_that_came_first() -> None:
    """A short chat arriving while a long document is computed gets its first token after
    a step, not after the whole document (the scheduler's prefill order)."""
    with _model(context=2048, slots=2, batch=64, threads=2) as served:
        tokens = served.runtime.tokenize("The lighthouse keeper wrote in his log. " * 150,
                                         add_special=False, parse_special=False)[:1200]
        first: list[str] = []

        async def one(rid: str, prompt: list[int]) -> None:
            async for _ in served.engine.generate(rid, prompt, SamplingParams(
                    temperature=0, max_tokens=2)):
                if rid not in first:
                    first.append(rid)

        async def main() -> None:
            served.engine.start(asyncio.get_running_loop())
            long = asyncio.ensure_future(one("long", tokens))
            while served.engine.stats.steps < 2:  # the document is being computed
                await asyncio.sleep(0.005)
            await asyncio.gather(long, one("short", tokens[:12]))

        asyncio.run(main())
        assert first == ["short", "long"]


def test_a_dry_sampler_is_made_off_the_engine_thread_then_cloned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """DRY scans the vocabulary for each breaker when it is made (160 ms for long ones):
    it is made once per setting in a worker thread and cloned on the engine thread, with
    the same output as one made on the spot."""
    from edgeinfer.engine.dry import DryCache
    threads: list[str] = []
    build = DryCache._build

    def spy(self: DryCache, key: Any) -> Any:
        threads.append(threading.current_thread().name)
        return build(self, key)

    monkeypatch.setattr(DryCache, "_build", spy)
    params = SamplingParams(temperature=0, max_tokens=24, dry_multiplier=2.0,
                            dry_allowed_length=1, dry_sequence_breakers=("abcdefghijklmnop",))
    with _model(context=512, slots=2, batch=64, threads=2) as served:
        prompt = served.tokenize_chat(served.template.render(
            [{"role": "user", "content": "Repeat: one two one two one two one two"}]))

        async def main() -> list[str]:
            served.engine.start(asyncio.get_running_loop())
            texts = []
            for i in range(2):
                async for d in served.engine.generate(f"dry{i}", prompt, params,
                                                      use_cache=False):
                    texts.append(d.text)
                texts.append("|")
            served.engine.dry.close()
            served.engine.dry = DryCache(served.runtime.vocab, served.runtime.info.n_ctx,
                                         size=0)  # made on the spot, for comparison
            async for d in served.engine.generate("dry-spot", prompt, params,
                                                  use_cache=False):
                texts.append(d.text)
            return "".join(texts).split("|")

        first, second, spot = asyncio.run(main())
    assert first == second == spot and first
    engine = f"engine-{served.cfg.id}"
    assert len(threads) == 2 and threads[0] != engine  # prepared once, then cloned
    assert threads[1] == engine  # the one made on the spot


def test_dry_prototypes_are_made_once_and_close_waits_for_a_build_under_way() -> None:
    """Requests with the same DRY setting arriving together make its prototype once; closing
    the cache (before the model is freed) waits for a build still reading the vocabulary."""
    from concurrent.futures import ThreadPoolExecutor

    from edgeinfer.engine.dry import DryCache
    params = SamplingParams(dry_multiplier=0.8, dry_sequence_breakers=("abcdefghijklmnop",) * 8)
    with _model(context=256, slots=2, batch=64, threads=2) as served:
        cache = DryCache(served.runtime.vocab, 256)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: cache.prepare(params), range(4)))
        assert cache.made == 1 and cache.ready(params)
        slow = replace(params, dry_base=1.5)
        with ThreadPoolExecutor(1) as pool:
            building = pool.submit(cache.prepare, slow)
            while not cache._building and not building.done():
                pass
            cache.close()  # returns only once the build has ended
            assert building.done() and not cache._building and not cache._protos
        cache.prepare(params)  # closed: nothing is made any more
        assert cache.made == 2


def test_a_request_waiting_for_a_slot_gets_its_first_token_ahead() -> None:
    """Prefill ahead: with the one slot taken, a second request's prompt is computed and
    its first token sent while the first still generates; it then waits for the slot
    (``/slots`` says so) and generates from there, its whole answer."""
    with _model(context=1024, slots=1, batch=64, threads=2, prefill_ahead=1) as served:
        prompt = served.tokenize_chat(served.template.render(
            [{"role": "user", "content": "Count to one thousand."}]))
        params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=40)
        events: list[tuple[str, int]] = []
        states: list[str] = []

        async def one(rid: str) -> Delta:
            last = None
            async for d in served.engine.generate(rid, prompt, params):
                events.append((rid, d.completion_tokens))
                states.extend(str(s["state"]) for s in served.engine.slots_snapshot())
                last = d
            assert last is not None
            return last

        async def main() -> list[Delta]:
            served.engine.start(asyncio.get_running_loop())
            try:
                first = asyncio.ensure_future(one("first"))
                while not events:  # the first generates
                    await asyncio.sleep(0.005)
                return list(await asyncio.gather(first, one("second")))
            finally:
                served.engine.stop()

        finals = asyncio.run(main())
        assert [d.completion_tokens for d in finals] == [40, 40]
        second_first = next(i for i, (rid, _) in enumerate(events) if rid == "second")
        first_last = max(i for i, (rid, _) in enumerate(events) if rid == "first")
        assert second_first < first_last  # its first token came while the first ran
        assert "waiting_for_slot" in states
        stats = served.engine.stats_snapshot()
        assert stats["queued"] == 0 and stats["ahead"] == 0 and stats["slots_busy"] == 0
