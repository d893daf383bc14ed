"""A draft model for speculative decoding: a second, smaller model with the same vocabulary
guesses each generating sequence's next tokens, and the target verifies them (``speculation``).

The draft model has a context of its own, with one sequence per slot of the target, as many
cells as the target's context, and the target's K/V types. Each slot's sequence holds the
tokens it was last given (``held``): when the scheduler asks for drafts, what the slot
holds is cut back to what it shares with the sequence's tokens (rejected drafts, or a new
request in the slot: a shared system prompt stays; another slot's cells are shared where
it holds more of them), the rest is computed, and then the
draft model guesses greedily, one token per call for all the drafted slots together, until
it is unsure (its top token below ``P_MIN``, as llama-server's ``--draft-p-min``). A
sequence whose missing tokens (its prompt, on its first draft) exceed the step's catch-up
budget (the target's ``batch``) computes them over several steps and drafts nothing
meanwhile. Slots not drafted are cleared when the context could not hold them too, and a
failed call clears every slot (they are computed again when next drafted).

What is drafted never changes the output: the target samples every position itself and
keeps drafts only while they equal its own tokens. The draft model only decides how many
target tokens one step yields, so it pays when it is much cheaper than the target (a 135M
draft for a model of a billion parameters or more), and costs when it is not.
Owned by the engine thread.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import llama_cpp
import numpy as np

from edgeinfer.config import ModelConfig
from edgeinfer.engine.batch import Run
from edgeinfer.engine.decode_errors import DECODE_OK
from edgeinfer.engine.kv import seats
from edgeinfer.engine.native import LlamaRuntime
from edgeinfer.engine.prefix_index import common_prefix
from edgeinfer.errors import ModelLoadError

log = logging.getLogger("edgeinfer.engine.draft_model")

VOCAB_SLACK = 128  # token counts may differ this much (added tokens), as llama-server allows
FIRST_COMPARED = 5  # tokens below this id (special ones) are not compared, as llama-server
SHARE_MIN = 32  # another slot's cells are shared when they hold this many more tokens
P_MIN = 0.75  # a guess the draft model gives less probability ends the draft (llama-server's)


class DraftModel:
    """See the module docstring. A ``DraftSource`` for the scheduler."""

    def __init__(self, target: LlamaRuntime, cfg: ModelConfig, path: Path) -> None:
        tcfg = target.cfg
        own = replace(
            cfg, id=f"{tcfg.id}:draft", path=path, source=None, context=target.info.n_ctx,
            slots=(n := seats(tcfg, target.memory_kind)), prefill_ahead=0, cache_entries=0,
            batch=max(n, tcfg.batch), prefill_batch=0,  # (a sequence for each of the target's)
            threads=tcfg.threads, gpu_layers=999 if tcfg.gpu_layers else 0,
            cache_type_k=tcfg.cache_type_k, cache_type_v=tcfg.cache_type_v,
            cache_mode="auto", swa_full=True, speculative="off", draft_model=None)
        self.runtime = LlamaRuntime(own, path)
        try:
            self._check(target)
        except BaseException:
            self.runtime.close()
            raise
        self.n_vocab = min(target.info.n_vocab, self.runtime.info.n_vocab)
        self.budget = tcfg.batch  # prompt tokens one step may catch up, all slots together
        self.held: dict[int, list[int]] = {}  # slot -> the tokens its sequence holds
        log.info("model %s: draft model %s (%s)", tcfg.id, cfg.id, self.runtime.info.description)

    def _check(self, target: LlamaRuntime) -> None:
        """Refuse a draft model whose guesses the target could not read: another
        vocabulary, or a memory that cannot drop rejected drafts."""
        rt, name = self.runtime, f"model {target.cfg.id!r}: draft model"
        if rt.memory_kind != "kv":
            raise ModelLoadError(f"{name}: its memory cannot drop rejected drafts "
                                 "(recurrent, hybrid or sliding-window without swa_full)")
        a, b = target.vocab, rt.vocab
        if (llama_cpp.llama_vocab_type(a) != llama_cpp.llama_vocab_type(b)
                or abs(target.info.n_vocab - rt.info.n_vocab) > VOCAB_SLACK
                or llama_cpp.llama_vocab_bos(a) != llama_cpp.llama_vocab_bos(b)
                or llama_cpp.llama_vocab_eos(a) != llama_cpp.llama_vocab_eos(b)):
            raise ModelLoadError(f"{name}: its vocabulary is not the target's "
                                 f"({rt.info.n_vocab} tokens against {target.info.n_vocab})")
        for t in range(FIRST_COMPARED, min(target.info.n_vocab, rt.info.n_vocab)):
            if llama_cpp.llama_vocab_get_text(a, t) != llama_cpp.llama_vocab_get_text(b, t):
                raise ModelLoadError(f"{name}: its vocabulary is not the target's (token {t} "
                                     "differs)")

    def memory_bytes(self) -> int:
        """The draft model's weights and KV cache."""
        return self.runtime.memory_bytes()

    def draft(self, requests: list[tuple[int, Sequence[int], int]]) -> list[list[int]]:
        """For each ``(slot, tokens, k)``, up to ``k`` greedy guesses of what follows
        ``tokens`` (none for a slot still catching up, or after a failed call: drafting
        never fails a step)."""
        try:
            return self._draft(requests)
        except Exception:  # a bug here must not end the target's requests
            log.exception("draft model: drafting failed; its slots are cleared")
            self._clear()
            return [[] for _ in requests]

    def _clear(self) -> None:
        for slot in self.held:
            self.runtime.seq_rm(slot)
        self.held.clear()

    def _draft(self, requests: list[tuple[int, Sequence[int], int]]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in requests]
        self._make_room(requests)
        runs: list[tuple[int, Run]] = []  # (request index, the tokens its slot is missing)
        left = self.budget - len(requests)  # every slot gets a row, the shortest first more
        for i in sorted(range(len(requests)), key=lambda i: len(requests[i][1])):
            slot, tokens, _ = requests[i]
            kept = self._cut(slot, tokens)
            n = min(len(tokens) - kept, 1 + max(left, 0))
            left -= n - 1
            runs.append((i, Run(slot, kept, list(tokens[kept:kept + n]),
                                kept + n == len(tokens))))
        while runs:
            outputs = self._decode([r for _, r in runs])
            if outputs is None:
                return [[] for _ in requests]
            rows = iter(outputs)
            runs = [(i, nxt) for i, r in runs if r.wants_logits
                    if (nxt := self._guess(r, next(rows), requests[i][2], drafts[i]))]
        return drafts

    def _make_room(self, requests: list[tuple[int, Sequence[int], int]]) -> None:
        """Clear the slots not drafted now when what the drafted ones will hold and what
        those hold would not fit the context together."""
        drafted = {slot for slot, _, _ in requests}
        idle = [s for s in self.held if s not in drafted]
        needed = sum(len(tokens) + k for _, tokens, k in requests)
        if needed + sum(len(self.held[s]) for s in idle) > self.runtime.info.n_ctx:
            for slot in idle:
                self.runtime.seq_rm(slot)
                del self.held[slot]

    def _guess(self, run: Run, row: int, k: int, draft: list[int]) -> Run | None:
        """Take the guess of a run's output ``row`` unless the draft model is unsure of it
        (below P_MIN); returns the run that feeds it back (None: the draft is done)."""
        logits = self.runtime.logits_row(row)[: self.n_vocab]
        token = int(np.argmax(logits))
        if 1.0 / float(np.exp(logits - logits[token]).sum()) < P_MIN:
            return None
        draft.append(token)
        if len(draft) >= k or self.runtime.is_eog(token):
            return None
        return Run(run.seq_id, run.start + len(run.tokens), [token], True)

    def _cut(self, slot: int, tokens: Sequence[int]) -> int:
        """Keep what ``slot`` holds of ``tokens`` (all but the last, whose logits are
        wanted), drop the rest; returns how many are kept. When another slot holds more
        of them (a shared system prompt), its cells are shared instead."""
        held = self.held.setdefault(slot, [])
        keep = min(common_prefix(held, tokens), len(tokens) - 1)
        other, most = max(((s, min(common_prefix(h, tokens), len(tokens) - 1))
                           for s, h in self.held.items() if s != slot),
                          key=lambda pair: pair[1], default=(slot, keep))
        if most > keep + SHARE_MIN:
            self.runtime.seq_rm(slot)
            self.runtime.seq_cp(other, slot, 0, most)
            self.held[slot] = list(tokens[:most])
            return most
        if keep < len(held) and not self.runtime.seq_rm(slot, keep, -1):
            self.runtime.seq_rm(slot)
            keep = 0
        del held[keep:]
        return keep

    def _decode(self, runs: list[Run]) -> list[int] | None:
        """One call; records what each slot holds and returns the output rows (None, and
        every slot cleared, on failure)."""
        decoded = self.runtime.decode(runs)
        if decoded.rc != DECODE_OK:
            log.warning("draft model: llama_decode returned %d; its slots are cleared",
                        decoded.rc)
            self._clear()
            return None
        for run in runs:
            self.held[run.seq_id].extend(run.tokens)
        return decoded.outputs

    def close(self) -> None:
        self.runtime.close()
