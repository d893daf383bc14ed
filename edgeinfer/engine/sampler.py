"""A per-request llama_sampler chain in llama-server's order: logit bias, penalties, DRY,
then greedy; or Mirostat; or top-n-sigma, top-k, typical, top-p, min-p, XTC, temperature
(dynamic with ``dynatemp_range``) and the seeded draw."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable

import llama_cpp
import numpy as np
import numpy.typing as npt

from edgeinfer.engine.batch import logits_row
from edgeinfer.engine.dry import DryCache
from edgeinfer.engine.grammar_check import grammar_sampler
from edgeinfer.engine.handles import ContextPtr, Sampler, SamplerPtr, VocabPtr
from edgeinfer.engine.sequence import SamplingParams
from edgeinfer.engine.thought_budget import ThoughtBudget
from edgeinfer.engine.trigger import TriggerScan, safe_after

LLAMA_DEFAULT_SEED = 0xFFFFFFFF
SUBSET = 256  # candidates a grammar-constrained step checks before the whole vocabulary
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
assert _TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)


class GrammarDeadEnd(ValueError):
    """No token the grammar allows can be sampled: the request ends with a 400."""


class SamplerChain:
    """Owns one llama_sampler chain; sample() also accepts the chosen token.

    With ``grammar_triggers`` (a lazy grammar, as for ``tool_choice: auto``), the
    grammar is not created until a trigger word appears in the output: until then
    sampling costs what an unconstrained request costs, and the trigger scan looks
    at each new piece only (``piece`` gives a token's bytes).

    Created and used only on the engine thread; call close() exactly once.
    """

    def __init__(self, params: SamplingParams, n_vocab: int, eog_bans: tuple[int, ...] = (),
                 vocab: VocabPtr | None = None, piece: Callable[[int], bytes] | None = None,
                 n_ctx: int = 4096, dry: DryCache | None = None):
        sparams = llama_cpp.llama_sampler_chain_default_params()
        sparams.no_perf = True
        # owns the chain and, once made, the grammar; frees them newest first
        self._handles = contextlib.ExitStack()
        self._chain = self._handles.enter_context(contextlib.closing(Sampler(
            llama_cpp.llama_sampler_chain_init(sparams),
            MemoryError("llama_sampler_chain_init failed"))))
        self._grammar: Sampler | None = None
        self._scan: TriggerScan | None = None
        self._triggers: tuple[str, ...] = ()
        self._budget = (ThoughtBudget(params.reasoning_budget, params.reasoning_close)
                        if params.reasoning_budget is not None else None)
        self._end_closes = vocab if params.reasoning_end_closes else None
        try:
            self._build(params, n_vocab, eog_bans, vocab, n_ctx, dry)
            if params.grammar is not None:
                self._setup_grammar(params, params.grammar, n_vocab, vocab, piece)
        except BaseException:
            self.close()
            raise

    def _setup_grammar(self, params: SamplingParams, gbnf: str, n_vocab: int,
                       vocab: VocabPtr | None, piece: Callable[[int], bytes] | None) -> None:
        assert vocab is not None, "a grammar needs the vocabulary"
        self._vocab, self._gbnf = vocab, gbnf
        self._triggers = params.grammar_triggers
        if self._triggers:
            assert piece is not None, "a lazy grammar needs the token pieces"
            self._piece = piece
            self._scan = TriggerScan(self._triggers)
        else:
            self._own_grammar(grammar_sampler(vocab, gbnf))
        self._n_vocab = n_vocab
        self._subset = max(SUBSET, params.top_k)
        self._cur = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._sub = np.zeros(min(self._subset, n_vocab), dtype=_TOKEN_DATA)
        self._one = np.zeros(1, dtype=_TOKEN_DATA)

    def _add(self, smpl: SamplerPtr | None) -> None:
        """Add a sampler to the chain, which owns it from then on."""
        if not smpl:
            raise ValueError("llama.cpp could not create a sampler")
        llama_cpp.llama_sampler_chain_add(self._chain.ptr, smpl)

    def _build(self, p: SamplingParams, n_vocab: int, eog_bans: tuple[int, ...],
               vocab: VocabPtr | None, n_ctx: int, dry: DryCache | None) -> None:
        bias = dict(p.logit_bias)
        for tok in eog_bans:
            bias[tok] = float("-inf")
        if bias:
            arr = (llama_cpp.llama_logit_bias * len(bias))()
            for i, (tok, b) in enumerate(bias.items()):
                arr[i].token = tok  # type: ignore[assignment]  # stub: the field takes an int
                arr[i].bias = b
            self._add(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(bias), arr))
        if p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
            self._add(llama_cpp.llama_sampler_init_penalties(
                n_vocab, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty,
                p.presence_penalty))
        if p.dry_multiplier > 0.0 and vocab is not None:  # as llama-server sets it up
            self._add((dry or DryCache(vocab, n_ctx, size=0)).make(p))
        if p.is_greedy:
            self._add(llama_cpp.llama_sampler_init_greedy())
            return
        seed = LLAMA_DEFAULT_SEED if p.seed is None else p.seed & 0xFFFFFFFF
        if p.mirostat:  # as llama-server: temperature, then Mirostat picks the token
            self._add(llama_cpp.llama_sampler_init_temp(p.temperature))
            self._add(llama_cpp.llama_sampler_init_mirostat(
                n_vocab, seed, p.mirostat_tau, p.mirostat_eta, 100) if p.mirostat == 1 else
                llama_cpp.llama_sampler_init_mirostat_v2(seed, p.mirostat_tau, p.mirostat_eta))
            return
        if p.top_n_sigma > 0.0:
            self._add(llama_cpp.llama_sampler_init_top_n_sigma(p.top_n_sigma))
        if p.top_k > 0:
            self._add(llama_cpp.llama_sampler_init_top_k(p.top_k))
        if p.typical_p < 1.0:
            self._add(llama_cpp.llama_sampler_init_typical(p.typical_p, 1))
        if p.top_p < 1.0:
            self._add(llama_cpp.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0.0:
            self._add(llama_cpp.llama_sampler_init_min_p(p.min_p, 1))
        if p.xtc_probability > 0.0:
            self._add(llama_cpp.llama_sampler_init_xtc(p.xtc_probability, p.xtc_threshold, 1,
                                                       seed))
        self._add(llama_cpp.llama_sampler_init_temp_ext(
            p.temperature, p.dynatemp_range, p.dynatemp_exponent) if p.dynatemp_range > 0.0
            else llama_cpp.llama_sampler_init_temp(p.temperature))
        self._add(llama_cpp.llama_sampler_init_dist(seed))

    def sample(self, ctx: ContextPtr, batch_index: int) -> int:
        # a reasoning block over its budget is closed by force; never under an active
        # grammar (llama.cpp aborts on a token its grammar cannot take)
        forced = (self._budget.forced()
                  if self._budget is not None and self._grammar is None else None)
        if forced is not None:
            token = forced
            llama_cpp.llama_sampler_accept(self._chain.ptr, token)
            if self._scan is not None:
                self._watch(token)
        elif self._grammar is None:
            token = self._free_token(ctx, batch_index)
            if self._scan is not None:
                self._watch(token)
        else:
            token = self._sample_constrained(ctx, batch_index)
        if self._budget is not None:
            self._budget.saw(token)
        return token

    def _free_token(self, ctx: ContextPtr, batch_index: int) -> int:
        """A token sampled without a grammar; an end of generation inside a reasoning block
        that a forced call must follow becomes the block's closing marker (its first
        token; the budget forces the rest), so the call still comes."""
        token = int(llama_cpp.llama_sampler_sample(self._chain.ptr, ctx, batch_index))
        budget = self._budget
        if (self._end_closes is not None and budget is not None and not budget.done
                and llama_cpp.llama_vocab_is_eog(self._end_closes, token)):
            budget.left = 0
            forced = budget.forced()
            if forced is not None:
                token = forced
                llama_cpp.llama_sampler_accept(self._chain.ptr, token)
        return token

    @property
    def lazily_constrained(self) -> bool:
        """A lazy grammar's trigger word has appeared: the output follows it from here."""
        return bool(self._triggers) and self._grammar is not None

    def _watch(self, token: int) -> None:
        """Free text so far: start the grammar once a trigger word has appeared."""
        assert self._scan is not None
        found = self._scan.feed(token, self._piece(token))
        if found is None:
            return
        recent, word, after = found
        if not safe_after(word, after):
            # llama.cpp would abort the process on text after the word that its grammar
            # cannot take (``<tool_call></tool_call>`` where ``></`` is one token): this
            # occurrence stays free text, and the scan goes on from the next token, so a
            # later call is still constrained
            self._scan = TriggerScan(self._triggers)
            return
        self._scan = None
        # a lazy grammar shown only the tokens that hold the word: it triggers at once,
        # and its own whole-text matching never runs on the rest of the output
        grammar = self._own_grammar(grammar_sampler(self._vocab, self._gbnf, self._triggers))
        for tok in recent:
            llama_cpp.llama_sampler_accept(grammar.ptr, tok)

    @staticmethod
    def _apply(smpl: Sampler, arr: npt.NDArray[np.void]) -> int:
        """Apply ``smpl`` to the candidates in ``arr``; the index in ``arr`` of the one it
        selected (a sampler may move the array's start past candidates it drops, as XTC
        does, and count ``selected`` from there)."""
        base = arr.ctypes.data
        cur = llama_cpp.llama_token_data_array(
            data=arr.ctypes.data_as(llama_cpp.llama_token_data_p), size=arr.shape[0],
            selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(smpl.ptr, ctypes.byref(cur))
        start = ctypes.cast(cur.data, ctypes.c_void_p).value or base
        return (start - base) // _TOKEN_DATA.itemsize + int(cur.selected)

    def _sample_constrained(self, ctx: ContextPtr, batch_index: int) -> int:
        """llama.cpp's common-sampler recipe, with a cheaper fallback.

        1. Sample with the chain alone and check just that token against the
           grammar: most steps stop here, and checking one token is cheap.
        2. If the grammar rejects it: grammar first, then the chain, on the SUBSET
           most likely tokens (checking a candidate walks the grammar, which is the
           costly part). Exact for greedy decoding and for top-k up to SUBSET, as
           every token outside the subset has a lower logit than every token in it;
           with top-k disabled, this step samples among the SUBSET best tokens.
        3. If none of those is allowed: the same on the whole vocabulary.

        A token chosen in step 2 or 3 is checked against the grammar again before it is
        accepted (llama.cpp aborts the process on a token its grammar rejects):
        ``GrammarDeadEnd`` when nothing allowed is left.
        """
        grammar, chain = self._grammar, self._chain
        assert grammar is not None
        logits = logits_row(ctx, self._n_vocab, batch_index)
        cur = self._cur
        cur["id"], cur["logit"], cur["p"] = self._ids, logits, 0.0
        token = int(cur["id"][self._apply(chain, cur)])
        one = self._one
        one["id"], one["logit"], one["p"] = token, 1.0, 0.0
        self._apply(grammar, one)
        if not np.isfinite(one["logit"][0]):
            k = min(self._subset, self._n_vocab)
            top = np.argpartition(logits, -k)[-k:]
            sub = self._sub
            sub["id"], sub["logit"], sub["p"] = top, logits[top], 0.0
            self._apply(grammar, sub)
            if np.isfinite(sub["logit"]).any():
                token = int(sub["id"][self._apply(chain, sub)])
            else:
                cur["id"], cur["logit"], cur["p"] = self._ids, logits, 0.0
                self._apply(grammar, cur)
                token = int(cur["id"][self._apply(chain, cur)])
            one["id"], one["logit"], one["p"] = token, 1.0, 0.0
            self._apply(grammar, one)
            if not np.isfinite(one["logit"][0]):  # llama.cpp would abort the process
                raise GrammarDeadEnd("the grammar allows no token at this point of the output "
                                     "(it asks for a character no token can write, such as "
                                     "NUL, or for the end while the end is banned)")
        llama_cpp.llama_sampler_accept(grammar.ptr, token)
        llama_cpp.llama_sampler_accept(chain.ptr, token)
        return token

    def close(self) -> None:
        """Free the grammar sampler, then the chain (which owns the samplers in it)."""
        self._handles.close()
        self._grammar = None

    def _own_grammar(self, grammar: Sampler) -> Sampler:
        self._grammar = self._handles.enter_context(contextlib.closing(grammar))
        return grammar
