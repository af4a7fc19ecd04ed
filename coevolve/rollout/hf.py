"""Batched sampling with a Hugging Face causal LM: left padding, KV cache, our own sampling loop.

Our own loop (rather than ``model.generate``) records the exact log-probability of every sampled
token under the temperature-scaled distribution, the pi_old that the trainer's PPO ratio needs.
"""

from __future__ import annotations

from typing import Sequence

import torch

from coevolve.rollout.base import Completion, SamplingParams


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of a prompt; special tokens are added unless the text already starts with BOS."""
    bos = getattr(tokenizer, "bos_token", None)
    add_special = not (bos and text.startswith(bos))
    return tokenizer(text, add_special_tokens=add_special)["input_ids"]


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists to one tensor; returns (input_ids, attention_mask)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq):] = 1
    return ids, mask


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that start at 0 on each row's first real token (left padding gets position 0)."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


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


class HFRolloutEngine:
    """Samples from a transformers causal LM in batches of ``batch_size`` prompts."""

    def __init__(self, model, tokenizer, *, batch_size: int = 64, eos_token_ids: Sequence[int] | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        if eos_token_ids is None:
            eos_token_ids = [tokenizer.eos_token_id]
        self.eos_token_ids = [i for i in eos_token_ids if i is not None]

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[Completion]:
        """One completion per prompt; the same prompts, params and seed give the same completions."""
        generator = torch.Generator().manual_seed(seed)
        completions: list[Completion] = []
        for start in range(0, len(prompts), self.batch_size):
            completions += self._generate_batch(prompts[start:start + self.batch_size], params, generator)
        return completions

    @torch.no_grad()
    def _generate_batch(self, prompts: Sequence[str], params: SamplingParams, generator: torch.Generator):
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        prompt_ids = [encode_prompt(self.tokenizer, p) for p in prompts]
        input_ids, attention_mask = left_pad(prompt_ids, self.tokenizer.pad_token_id)
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        batch = len(prompts)
        eos = torch.tensor(self.eos_token_ids, device=device)
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        reasons = ["length"] * batch
        active = torch.ones(batch, dtype=torch.bool, device=device)
        cache = None
        step_ids, positions = input_ids, position_ids_from_mask(attention_mask)
        for _ in range(params.max_new_tokens):
            out = self.model(input_ids=step_ids, attention_mask=attention_mask, position_ids=positions,
                             past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits = out.logits[:, -1, :].float()
            if params.temperature <= 0:
                chosen = logits.argmax(-1)
                chosen_logprob = logits.log_softmax(-1).gather(-1, chosen[:, None])[:, 0]
            else:
                scaled = logits / params.temperature
                kept = truncate_logits(scaled, params.top_k, params.top_p)
                chosen = torch.multinomial(kept.softmax(-1).cpu(), 1, generator=generator)[:, 0].to(device)
                chosen_logprob = scaled.log_softmax(-1).gather(-1, chosen[:, None])[:, 0]
            for row in active.nonzero()[:, 0].tolist():
                tokens[row].append(int(chosen[row]))
                logprobs[row].append(float(chosen_logprob[row]))
            finished_eos = active & torch.isin(chosen, eos)
            for row in finished_eos.nonzero()[:, 0].tolist():
                reasons[row] = "eos"
            active &= ~finished_eos
            if params.stop:
                for row in active.nonzero()[:, 0].tolist():
                    if self._hit_stop(tokens[row], params.stop):
                        reasons[row] = "stop"
                        active[row] = False
            if not active.any():
                break
            step_ids = torch.where(active, chosen, torch.full_like(chosen, self.tokenizer.pad_token_id))[:, None]
            attention_mask = torch.cat([attention_mask, torch.ones_like(step_ids)], dim=1)
            positions = positions[:, -1:] + 1
        self.model.train(was_training)
        return [
            Completion(prompt=prompts[i], prompt_ids=prompt_ids[i], token_ids=tokens[i],
                       text=self.tokenizer.decode(tokens[i], skip_special_tokens=True),
                       logprobs=logprobs[i], finish_reason=reasons[i])
            for i in range(batch)
        ]

    def pop_metrics(self) -> dict[str, float]:
        """Nothing to report: this engine samples from the live model, so there are no weights to sync."""
        return {}

    def _hit_stop(self, token_ids: list[int], stop: Sequence[str]) -> bool:
        tail = self.tokenizer.decode(token_ids[-16:], skip_special_tokens=True)
        return any(s in tail for s in stop)
