"""A per-request llama_sampler chain (penalties, logit bias, top-k/p, min-p, temperature)."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from typing import Any

import llama_cpp
import numpy as np

from edgeinfer.engine.sequence import SamplingParams

LLAMA_DEFAULT_SEED = 0xFFFFFFFF
SUBSET = 256  # candidates a grammar-constrained step checks before the whole vocabulary
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
assert _TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)


def grammar_sampler(vocab: Any, gbnf: str, triggers: tuple[str, ...] = ()) -> Any:
    """A llama.cpp grammar sampler (lazy when trigger words are given); ValueError if invalid.

    A lazy grammar lets the model write freely until a trigger word appears;
    from the word on, the output follows the grammar.
    """
    if not triggers:
        smpl = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    else:
        patterns = [r"[\s\S]*?(" + re.escape(t) + r")[\s\S]*" for t in triggers]
        pats = (ctypes.c_char_p * len(patterns))(*(p.encode() for p in patterns))
        smpl = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
            vocab, gbnf.encode(), b"root", pats, len(triggers), None, 0)
    if not smpl:
        raise ValueError("llama.cpp cannot parse the grammar")
    return smpl


# What may follow a trigger word within the same token: the start of the tool-call
# grammar's JSON object (see grammar.tool_calls_gbnf), nothing else.
_SAFE_AFTER = re.compile(rb'\n?(\{[ \t\n]*("(n(a(m(e"?)?)?)?)?)?)?\Z')


class TriggerScan:
    """Finds the first of some trigger words in a stream of token pieces, looking only at
    the new bytes (plus a tail as long as the longest word): constant work per token.

    ``feed`` returns, once a word has appeared, the recent tokens from the one holding
    the word's first byte on (what a lazy grammar must be shown) and the bytes that
    follow the word in them; else None.
    """

    def __init__(self, words: tuple[str, ...]) -> None:
        self._words = [w.encode() for w in words if w]
        self._keep = max((len(w) for w in self._words), default=1)
        self._recent: list[tuple[int, bytes]] = []  # tokens whose pieces cover the tail

    def feed(self, token: int, piece: bytes) -> tuple[list[int], bytes] | None:
        self._recent.append((token, piece))
        tail = b"".join(p for _, p in self._recent)
        hits = [(at, w) for w in self._words if (at := tail.find(w)) != -1]
        if not hits:
            # drop the tokens no later word could start in
            while len(self._recent) > 1 and sum(
                    len(p) for _, p in self._recent[1:]) >= self._keep - 1:
                self._recent.pop(0)
            return None
        start, word = min(hits)
        out, pos = [], 0
        for tok, p in self._recent:
            if pos + len(p) > start:
                out.append(tok)
            pos += len(p)
        return out, tail[start + len(word):]


class SamplerChain:
    """Owns one llama_sampler chain; sample() also accepts the chosen token.

    With ``grammar_triggers`` (a lazy grammar, as for ``tool_choice: auto``), the
    grammar is not created until a trigger word appears in the output: until then
    sampling costs what an unconstrained request costs, and the trigger scan looks
    at each new piece only (``piece`` gives a token's bytes).

    Created and used only on the engine thread; call close() exactly once.
    """

    def __init__(self, params: SamplingParams, n_vocab: int, eog_bans: tuple[int, ...] = (),
                 vocab: Any = None, piece: Callable[[int], bytes] | None = None):
        sparams = llama_cpp.llama_sampler_chain_default_params()
        sparams.no_perf = True
        self._grammar: Any = None
        self._scan: TriggerScan | None = None
        self._chain = llama_cpp.llama_sampler_chain_init(sparams)
        if not self._chain:
            raise MemoryError("llama_sampler_chain_init failed")
        try:
            self._build(params, n_vocab, eog_bans)
            if params.grammar is not None:
                self._vocab, self._gbnf = vocab, params.grammar
                self._triggers = params.grammar_triggers
                if self._triggers:
                    assert piece is not None, "a lazy grammar needs the token pieces"
                    self._piece = piece
                    self._scan = TriggerScan(self._triggers)
                else:
                    self._grammar = grammar_sampler(vocab, params.grammar)
                self._n_vocab = n_vocab
                self._subset = max(SUBSET, params.top_k)
                self._cur = np.zeros(n_vocab, dtype=_TOKEN_DATA)
                self._ids = np.arange(n_vocab, dtype=np.int32)
                self._sub = np.zeros(min(self._subset, n_vocab), dtype=_TOKEN_DATA)
                self._one = np.zeros(1, dtype=_TOKEN_DATA)
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
        if self._grammar is None:
            token = int(llama_cpp.llama_sampler_sample(self._chain, ctx, batch_index))
            if self._scan is not None:
                self._watch(token)
            return token
        return self._sample_constrained(ctx, batch_index)

    def _watch(self, token: int) -> None:
        """Free text so far: start the grammar once a trigger word has appeared."""
        assert self._scan is not None
        found = self._scan.feed(token, self._piece(token))
        if found is None:
            return
        self._scan = None
        recent, after = found
        if not _SAFE_AFTER.match(after):
            # llama.cpp would abort the process on text after the word that its grammar
            # cannot take; such output is left unconstrained (and is not a valid call)
            return
        # a lazy grammar shown only the tokens that hold the word: it triggers at once,
        # and its own whole-text matching never runs on the rest of the output
        self._grammar = grammar_sampler(self._vocab, self._gbnf, self._triggers)
        for tok in recent:
            llama_cpp.llama_sampler_accept(self._grammar, tok)

    def _apply(self, smpl: Any, arr: np.ndarray) -> int:
        cur = llama_cpp.llama_token_data_array(
            data=arr.ctypes.data_as(llama_cpp.llama_token_data_p), size=arr.shape[0],
            selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(smpl, ctypes.byref(cur))
        return int(cur.selected)

    def _sample_constrained(self, ctx: llama_cpp.llama_context_p, batch_index: int) -> int:
        """llama.cpp's common-sampler recipe, with a cheaper fallback.

        1. Sample with the chain alone and check just that token against the
           grammar: most steps stop here, and checking one token is cheap.
        2. If the grammar rejects it: grammar first, then the chain, on the SUBSET
           most likely tokens (checking a candidate walks the grammar, which is the
           costly part). Exact for greedy decoding and for top-k up to SUBSET, as
           every token outside the subset has a lower logit than every token in it;
           with top-k disabled, this step samples among the SUBSET best tokens.
        3. If none of those is allowed: the same on the whole vocabulary.
        """
        ptr = llama_cpp.llama_get_logits_ith(ctx, batch_index)
        logits = np.ctypeslib.as_array(ptr, shape=(self._n_vocab,))
        cur = self._cur
        cur["id"], cur["logit"], cur["p"] = self._ids, logits, 0.0
        token = int(cur["id"][self._apply(self._chain, cur)])
        one = self._one
        one["id"], one["logit"], one["p"] = token, 1.0, 0.0
        self._apply(self._grammar, one)
        if not np.isfinite(one["logit"][0]):
            k = min(self._subset, self._n_vocab)
            top = np.argpartition(logits, -k)[-k:]
            sub = self._sub
            sub["id"], sub["logit"], sub["p"] = top, logits[top], 0.0
            self._apply(self._grammar, sub)
            if np.isfinite(sub["logit"]).any():
                token = int(sub["id"][self._apply(self._chain, sub)])
            else:
                cur["id"], cur["logit"], cur["p"] = self._ids, logits, 0.0
                self._apply(self._grammar, cur)
                token = int(cur["id"][self._apply(self._chain, cur)])
        llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def close(self) -> None:
        if self._grammar:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None
        if self._chain:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
