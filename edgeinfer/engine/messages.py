"""The messages other threads send the engine thread (see ``loop``), through its inbox."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from edgeinfer.engine.finishing import DeltaSink
from edgeinfer.engine.sequence import Sequence


@dataclass(frozen=True, slots=True)
class Submit:
    seq: Sequence
    sink: DeltaSink


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str
    stop: bool = False  # finish it as stopped (its last delta is sent), not aborted


@dataclass(frozen=True, slots=True)
class Stop:
    pass


@dataclass(frozen=True, slots=True)
class Unpin:
    pass


@dataclass(frozen=True, slots=True)
class FailAll:
    reason: str


@dataclass(frozen=True, slots=True)
class Call:
    """Run ``fn`` on the engine thread (between steps); its result or exception goes to
    ``future`` on the event loop."""

    fn: Callable[[], object]
    future: asyncio.Future[object]


Message = Submit | Abort | Stop | Unpin | FailAll | Call
