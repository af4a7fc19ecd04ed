"""AZR's rewards and Task-Relative REINFORCE++ on worked examples computed by hand (arXiv 2505.03335, Eq. 4-8)."""

from __future__ import annotations

import numpy as np
import pytest

from coevolve.rewards.azr import (
    learnability,
    proposer_reward,
    solver_reward,
    tagged_answer,
    think_answer_format,
)
from coevolve.rl.advantages import compute_advantages, grpo_advantages, task_relative_advantages


def test_learnability_is_one_minus_the_solve_rate_and_zero_at_the_ends():
    assert learnability([True, False, False, False]) == 0.75  # 1 - 1/4
    assert learnability([1, 1, 1, 0, 0, 0, 0, 0]) == 0.625  # 1 - 3/8
    assert learnability([1, 1, 1, 1]) == 0.0  # trivial
    assert learnability([0, 0, 0, 0]) == 0.0  # unsolvable
    assert learnability([]) == 0.0


def test_format_aware_rewards():
    assert proposer_reward(False, 0.0) == -1.0  # not a valid task: a formatting error (§3.1)
    assert proposer_reward(True, 0.625) == 0.625
    assert proposer_reward(True, 0.0) == -0.5  # valid but trivial or unsolvable: the code's "wrong"
    assert proposer_reward(True, 0.0, trivial=0.0) == 0.0  # Eq. 6 read literally
    assert solver_reward(True, True) == 1.0
    assert solver_reward(True, False) == -0.5
    assert solver_reward(False, False) == -1.0


def test_task_relative_reinforce_has_one_baseline_per_task_type_and_role():
    # Six groups (3 task types x 2 roles), two samples each where the group varies. Group 0: rewards 1 and -0.5:
    # mean 0.25, sample std (n - 1) = 1.0607; advantages +-0.7071. Group 1 has one constant value: 0.
    rewards = [1.0, -0.5, 0.3, 0.3, -1.0, 0.5, -1.0, -1.0, 0.625, -0.5, 1.0, -1.0]
    groups = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    a = task_relative_advantages(rewards, groups)
    z = 1 / np.sqrt(2)  # (r - mean) / std for any two distinct values
    np.testing.assert_allclose(a, [z, -z, 0, 0, -z, z, 0, 0, z, -z, z, -z], atol=1e-5)
    np.testing.assert_allclose(compute_advantages("task_relative", rewards, groups), a)
    # one global baseline (REINFORCE++) differs: group 1's 0.3 rewards get a non-zero advantage there
    assert abs(grpo_advantages(rewards, [0] * len(rewards))[2]) > 0.01


def test_a_three_sample_group_by_hand():
    # rewards 1, -0.5, -0.5: mean 0, sample variance (1 + 0.25 + 0.25) / 2 = 0.75, std 0.8660
    a = task_relative_advantages([1.0, -0.5, -0.5], [7, 7, 7])
    np.testing.assert_allclose(a, [1 / 0.8660254, -0.5 / 0.8660254, -0.5 / 0.8660254], rtol=1e-5)


def test_the_codes_token_weighted_baseline():
    # Two sequences of 3 and 1 tokens with rewards 1 and -1, as verl whitens token-level returns: the token mean is
    # (3*1 - 1) / 4 = 0.5, the token variance (3*0.25 + 2.25) / (4 - 1) = 1.0, so advantages 0.5 and -1.5.
    a = task_relative_advantages([1.0, -1.0], [0, 0], weights=[3, 1])
    np.testing.assert_allclose(a, [0.5, -1.5], atol=1e-5)
    # equal weights are the per-sequence estimator with n - 1 counted over tokens: weights 1 give Eq. 8 exactly
    np.testing.assert_allclose(task_relative_advantages([1.0, -1.0, 0.5], [0, 0, 1], weights=[1, 1, 1]),
                               task_relative_advantages([1.0, -1.0, 0.5], [0, 0, 1]), atol=1e-9)
    with pytest.raises(ValueError):
        task_relative_advantages([1.0, 0.0], [0, 0], weights=[1, 0])


@pytest.mark.parametrize(("completion", "formatted", "answer"), [
    # the completion follows R1-Zero's prompt, which ends in "<think>"
    (" reason </think> <answer>```output\n3\n```</answer>", True, "```output\n3\n```"),
    ("r</think>\n\n<answer>5</answer> trailing text", True, "5"),  # matched from the start, not to the end
    ("reason <answer>5</answer>", False, "5"),  # no </think>: read (a proposal can join its buffer), scores -1
    ("r</think> x <answer>5</answer>", False, "5"),  # text between the parts
    ("r</think><answer>5", False, "5"),  # unclosed: read to the end, not well formatted
    ("r</think><answer>1</answer><answer>2</answer>", True, "2"),  # the last <answer> counts
    ("r</think>```output\n3\n```", False, ""),  # no tag: nothing is read
])
def test_the_codes_think_answer_format_and_tag_extraction(completion, formatted, answer):
    """get_format_reward and extract_answer of the code (extraction answer_conditional) on worked examples."""
    assert think_answer_format(completion) is formatted
    assert tagged_answer(completion) == answer
