"""Batches for llama_decode: runs of tokens in, the batch indexes of their outputs and
llama_decode's code out (see ``LlamaRuntime.decode``), and an output's logits."""

from __future__ import annotations

from typing import NamedTuple

import llama_cpp
import numpy as np
import numpy.typing as npt

from edgeinfer.engine.handles import ContextPtr


class Run(NamedTuple):
    """Consecutive tokens of one sequence, for one batch."""

    seq_id: int
    start: int  # position of tokens[0] in the sequence
    tokens: list[int]
    wants_logits: bool  # logits for the last token
    drafts: int = 0  # and for the ``drafts`` tokens before it (draft tokens to verify)


class Decoded(NamedTuple):
    """What one llama_decode gave back."""

    rc: int  # llama_decode's code (see ``decode_errors``)
    # per run that wants logits, the batch index of its first output row (its last token,
    # or the token before its drafts: the drafts' rows follow it)
    outputs: list[int]


def fill_batch(batch: llama_cpp.llama_batch, runs: list[Run],
               every_output: bool = False) -> list[int]:
    """Write runs of tokens into a llama_batch.

    A run that wants logits gets them for its last token, and for the ``drafts`` tokens
    before it (all its tokens with ``every_output``, as pooled embeddings need). Returns
    the batch index of each such run's first output row.
    """
    token, pos, n_seq, seq_ids, logits = (
        batch.token, batch.pos, batch.n_seq_id, batch.seq_id, batch.logits)
    i = 0
    out: list[int] = []
    for run in runs:
        for k, t in enumerate(run.tokens):
            token[i] = t
            pos[i] = run.start + k  # type: ignore[call-overload]  # stub: pos is llama_pos*
            n_seq[i] = 1
            seq_ids[i][0] = run.seq_id
            logits[i] = 1 if every_output else 0
            i += 1
        if run.wants_logits:
            for j in range(i - 1 - run.drafts, i):
                logits[j] = 1
            out.append(i - 1 - run.drafts)
    batch.n_tokens = i
    return out


def logits_row(ctx: ContextPtr, n_vocab: int, batch_index: int) -> npt.NDArray[np.float32]:
    """The logits of one output of ``ctx``'s last decode (a view, valid until the next)."""
    ptr = llama_cpp.llama_get_logits_ith(ctx, batch_index)
    if not ptr:
        raise RuntimeError(f"no logits for batch index {batch_index}")
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,))
