"""The threads that run requests' blocking native work (rendering, tokenizing,
detokenizing, grammar checks) off the event loop.

At most all cores but one run ordinary work at a time, so that a storm of requests queues
instead of taking every core from the event loop and the engine threads. Work on a lot of
text (a job that holds more than ``HEAVY_CHARS`` characters: seconds of tokenizing for
megabytes) queues apart, on one more thread of its own, so that a few huge requests do not
hold up every other request's prompt behind them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HEAVY_CHARS = 1 << 18  # 256 K characters: about a quarter of a second of tokenizing

_light = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) - 1),
                            thread_name_prefix="edgeinfer-native")
_heavy = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgeinfer-native-large")


def _chars(x: Any, budget: int, depth: int = 0) -> int:
    """The characters of the strings in ``x``, counted until they pass ``budget``: in
    lists, tuples, dicts and frozen dataclasses (value objects: messages, content parts,
    tool specs, constraints), a few levels down; a list of token ids counts nothing."""
    if isinstance(x, str):
        return len(x)
    if depth >= 6:
        return 0
    if isinstance(x, dict):
        items: Any = x.values()
    elif isinstance(x, list | tuple):
        items = () if x and isinstance(x[0], int) else x
    elif dataclasses.is_dataclass(x) and not isinstance(x, type) and \
            x.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        items = [getattr(x, f.name) for f in dataclasses.fields(x)]
    else:
        return 0
    total = 0
    for v in items:
        total += _chars(v, budget - total, depth + 1)
        if total > budget:
            break
    return total


def executor_for(fn: Any, args: tuple[Any, ...]) -> ThreadPoolExecutor:
    """Where ``fn(*args)`` runs: the text may be in ``args``, in a ``functools.partial``'s
    arguments, or in what a closure (a ``lambda``, a nested function) holds."""
    roots: list[Any] = [args]
    if isinstance(fn, functools.partial):
        roots += [fn.args, fn.keywords]
    for cell in getattr(fn, "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # (a cell not yet filled)
            roots.append(cell.cell_contents)
    return _heavy if _chars(roots, HEAVY_CHARS) > HEAVY_CHARS else _light
