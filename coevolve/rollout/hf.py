"""Batched sampling with a Hugging Face causal LM: left padding, KV cache, our own sampling loop.

Our own loop (rather than ``model.generate``) records the exact log-probability of every sampled
token under the temperature-scaled distribution, the pi_old that the trainer's PPO ratio needs. With
``SamplingParams.regex`` it samples from, and records log-probs of, the grammar-masked renormalised distribution
(:mod:`coevolve.rollout.constrained`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import StaticCache

from coevolve.memory import CPU_BATCH_SIZE, ModelShape, free_device_memory, plan_sampling_rows
from coevolve.padding import left_pad, position_ids_from_mask
from coevolve.rollout.base import (
    PROMPT_SEED_STRIDE,
    STOP_WINDOW,
    Completion,
    SamplingParams,
    distinct_prompts,
    fixed_weights,
    holds_stop,
)
from coevolve.rollout.constrained import RegexConstraint
from coevolve.rollout.static_decode import BUCKETS, SLOT_ROUNDING, Shape, StaticDecoder
from coevolve.rollout.static_decode import supports as supports_static
from coevolve.rollout.weights import SamplerCopy


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of a prompt; special tokens are added unless the text already starts with BOS."""
    bos = getattr(tokenizer, "bos_token", None)
    add_special = not (bos and text.startswith(bos))
    return tokenizer(text, add_special_tokens=add_special)["input_ids"]


def truncate_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside the top-k and the top-p nucleus with -inf (the most likely token always stays)."""
    if top_k and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cumulative - sorted_logits.softmax(-1) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One index per row of ``probs`` [B, V] by inverse transform sampling of the row's uniform (``uniforms`` [B]).

    The cumulative sums are in float64; the first index whose sum exceeds u * total always has a
    positive probability. (``torch.multinomial`` draws an exponential per entry, 20x slower on CPU at V = 49k.)
    """
    cdf = probs.double().cumsum(-1)
    return torch.searchsorted(cdf, uniforms[:, None] * cdf[:, -1:], right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)


