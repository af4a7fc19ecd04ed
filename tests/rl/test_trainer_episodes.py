"""Episodes in the trainer: tool tokens are context only. The mask lines up with them token for token, they add
nothing to the gradient (loss, KL, entropy, TIS weights), and without them the update is today's exactly."""

from __future__ import annotations

import copy

import pytest
import torch

from coevolve.rl.trainer import PolicyTrainer, TrainSample, UpdateSettings, completion_logprobs, sequence_logprobs

# every term on: several epochs (pi_old from a frozen pass), a KL reference, an entropy bonus, TIS weights
FULL = {"epochs": 2, "kl_beta": 0.1, "entropy_coef": 0.01, "tis_cap": 2.0}


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def episode(tokenizer, parts, advantage=1.0, placeholder=0.0):
    """A TrainSample from (text, by_tool) parts, model tokens with log-prob -1.0, tool tokens ``placeholder``."""
    tokens, mask = [], []
    for text, by_tool in parts:
        piece = ids(tokenizer, text)
        tokens += piece
        mask += [by_tool] * len(piece)
    logprobs = [placeholder if tool else -1.0 for tool in mask]
    return TrainSample(tokenizer("Q:6*7=?")["input_ids"], tokens, logprobs, advantage, mask)


def update_grads(policy, samples, **settings):
    model = copy.deepcopy(policy.model)
    trainer = PolicyTrainer(model, policy.tokenizer, UpdateSettings(lr=1e-2, grad_clip=0.0, **settings))
    stats = trainer.update(samples)
    return torch.cat([p.grad.flatten() for p in model.parameters()]), stats


CALL = "```python\nprint(6*7)\n```\n```output"


def test_the_mask_lines_up_with_the_tool_tokens(random_policy):
    tok = random_policy.tokenizer
    long = episode(tok, [(CALL, False), ("\n42\n```\n", True), ("A:42", False)])
    short = episode(tok, [("A:", False), ("\n1\n", True)])
    _, mask, _ = completion_logprobs(random_policy.model, [long, short], tok.pad_token_id, 1.0, entropy=False)
    width = len(long.completion_ids)
    assert mask.shape == (2, width)
    assert mask[0].tolist() == [0.0 if t else 1.0 for t in long.tool_mask]
    pad = width - len(short.completion_ids)
    assert mask[1].tolist() == [0.0] * pad + [0.0 if t else 1.0 for t in short.tool_mask]
    assert long.model_tokens == len(long.completion_ids) - len("\n42\n```\n")
    with pytest.raises(ValueError, match="tool_mask"):
        TrainSample([1], [5, 6], [0.0, 0.0], 1.0, [True])


def test_an_observations_tokens_add_nothing_to_the_gradient(random_policy):
    """An episode that ends in its observation: other observation tokens and other placeholders at their
    positions give exactly the same gradients and statistics, with every loss term on."""
    tok = random_policy.tokenizer
    first = [episode(tok, [(CALL, False), ("\n42\n```\n", True)], 1.0),
             episode(tok, [("A:7", False)], -0.5)]
    other = [episode(tok, [(CALL, False), ("\n99\n```\n", True)], 1.0, placeholder=-40.0), first[1]]
    grads_a, stats_a = update_grads(random_policy, first, **FULL)
    grads_b, stats_b = update_grads(random_policy, other, **FULL)
    assert torch.equal(grads_a, grads_b)
    assert stats_a == stats_b
    unmasked = [TrainSample(s.prompt_ids, s.completion_ids, s.rollout_logprobs, s.advantage) for s in other]
    assert not torch.equal(update_grads(random_policy, unmasked, **FULL)[0], grads_b)  # the mask is what did it


def test_observations_in_the_middle_are_context_for_the_model_tokens_after_them(random_policy):
    """One step, token-mean: the gradient is -A/n times the sum of d log pi over the model's tokens only, each
    computed on the whole episode (observation included) as context."""
    tok = random_policy.tokenizer
    sample = episode(tok, [(CALL, False), ("\n42\n```\n", True), ("A:42", False)], advantage=0.7)
    grads, _ = update_grads(random_policy, [sample])
    model = copy.deepcopy(random_policy.model).train()
    whole = TrainSample(sample.prompt_ids, sample.completion_ids, sample.rollout_logprobs, sample.advantage)
    logprobs, _ = sequence_logprobs(model, [whole], tok.pad_token_id, 1.0)
    written = torch.tensor([not t for t in sample.tool_mask])
    (-sample.advantage * logprobs[0][written].sum() / written.sum()).backward()
    expected = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert torch.allclose(grads, expected, atol=1e-6, rtol=1e-5)
    # and the context matters: another observation changes the model tokens' gradient after it
    changed = episode(tok, [(CALL, False), ("\n99\n```\n", True), ("A:42", False)], advantage=0.7)
    assert not torch.allclose(update_grads(random_policy, [changed])[0], grads, atol=1e-6)


def test_without_observations_the_update_is_todays(random_policy):
    tok = random_policy.tokenizer
    plain = [TrainSample(tok("Q:1+1=?")["input_ids"], ids(tok, "A:2"), [-1.0] * 3, 1.0),
             TrainSample(tok("Q:2+2=?")["input_ids"], ids(tok, "A:44"), [-2.0] * 4, -1.0)]
    all_model = [TrainSample(s.prompt_ids, s.completion_ids, s.rollout_logprobs, s.advantage,
                             [False] * len(s.completion_ids)) for s in plain]
    grads_a, stats_a = update_grads(random_policy, plain, **FULL)
    grads_b, stats_b = update_grads(random_policy, all_model, **FULL)
    assert torch.equal(grads_a, grads_b) and stats_a == stats_b
