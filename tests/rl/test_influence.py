"""Influence scores against a brute force: explicit per-question gradients, explicit AdamW preconditioning."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch

from coevolve.rl import influence
from coevolve.rl.influence import dev_gradient, influence_scores, one_step_dev_gains, trainable
from coevolve.rl.trainer import PolicyTrainer, TrainSample, UpdateSettings

C = 16  # Dr.GRPO's constant


def make_samples(tokenizer, rng: random.Random, n_questions: int, n: int) -> list[list[TrainSample]]:
    """Groups of n rollouts per question: random completions of varied length, mean-centred 0/1 rewards."""
    vocab = [tokenizer.convert_tokens_to_ids(ch) for ch in "0123456789+-*=AS:"]
    groups = []
    for q in range(n_questions):
        prompt = tokenizer(f"Q:{q}+{q + 1}=?\n", add_special_tokens=False)["input_ids"]
        rewards = [float(rng.random() < 0.5) for _ in range(n - 1)]
        rewards.append(1.0 - rewards[0])  # never zero variance
        mean = sum(rewards) / n
        groups.append([TrainSample(prompt, [rng.choice(vocab) for _ in range(rng.randint(2, 9))], [], r - mean)
                       for r in rewards])
    return groups


def explicit_gradient(model, samples: list[TrainSample]) -> torch.Tensor:
    """Flattened gradient of -(1/n) sum_i A_i (1/C) sum_t log pi(x_it), each sequence in its own unpadded forward."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = 0.0
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1:-1].float()
        logp = logits.log_softmax(-1).gather(-1, torch.tensor(s.completion_ids)[:, None]).sum()
        total = total - s.advantage * logp / C
    grads = torch.autograd.grad(total / len(samples), params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def explicit_preconditioned(optimizer, params, g: torch.Tensor) -> torch.Tensor:
    """Gamma = g / (sqrt((b2 v + (1 - b2) g^2) / (1 - b2^(k+1))) + eps), v and k read from the optimizer state."""
    b2, eps = optimizer.param_groups[0]["betas"][1], optimizer.param_groups[0]["eps"]
    parts = []
    for p in params:
        state = optimizer.state.get(p, {})
        parts.append(state["exp_avg_sq"].reshape(-1) if state else torch.zeros(p.numel()))
        k = int(state["step"]) if state else 0
    v = torch.cat(parts)
    return g / (((b2 * v + (1 - b2) * g * g) / (1 - b2 ** (k + 1))).sqrt() + eps)


def cosine(u: torch.Tensor, v: torch.Tensor) -> float:
    return float(torch.dot(u.double(), v.double()) / (u.double().norm() * v.double().norm()))


@pytest.fixture
def setting(random_policy):
    torch.manual_seed(0)
    trainer = PolicyTrainer(random_policy.model, random_policy.tokenizer,
                            UpdateSettings(lr=1e-2, loss_agg="token_sum_norm", norm_constant=C, micro_batch_size=3,
                                           grad_clip=0.0))
    rng = random.Random(0)
    return trainer, make_samples(random_policy.tokenizer, rng, 3, 4), make_samples(random_policy.tokenizer, rng, 2, 4)


@pytest.mark.parametrize("warm_steps", [0, 3])
def test_scores_match_brute_force(setting, warm_steps, monkeypatch):
    trainer, questions, dev_groups = setting
    for k in range(warm_steps):  # real AdamW steps, so exp_avg_sq and step are live and non-trivial
        trainer.update([s for q in make_samples(trainer.tokenizer, random.Random(10 + k), 2, 4) for s in q])
    params = trainable(trainer)
    weights = [p.detach().clone() for p in params]
    state = copy.deepcopy(trainer.optimizer.state_dict())
    monkeypatch.setattr(influence, "CHUNK", 37)  # stream parameters in odd slices

    dev = dev_gradient(trainer, [s for g in dev_groups for s in g]).grads
    scores = influence_scores(trainer, questions, dev)
    sgd = influence_scores(trainer, questions, dev, precondition=False)

    reference = copy.deepcopy(trainer.model).train()
    dev_flat = torch.cat([d.reshape(-1) for d in dev])
    assert torch.allclose(dev_flat, explicit_gradient(reference, [s for g in dev_groups for s in g]), atol=1e-6)
    for q, score, plain in zip(questions, scores, sgd):
        g = explicit_gradient(reference, q)
        gamma = explicit_preconditioned(trainer.optimizer, params, g)
        assert score.score == pytest.approx(cosine(dev_flat, gamma), abs=2e-5)
        assert plain.score == pytest.approx(cosine(dev_flat, g), abs=2e-5)
        assert score.grad_norm == pytest.approx(float(g.norm()), rel=1e-4)
        if warm_steps == 0:  # empty state: Gamma = g / (|g| + eps), about sign(g)
            assert score.score == pytest.approx(cosine(dev_flat, torch.sign(g)), abs=1e-3)
    # the optimizer state is read, never changed; weights untouched; no gradient left behind
    assert all(torch.equal(w, p) for w, p in zip(weights, params))
    after = trainer.optimizer.state_dict()
    assert after["param_groups"] == state["param_groups"]
    for key, values in state["state"].items():
        assert all(torch.equal(values[name], after["state"][key][name]) for name in values)
    assert all(p.grad is None for p in params)


def test_zero_gradient_scores_zero(setting):
    trainer, questions, dev_groups = setting
    dev = dev_gradient(trainer, [s for g in dev_groups for s in g]).grads
    flat = [TrainSample(s.prompt_ids, s.completion_ids, [], 0.0) for s in questions[0]]  # zero advantages
    (result,) = influence_scores(trainer, [flat], dev)
    assert result.score == 0.0 and result.grad_norm == 0.0


def test_dev_gradient_halves_sum_to_the_whole_and_give_the_halves_cosine(setting):
    trainer, questions, dev_groups = setting
    first, second = [s for g in questions[:2] for s in g], [s for g in questions[2:] + dev_groups for s in g]
    whole = dev_gradient(trainer, first + second)
    split = dev_gradient(trainer, first, second)
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(whole.grads, split.grads))
    assert split.norm == pytest.approx(whole.norm, rel=1e-6) and math.isnan(whole.half_cosine)  # one half empty
    model = copy.deepcopy(trainer.model).train()
    assert split.half_cosine == pytest.approx(cosine(explicit_gradient(model, first), explicit_gradient(model, second)),
                                              abs=1e-5)
    assert all(p.grad is None for p in trainable(trainer))