def sample_tokens(logits: torch.Tensor, params: SamplingParams,
                  uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token of each row of ``logits`` [B, V] and its log-prob under the temperature-scaled distribution.

    ``uniforms`` [B] (float64 in [0, 1)) are the rows' random draws. The log-prob is taken before top-k / top-p
    truncation (the trainer's pi_old); greedy decoding (temperature 0) gives the argmax and its log-prob under the
    unscaled distribution. Every operation stays on the device (the static decoder captures it in a CUDA graph).
    """
    if params.temperature <= 0:
        chosen = logits.argmax(-1)
        logprobs = logits.log_softmax(-1)
    else:
        scaled = logits / params.temperature if params.temperature != 1.0 else logits
        logprobs = scaled.log_softmax(-1)
        truncated = (0 < params.top_k < logits.shape[-1]) or params.top_p < 1.0
        probs = truncate_logits(scaled, params.top_k, params.top_p).softmax(-1) if truncated else logprobs.exp()
        chosen = draw(probs, uniforms)
    return chosen, logprobs.gather(-1, chosen[:, None])[:, 0]


class HFRolloutEngine:
    """Samples from a transformers causal LM in batches of ``batch_size`` prompts.

    Two loops. The plain loop decodes into one preallocated (static) KV cache, asks the host after every token which
    rows finished, and drops finished rows from the batch and the cache once they make up a quarter of it; it samples
    from the live model and is the one that applies a regex constraint (its mask comes from the host every token).
    With ``dtype`` set, the engine samples from its own copy of the weights in that dtype (bf16 on a GPU; refreshed
    whenever ``version()`` changes, LoRA merged) with the :class:`~coevolve.rollout.static_decode.StaticDecoder`: one
    CUDA graph per batch-size bucket on a GPU, a host check every ``sync_every`` tokens. The plain loop draws one
    uniform per live row and step (as before the static decoder existed, so its samples for a seed are unchanged);
    the static decoder draws one per prompt and token up front. Both sample the same distribution, and greedy
    decoding gives the same tokens.
    """

    def __init__(self, model, tokenizer, *, batch_size: int | None = 64, eos_token_ids: Sequence[int] | None = None,
                 dtype: torch.dtype | None = None, cuda_graphs: bool = True, keep_sampler: bool = True,
                 sync_every: int = 16, version: Callable[[], object] | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size  # None: planned per call from the free device memory (CPU_BATCH_SIZE off CUDA)
        if eos_token_ids is None:
            eos_token_ids = [tokenizer.eos_token_id]
        self.eos_token_ids = [i for i in eos_token_ids if i is not None]
        self.cuda_graphs, self.keep_sampler, self.sync_every = cuda_graphs, keep_sampler, sync_every
        self.copy = (SamplerCopy(model, dtype, version or fixed_weights)
                     if dtype is not None else None)
        self.decoder: StaticDecoder | None = None
        self.reported = (0, 0.0)  # the copy's refreshes and seconds at the last pop_metrics
        self.planned: list[int] = []  # the batch sizes planned on CUDA since the last pop_metrics

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[Completion]:
        """One completion per prompt; the same prompts, params and seed give the same completions.

        The batch starting at prompt ``j`` draws from its own stream seeded ``seed + j * PROMPT_SEED_STRIDE`` (the
        rollout seed contract), so sampling a slice of whole batches reproduces the whole call's samples. A planned
        batch size (``batch_size=None``) that runs out of device memory is halved and the batch sampled again.
        """
        static = self.copy is not None and params.regex is None and supports_static(self.model)
        model = self.copy.current() if self.copy is not None and static else self.model
        device = next(model.parameters()).device
        generator = torch.Generator(device=device)
        prompt_ids = [encode_prompt(self.tokenizer, p) for p in prompts]
        rows = self.batch_size or self._plan_rows(model, prompt_ids, params, static)
        completions: list[Completion] = []
        while len(completions) < len(prompts):
            start = len(completions)
            generator.manual_seed(seed + start * PROMPT_SEED_STRIDE)
            batch, batch_ids = prompts[start:start + rows], prompt_ids[start:start + rows]
            try:
                completions += (self._generate_static(model, batch, batch_ids, params, generator, rows) if static
                                else self._generate_batch(model, batch, batch_ids, params, generator))
            except torch.OutOfMemoryError:
                if self.batch_size is not None or rows == 1:
                    raise
                self.decoder = None
                torch.cuda.empty_cache()
                rows = max(1, rows // 2)
        if not self.keep_sampler:
            self.release()
        elif self.batch_size is None and self.decoder is not None and device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            if self.decoder.nbytes > total // 4:  # a long call's buffers: give them back to the next phase
                self.decoder = None
        return completions

    def _plan_rows(self, model, prompt_ids: list[list[int]], params: SamplingParams, static: bool) -> int:
        """The batch size of this call: as many prompts as one batch's decoding memory fits in the free device memory
        (counting the buffers a new shape would replace); ``CPU_BATCH_SIZE`` off CUDA."""
        device = next(model.parameters()).device
        free = free_device_memory(device)
        if free is None:
            return CPU_BATCH_SIZE
        if self.decoder is not None:
            free += self.decoder.nbytes
        longest = max(len(ids) for ids in prompt_ids)
        slots = -(-(longest + params.max_new_tokens) // SLOT_ROUNDING) * SLOT_ROUNDING
        dtype_bytes = next(model.parameters()).element_size()
        rows = plan_sampling_rows(free, ModelShape.of(model.config), len(prompt_ids), longest, params.max_new_tokens,
                                  slots, dtype_bytes=dtype_bytes, truncated=params.top_k > 0 or params.top_p < 1.0,
                                  buckets=BUCKETS if static else ())
        self.planned.append(rows)
        return rows

    def release(self) -> None:
        """Free the sampler's copy of the weights and its decoding buffers (rebuilt on the next call)."""
        self.decoder = None
        if self.copy is not None:
            self.copy.release()

    @torch.no_grad()
    def _generate_static(self, model, prompts: Sequence[str], prompt_ids: list[list[int]], params: SamplingParams,
                         generator: torch.Generator, rows: int) -> list[Completion]:
        longest = max(len(ids) for ids in prompt_ids) + params.max_new_tokens
        shape = Shape(rows=max(rows, len(prompts)), new_tokens=params.max_new_tokens,
                      slots=-(-longest // SLOT_ROUNDING) * SLOT_ROUNDING)
        if self.decoder is None or self.decoder.shape != shape or self.decoder.model is not model:
            self.decoder = None  # free the old buffers before allocating new ones
            self.decoder = StaticDecoder(model, shape, self.eos_token_ids, sample_tokens, graphs=self.cuda_graphs)
        stopped = None
        if params.stop:
            def stopped(tokens: list[list[int]], first: int) -> list[int | None]:
                return [self._first_stop(row, first, params.stop) for row in tokens]
        tokens, logprobs, lengths, reasons = self.decoder.run(prompt_ids, params, generator,
                                                              self.tokenizer.pad_token_id, self.sync_every, stopped)
        return [Completion(prompt=prompts[i], prompt_ids=prompt_ids[i], token_ids=tokens[i],
                           text=self.tokenizer.decode(tokens[i], skip_special_tokens=True), logprobs=logprobs[i],
                           finish_reason=reasons[i]) for i in range(len(prompts))]

    def _first_stop(self, tokens: list[int], first: int, stop: Sequence[str]) -> int | None:
        """The first index ``i >= first`` at which the last ``STOP_WINDOW`` tokens hold a stop string (the plain
        loop's rule)."""
        if not holds_stop(self.tokenizer, tokens[max(0, first - STOP_WINDOW + 1):], stop, window=None):
            return None  # no window of the span can hold one
        return next((i for i in range(first, len(tokens)) if holds_stop(self.tokenizer, tokens[:i + 1], stop)), None)

    @torch.no_grad()
    def _generate_batch(self, model, prompts: Sequence[str], prompt_ids: list[list[int]], params: SamplingParams,
                        generator: torch.Generator) -> list[Completion]:
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        batch, new = len(prompts), params.max_new_tokens
        logits, cache, kv_mask, positions = self._prefill(model, prompt_ids, new, device)
        eos = torch.tensor(self.eos_token_ids, dtype=torch.long, device=device)
        tokens = torch.zeros(batch, new, dtype=torch.long, device=device)
        logprobs = torch.zeros(batch, new, device=device)
        lengths, reasons = [new] * batch, ["length"] * batch
        tails: list[list[int]] = [[] for _ in range(batch)]  # recent tokens per prompt, for stop strings
        # Batch row i holds prompt row_of[i] (``rows`` on the device); ``alive`` marks the rows still generating.
        rows = torch.arange(batch, device=device)
        row_of = list(range(batch))
        alive = torch.ones(batch, dtype=torch.bool, device=device)
        done_in_batch = 0
        constraint = (RegexConstraint(self.tokenizer, logits.shape[-1], params.regex, self.eos_token_ids, batch)
                      if params.regex else None)
        for t in range(new):
            if constraint is not None:  # sample from the masked, renormalised distribution; log-probs are its own
                live = alive.tolist()
                logits = constraint.mask(logits, row_of, live)
            uniforms = torch.rand(len(row_of), generator=generator, device=device, dtype=torch.float64)
            chosen, chosen_logprob = sample_tokens(logits.float(), params, uniforms)
            if constraint is not None:
                constraint.accept(chosen.tolist(), row_of, live)
            tokens[rows, t] = chosen
            logprobs[rows, t] = chosen_logprob
            ended = (alive & torch.isin(chosen, eos)).nonzero()[:, 0].tolist()
            for i in ended:
                reasons[row_of[i]] = "eos"
            if params.stop:
                stopped = self._stopped(tails, row_of, alive, chosen, set(ended), params.stop)
                for i in stopped:
                    reasons[row_of[i]] = "stop"
                ended += stopped
            for i in ended:
                lengths[row_of[i]] = t + 1
            if ended:
                alive[ended] = False
                done_in_batch += len(ended)
            if done_in_batch == len(row_of) or t + 1 == new:
                break
            if 4 * done_in_batch >= len(row_of):  # drop the finished rows once they are a quarter of the batch
                keep = alive.nonzero()[:, 0]
                cache.reorder_cache(keep)
                rows, alive, chosen, kv_mask, positions = (x[keep] for x in (rows, alive, chosen, kv_mask, positions))
                row_of, done_in_batch = rows.tolist(), 0
            positions = positions + 1
            logits = model(input_ids=chosen[:, None], attention_mask=kv_mask, position_ids=positions,
                           past_key_values=cache, use_cache=True).logits[:, -1, :]
        model.train(was_training)
        token_lists, logprob_lists = tokens.tolist(), logprobs.tolist()
        return [
            Completion(prompt=prompts[i], prompt_ids=prompt_ids[i], token_ids=token_lists[i][:lengths[i]],
                       text=self.tokenizer.decode(token_lists[i][:lengths[i]], skip_special_tokens=True),
                       logprobs=logprob_lists[i][:lengths[i]], finish_reason=reasons[i])
            for i in range(batch)
        ]

    def _prefill(self, model, prompt_ids: list[list[int]], new: int, device: torch.device):
        """Run the prompts into a static cache with room for ``new`` tokens, each distinct prompt once.

        Returns the next-token logits [B, V], the cache (expanded to one row per prompt), the padding mask
        over the cache's slots [B, P + new] and each row's position of its last prompt token [B, 1].
        """
        distinct, expand = distinct_prompts(prompt_ids, device)
        input_ids, attention_mask = left_pad(distinct, self.tokenizer.pad_token_id)
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        # Every slot after the prompt will hold a generated token, so the padding mask is fixed up front.
        kv_mask = torch.cat([attention_mask, attention_mask.new_ones(len(distinct), new)], dim=1)
        positions = position_ids_from_mask(attention_mask)
        cache = StaticCache(config=model.config, max_cache_len=kv_mask.shape[1])
        logits = model(input_ids=input_ids, attention_mask=kv_mask, position_ids=positions,
                            past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1, :]
        if len(distinct) < len(prompt_ids):
            cache.reorder_cache(expand)
            logits = logits[expand]
        return logits, cache, kv_mask[expand], positions[expand, -1:]

    def _stopped(self, tails: list[list[int]], row_of: list[int], alive: torch.Tensor, chosen: torch.Tensor,
                 ended: set[int], stop: Sequence[str]) -> list[int]:
        """Batch rows still generating whose last ``STOP_WINDOW`` tokens now hold a stop string."""
        stopped = []
        for i, (live, token) in enumerate(zip(alive.tolist(), chosen.tolist())):
            if not live or i in ended:
                continue
            tail = tails[row_of[i]]
            tail.append(token)
            del tail[:-STOP_WINDOW]
            if holds_stop(self.tokenizer, tail, stop):
                stopped.append(i)
        return stopped

    def pop_metrics(self) -> dict[str, float]:
        """Refreshes of the sampler's copy since the last call (``time/weight_sync_s``, ``rollout/weight_syncs``),
        empty when the engine samples from the live model; the smallest batch size planned on CUDA since then
        (``rollout/planned_batch``)."""
        metrics = {"rollout/planned_batch": float(min(self.planned))} if self.planned else {}
        self.planned = []
        if self.copy is None:
            return metrics
        count, seconds = self.copy.refreshes - self.reported[0], self.copy.refresh_seconds - self.reported[1]
        self.reported = (self.copy.refreshes, self.copy.refresh_seconds)
        return {**metrics, "time/weight_sync_s": seconds, "rollout/weight_syncs": float(count)}
