"""The threads that run requests' blocking native work (rendering, tokenizing,
detokenizing, grammar checks) off the event loop.

At most all cores but one run it at a time, so that a storm of requests queues instead of
taking every core from the event loop and the engine threads. Work on a lot of text (a
job whose arguments hold more than ``HEAVY_CHARS`` characters: seconds of tokenizing for
megabytes) queues apart, on a thread of its own, so that a few huge requests do not hold
up every other request's prompt behind them.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HEAVY_CHARS = 1 << 18  # 256 K characters: about a quarter of a second of tokenizing

_light = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) - 1),
                            thread_name_prefix="edgeinfer-native")
_heavy = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgeinfer-native-large")


def _chars(x: Any, depth: int = 0) -> int:
    """The characters of the strings in ``x`` (in lists, tuples and dicts, a few levels
    down: messages, their content parts)."""
    if isinstance(x, str):
        return len(x)
    if depth >= 6:
        return 0
    if isinstance(x, dict):
        x = x.values()
    elif not isinstance(x, list | tuple):
        return 0
    return sum(_chars(v, depth + 1) for v in x)


def executor_for(fn: Any, args: tuple[Any, ...]) -> ThreadPoolExecutor:
    """Where ``fn(*args)`` runs (``fn`` may be a ``functools.partial`` holding the text)."""
    chars = _chars(args)
    if isinstance(fn, functools.partial):
        chars += _chars(fn.args) + _chars(fn.keywords)
    return _heavy if chars > HEAVY_CHARS else _light
