"""policy_loss against hand-computed values on a 2x3 batch."""

from __future__ import annotations

import math

import pytest
import torch

from coevolve.rl.losses import AGG_MODES, k3_kl, policy_loss

# Two sequences, three positions; the second sequence has two completion tokens (position 2 is padding).
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADV = torch.tensor([1.0, -1.0])
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -1.0, -3.0]], dtype=torch.float64)
# Ratios rho = exp(logp - old):
#   seq 0 (A = +1): [1.0, 1.5, 0.7]   1.5 > 1 + 0.2 with A > 0 -> clipped at 1.2; 0.7 < 0.8 but A > 0 -> not clipped
#   seq 1 (A = -1): [0.5, 1.3, pad]   0.5 < 1 - 0.2 with A < 0 -> clipped at 0.8; 1.3 > 1.2 but A < 0 -> not clipped
RATIOS = torch.tensor([[1.0, 1.5, 0.7], [0.5, 1.3, 1.0]], dtype=torch.float64)
# Per-token loss -min(rho*A, clip(rho)*A):
#   clipped (eps 0.2/0.2): seq 0 [-1, -1.2, -0.7] (sum -2.9);  seq 1 [0.8, 1.3] (sum 2.1)
#   unclipped:             seq 0 [-1, -1.5, -0.7] (sum -3.2);  seq 1 [0.5, 1.3] (sum 1.8)
EXPECTED = {
    # seq_mean:       (-2.9/3 + 2.1/2) / 2 = 0.0416667      (-3.2/3 + 1.8/2) / 2 = -0.0833333
    # token_sum_norm: (-2.9/3 + 2.1/3) / 2 = -0.1333333     (-3.2/3 + 1.8/3) / 2 = -0.2333333
    # token_mean:     (-2.9 + 2.1) / 5 = -0.16               (-3.2 + 1.8) / 5 = -0.28
    "seq_mean": (0.0416667, -0.0833333),
    "token_sum_norm": (-0.1333333, -0.2333333),
    "token_mean": (-0.16, -0.28),
}


def _logp() -> torch.Tensor:
    return (OLD + torch.log(RATIOS)).clone().requires_grad_(True)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_loss_values_with_and_without_clipping(agg):
    clipped, unclipped = EXPECTED[agg]
    loss, stats = policy_loss(_logp(), OLD, ADV, MASK, agg=agg)
    assert loss.item() == pytest.approx(clipped, abs=1e-6)
    # A clip range wide enough that nothing clips gives the plain surrogate -rho*A.
    loss_wide, stats_wide = policy_loss(_logp(), OLD, ADV, MASK, clip_low=0.9, clip_high=10.0, agg=agg)
    assert loss_wide.item() == pytest.approx(unclipped, abs=1e-6)
    # mean ratio over the 5 completion tokens: (1 + 1.5 + 0.7 + 0.5 + 1.3) / 5 = 1.0
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["clip_frac_high"] == pytest.approx(1 / 5)
    assert stats["clip_frac_low"] == pytest.approx(1 / 5)
    assert stats_wide["clip_frac_high"] == 0.0 and stats_wide["clip_frac_low"] == 0.0
    assert stats["n_tokens"] == 5.0 and stats["n_sequences"] == 2.0
    assert stats["nonfinite"] is False
    assert all(isinstance(v, (float, bool)) for v in stats.values())


def test_token_sum_norm_constant():
    # C = 10: (-2.9/10 + 2.1/10) / 2 = -0.04.  C = 1 (sequence log-likelihood): (-2.9 + 2.1) / 2 = -0.4
    loss, _ = policy_loss(_logp(), OLD, ADV, MASK, agg="token_sum_norm", norm_constant=10)
    assert loss.item() == pytest.approx(-0.04, abs=1e-7)
    loss, _ = policy_loss(_logp(), OLD, ADV, MASK, agg="token_sum_norm", norm_constant=1)
    assert loss.item() == pytest.approx(-0.4, abs=1e-7)


