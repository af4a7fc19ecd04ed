"""The questioner reward stages alone, against hand-computed values (R-Zero's and Prism's formulas)."""

from __future__ import annotations

import pytest

from coevolve.rewards.questioner import (
    QuestionReward,
    ScoredQuestion,
    agent0_rewards,
    prism_rewards,
    repetition_penalties,
    rzero_rewards,
    tool_rewards,
    uncertainties,
)

BATCH = [ScoredQuestion("1+2", 0.5), ScoredQuestion("1+2", 0.25), ScoredQuestion("7*8-9", 0.9),
         ScoredQuestion(None, None)]


def test_uncertainty_peaks_at_one_half_and_is_zero_unscored():
    assert uncertainties(BATCH) == pytest.approx([1.0, 0.5, 0.2, 0.0])


def test_repetition_penalty_is_the_share_of_the_batch_in_each_cluster():
    # the two copies of "1+2" share a cluster (BLEU distance 0); "7*8-9" and the empty bad-format output are apart
    assert repetition_penalties(BATCH, 0.5, "char", 1.0) == pytest.approx([0.5, 0.5, 0.25, 0.25])
    assert repetition_penalties(BATCH, 0.5, "char", 0.0) == [0.0] * 4


def test_rzero_rewards_in_the_papers_and_the_codes_form():
    penalties = [0.5, 0.5, 0.25, 0.25]
    paper = rzero_rewards(BATCH, penalties, "paper")  # max(0, r_unc - r_rep), 0 for a bad format
    assert [r.reward for r in paper] == pytest.approx([0.5, 0.0, 0.0, 0.0])
    assert paper[0] == QuestionReward(0.5, {"uncertainty": 1.0, "repetition": 0.5})
    code = rzero_rewards(BATCH, penalties, "code")  # min(p, 1 - p) - r_rep, -1 - r_rep for a bad format
    assert [r.reward for r in code] == pytest.approx([0.0, -0.25, -0.15, -1.25])
    with pytest.raises(ValueError):
        rzero_rewards(BATCH, penalties[:2], "paper")  # one penalty per question


def test_prism_rewards_gate_by_the_zpd_and_add_the_rarity_bonus():
    rarities = [0.5, 0.0, 0.2, 0.0]
    gated = prism_rewards(BATCH, rarities, [0.5, 0.9], lam=5.0)
    # zpd(p) = max(0, 1 - |p - 0.75| / 0.4) on [0.5, 0.9]: 0.375 at 0.5, 0 outside the band, 0.625 at 0.9
    assert [r.reward for r in gated] == pytest.approx([0.375 * 3.5, 0.0, 0.625 * 2.0, -1.0])
    assert gated[2].terms == pytest.approx({"zpd": 0.625, "rarity": 0.2})
    band_only = prism_rewards(BATCH, rarities, [0.5, 0.9], lam=5.0, gate=False)  # the band's indicator
    assert [r.reward for r in band_only] == pytest.approx([3.5, 0.0, 2.0, -1.0])


def test_agent0_stages_by_hand():
    """Agent0's R_tool = 0.05 min(N, 4) averaged over a task's counts, and R_C in both forms on BATCH (p 0.5, 0.25,
    0.9, bad; R_unc 1, 0.5, 0.2, 0) with r_rep [0.5, 0.5, 0.25, 0.25]."""
    tools = tool_rewards([[1, 3], [0], [9, 4, 0], []], 0.05, 4)
    assert tools == pytest.approx([0.1, 0.0, (0.2 + 0.2 + 0.0) / 3, 0.0])
    penalties = [0.5, 0.5, 0.25, 0.25]
    paper = agent0_rewards(BATCH, penalties, tools, "paper")
    assert [r.reward for r in paper] == pytest.approx([0.6, 0.0, 0.2 + 0.4 / 3 - 0.25, 0.0])
    assert paper[0].terms == pytest.approx({"uncertainty": 1.0, "repetition": 0.5, "tool": 0.1})
    code = agent0_rewards(BATCH, penalties, tools, "code")  # min(p, 1-p) - r_rep + r_tool; bad: -1 - r_rep
    assert [r.reward for r in code] == pytest.approx([0.1, -0.25, 0.1 - 0.25 + 0.4 / 3, -1.25])
