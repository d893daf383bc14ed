"""Admission control: places count from admission, not from the first step of a stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from edgeinfer.config import ModelConfig
from edgeinfer.engine.delta import Delta
from edgeinfer.errors import Overloaded
from edgeinfer.models.served import ServedModel


class FakeEngine:
    async def generate(self, *args: Any, **kw: Any) -> AsyncIterator[Delta]:
        await asyncio.sleep(0)
        yield cast(Delta, None)


def served(slots: int, queue: int) -> ServedModel:
    cfg = ModelConfig(id="m", path=Path("m.gguf"), slots=slots, max_queue=queue)
    none = cast(Any, None)
    return ServedModel(cfg, none, cast(Any, FakeEngine()), none, none)


def test_a_burst_cannot_pass_before_its_streams_start() -> None:
    model = served(slots=2, queue=1)
    first = model.reserve(2)
    model.reserve(1)
    with pytest.raises(Overloaded) as exc:  # 3 admitted, none started: the bound holds
        model.reserve(1)
    assert int(exc.value.headers["Retry-After"]) >= 1
    first.release()  # a response that ended before its streams started gives them back
    first.release()
    assert model.reserved == 1 and model.busy
    model.reserve(2)


def test_a_stream_takes_its_place_and_gives_it_back_when_done() -> None:
    model = served(slots=1, queue=0)
    places = model.reserve(1)

    async def run() -> None:
        stream = model.generate("r", [1, 2], cast(Any, None), places)
        with pytest.raises(Overloaded):
            model.reserve(1)
        seen = [(model.reserved, model.inflight) async for _ in stream]
        assert seen == [(0, 1)]
        assert (model.reserved, model.inflight) == (0, 0)

    asyncio.run(run())
    places.release()
    assert model.reserved == 0
    model.reserve(1)
