"""Parallel tool calls without repeats: a call with the same name and the same arguments
as an earlier call of the same answer ends the answer, and is left out.

A small model asked for parallel calls often writes its one call again and again; run
twice, a call with side effects would act twice. The first call streams as it is parsed
(``edgeinfer.prompt.callparser``); each later call is held until it is complete, then
passed on, renumbered, only when it is new. After a repeat nothing more of the output is
passed on (``ended``: the caller may stop generating). A later call cut off by the end of
the output (``max_tokens``) is passed on as far as it was written, unless what was written
starts an earlier call again. Blank text around calls is not content, except where text
follows on both sides (then it is kept, streamed or whole).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from edgeinfer.prompt.callparser import CallArgs, CallOpen, Content
from edgeinfer.prompt.reasoning import Thought

Part = Content | CallOpen | CallArgs | Thought  # (reasoning passes as it is)


@dataclass(slots=True)
class _Call:
    name: str
    held: list[CallOpen | CallArgs] = field(default_factory=list)
    args: str = ""
    passing: bool = False  # streamed as it comes (the answer's first call)


def _json(text: str) -> str | None:
    """``text`` as canonical JSON (keys sorted, no spaces), None when it does not parse."""
    try:
        return json.dumps(json.loads(text or "{}"), sort_keys=True)
    except (ValueError, RecursionError):
        return None


def _same_args(a: str, b: str) -> bool:
    x, y = _json(a), _json(b)
    return x == y if x is not None and y is not None else a.strip() == b.strip()


class RepeatFilter:
    """Feed it a call parser's events (``feed``, then ``finish`` at the end of the output);
    it returns them less repeated calls and blank text beside calls, with the calls
    numbered 0, 1, ... as passed on."""

    def __init__(self) -> None:
        self.num_calls = 0  # calls passed on
        self.ended = False  # a repeat was found: nothing after it is passed on
        self.whole = False  # (after finish) the output passed on ends with a whole call
        self._done: list[tuple[str, str]] = []  # (name, arguments) of the calls passed on
        self._call: _Call | None = None
        self._blank = ""  # blank text held: content only if more text follows
        self._text_after = False  # text was passed on after the last call
        self._said = False  # text was passed on
        self._in_calls = False  # calls came since the last text
        self._kept = ""  # the blank held when they began

    def feed(self, events: list[Part]) -> list[Part]:
        out: list[Part] = []
        for e in events:
            if self.ended:
                break
            if isinstance(e, CallArgs) and self._call is not None:
                self._call.args += e.text
                if self._call.passing:
                    out.append(replace(e, index=0))
                else:
                    self._call.held.append(e)
                continue
            self._close(out)
            if self.ended:
                break
            if isinstance(e, CallOpen):
                # the blank before the first call of a run stays held (text may follow the
                # calls); blanks between calls, and before any text, go
                self._blank = self._kept if self._in_calls else self._blank if self._said else ""
                self._kept, self._in_calls = self._blank, True
                self._open(e, out)
            elif isinstance(e, Content):
                self._content(e, out)
            else:
                out.append(e)
        return out

    def finish(self, events: list[Part], cut: bool) -> list[Part]:
        """The last events; ``cut``: the output ran out (a call may be incomplete)."""
        out = self.feed(events)
        last = self._call
        if not self.ended:
            self._close(out, cut)
        if self.ended:
            self.whole = self.num_calls > 0
        elif self.num_calls and not self._text_after:
            # (a call cut off before any of its arguments was written is not whole)
            self.whole = last is None or not cut or (
                bool(last.args.strip()) and _json(last.args) is not None)
        if self._blank and not self.num_calls and not self.ended:
            out.append(Content(self._blank))  # an answer of blanks alone: as written
        self._blank = ""
        return out

    def _content(self, e: Content, out: list[Part]) -> None:
        body = e.text.rstrip()
        if not body:
            self._blank += e.text
            return
        # the trailing blank is held, whether it comes in this piece or the next one, so a
        # streamed answer and a whole one agree on the blank beside a call
        out.append(Content(self._blank + body) if self._blank or body != e.text else e)
        self._blank = e.text[len(body):]
        self._said, self._in_calls = True, False
        self._text_after = self.num_calls > 0

    def _open(self, e: CallOpen, out: list[Part]) -> None:
        self._text_after = False
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
        if cut and self._starts_again(c) or not cut and any(
                n == c.name and _same_args(a, c.args) for n, a in self._done):
            self.ended = True
            return
        index = self.num_calls
        self.num_calls += 1
        self._done.append((c.name, c.args))
        out.extend(replace(p, index=index) for p in c.held)

    def _starts_again(self, c: _Call) -> bool:
        text = "".join(c.args.split())
        return any(n == c.name and "".join(a.split()).startswith(text) for n, a in self._done)
