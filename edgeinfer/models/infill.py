"""Fill-in-the-middle prompts, as llama-server's /infill builds them from the model's FIM
tokens (the repo-level pattern of Qwen2.5-Coder, arXiv 2409.12186):

    [FIM_REP]myproject\\n [FIM_SEP]file0\\n extra 0 ... [FIM_SEP]filename\\n
    [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID]

Without a FIM_REP / FIM_SEP token the extra chunks go in with a plain separator line. The
request's texts are tokenized without special tokens: a ``<fim_middle>`` written in the
code is text, never a marker.
"""

from __future__ import annotations

from dataclasses import dataclass

import llama_cpp

from edgeinfer.engine.native import LlamaRuntime

WINDOW = 2048  # llama-server's default n_batch: its prefix and suffix fit in one
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"  # between extra chunks without FIM_SEP


@dataclass(frozen=True, slots=True)
class FimTokens:
    pre: int
    suf: int
    mid: int
    rep: int | None
    sep: int | None


@dataclass(frozen=True, slots=True)
class InfillInput:
    prefix: str
    suffix: str
    extra: tuple[tuple[str, str], ...]  # (filename, text)
    prompt: str  # goes after the prefix (the start of the line being completed)


def fim_tokens(runtime: LlamaRuntime) -> FimTokens | None:
    """The model's FIM tokens; None when it lacks a prefix, suffix or middle token."""
    vocab = llama_cpp.llama_model_get_vocab(runtime.model)
    ids = [int(f(vocab)) for f in (
        llama_cpp.llama_vocab_fim_pre, llama_cpp.llama_vocab_fim_suf,
        llama_cpp.llama_vocab_fim_mid, llama_cpp.llama_vocab_fim_rep,
        llama_cpp.llama_vocab_fim_sep)]
    pre, suf, mid, rep, sep = (None if t < 0 else t for t in ids)
    if pre is None or suf is None or mid is None:
        return None
    return FimTokens(pre, suf, mid, rep, sep)


def infill_prompt(runtime: LlamaRuntime, fim: FimTokens, given: InfillInput,
                  max_tokens: int | None, bos: list[int]) -> list[int]:
    """The prompt's tokens (``bos``: what the model puts first, ``ServedModel.bos_head``;
    after the extra chunks, as llama-server puts it). As llama-server: the prefix's last
    3/4 of ``WINDOW`` tokens, the suffix's first quarter less the prompt's, the extra
    chunks' last tokens in what the context leaves besides ``WINDOW`` and twice
    ``max_tokens``."""
    def tok(text: str) -> list[int]:
        return runtime.tokenize(text, add_special=False, parse_special=False)
    extra: list[int] = []
    if fim.rep is not None:
        extra += [fim.rep, *tok("myproject\n")]
    for filename, text in given.extra:
        extra += [fim.sep, *tok(filename + "\n")] if fim.sep is not None else tok(
            CHUNK_SEPARATOR)
        extra += tok(text)
    if fim.sep is not None:
        extra += [fim.sep, *tok("filename\n")]
    prompt = tok(given.prompt)
    prefix = tok(given.prefix)[-(3 * WINDOW // 4):]
    suffix = tok(given.suffix)[:max(0, WINDOW // 4 - 2 - len(prompt))]
    n_extra = min(max(0, runtime.info.n_ctx - WINDOW - 2 * (max_tokens or 0)), len(extra))
    return [*extra[len(extra) - n_extra:], *bos, fim.pre, *prefix, *prompt, fim.suf, *suffix,
            fim.mid]
