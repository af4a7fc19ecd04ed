"""PolicyTrainer.update against the loss built by hand on the same batch: what the KL term, the TIS weights, the
sampling temperature, gradient clipping, each clip bound and the entropy bonus do to the gradient."""

from __future__ import annotations

import copy

import pytest
import torch

from coevolve.rl.trainer import PolicyTrainer, TrainSample, UpdateSettings

PROMPTS = ["Q:3+4=?\n", "Q:12*(3-5)+7=?\n", "W:\n", "D:a=3,b=7\nQ:a+b=?\n"]
ADVANTAGES = (1.0, -0.5, 2.0, -1.0, 0.5, 1.5, -2.0, -0.3)


def batch(policy) -> list[TrainSample]:
    """Eight fixed completions of 3 to 10 random tokens (two per prompt) with mixed-sign advantages."""
    gen = torch.Generator().manual_seed(0)
    prompts = [policy.tokenizer(p)["input_ids"] for p in PROMPTS]
    return [TrainSample(prompts[k % 4], torch.randint(3, 100, (3 + (5 * k) % 8,), generator=gen).tolist(), [], a)
            for k, a in enumerate(ADVANTAGES)]


def hand_logprobs(model, samples: list[TrainSample], temperature: float) -> list[torch.Tensor]:
    """Each completion's token log-probs from one unpadded forward pass per sequence, at ``temperature``."""
    return [lp for lp, _ in hand_logprobs_entropy(model, samples, temperature)]


