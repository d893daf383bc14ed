"""edgeinfer in your own process (``edgeinfer.inprocess.EdgeInfer``): ``close`` ends the
generations still open and frees the models, also after a loop left with ``break``;
``chat`` / ``complete`` outside start .. close are a RuntimeError, not a model loaded
again behind the caller's back."""

from __future__ import annotations

import asyncio
import threading

import pytest

from edgeinfer.errors import Unavailable
from edgeinfer.inprocess import EdgeInfer

ASK = [{"role": "user", "content": "Tell me a long story about a fox."}]


_OTHERS: set[threading.Thread] = set()  # engine threads of other tests' models, still up


def _engine_threads() -> list[str]:
    """The engine threads this test started that are still alive."""
    return [t.name for t in threading.enumerate()
            if t.name.startswith("engine-") and t not in _OTHERS]


def _others() -> None:
    _OTHERS.update(t for t in threading.enumerate() if t.name.startswith("engine-"))


def test_close_after_a_loop_left_with_break_frees_the_model() -> None:
    _others()

    async def main() -> None:
        ei = EdgeInfer.from_config(slots=2, context=2048)
        await ei.start()
        pieces = ei.chat("default", ASK, max_tokens=200, temperature=0)
        async for _ in pieces:
            break  # (not closed: the generation and its hold on the model stay open)
        assert ei.pool.models and _engine_threads()
        await ei.close()
        assert not ei.pool.models and not _engine_threads()  # it stayed loaded before
        with pytest.raises(RuntimeError, match="not started"):
            ei.chat("default", ASK)
        with pytest.raises(RuntimeError, match="not started"):
            ei.complete("default", "Once")
        await ei.start()  # and again: the same object serves
        text = "".join([p async for p in ei.complete("default", "Once upon", max_tokens=4)])
        assert text
        await ei.close()
        assert not ei.pool.models and not _engine_threads()

    asyncio.run(main())


def test_a_model_loading_when_close_comes_is_freed_not_left_running() -> None:
    """(It finished loading after the pool stopped, and its engine ran for good.)"""
    _others()

    async def main() -> None:
        ei = EdgeInfer.from_config(slots=2, context=2048)
        await ei.start()
        assert await ei.pool.unload("default")
        loading = asyncio.ensure_future(ei.pool.acquire("default"))
        await asyncio.sleep(0)  # (the load is under way)
        await ei.close()
        with pytest.raises(Unavailable, match="shutting down"):
            await loading
        assert not ei.pool.models and not _engine_threads()

    asyncio.run(main())


def test_sampling_arguments_have_the_bounds_of_an_http_request() -> None:
    """``temperature=9`` generated, an unknown name was a TypeError from a dataclass, and a
    grammar skipped the checks an HTTP grammar gets; all are a named InvalidRequest now,
    raised when ``chat`` is called (nothing is loaded for it)."""
    from edgeinfer.errors import InvalidRequest

    async def main() -> None:
        async with EdgeInfer.from_config(slots=1, context=1024) as ei:
            for bad, param in [({"temperature": 9}, "temperature"), ({"foo": 1}, "foo"),
                               ({"max_tokens": 0}, "max_tokens"), ({"top_k": -1}, "top_k"),
                               ({"dry_multiplier": -1}, "dry_multiplier"),
                               ({"logit_bias": {10**9: 1}}, "logit_bias")]:
                with pytest.raises(InvalidRequest) as err:
                    ei.chat("default", ASK, **bad)
                assert err.value.param == param
            with pytest.raises(InvalidRequest, match="cannot parse"):
                async for _ in ei.complete("default", "Hi", grammar="root ::= (", max_tokens=2):
                    pass
            text = "".join([p async for p in ei.complete(
                "default", "Say yes:", grammar='root ::= "yes" | "no"', max_tokens=4,
                stop=("x",), logit_bias={13: -100}, temperature=0)])
            assert text in ("yes", "no")

    asyncio.run(main())
