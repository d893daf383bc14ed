"""Verifying a sequence's draft tokens (speculative decoding, see ``drafts``).

The batch held the sequence's last token followed by its drafts, each with logits. The
request's own sampler samples at every position in order (grammar, penalties, seed and
all, exactly as one token per step would) and the finishing rules see each token; the
drafts are kept while they equal what was sampled. So the output is the one decoding
without drafts gives: sampled from the same logits (llama.cpp gives a sequence's rows the
same numbers whether it decodes them one per call or several in one, with flash
attention, which tests/engine/test_speculation.py checks bit for bit), with the
sampler's state advanced over accepted tokens only. The KV cells of rejected drafts are
removed by the engine (the prefix cache's ``rollback``).
"""

from __future__ import annotations

from edgeinfer.config import ModelConfig
from edgeinfer.engine import finishing
from edgeinfer.engine.drafts import Drafter, DraftSource, NgramDrafter, SourceDrafter
from edgeinfer.engine.finishing import Output, Sampled, Verdict
from edgeinfer.engine.native import LlamaRuntime
from edgeinfer.engine.scheduler import Scheduler
from edgeinfer.engine.sequence import SamplingParams, Sequence


def drafter_for(cfg: ModelConfig, memory_kind: str, params: SamplingParams,
                source: DraftSource | None = None) -> Drafter | None:
    """The drafter of a new request: none when the model's setting or the request says
    no, or when its memory cannot take rejected drafts back (recurrent / hybrid models,
    sliding windows without the full-size cache); with ``speculative = "draft"``, one
    drafted by ``source`` (the model's draft model), unless the request predicts its
    output: prompt lookup over that prediction and its own tokens then."""
    if cfg.speculative == "off" or not params.speculative or memory_kind != "kv":
        return None
    if cfg.speculative == "draft" and not params.prediction:
        return SourceDrafter(source, cfg.draft_max) if source is not None else None
    return NgramDrafter(cfg.draft_max, min_len=cfg.draft_min, prediction=params.prediction)


def verify(scheduler: Scheduler, seq: Sequence, out: Output, runtime: LlamaRuntime,
           index: int, drafts: list[int]) -> tuple[list[tuple[Sampled, Verdict]], int]:
    """Sample at output rows ``index``, ``index + 1`` ... (the sequence's last token, then
    each draft) while the drafts match; returns each sampled token with its verdict (the
    token is appended to the sequence), and how many drafts were accepted."""
    results: list[tuple[Sampled, Verdict]] = []
    taken = 0
    for j in range(len(drafts) + 1):
        sampled = finishing.sample(seq, out, runtime, index + j)
        verdict = finishing.after_token(scheduler, seq, out, sampled,
                                        runtime.piece(sampled.token),
                                        is_eog=runtime.is_eog(sampled.token))
        results.append((sampled, verdict))
        if j == len(drafts) or sampled.token != drafts[j]:
            break
        taken += 1
        if verdict.status is not None:
            break
    return results, taken
