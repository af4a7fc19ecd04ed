"""Advantage estimators against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from coevolve.rl.advantages import (
    ESTIMATORS,
    advantage_estimator,
    batch_norm_advantages,
    compute_advantages,
    decomposed_advantages,
    dr_grpo_advantages,
    dugrpo_advantages,
    grpo_advantages,
    nonzero_variance_mask,
)

EPS = 1e-6
# Three unequal groups, interleaved, with non-contiguous ids:
#   group 7: rewards [1, 2, 3]   mean 2, centred [-1, 0, 1], sum of squares 2
#            unbiased std sqrt(2/2) = 1,        population std sqrt(2/3) = 0.816497
#   group 3: rewards [0, 4]      mean 2, centred [-2, 2],   sum of squares 8
#            unbiased std sqrt(8/1) = 2*sqrt(2) = 2.828427, population std sqrt(8/2) = 2
#   group 5: rewards [5, 5, 5, 5] zero variance
REWARDS = [1.0, 0.0, 5.0, 2.0, 5.0, 4.0, 3.0, 5.0, 5.0]
GROUPS = [7, 3, 5, 7, 5, 3, 7, 5, 5]
G7 = [0, 3, 6]  # positions of each group's members
G3 = [1, 5]
G5 = [2, 4, 7, 8]
SQRT2 = math.sqrt(2.0)


def test_grpo_unbiased_std():
    a = grpo_advantages(REWARDS, GROUPS)
    assert a.dtype == np.float64
    # group 7: [-1, 0, 1] / (1 + eps)
    np.testing.assert_allclose(a[G7], np.array([-1.0, 0.0, 1.0]) / (1.0 + EPS), rtol=1e-12)
    # group 3: [-2, 2] / (2*sqrt(2) + eps) = +-0.7071066
    np.testing.assert_allclose(a[G3], np.array([-2.0, 2.0]) / (2 * SQRT2 + EPS), rtol=1e-12)
    np.testing.assert_allclose(a[G3], [-0.7071066, 0.7071066], atol=1e-6)
    # group 5: zero variance -> exactly 0
    assert np.all(a[G5] == 0.0)


def test_grpo_population_std():
    a = grpo_advantages(REWARDS, GROUPS, unbiased=False)
    # group 7: [-1, 0, 1] / 0.816497 = [-1.224745, 0, 1.224745]
    np.testing.assert_allclose(a[G7], [-1.2247449, 0.0, 1.2247449], atol=1e-5)
    # group 3: [-2, 2] / 2 = [-1, 1]
    np.testing.assert_allclose(a[G3], [-1.0, 1.0], atol=1e-5)
    assert np.all(a[G5] == 0.0)


def test_grpo_accepts_numpy_and_torch_inputs():
    ref = grpo_advantages(REWARDS, GROUPS)
    np.testing.assert_array_equal(grpo_advantages(np.array(REWARDS), np.array(GROUPS)), ref)
    out = grpo_advantages(torch.tensor(REWARDS, requires_grad=True), torch.tensor(GROUPS))
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    np.testing.assert_allclose(out, ref, rtol=1e-12)


def test_singleton_group_and_float_ties_give_exact_zero():
    # A group of one has std 0 under both conventions (not NaN from n - 1 = 0).
    a = grpo_advantages([3.0, 1.0, 2.0], [0, 1, 1])
    assert a[0] == 0.0
    # 0.1 * 3 / 3 != 0.1 in floating point; a tied group must still give exactly 0.
    b = grpo_advantages([0.1, 0.1, 0.1, 0.0, 1.0], [0, 0, 0, 1, 1])
    assert np.all(b[:3] == 0.0)
    assert np.all(dr_grpo_advantages([0.1, 0.1, 0.1], [0, 0, 0]) == 0.0)


def test_dr_grpo_is_mean_centred_only():
    a = dr_grpo_advantages(REWARDS, GROUPS)
    np.testing.assert_array_equal(a[G7], [-1.0, 0.0, 1.0])
    np.testing.assert_array_equal(a[G3], [-2.0, 2.0])
    np.testing.assert_array_equal(a[G5], [0.0, 0.0, 0.0, 0.0])


def test_dr_grpo_keeps_the_scale_of_a_wide_group():
    # rewards [0, 10, 20, 50]: mean 20, so r - mean = [-20, -10, 0, 30], exactly; the group's std is far from 1
    # (unbiased sqrt(1400 / 3) = 21.60, population sqrt(1400 / 4) = 18.71), so any std scaling lands near +-1 instead.
    # The other group, [1, 3, 8]: mean 4, centred [-3, -1, 4] (std 3.61).
    rewards, groups = [0.0, 1.0, 10.0, 3.0, 20.0, 50.0, 8.0], [0, 1, 0, 1, 0, 0, 1]
    expected = [-20.0, -3.0, -10.0, -1.0, 0.0, 30.0, 4.0]
    for unbiased in (True, False):
        np.testing.assert_array_equal(dr_grpo_advantages(rewards, groups, unbiased=unbiased), expected)
        np.testing.assert_array_equal(compute_advantages("dr_grpo", rewards, groups, eps=1e-4, unbiased=unbiased),
                                      expected)
    np.testing.assert_array_equal(dr_grpo_advantages(torch.tensor(rewards), torch.tensor(groups)), expected)
    # GRPO on the same group scales by the std: -20 / 21.602469 = -0.9258201, 30 / 21.602469 = 1.3887301
    np.testing.assert_allclose(grpo_advantages(rewards, groups)[[0, 5]], [-0.9258201, 1.3887301], atol=1e-6)


def test_dugrpo_values_and_sigma_b_over_nonzero_groups():
    # sigma_B = mean of the non-zero group stds = (1 + 2*sqrt(2)) / 2 = 1.9142136
    sigma_b = (1.0 + 2 * SQRT2) / 2
    a = dugrpo_advantages(REWARDS, GROUPS)
    # group 7: [-1, 0, 1] / (1 + 1.9142136 + eps) = [-0.3431458, 0, 0.3431458]
    np.testing.assert_allclose(a[G7], [-0.3431458, 0.0, 0.3431458], atol=1e-6)
    np.testing.assert_allclose(a[G7], np.array([-1.0, 0.0, 1.0]) / (1.0 + sigma_b + EPS), rtol=1e-12)
    # group 3: [-2, 2] / (2.8284271 + 1.9142136 + eps) = [-0.4217059, 0.4217059]
    np.testing.assert_allclose(a[G3], [-0.4217059, 0.4217059], atol=1e-6)
    assert np.all(a[G5] == 0.0)


def test_dugrpo_sigma_b_over_all_groups_option():
    # sigma_B = (1 + 2*sqrt(2) + 0) / 3 = 1.2761424
    a = dugrpo_advantages(REWARDS, GROUPS, include_zero_variance_in_sigma_b=True)
    # group 7: 1 / (1 + 1.2761424) = 0.4393398;  group 3: 2 / (2.8284271 + 1.2761424) = 0.4872625
    np.testing.assert_allclose(a[G7], [-0.4393398, 0.0, 0.4393398], atol=1e-6)
    np.testing.assert_allclose(a[G3], [-0.4872625, 0.4872625], atol=1e-6)


def test_dugrpo_within_group_spread_matches_spec():
    # INFUSER §4.11: std_d(A) = sigma_d / (sigma_d + sigma_B + eps), with the same (unbiased) std convention.
    a = dugrpo_advantages(REWARDS, GROUPS)
    sigma_b = (1.0 + 2 * SQRT2) / 2
    for members, sigma_d in ((G7, 1.0), (G3, 2 * SQRT2)):
        spread = np.std(a[members], ddof=1)
        assert spread == pytest.approx(sigma_d / (sigma_d + sigma_b + EPS), rel=1e-12)
    # At sigma_d = sigma_B the spread is 0.5: two groups with equal std -> sigma_B = sigma_d.
    b = dugrpo_advantages([0.0, 2.0, 5.0, 7.0], [0, 0, 1, 1], eps=0.0)
    assert np.std(b[:2], ddof=1) == pytest.approx(0.5)


def test_batch_norm_is_papers_mean_of_group_stds():
    # (r - mu_d) / (sigma_B + eps), sigma_B = 1.9142136:
    # group 7: +-1 / 1.9142136 = +-0.5224077;  group 3: +-2 / 1.9142136 = +-1.0448155
    a = batch_norm_advantages(REWARDS, GROUPS)
    np.testing.assert_allclose(a[G7], [-0.5224077, 0.0, 0.5224077], atol=1e-6)
    np.testing.assert_allclose(a[G3], [-1.0448155, 1.0448155], atol=1e-6)
    assert np.all(a[G5] == 0.0)


def test_all_groups_zero_variance():
    assert set(ESTIMATORS) >= {"grpo", "dr_grpo", "dugrpo", "batch_norm", "task_relative"}
    for kind in ESTIMATORS:
        assert np.all(compute_advantages(kind, [1.0, 1.0, 0.0, 0.0], [0, 0, 1, 1]) == 0.0)


def test_dispatcher_matches_functions_and_rejects_unknown():
    np.testing.assert_array_equal(compute_advantages("grpo", REWARDS, GROUPS), grpo_advantages(REWARDS, GROUPS))
    np.testing.assert_array_equal(
        compute_advantages("grpo", REWARDS, GROUPS, eps=1e-4, unbiased=False),
        grpo_advantages(REWARDS, GROUPS, eps=1e-4, unbiased=False),
    )
    np.testing.assert_array_equal(compute_advantages("dr_grpo", REWARDS, GROUPS), dr_grpo_advantages(REWARDS, GROUPS))
    np.testing.assert_array_equal(compute_advantages("dugrpo", REWARDS, GROUPS), dugrpo_advantages(REWARDS, GROUPS))
    np.testing.assert_array_equal(
        compute_advantages("batch_norm", REWARDS, GROUPS), batch_norm_advantages(REWARDS, GROUPS)
    )
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        compute_advantages("ppo", REWARDS, GROUPS)


def test_nonzero_variance_mask():
    mask = nonzero_variance_mask(REWARDS, GROUPS)
    assert mask.dtype == bool
    np.testing.assert_array_equal(mask, [True, True, False, True, False, True, True, False, False])
    assert not nonzero_variance_mask([0.1, 0.1, 0.1], [4, 4, 4]).any()


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="equal length"):
        grpo_advantages([1.0, 2.0], [0])
    with pytest.raises(ValueError, match="non-finite"):
        grpo_advantages([1.0, float("nan")], [0, 0])


def test_decomposed_two_terms():
    groups = [0, 0, 1, 1, 1]
    # term a: group 0 [1, 3] -> mean 2, std sqrt(2): z = [-0.7071068, 0.7071068]
    #         group 1 [0, 0, 6] -> mean 2, centred [-2, -2, 4], var 24/2 = 12, std 3.4641016:
    #         z = [-0.5773503, -0.5773503, 1.1547005]
    # term b: group 0 [2, 2] -> zero variance: [0, 0]
    #         group 1 [1, 2, 3] -> std 1: z = [-1, 0, 1]
    # A = 0.5 * z_a + 2 * z_b = [-0.3535534, 0.3535534, -2.2886751, -0.2886751, 2.5773503]
    terms = {"a": [1.0, 3.0, 0.0, 0.0, 6.0], "b": np.array([2.0, 2.0, 1.0, 2.0, 3.0])}
    a = decomposed_advantages(terms, {"a": 0.5, "b": 2.0}, groups)
    np.testing.assert_allclose(a, [-0.3535534, 0.3535534, -2.2886751, -0.2886751, 2.5773503], atol=1e-5)
    # Summing the raw rewards first and normalising once gives something else (spec §4.9).
    summed = grpo_advantages(0.5 * np.array(terms["a"]) + 2.0 * terms["b"], groups)
    assert not np.allclose(a, summed, atol=1e-3)


def test_decomposed_dynamic_rl_worked_example():
    # Dynamic RL spec §4.9 worked example: n = 4 questions in one group, lambda_q = 1e-3, lambda_dq = 0.1,
    # lambda_da = 1. R_dq = [6/13, 6/11, 1/2, 1] (1 / sum of question similarities), R_da = [1/2, 1, 1/2, 1].
    terms = {
        "q": [0.0, 1.0, 1.0 / 3.0, 0.0],
        "dq": [6 / 13, 6 / 11, 0.5, 1.0],
        "da": [0.5, 1.0, 0.5, 1.0],
    }
    weights = {"q": 1e-3, "dq": 0.1, "da": 1.0}
    groups = [0, 0, 0, 0]
    a = decomposed_advantages(terms, weights, groups)
    np.testing.assert_allclose(a, [-0.9325, 0.8351, -0.9165, 1.0139], atol=1e-4)
    a_pop = decomposed_advantages(terms, weights, groups, unbiased=False)
    np.testing.assert_allclose(a_pop, [-1.0768, 0.9643, -1.0583, 1.1708], atol=1e-4)
    # A_s for q2's solutions R_s = [1, 1, 1, 0] (lambda_s = 1): [0.5, 0.5, 0.5, -1.5]
    a_s = decomposed_advantages({"s": [1.0, 1.0, 1.0, 0.0]}, {"s": 1.0}, [0, 0, 0, 0])
    np.testing.assert_allclose(a_s, [0.5, 0.5, 0.5, -1.5], atol=1e-5)


def test_decomposed_key_mismatch_raises():
    with pytest.raises(ValueError, match="same keys"):
        decomposed_advantages({"a": [1.0, 2.0]}, {"b": 1.0}, [0, 0])
    with pytest.raises(ValueError, match="at least one"):
        decomposed_advantages({}, {}, [0, 0])


def test_an_estimator_registers_by_decorator_and_a_second_use_of_its_name_is_refused():
    @advantage_estimator("test_negated_grpo")
    def negated(rewards, groups, eps=1e-6, unbiased=True):
        return -grpo_advantages(rewards, groups, eps=eps, unbiased=unbiased)

    try:
        np.testing.assert_array_equal(compute_advantages("test_negated_grpo", REWARDS, GROUPS),
                                      -grpo_advantages(REWARDS, GROUPS))
        with pytest.raises(ValueError, match="'grpo' is registered twice"):
            advantage_estimator("grpo")(negated)
    finally:
        del ESTIMATORS["test_negated_grpo"]


def test_adpo_scaled_advantages_by_hand():
    """ADPO's advantage (Agent0's compute_adpo_outcome_advantage, the script's min_advantage_scale 0.6): the GRPO
    advantage of the executor's +-1 rewards times min_scale + (1 - min_scale) clamp((p - 0.3) / 0.5, 0, 1)."""
    from coevolve.rl.advantages import ambiguity_scale

    assert [ambiguity_scale(p, 0.3, 0.8, 0.6) for p in (0.1, 0.3, 0.55, 0.8, 1.0)] == pytest.approx(
        [0.6, 0.6, 0.8, 1.0, 1.0])
    # rewards [1, -1, -1, 1]: mean 0, sample std sqrt(4/3) = 1.1547, GRPO +-0.8660; at p = 0.55 (scale 0.8) +-0.6928
    scaled = grpo_advantages([1.0, -1.0, -1.0, 1.0], [0, 0, 0, 0]) * ambiguity_scale(0.55, 0.3, 0.8, 0.6)
    assert scaled == pytest.approx([0.69282, -0.69282, -0.69282, 0.69282], abs=1e-5)
