"""A per-request llama_sampler chain (penalties, logit bias, top-k/p, min-p, temperature)."""

from __future__ import annotations

import llama_cpp

from edgeinfer.sequence import SamplingParams

LLAMA_DEFAULT_SEED = 0xFFFFFFFF


class SamplerChain:
    """Owns one llama_sampler chain; sample() also accepts the chosen token.

    Created and used only on the engine thread; call close() exactly once.
    """

    def __init__(self, params: SamplingParams, n_vocab: int, eog_bans: tuple[int, ...] = ()):
        sparams = llama_cpp.llama_sampler_chain_default_params()
        sparams.no_perf = True
        self._chain = llama_cpp.llama_sampler_chain_init(sparams)
        if not self._chain:
            raise MemoryError("llama_sampler_chain_init failed")
        try:
            self._build(params, n_vocab, eog_bans)
        except BaseException:
            self.close()
            raise

    def _add(self, smpl: llama_cpp.llama_sampler_p) -> None:
        if not smpl:
            raise ValueError("llama.cpp could not create a sampler")
        llama_cpp.llama_sampler_chain_add(self._chain, smpl)

    def _build(self, p: SamplingParams, n_vocab: int, eog_bans: tuple[int, ...]) -> None:
        bias = dict(p.logit_bias)
        for tok in eog_bans:
            bias[tok] = float("-inf")
        if bias:
            arr = (llama_cpp.llama_logit_bias * len(bias))()
            for i, (tok, b) in enumerate(bias.items()):
                arr[i].token = tok  # type: ignore[assignment]
                arr[i].bias = b
            self._add(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(bias), arr))
        if p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
            self._add(llama_cpp.llama_sampler_init_penalties(
                n_vocab, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty))
        if p.is_greedy:
            self._add(llama_cpp.llama_sampler_init_greedy())
            return
        if p.top_k > 0:
            self._add(llama_cpp.llama_sampler_init_top_k(p.top_k))
        if p.top_p < 1.0:
            self._add(llama_cpp.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0.0:
            self._add(llama_cpp.llama_sampler_init_min_p(p.min_p, 1))
        self._add(llama_cpp.llama_sampler_init_temp(p.temperature))
        seed = LLAMA_DEFAULT_SEED if p.seed is None else p.seed & 0xFFFFFFFF
        self._add(llama_cpp.llama_sampler_init_dist(seed))

    def sample(self, ctx: llama_cpp.llama_context_p, batch_index: int) -> int:
        return int(llama_cpp.llama_sampler_sample(self._chain, ctx, batch_index))

    def close(self) -> None:
        if self._chain:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
