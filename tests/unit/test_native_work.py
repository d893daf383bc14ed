"""Where requests' blocking native work runs: text past HEAVY_CHARS apart (see
``edgeinfer.models.native_work``), so that huge requests do not queue every other
request's prompt behind them."""

from __future__ import annotations

import functools
from typing import Any

from edgeinfer.models.native_work import HEAVY_CHARS, _heavy, _light, executor_for
from edgeinfer.prompt.tools import ToolSpec


def _work(*args: Any, **kwargs: Any) -> None:
    return None


def test_large_text_goes_apart_wherever_the_job_holds_it() -> None:
    big = "x" * (HEAVY_CHARS + 1)
    parts = [{"role": "user", "content": [{"type": "text", "text": big}]}]
    for fn, args in [(_work, (big,)),  # a text
                     (_work, ([{"role": "user", "content": big}],)),  # messages
                     (functools.partial(_work, parts, ()), ()),  # content parts, in a partial
                     (functools.partial(_work, template_kwargs={"doc": big}), ()),
                     (lambda: _work(big), ()),  # a closure (/tokenize's, /infill's)
                     (_work, ((ToolSpec("f", big, {}),),))]:  # a tool's description
        assert executor_for(fn, args) is _heavy
    assert executor_for(_work, (list(range(HEAVY_CHARS * 2)),)) is _light  # token ids
    small = [{"role": "user", "content": "hi"}] * 100
    assert executor_for(functools.partial(_work, small), ("hi",)) is _light
    assert executor_for(_work, ([1, 2, 3],)) is _light
