"""EVOL-RL's novelty reward and RESTRAIN's weighted, self-penalising advantages against hand computation."""

import math

import numpy as np
import pytest

from coevolve.rewards.label_free import (
    after_think,
    evol_rl_novelty,
    evol_rl_rewards,
    gaussian,
    pseudo_label_weights,
    restrain_advantages,
    weight_entropy,
)
from coevolve.rl.advantages import compute_advantages

# Five responses, three in the majority: unit rows, so the cosine similarities are S01 = 0.8, S12 = 0.6, S14 = 0.36,
# S24 = 0.6, S34 = 0.8 and 0 elsewhere.
E = np.array([[1, 0, 0], [0.8, 0.6, 0], [0, 1, 0], [0, 0, 1], [0, 0.6, 0.8]])
MAJORITY = [True, True, True, False, False]


def test_novelty_is_one_minus_half_the_group_mean_and_half_the_global_max():
    # u0 = 1 - (0.5 * mean(0.8, 0) + 0.5 * 0.8) = 0.4; u1 = 1 - (0.5 * 0.7 + 0.5 * 0.8) = 0.25;
    # u2 = 1 - (0.5 * 0.3 + 0.5 * 0.6) = 0.55; u3 = 1 - (0.5 * 0.8 + 0.5 * 0.8) = 0.2 = u4
    assert evol_rl_novelty(E, MAJORITY) == pytest.approx([0.4, 0.25, 0.55, 0.2, 0.2])


def test_majority_rewards_span_half_to_one_and_equal_minority_novelty_takes_the_midpoint():
    rewards, novelty = evol_rl_rewards(E, [True] * 5, MAJORITY)
    # majority: min-max of (0.4, 0.25, 0.55) = (0.5, 0, 1) -> 0.5 + 0.5 * that; minority: equal novelty -> -0.75
    assert rewards == pytest.approx([0.75, 0.5, 1.0, -0.75, -0.75])
    assert novelty == pytest.approx([0.4, 0.25, 0.55, 0.2, 0.2])


def test_an_invalid_answer_gets_minus_one_and_stays_out_of_the_novelty():
    # a sixth response identical to the first would raise the others' similarities if it counted
    rewards, novelty = evol_rl_rewards(np.vstack([E, E[:1]]), [True] * 5 + [False], MAJORITY + [False])
    assert rewards == pytest.approx([0.75, 0.5, 1.0, -0.75, -0.75, -1.0])
    assert np.isnan(novelty[5])


def test_a_lone_group_member_compares_with_everyone_and_gets_the_groups_top():
    e = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    # u0 = 1 - (0.5 * mean(0, 0.6) + 0.5 * 0.6) = 0.55 (alone in the majority)
    assert evol_rl_novelty(e, [True, False, False])[0] == pytest.approx(0.55)
    # the minority pair: u1 = u2 = 1 - (0.5 * 0.8 + 0.5 * 0.8) = 0.2, equal -> -0.75
    assert evol_rl_rewards(e, [True] * 3, [True, False, False])[0] == pytest.approx([1.0, -0.75, -0.75])
    assert evol_rl_rewards(e, [True] * 3, [True, True, False])[0][2] == pytest.approx(-0.5)


def test_fewer_than_two_valid_answers_leave_everyone_at_minus_one():
    e = np.eye(3)
    assert evol_rl_rewards(e, [True, False, False], [True, False, False])[0] == pytest.approx([-1.0] * 3)
    assert evol_rl_rewards(e, [False] * 3, [False] * 3)[0] == pytest.approx([-1.0] * 3)


def test_negative_similarity_is_clipped_to_zero():
    assert evol_rl_novelty(np.array([[1.0, 0.0], [-1.0, 0.0]]), [True, True]) == pytest.approx([1.0, 1.0])


def test_after_think_keeps_what_follows_the_first_think_end():
    assert after_think("<think>a</think> b </think> c") == "b </think> c"
    assert after_think("no tags") == "no tags"


def test_pseudo_label_weights_are_normalised_gaussians_of_the_vote_share():
    # f = (0.75, 0.25), k = 1, sigma = 0.5: g = (e^-0.125, e^-1.125), ratio e
    w = pseudo_label_weights([3, 1], 4, k=1.0, sigma=0.5)
    assert w == pytest.approx([1 / (1 + math.exp(-1)), 1 / (1 + math.exp(1))])
    assert gaussian(0.75, 1.0, 0.5) == pytest.approx(math.exp(-0.125))
    assert weight_entropy(w) == pytest.approx(-(w[0] * math.log(w[0]) + w[1] * math.log(w[1])))
    assert weight_entropy(np.array([1.0])) == 0.0


def _dr_grpo(r):
    return compute_advantages("dr_grpo", r, [0] * len(r))


def test_restrain_advantage_is_the_prompt_weighted_sum_over_candidate_labels():
    w0, w1 = 1 / (1 + math.exp(-1)), 1 / (1 + math.exp(1))
    adv, weights, penalised = restrain_advantages([0, 0, 0, 1], [3, 1], 4, k=1.0, sigma=0.5, kappa=3, delta=0.5,
                                                  prompt_weight=0.5, group_advantages=_dr_grpo)
    # a_0 as label: r = (1, 1, 1, 0), A = (0.25, 0.25, 0.25, -0.75); a_1: r = (0, 0, 0, 1), A = -(that)
    assert not penalised and weights == pytest.approx([w0, w1])
    assert adv == pytest.approx([0.5 * 0.25 * (w0 - w1)] * 3 + [0.5 * -0.75 * (w0 - w1)])


def test_a_low_consistency_question_gets_zero_reward_and_minus_delta():
    # M(x) = 3 < kappa = 4: every r~ = 0, so every A = 0, and A~ = -delta; sum_j w_j = 1, times u_x = 0.5
    adv, _, penalised = restrain_advantages([0, 0, 0, 1], [3, 1], 4, k=1.0, sigma=0.5, kappa=4, delta=0.5,
                                            prompt_weight=0.5, group_advantages=_dr_grpo)
    assert penalised and adv == pytest.approx([-0.25] * 4)


def test_an_unparseable_sample_matches_no_candidate():
    # counts over n = 4 votes (one unparseable): f = (0.5, 0.25); w0 / w1 = e^(0.625)
    w0 = 1 / (1 + math.exp(-0.625))
    adv, _, _ = restrain_advantages([0, 0, -1, 1], [2, 1], 4, k=1.0, sigma=0.5, kappa=0, delta=0.5,
                                    prompt_weight=1.0, group_advantages=_dr_grpo)
    # a_0: r = (1, 1, 0, 0), A = (0.5, 0.5, -0.5, -0.5); a_1: r = (0, 0, 0, 1), A = (-0.25, -0.25, -0.25, 0.75)
    assert adv[2] == pytest.approx(-0.5 * w0 - 0.25 * (1 - w0))
    assert adv[3] == pytest.approx(-0.5 * w0 + 0.75 * (1 - w0))


def test_no_candidate_gives_zero_advantages():
    adv, weights, penalised = restrain_advantages([-1, -1], [], 2, k=1.0, sigma=0.5, kappa=1, delta=0.5,
                                                  prompt_weight=1.0, group_advantages=_dr_grpo)
    assert adv == pytest.approx([0.0, 0.0]) and len(weights) == 0 and not penalised
