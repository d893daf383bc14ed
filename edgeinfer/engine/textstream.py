"""Incremental detokenizing: token pieces (bytes) in, safe text deltas out.

Holds back bytes of an incomplete UTF-8 character, and any tail of the text
that could be the start of a stop string, so that neither a broken character
nor part of a stop string is ever emitted.
"""

from __future__ import annotations

import codecs


class TextStream:
    """Text of one generated sequence, built one token piece at a time."""

    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._held = ""  # decoded text not emitted yet
        self.stopped_by: str | None = None

    def push(self, piece: bytes, stops: bool = True) -> str:
        """Add one token's bytes; return the text that is now safe to emit.

        After a stop string is found, ``stopped_by`` is set, the text before
        it is returned, and further pushes return "". ``stops`` False: stop strings
        are not looked for in this piece (nor in text held before it).
        """
        if self.stopped_by is not None:
            return ""
        self._held += self._decoder.decode(piece)
        if not stops:
            out, self._held = self._held, ""
            return out
        return self._release()

    def flush(self) -> str:
        """End of generation: return everything still held (never a stop string). A
        character the output ran out in (max_tokens between its bytes) is left out."""
        if self.stopped_by is not None:
            return ""
        self._decoder.reset()  # the last character's first bytes alone: dropped, not "\ufffd"
        out = self._release()
        if self.stopped_by is None:
            out += self._held
            self._held = ""
        return out

    def _release(self) -> str:
        held = self._held
        if not self._stop:
            self._held = ""
            return held
        first = -1
        for stop in self._stop:
            i = held.find(stop)
            if i != -1 and (first == -1 or i < first):
                first, self.stopped_by = i, stop
        if first != -1:
            self._held = ""
            return held[:first]
        keep = 0
        for stop in self._stop:
            for k in range(min(len(stop) - 1, len(held)), keep, -1):
                if held.endswith(stop[:k]):
                    keep = k
                    break
        cut = len(held) - keep
        self._held = held[cut:]
        return held[:cut]
