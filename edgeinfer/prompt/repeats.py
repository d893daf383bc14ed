"""Parallel tool calls without repeats: a call with the same name and the same arguments
as an earlier call of the same answer is dropped.

A small model asked for parallel calls often writes its one call again and again; run
twice, a call with side effects would act twice. The first call streams as it is parsed
(``edgeinfer.prompt.callparser``); each later call is held until it is complete, then
passed on, renumbered, only when it is new. A later call cut off by the end of the output
(``max_tokens``) is passed on as far as it was written, unless what was written starts an
earlier call again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from edgeinfer.prompt.callparser import CallArgs, CallOpen, Content

Part = Content | CallOpen | CallArgs


@dataclass(slots=True)
class _Call:
    name: str
    held: list[Part] = field(default_factory=list)  # empty once passed on
    args: str = ""
    passing: bool = False  # streamed as it comes (the answer's first call)


def _same_args(a: str, b: str) -> bool:
    try:
        return bool(json.loads(a or "{}") == json.loads(b or "{}"))
    except ValueError:
        return a.strip() == b.strip()


class RepeatFilter:
    """Feed it a call parser's events (``feed``, then ``finish`` at the end of the output);
    it returns them less repeated calls, with the calls numbered 0, 1, ... as passed on."""

    def __init__(self) -> None:
        self.num_calls = 0  # calls passed on
        self.repeats = 0  # calls dropped
        self.cut_repeat = False  # the output ended inside a repeat (dropped)
        self._done: list[tuple[str, str]] = []  # (name, arguments) of the calls passed on
        self._call: _Call | None = None

    def feed(self, events: list[Part]) -> list[Part]:
        out: list[Part] = []
        for e in events:
            if isinstance(e, CallArgs) and self._call is not None:
                self._call.args += e.text
                if self._call.passing:
                    out.append(replace(e, index=self.num_calls - 1))
                else:
                    self._call.held.append(e)
                continue
            self._close(out)
            if isinstance(e, CallOpen):
                self._open(e, out)
            else:
                out.append(e)
        return out

    def finish(self, events: list[Part], cut: bool) -> list[Part]:
        """The last events; ``cut``: the output ran out (a call may be incomplete)."""
        out = self.feed(events)
        self._close(out, cut)
        return out

    def _open(self, e: CallOpen, out: list[Part]) -> None:
        if self.num_calls == 0:
            self._call = _Call(e.name, passing=True)
            self.num_calls += 1
            out.append(replace(e, index=0))
        else:
            self._call = _Call(e.name, held=[e])

    def _close(self, out: list[Part], cut: bool = False) -> None:
        c, self._call = self._call, None
        if c is None:
            return
        if c.passing:
            self._done.append((c.name, c.args))
            return
        if cut and self._starts_again(c):
            self.repeats += 1
            self.cut_repeat = True
            return
        if not cut and any(n == c.name and _same_args(a, c.args) for n, a in self._done):
            self.repeats += 1
            return
        index = self.num_calls
        self.num_calls += 1
        self._done.append((c.name, c.args))
        out.extend(replace(p, index=index) for p in c.held if not isinstance(p, Content))

    def _starts_again(self, c: _Call) -> bool:
        text = "".join(c.args.split())
        return any(n == c.name and "".join(a.split()).startswith(text) for n, a in self._done)
