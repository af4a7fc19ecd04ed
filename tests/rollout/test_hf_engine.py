"""The sampler's fast decoding path (static cache, one prefill per distinct prompt, finished rows dropped from the
batch) and the trainer's log-probs (packed micro-batches with shared prompts, or left-padded) give what a plain
forward pass over prompt + completion gives."""

from __future__ import annotations

import torch
from helpers import random_samples

from coevolve.rl import trainer as trainer_module
from coevolve.rl.trainer import TrainSample, sequence_logprobs
from coevolve.rollout import SamplingParams
from coevolve.rollout.hf import HFRolloutEngine, draw

PROMPTS = ["Q:3+4=?\n", "Q:12*(3-5)+7=?\n", "W:\n", "D:a=3,b=7\nQ:a+b=?\n"]


@torch.no_grad()
def _plain_logprobs(model, prompt_ids: list[int], token_ids: list[int], temperature: float) -> torch.Tensor:
    """Log-probs of ``token_ids`` after ``prompt_ids`` from one uncached, unpadded forward pass."""
    logits = model(input_ids=torch.tensor([prompt_ids + token_ids])).logits[0, len(prompt_ids) - 1:-1].float()
    if temperature > 0:
        logits = logits / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(token_ids)[:, None])[:, 0]


@torch.no_grad()
def _plain_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    """``n`` greedy tokens, recomputing the whole sequence at every step (no cache, no padding)."""
    ids = list(prompt_ids)
    for _ in range(n):
        ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids):]


def test_greedy_decoding_equals_a_plain_uncached_loop(random_policy):
    engine = HFRolloutEngine(random_policy.model, random_policy.tokenizer, batch_size=8, eos_token_ids=[])
    completions = engine.generate(PROMPTS * 2, SamplingParams(temperature=0.0, max_new_tokens=12), seed=0)
    for c in completions:
        assert c.token_ids == _plain_greedy(random_policy.model, c.prompt_ids, 12)
        assert c.finish_reason == "length"
        expected = _plain_logprobs(random_policy.model, c.prompt_ids, c.token_ids, 0.0)
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-5)


def test_rows_finishing_at_different_steps_keep_exact_logprobs(random_policy):
    """Ten EOS ids make rows end early and at different steps, so finished rows are dropped mid-batch; repeated
    prompts share one prefill. Every log-prob still equals the plain forward pass's."""
    eos_ids = list(range(10, 20))
    engine = HFRolloutEngine(random_policy.model, random_policy.tokenizer, batch_size=32, eos_token_ids=eos_ids)
    prompts = [p for p in PROMPTS for _ in range(8)]
    params = SamplingParams(temperature=1.3, top_k=40, max_new_tokens=24)
    completions = engine.generate(prompts, params, seed=11)
    assert [c.token_ids for c in completions] == [c.token_ids for c in engine.generate(prompts, params, seed=11)]
    assert len({len(c.token_ids) for c in completions if c.finish_reason == "eos"}) > 3
    for c in completions:
        ends = [i for i, t in enumerate(c.token_ids) if t in eos_ids]
        assert ends == ([len(c.token_ids) - 1] if c.finish_reason == "eos" else [])
        assert c.prompt_ids == random_policy.tokenizer(c.prompt)["input_ids"]
        expected = _plain_logprobs(random_policy.model, c.prompt_ids, c.token_ids, 1.3)
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-5), (c.logprobs, expected)


def _samples(policy, lengths=(5, 1, 9, 3, 0, 7, 2)) -> list[TrainSample]:
    """Random completions for the prompts in turn, so some samples share a prompt; one completion is empty."""
    return random_samples([policy.tokenizer(p)["input_ids"] for p in PROMPTS], lengths, tokens=(3, 100))


def test_trainer_logprobs_equal_a_plain_forward_pass(random_policy, monkeypatch):
    samples = _samples(random_policy)
    for packed in (True, False):
        monkeypatch.setattr(trainer_module, "packs", lambda model, samples, packed=packed: packed)
        logprobs, mask = sequence_logprobs(random_policy.model, samples, random_policy.tokenizer.pad_token_id, 0.7)
        width = logprobs.shape[1]
        for row, s in enumerate(samples):
            n = len(s.completion_ids)
            assert mask[row].tolist() == [0.0] * (width - n) + [1.0] * n
            if n:
                expected = _plain_logprobs(random_policy.model, s.prompt_ids, s.completion_ids, 0.7)
                assert torch.allclose(logprobs[row, width - n:], expected, atol=1e-5), (packed, row)


def test_packed_and_padded_micro_batches_give_the_same_gradient(random_policy, monkeypatch):
    """A prompt shared by several completions is computed once when packed; its gradient is still the sum."""
    samples, model = _samples(random_policy), random_policy.model
    assert trainer_module.packs(model, samples)  # the random Llama uses sdpa
    grads = []
    for packed in (True, False):
        monkeypatch.setattr(trainer_module, "packs", lambda model, samples, packed=packed: packed)
        model.zero_grad(set_to_none=True)
        logprobs, mask = sequence_logprobs(model, samples, random_policy.tokenizer.pad_token_id, 1.0)
        (logprobs * mask * torch.linspace(-1, 1, logprobs.shape[1])).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_draw_follows_the_distribution_and_never_picks_a_zero_probability_token():
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0]]).repeat(20_000, 1)
    uniforms = torch.rand(probs.shape[0], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    picks = draw(probs, uniforms)
    first = torch.bincount(picks[0::2], minlength=5).double() / 20_000
    assert torch.allclose(first, probs[0].double(), atol=0.015), first
    assert (picks[1::2] == 4).all()
    assert torch.equal(picks, draw(probs, uniforms.clone()))
