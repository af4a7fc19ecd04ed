"""Constrained decoding for the HF engine: a regex (``SamplingParams.regex``) compiled by xgrammar to token masks.

At each decoding step every row's grammar matcher fills a bitmask of the tokens that keep the text inside the
regex (the end-of-sequence token once it is complete); the engine sets the other logits to -inf and samples from the
renormalised, temperature-scaled rest. So the log-probs it records are those of the distribution actually sampled
from, q(y_t) = pi(y_t) / Z_t with Z_t the mass pi gives the allowed tokens (a token the format forces gets
log q = 0). The vLLM engine does the same through its structured outputs (xgrammar
there too); its ``processed_logprobs`` are taken after the grammar mask.

What the update does with them: the trainer recomputes pi_old without the mask (it trains the unconstrained
policy). A recipe with ``params.format_constraint`` turns on truncated importance sampling (``train.tis_cap``, 2.0
unless set), whose per-token weight min(pi_old / q, cap) = Z_t <= 1 corrects the constrained samples to the
unconstrained policy's objective: tokens the model would rarely have chosen itself weigh little.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class RegexConstraint:
    """Token masks for one batch of rows that must each match ``regex`` (xgrammar's compiled grammar, cached)."""

    _compiled: dict[tuple[int, int, str], object] = {}

    def __init__(self, tokenizer, vocab_size: int, regex: str, eos_token_ids: Sequence[int], rows: int):
        import xgrammar as xgr

        key = (id(tokenizer), vocab_size, regex)
        if key not in self._compiled:
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                      stop_token_ids=list(eos_token_ids))
            self._compiled[key] = xgr.GrammarCompiler(info).compile_regex(regex)
        self._xgr = xgr
        self.matchers = [xgr.GrammarMatcher(self._compiled[key]) for _ in range(rows)]
        self.bitmask = xgr.allocate_token_bitmask(rows, vocab_size)
        self.vocab_size = vocab_size

    def mask(self, logits: torch.Tensor, row_of: Sequence[int], alive: Sequence[bool]) -> torch.Tensor:
        """``logits`` [B, V] (batch row i holds prompt row ``row_of[i]``) with disallowed tokens at -inf."""
        bitmask = self.bitmask[:len(row_of)]
        bitmask.fill_(-1)  # all allowed: finished rows keep whatever they sample (it is discarded)
        for i, (row, live) in enumerate(zip(row_of, alive)):
            if live and not self.matchers[row].is_terminated():
                self.matchers[row].fill_next_token_bitmask(bitmask, i)
        logits = logits.float().clone()
        self._xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=self.vocab_size)
        return logits

    def accept(self, chosen: Sequence[int], row_of: Sequence[int], alive: Sequence[bool]) -> None:
        """Advance each live row's matcher by the token it sampled."""
        for token, row, live in zip(chosen, row_of, alive):
            if live and not self.matchers[row].is_terminated():
                self.matchers[row].accept_token(int(token))
