"""A reasoning token budget: a reasoning block that runs past its budget is closed by
forcing its closing marker's tokens (the model then answers).

Pure Python; the sampler asks ``forced()`` before sampling and tells ``saw()`` every
token of the output.
"""

from __future__ import annotations


class ThoughtBudget:
    """Counts the reasoning tokens of an output that starts inside a reasoning block;
    once ``budget`` of them have passed without the block closing, the next tokens are
    ``close`` (the tokens of ``</think>``), one per step."""

    def __init__(self, budget: int, close: tuple[int, ...]) -> None:
        if not close:
            raise ValueError("a reasoning budget needs the closing marker's tokens")
        self.left = budget
        self.close = close
        self._recent: tuple[int, ...] = ()
        self._forcing: list[int] = []
        self.done = False  # the block is closed (by the model or by force)

    def forced(self) -> int | None:
        """The token the output must take next, or None (sample freely)."""
        if self.done:
            return None
        if not self._forcing and self.left <= 0:
            self._forcing = list(self.close)
        return self._forcing[0] if self._forcing else None

    def saw(self, token: int) -> None:
        """The output took ``token``."""
        if self.done:
            return
        if self._forcing:
            self._forcing.pop(0)
            self.done = not self._forcing
            return
        self.left -= 1
        self._recent = (*self._recent, token)[-len(self.close):]
        self.done = self._recent == self.close