def test_clip_higher():
    # clip_high 0.28 (DAPO): seq 0 token 1 clips at 1.28 instead of 1.2 -> token_mean (-2.98 + 2.1) / 5 = -0.176
    loss, stats = policy_loss(_logp(), OLD, ADV, MASK, clip_low=0.2, clip_high=0.28, agg="token_mean")
    assert loss.item() == pytest.approx(-0.176, abs=1e-7)
    assert stats["clip_frac_high"] == pytest.approx(1 / 5)
    # The loss above is symmetric in the two bounds (rho 1.5 with A > 0 and 0.5 with A < 0 both clip); the gradient
    # is not. Range [0.8, 1.6]: rho = 1.5 keeps its gradient, rho = 0.5 (A < 0) is below the range and loses it.
    # d loss / d logp = -rho A / 5 on unclipped tokens: seq 0 [-0.2, -0.3, -0.14]; seq 1 [0, 0.26, pad]
    logp = _logp()
    loss, stats = policy_loss(logp, OLD, ADV, MASK, clip_low=0.2, clip_high=0.6, agg="token_mean")
    loss.backward()
    expected = torch.tensor([[-0.2, -0.3, -0.14], [0.0, 0.26, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected, atol=1e-7, rtol=0)
    assert stats["clip_frac_high"] == 0.0 and stats["clip_frac_low"] == pytest.approx(1 / 5)


def test_gradients_token_mean():
    # d loss / d logp = -rho*A / 5 on unclipped tokens, 0 on clipped tokens and padding:
    #   seq 0: [-1*1/5, 0 (clipped), -0.7*1/5] = [-0.2, 0, -0.14]
    #   seq 1: [0 (clipped), 1.3/5, 0 (pad)]   = [0, 0.26, 0]
    logp = _logp()
    loss, _ = policy_loss(logp, OLD, ADV, MASK, agg="token_mean")
    loss.backward()
    expected = torch.tensor([[-0.2, 0.0, -0.14], [0.0, 0.26, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected, atol=1e-7, rtol=0)


def test_token_advantages_broadcast_equivalence():
    adv_bt = ADV.unsqueeze(1).expand(2, 3).clone()
    for agg in AGG_MODES:
        a, _ = policy_loss(_logp(), OLD, ADV, MASK, agg=agg)
        b, _ = policy_loss(_logp(), OLD, adv_bt, MASK.bool(), agg=agg)
        assert a.item() == pytest.approx(b.item(), abs=1e-12)


def test_tis_weights():
    # rollout log-probs so that exp(old - rollout) = [[1, 3, 0.5], [1.5, 1, 1]]; cap 2 -> w = [[1, 2, 0.5], [1.5, 1]]
    raw = torch.tensor([[1.0, 3.0, 0.5], [1.5, 1.0, 1.0]], dtype=torch.float64)
    rollout = OLD - torch.log(raw)
    logp = _logp()
    loss, stats = policy_loss(logp, OLD, ADV, MASK, tis_cap=2.0, rollout_logprobs=rollout, agg="token_mean")
    # weighted clipped losses: seq 0 [-1, -2.4, -0.35]; seq 1 [1.2, 1.3] -> (-3.75 + 2.5) / 5 = -0.25
    assert loss.item() == pytest.approx(-0.25, abs=1e-7)
    assert stats["tis_clip_frac"] == pytest.approx(1 / 5)
    # mean weight (1 + 2 + 0.5 + 1.5 + 1) / 5 = 1.2
    assert stats["tis_weight_mean"] == pytest.approx(1.2)
    # The weight is detached: gradient = w * (unweighted gradient) = [[-0.2, 0, -0.07], [0, 0.26, 0]]
    loss.backward()
    expected = torch.tensor([[-0.2, 0.0, -0.07], [0.0, 0.26, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected, atol=1e-7, rtol=0)
    # Without a cap, rollout log-probs alone do not switch TIS on.
    plain, plain_stats = policy_loss(_logp(), OLD, ADV, MASK, rollout_logprobs=rollout, agg="token_mean")
    assert plain.item() == pytest.approx(-0.16, abs=1e-7) and plain_stats["tis_weight_mean"] == 1.0


def test_k3_kl_values():
    # d = ref - logp: k3 = e^d - d - 1
    #   d = ln 2 -> 2 - 0.6931472 - 1 = 0.3068528;  d = 0 -> 0;  d = -1 -> e^-1 + 1 - 1 = 0.3678794
    logp = torch.full((1, 3), -1.0, dtype=torch.float64)
    ref = logp + torch.tensor([[math.log(2.0), 0.0, -1.0]], dtype=torch.float64)
    torch.testing.assert_close(
        k3_kl(logp, ref), torch.tensor([[0.3068528, 0.0, 0.3678794]], dtype=torch.float64), atol=1e-7, rtol=0
    )


def test_kl_term_in_loss():
    # A = 0 and rho = 1 isolate the KL: token_mean of beta * k3 = 0.1 * (0.3068528 + 0 + 0.3678794) / 3 = 0.0224911
    logp = torch.full((1, 3), -1.0, dtype=torch.float64, requires_grad=True)
    ref = logp.detach() + torch.tensor([[math.log(2.0), 0.0, -1.0]], dtype=torch.float64)
    loss, stats = policy_loss(
        logp, logp.detach(), torch.zeros(1), torch.ones(1, 3), ref_logprobs=ref, beta=0.1, agg="token_mean"
    )
    assert loss.item() == pytest.approx(0.0224911, abs=1e-7)
    assert stats["kl_mean"] == pytest.approx(0.2249107, abs=1e-7)
    # d k3 / d logp = 1 - e^d = [1 - 2, 0, 1 - e^-1] = [-1, 0, 0.6321206], times beta / 3
    loss.backward()
    expected = torch.tensor([[-1.0, 0.0, 0.6321206]], dtype=torch.float64) * 0.1 / 3
    torch.testing.assert_close(logp.grad, expected, atol=1e-8, rtol=0)
    # beta = 0 with a reference: KL is reported but not added.
    loss0, stats0 = policy_loss(logp, logp.detach(), torch.zeros(1), torch.ones(1, 3), ref_logprobs=ref)
    assert loss0.item() == 0.0 and stats0["kl_mean"] == pytest.approx(0.2249107, abs=1e-7)


def test_dual_clip():
    # A = -1, rho = 4: standard clipped loss max(4, 0.8) = 4; dual clip c = 3 caps it at 3, with zero gradient.
    old = torch.zeros(1, 2, dtype=torch.float64)
    logp = torch.log(torch.tensor([[4.0, 2.0]], dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([-1.0])
    loss, stats = policy_loss(logp, old, adv, torch.ones(1, 2), agg="token_mean")
    assert loss.item() == pytest.approx((4.0 + 2.0) / 2)
    loss, stats = policy_loss(logp, old, adv, torch.ones(1, 2), dual_clip=3.0, agg="token_mean")
    assert loss.item() == pytest.approx((3.0 + 2.0) / 2)
    assert stats["dual_clip_frac"] == pytest.approx(0.5)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 1.0]], dtype=torch.float64))


def test_dual_clip_leaves_positive_advantages_alone():
    """The cap is for A < 0 only: with A > 0 the loss and its gradient are plain clipped PPO's, at any ratio."""
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 4, generator=gen, dtype=torch.float64)
    logp = (old + 2 * torch.randn(3, 4, generator=gen, dtype=torch.float64)).requires_grad_(True)  # ratios 0.02-50
    adv, mask = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64), torch.ones(3, 4)
    plain, _ = policy_loss(logp, old, adv, mask, agg="token_mean")
    (plain_grad,) = torch.autograd.grad(plain, logp)
    dual, stats = policy_loss(logp, old, adv, mask, dual_clip=3.0, agg="token_mean")
    (dual_grad,) = torch.autograd.grad(dual, logp)
    assert dual.item() == pytest.approx(plain.item()) and stats["dual_clip_frac"] == 0.0
    torch.testing.assert_close(dual_grad, plain_grad)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_micro_batch_accumulation_matches_full_batch(agg):
    gen = torch.Generator().manual_seed(0)
    b, t = 6, 5
    old = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3
    base = old + 0.4 * torch.randn(b, t, generator=gen, dtype=torch.float64)
    ref = old + 0.3 * torch.randn(b, t, generator=gen, dtype=torch.float64)
    rollout = old + 0.5 * torch.randn(b, t, generator=gen, dtype=torch.float64)
    adv = torch.randn(b, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([5, 2, 4, 1, 3, 5])
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    kw = dict(agg=agg, tis_cap=2.0, rollout_logprobs=rollout, ref_logprobs=ref, beta=0.05, norm_constant=8)

    full_lp = base.clone().requires_grad_(True)
    full, _ = policy_loss(full_lp, old, adv, mask, **kw)
    full.backward()

    micro_lp = base.clone().requires_grad_(True)
    total, naive = 0.0, 0.0
    splits = (slice(0, 2), slice(2, 5), slice(5, 6))
    for rows in splits:
        args = (micro_lp[rows], old[rows], adv[rows], mask[rows])
        kw_micro = dict(kw, rollout_logprobs=rollout[rows], ref_logprobs=ref[rows])
        part, _ = policy_loss(*args, total_tokens=float(mask.sum()), total_sequences=b, **kw_micro)
        part.backward()
        total += part.item()
        naive += policy_loss(*args, **kw_micro)[0].item() / len(splits)
    assert total == pytest.approx(full.item(), abs=1e-12)
    torch.testing.assert_close(micro_lp.grad, full_lp.grad, atol=1e-12, rtol=0)
    if agg == "token_mean":
        # Averaging per-micro-batch token means is not the full-batch token mean (unequal token counts).
        assert naive != pytest.approx(full.item(), abs=1e-6)


def test_padding_garbage_is_ignored():
    # inf / NaN at padding positions must not reach the loss, the gradient or the flag.
    logp = _logp().detach().clone()
    logp[1, 2] = float("-inf")
    old = OLD.clone()
    old[1, 2] = float("nan")
    logp.requires_grad_(True)
    loss, stats = policy_loss(logp, old, ADV, MASK, agg="token_mean")
    assert loss.item() == pytest.approx(-0.16, abs=1e-7)
    loss.backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[1, 2] == 0.0
    assert stats["nonfinite"] is False


def test_nonfinite_inputs_are_flagged():
    logp = _logp().detach().clone()
    logp[0, 1] = float("nan")
    loss, stats = policy_loss(logp.requires_grad_(True), OLD, ADV, MASK)
    assert stats["nonfinite"] is True and not torch.isfinite(loss)
    _, stats = policy_loss(_logp(), OLD, torch.tensor([float("inf"), -1.0]), MASK)
    assert stats["nonfinite"] is True


def test_overflowed_ratio_with_finite_loss_is_flagged():
    # rho = exp(-1 - (-1000)) overflows to inf; with A > 0 the clipped branch wins, so the loss is finite
    # (-1.2 on that token) but exp's backward gives 0 * inf = NaN. The flag must catch it.
    logp = torch.tensor([[-1.0]], requires_grad=True)
    loss, stats = policy_loss(logp, torch.tensor([[-1000.0]]), torch.tensor([1.0]), torch.ones(1, 1))
    assert torch.isfinite(loss)
    loss.backward()
    assert not torch.isfinite(logp.grad).all()
    assert stats["nonfinite"] is True


def test_argument_validation():
    with pytest.raises(ValueError, match="unknown agg"):
        policy_loss(_logp(), OLD, ADV, MASK, agg="sum")
    with pytest.raises(ValueError, match="share shape"):
        policy_loss(_logp(), OLD[:, :2], ADV, MASK)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(_logp(), OLD, ADV, MASK, beta=0.1)
    with pytest.raises(ValueError, match="rollout_logprobs has shape"):
        policy_loss(_logp(), OLD, ADV, MASK, tis_cap=2.0, rollout_logprobs=OLD[:1])
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(_logp(), OLD, ADV, MASK, dual_clip=0.5)


# Entropies per token (position 2 of seq 1 is padding and holds a value that must not count).
ENTROPY = torch.tensor([[1.0, 2.0, 0.5], [3.0, 1.5, 99.0]], dtype=torch.float64)
# entropy_coef 0.1 subtracts 0.1 * H per token: seq 0 sum -0.35, seq 1 sum -0.45 (over its two tokens)
#   seq_mean:       0.0416667 + (-0.35/3 - 0.45/2) / 2 = 0.0416667 - 0.1708333 = -0.1291667
#   token_sum_norm: -0.1333333 + (-0.35/3 - 0.45/3) / 2 = -0.1333333 - 0.1333333 = -0.2666667
#   token_mean:     -0.16 + (-0.35 - 0.45) / 5 = -0.16 - 0.16 = -0.32
WITH_ENTROPY = {"seq_mean": -0.1291667, "token_sum_norm": -0.2666667, "token_mean": -0.32}


@pytest.mark.parametrize("agg", AGG_MODES)
def test_entropy_bonus_is_subtracted_with_the_loss_aggregation(agg):
    entropy = ENTROPY.clone().requires_grad_(True)
    loss, stats = policy_loss(_logp(), OLD, ADV, MASK, agg=agg, entropy=entropy, entropy_coef=0.1)
    assert loss.item() == pytest.approx(WITH_ENTROPY[agg], abs=1e-6)
    assert stats["entropy"] == pytest.approx((1.0 + 2.0 + 0.5 + 3.0 + 1.5) / 5)  # token mean, padding left out
    loss.backward()  # d loss / d H = -0.1 per token, weighted as the aggregation weighs it; 0 on padding
    weight = {"seq_mean": [[1 / 6] * 3, [1 / 4, 1 / 4, 0.0]], "token_sum_norm": [[1 / 6] * 3, [1 / 6, 1 / 6, 0.0]],
              "token_mean": [[1 / 5] * 3, [1 / 5, 1 / 5, 0.0]]}[agg]
    torch.testing.assert_close(entropy.grad, -0.1 * torch.tensor(weight, dtype=torch.float64), atol=1e-9, rtol=0)


def test_entropy_coef_zero_leaves_the_loss_bit_identical_and_only_reports_the_entropy():
    plain, plain_stats = policy_loss(_logp(), OLD, ADV, MASK, agg="token_mean")
    given, stats = policy_loss(_logp(), OLD, ADV, MASK, agg="token_mean", entropy=ENTROPY, entropy_coef=0.0)
    assert torch.equal(given, plain) and "entropy" not in plain_stats and stats["entropy"] == pytest.approx(1.6)
    with pytest.raises(ValueError, match="needs entropy"):
        policy_loss(_logp(), OLD, ADV, MASK, entropy_coef=0.01)
    bad = ENTROPY.clone()
    bad[0, 1] = math.nan
    assert policy_loss(_logp(), OLD, ADV, MASK, entropy=bad, entropy_coef=0.01)[1]["nonfinite"] is True


def test_kl_clamp_caps_each_tokens_k3_and_its_gradient():
    """verl's low_var_kl: k3 clamped per token (here at 0.5). d = ref - logp per token; k3 = e^d - d - 1:
    seq 0 [0, 1.982 -> 0.5, 0.368], seq 1 [4.389 -> 0.5, 0.149]; token_mean: -0.16 + 0.1 * sum / 5."""
    d = torch.tensor([[0.0, 1.5, -1.0], [2.0, 0.5, 0.0]], dtype=torch.float64)
    k3 = [[0.0, min(math.exp(1.5) - 2.5, 0.5), math.exp(-1.0)], [min(math.exp(2.0) - 3.0, 0.5), math.exp(0.5) - 1.5]]
    total = sum(map(sum, k3))
    logp = _logp()
    loss, stats = policy_loss(logp, OLD, ADV, MASK, ref_logprobs=(logp + d).detach(), beta=0.1, kl_clamp=0.5,
                              agg="token_mean")
    assert loss.item() == pytest.approx(-0.16 + 0.1 * total / 5, abs=1e-9)
    assert stats["kl_mean"] == pytest.approx(total / 5)
    loss.backward()
    # KL part of d loss / d logp: -0.1 (e^d - 1) / 5 on unclamped tokens, 0 on the two clamped ones; the policy part
    # is -rho A / 5 on unclipped tokens (seq 0 tokens 0 and 2, seq 1 token 1)
    pg = torch.tensor([[-1.0, 0.0, -0.7], [0.0, 1.3, 0.0]], dtype=torch.float64) / 5
    kl = -0.1 * torch.tensor([[0.0, 0.0, math.exp(-1.0) - 1], [0.0, math.exp(0.5) - 1, 0.0]], dtype=torch.float64) / 5
    torch.testing.assert_close(logp.grad, pg + kl, atol=1e-9, rtol=0)
    unclamped, _ = policy_loss(_logp(), OLD, ADV, MASK, ref_logprobs=(_logp() + d).detach(), beta=0.1,
                               agg="token_mean")
    assert unclamped.item() > loss.item() + 0.1 * 4 / 5  # 1.482 + 3.889 above the two caps


def test_a_per_sequence_upper_clip_bound_adpo():
    """ADPO (Agent0's compute_policy_loss_adpo): each sequence its own 1 + clip_high. Seq 0 (A = +1, ratio 1.5 at
    position 1) with clip_high 0.3 is clipped at 1.3, not 1.2: seq_mean (-(1 + 1.3 + 0.7)/3 + 2.1/2) / 2 = 0.025."""
    from coevolve.rl.losses import ambiguity_clip_high

    logp = (OLD + torch.log(RATIOS)).requires_grad_(True)
    highs = torch.tensor([0.3, 0.2], dtype=torch.float64)
    loss, stats = policy_loss(logp, OLD, ADV, MASK, clip_low=0.2, clip_high=highs)
    assert loss.item() == pytest.approx((-(1 + 1.3 + 0.7) / 3 + 2.1 / 2) / 2)
    assert stats["clip_frac_high"] == pytest.approx(1 / 5)  # 1.5 > 1.3 with A > 0: still clipped
    same, _ = policy_loss(logp, OLD, ADV, MASK, clip_low=0.2, clip_high=torch.tensor([0.2, 0.2], dtype=torch.float64))
    scalar, _ = policy_loss(logp, OLD, ADV, MASK, clip_low=0.2, clip_high=0.2)
    assert same.item() == pytest.approx(scalar.item(), abs=1e-12)
    wide, _ = policy_loss(logp, OLD, ADV, MASK, clip_low=0.2, clip_high=torch.tensor([0.6, 0.2], dtype=torch.float64))
    assert wide.item() == pytest.approx((-(1 + 1.5 + 0.7) / 3 + 2.1 / 2) / 2)  # 1.5 < 1.6: unclipped
    # the bound: clip + bonus * clamp((high - p) / (high - low), 0, 1), low 0.3, high 0.8, bonus 0.1 (the script's)
    assert [ambiguity_clip_high(p, 0.2, 0.3, 0.8, 0.1) for p in (0.1, 0.3, 0.55, 0.8, 0.9)] == pytest.approx(
        [0.3, 0.3, 0.25, 0.2, 0.2])