def explicit_gain(trainer: PolicyTrainer, question: list[TrainSample], dev: list[TrainSample], rollouts: int) -> float:
    """(1/rollouts) sum_i A_i (pi'(a_i)/pi(a_i) - 1) with a deep-copied trainer, each sequence in its own forward."""
    def logprob(model, s):
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1:-1].double()
        return float(logits.log_softmax(-1).gather(-1, torch.tensor(s.completion_ids)[:, None]).sum())

    before = [logprob(trainer.model, s) for s in dev]
    twin = copy.deepcopy(trainer)
    twin.update(question)
    return sum(s.advantage * (torch.tensor(logprob(twin.model, s) - b).exp().item() - 1)
               for s, b in zip(dev, before)) / rollouts


def test_one_step_dev_gains_match_a_copied_trainer_and_restore_it(setting):
    trainer, questions, dev_groups = setting
    trainer.update([s for s in questions[0]])  # live optimizer state
    dev = [s for g in dev_groups for s in g]
    params = trainable(trainer)
    weights = [p.detach().clone() for p in params]
    state = copy.deepcopy(trainer.optimizer.state_dict())
    done = trainer.updates_done
    expected = [explicit_gain(trainer, q, dev, 10) for q in questions]
    gains = one_step_dev_gains(trainer, questions, dev, 10)
    assert gains == pytest.approx(expected, rel=1e-4, abs=1e-9) and len(set(gains)) == 3
    # training on the dev rollouts themselves raises the dev reward; with the advantages negated it lowers it
    (same,) = one_step_dev_gains(trainer, [dev], dev, 10)
    (negated,) = one_step_dev_gains(trainer, [[TrainSample(s.prompt_ids, s.completion_ids, [], -s.advantage)
                                                for s in dev]], dev, 10)
    assert same > 0 > negated
    assert all(torch.equal(w, p) for w, p in zip(weights, params)) and trainer.updates_done == done
    after = trainer.optimizer.state_dict()
    for key, values in state["state"].items():
        assert all(torch.equal(values[name], after["state"][key][name]) for name in values)
    assert all(p.grad is None for p in params)
