"""SPICE's rewards against hand computation (arXiv:2510.24684 §3): r_R = 1[a ≡ a*];
r_C = exp(-(Var - 0.25)^2 / 0.02) for a valid task, ρ = -0.1 for an invalid one."""

from __future__ import annotations

import math

import pytest

from coevolve.rewards.spice import challenger_reward, reasoner_reward, success_variance


def test_reasoner_reward():
    assert reasoner_reward(True) == 1.0 and reasoner_reward(False) == 0.0


@pytest.mark.parametrize("correct, variance, reward", [
    (4, 0.25, 1.0),  # p = 1/2: the peak
    (2, 0.1875, math.exp(-0.0625 ** 2 / 0.02)),  # p = 1/4: (0.1875 - 0.25)^2 = 0.00390625; / 0.02 = 0.1953125
    (1, 0.109375, math.exp(-0.140625 ** 2 / 0.02)),  # p = 1/8: Var = 7/64; exp(-0.98876953125) = 0.372034...
    (0, 0.0, math.exp(-3.125)),  # p = 0: 0.25^2 / 0.02 = 3.125, r_C = 0.043937...
    (8, 0.0, math.exp(-3.125)),  # p = 1: as hard to learn from as p = 0
    (6, 0.1875, math.exp(-0.1953125)),  # p = 3/4 mirrors p = 1/4
])
def test_challenger_reward_over_eight_answers(correct, variance, reward):
    scores = [1.0] * correct + [0.0] * (8 - correct)
    assert success_variance(scores) == pytest.approx(variance)
    assert challenger_reward(scores) == pytest.approx(reward)


def test_challenger_reward_values_by_hand():
    assert challenger_reward([1, 0, 0, 0, 0, 0, 0, 0]) == pytest.approx(0.3720342, abs=1e-7)
    assert challenger_reward([1, 1, 0, 0, 0, 0, 0, 0]) == pytest.approx(0.8225776, abs=1e-7)
    assert challenger_reward([0, 0, 0, 0]) == pytest.approx(0.0439369, abs=1e-7)


def test_invalid_task_gets_the_penalty_and_constants_are_settings():
    assert challenger_reward(None) == -0.1
    assert challenger_reward(None, invalid=-0.5) == -0.5
    # a narrower Gaussian (σ² = 0.005) halves the exponent's denominator: exp(-0.0625^2 / 0.01)
    assert challenger_reward([1, 0, 0, 0], width=0.005) == pytest.approx(math.exp(-0.390625))
    assert challenger_reward([1, 0, 0, 0], target=0.1875) == 1.0  # centred at p = 1/4 instead


def test_success_variance_needs_scores():
    with pytest.raises(ValueError):
        success_variance([])