def hand_logprobs_entropy(model, samples: list[TrainSample],
                          temperature: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each completion's token log-probs and entropies -sum_v p_v log p_v of the whole next-token distribution."""
    out = []
    for s in samples:
        logits = model(input_ids=torch.tensor([s.prompt_ids + s.completion_ids])).logits[0].float() / temperature
        log_p = logits[len(s.prompt_ids) - 1:-1].log_softmax(-1)
        out.append((log_p.gather(-1, torch.tensor(s.completion_ids)[:, None])[:, 0], -(log_p.exp() * log_p).sum(-1)))
    return out


def hand_gradient(model, samples: list[TrainSample], *, old: list[torch.Tensor], temperature: float = 1.0,
                  clip: tuple[float, float] = (0.2, 0.2), ref: list[torch.Tensor] | None = None, beta: float = 0.0,
                  rollout: list[torch.Tensor] | None = None, tis_cap: float | None = None,
                  entropy_coef: float = 0.0) -> torch.Tensor:
    """The flat gradient of the GRPO loss written out: per token -min(rho A, clip(rho) A), times min(pi_old /
    pi_rollout, cap), plus beta k3, minus entropy_coef H; mean over each sequence's tokens, then over sequences."""
    model.zero_grad(set_to_none=True)
    per_sequence = []
    for i, (s, (logp, entropy)) in enumerate(zip(samples, hand_logprobs_entropy(model, samples, temperature))):
        ratio = torch.exp(logp - old[i])
        token = -torch.minimum(ratio * s.advantage, ratio.clamp(1 - clip[0], 1 + clip[1]) * s.advantage)
        if tis_cap is not None:
            token = token * torch.exp(old[i] - rollout[i]).clamp(max=tis_cap)
        if beta:
            d = ref[i] - logp
            token = token + beta * (torch.exp(d) - d - 1)
        if entropy_coef:
            token = token - entropy_coef * entropy
        per_sequence.append(token.mean())
    torch.stack(per_sequence).mean().backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def perturb(model) -> None:
    """Move every weight by a fixed random amount (the same on every call), so the policy is not its reference."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))


def trained_gradient(model) -> torch.Tensor:
    """The gradient of the trainer's last optimizer step (left in ``.grad``, after clipping)."""
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def test_kl_tis_temperature_and_grad_clip_reach_the_step_as_the_formula_says(random_policy):
    base, temperature, beta, cap = random_policy.model, 0.7, 0.5, 1.5
    samples = batch(random_policy)
    policy = copy.deepcopy(base)
    perturb(policy)
    with torch.no_grad():
        old = hand_logprobs(policy, samples, temperature)
        ref = hand_logprobs(base, samples, temperature)
    # Sampler log-probs off by a per-token amount: TIS weights exp(offset) = 0.67, 1.35 and 2.46 (capped at 1.5).
    offsets = [torch.tensor([(-0.4, 0.3, 0.9)[t % 3] for t in range(len(lp))]) for lp in old]
    rollout = [lp - o for lp, o in zip(old, offsets)]
    for s, r in zip(samples, rollout):
        s.rollout_logprobs = r.tolist()
    expected = hand_gradient(policy, samples, old=old, temperature=temperature, ref=ref, beta=beta, rollout=rollout,
                             tis_cap=cap)
    norm = float(expected.norm())
    for changed in (dict(beta=0.0), dict(tis_cap=None), dict(temperature=1.0)):  # each term matters here
        other = hand_gradient(policy, samples, **{**dict(old=old, temperature=temperature, ref=ref, beta=beta,
                                                         rollout=rollout, tis_cap=cap), **changed})
        assert float((other - expected).norm()) > 0.05 * norm, changed

    trainer = PolicyTrainer(base, random_policy.tokenizer, UpdateSettings(
        lr=1e-3, kl_beta=beta, tis_cap=cap, temperature=temperature, grad_clip=norm / 2, micro_batch_size=3))
    perturb(base)  # the trainer's reference is the weights it was given; its policy now the perturbed ones
    stats = trainer.update(samples)
    assert stats["optimizer_steps"] == 1 and stats["grad_norm"] == pytest.approx(norm, rel=1e-4)
    torch.testing.assert_close(trained_gradient(base), expected / 2, rtol=0, atol=1e-5 * norm)  # clipped to norm/2
    assert stats["tis_clip_frac"] == pytest.approx(sum(int((o > 0.5).sum()) for o in offsets) / sum(map(len, old)))


def test_each_clip_bound_acts_on_its_own_side(random_policy):
    """Two epochs of one step: the second step's ratios are pi / pi_old with pi_old the weights before the update.
    clip_low (0.02) caps how far a negative-advantage token's ratio may fall, clip_high (0.4) how far a positive one's
    may rise; the batch has tokens between the two bounds on both sides, so swapping them changes the gradient."""
    base, (low, high) = random_policy.model, (0.02, 0.4)
    samples = batch(random_policy)
    settings = dict(lr=2e-2, clip_low=low, clip_high=high, grad_clip=0.0, micro_batch_size=4)
    two = copy.deepcopy(base)
    PolicyTrainer(two, random_policy.tokenizer, UpdateSettings(epochs=2, **settings)).update(samples)
    one = copy.deepcopy(base)  # the weights between the two steps: the same first step alone
    PolicyTrainer(one, random_policy.tokenizer, UpdateSettings(epochs=1, **settings)).update(samples)
    with torch.no_grad():
        old = hand_logprobs(base, samples, 1.0)
        ratios = [torch.exp(lp - o) for lp, o in zip(hand_logprobs(one, samples, 1.0), old)]
    between = sum(int(((r > 1 + low) & (r < 1 + high)).sum()) if s.advantage > 0
                  else int(((r < 1 - low) & (r > 1 - high)).sum()) for s, r in zip(samples, ratios))
    assert between >= 3  # tokens the two bounds treat differently
    expected = hand_gradient(one, samples, old=old, clip=(low, high))
    norm = float(expected.norm())
    for other in ((high, low), (1.0, 1e9)):  # swapped bounds; no clipping at all
        assert float((hand_gradient(one, samples, old=old, clip=other) - expected).norm()) > 0.05 * norm, other
    torch.testing.assert_close(trained_gradient(two), expected, rtol=0, atol=1e-4 * norm)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_entropy_bonus_reaches_the_step_as_the_formula_says(random_policy, packed, monkeypatch):
    """entropy_coef 0.5 at temperature 0.7 over two epochs (the second step's pi_old differs from pi): the trainer's
    gradient is the hand-written loss minus 0.5 x each token's entropy, and it logs the token-mean entropy."""
    from coevolve.rl import trainer as trainer_module

    monkeypatch.setattr(trainer_module, "packs", lambda model, samples: packed)
    base, temperature, coef = random_policy.model, 0.7, 0.5
    samples = batch(random_policy)
    settings = dict(lr=1e-2, temperature=temperature, grad_clip=0.0, micro_batch_size=3, entropy_coef=coef)
    two = copy.deepcopy(base)
    stats = PolicyTrainer(two, random_policy.tokenizer, UpdateSettings(epochs=2, **settings)).update(samples)
    one = copy.deepcopy(base)
    PolicyTrainer(one, random_policy.tokenizer, UpdateSettings(epochs=1, **settings)).update(samples)
    with torch.no_grad():
        old = hand_logprobs(base, samples, temperature)
        first = hand_logprobs_entropy(base, samples, temperature)
        second = hand_logprobs_entropy(one, samples, temperature)
    expected = hand_gradient(one, samples, old=old, temperature=temperature, entropy_coef=coef)
    norm = float(expected.norm())
    without = hand_gradient(one, samples, old=old, temperature=temperature)
    assert float((without - expected).norm()) > 0.05 * norm  # the bonus matters here
    torch.testing.assert_close(trained_gradient(two), expected, rtol=0, atol=1e-4 * norm)
    tokens = sum(len(s.completion_ids) for s in samples)
    mean_entropy = [float(sum(h.sum() for _, h in step)) / tokens for step in (first, second)]
    assert stats["entropy"] == pytest.approx(sum(mean_entropy) / 2, rel=1e-5)  # the mean over the two steps


def test_entropy_coef_zero_computes_no_entropy(random_policy):
    samples = batch(random_policy)
    stats = PolicyTrainer(copy.deepcopy(random_policy.model), random_policy.tokenizer,
                          UpdateSettings(lr=1e-3)).update(samples)
    assert "entropy" not in stats and stats["optimizer_steps"] == 1
