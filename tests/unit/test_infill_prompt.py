"""The /infill prompt's layout (``models.infill``), with a fake one-token-per-character
tokenizer: llama-server's order and limits, with and without FIM_REP / FIM_SEP tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from edgeinfer.models.infill import CHUNK_SEPARATOR, WINDOW, FimTokens, InfillInput, infill_prompt

PRE, SUF, MID, REP, SEP, BOS = -10, -11, -12, -13, -14, -1


@dataclass
class _Info:
    n_ctx: int


class _Runtime:
    def __init__(self, n_ctx: int = 8192) -> None:
        self.info = _Info(n_ctx)

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        assert not parse_special and not add_special  # the request's text is only text
        return [ord(c) for c in text]


def _text(tokens: list[int]) -> str:
    return "".join(chr(t) if t >= 0 else f"<{t}>" for t in tokens)


def _prompt(fim: FimTokens, given: InfillInput, n_ctx: int = 8192,
            max_tokens: int | None = None, bos: tuple[int, ...] = ()) -> str:
    return _text(infill_prompt(cast(Any, _Runtime(n_ctx)), fim, given, max_tokens, [*bos]))


def test_repo_level_layout_with_file_separators() -> None:
    fim = FimTokens(PRE, SUF, MID, REP, SEP)
    given = InfillInput("def f():\n", "\nf()\n", (("a.py", "A = 1\n"), ("tmp", "B\n")), "  ret")
    assert _prompt(fim, given) == (
        "<-13>myproject\n<-14>a.py\nA = 1\n<-14>tmp\nB\n<-14>filename\n"
        "<-10>def f():\n  ret<-11>\nf()\n<-12>")
    assert _prompt(fim, given, bos=(BOS,)).startswith(  # BOS after the chunks, as there
        "<-13>myproject\n<-14>a.py\nA = 1\n<-14>tmp\nB\n<-14>filename\n<-1><-10>def")


def test_without_repo_and_separator_tokens_chunks_get_a_text_separator() -> None:
    fim = FimTokens(PRE, SUF, MID, None, None)
    given = InfillInput("p", "s", (("a.py", "A"), ("b.py", "B")), "")
    assert _prompt(fim, given) == f"{CHUNK_SEPARATOR}A{CHUNK_SEPARATOR}B<-10>p<-11>s<-12>"
    assert _prompt(fim, InfillInput("p", "s", (), "x"), bos=(BOS,)) == "<-1><-10>px<-11>s<-12>"


def test_prefix_keeps_its_end_suffix_its_start_extra_its_end() -> None:
    fim = FimTokens(PRE, SUF, MID, None, SEP)
    prefix, suffix = "a" * 2000 + "END", "START" + "b" * 1000
    out = _prompt(fim, InfillInput(prefix, suffix, (("f", "x" * 9000 + "LAST"),), "pp"),
                  n_ctx=WINDOW + 600, max_tokens=100)
    body = out[out.index("<-10>") + 5:out.index("<-11>")]
    assert len(body) == 3 * WINDOW // 4 + 2 and body.endswith("ENDpp")
    tail = out[out.index("<-11>") + 5:out.index("<-12>")]
    assert len(tail) == WINDOW // 4 - 2 - 2 and tail.startswith("START")
    extra = out[:out.index("<-10>")]  # the context less WINDOW and twice max_tokens
    assert len(infill_prompt(cast(Any, _Runtime(WINDOW + 600)), fim, InfillInput(
        "", "", (("f", "x" * 9000 + "LAST"),), ""), 100, [])) - 3 == 400
    assert extra.endswith("LAST<-14>filename\n")
