r"""A questioner's reward as stages: each a function of typed inputs to typed outputs, tested and reused alone.

    votes --(agreement p, the recipe's vote)--> ScoredQuestion --uncertainty--> r_unc
    questions of the batch --repetition_penalties--> r_rep       (R-Zero's BLEU clusters over the batch)
    (p, r_rep) --rzero_rewards--> QuestionReward                 (R-Zero's composite)
    (p, rarity d) --prism_rewards--> QuestionReward              (Prism's ZPD gate x (1 + lambda d))
    tool calls --tool_rewards--> r_tool                          (Agent0's gamma min(N_tool, C))
    (p, r_rep, r_tool) --agent0_rewards--> QuestionReward        (Agent0's composite)

A recipe composes the stages and owns the state some of them read (Prism's cluster counts give ``d``); a new
recipe reuses a stage with terms of its own (Agent0's curriculum reward is R-Zero's uncertainty and repetition
penalty plus a tool-use term).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from coevolve.rewards.coverage import prism_reward, zpd_gate
from coevolve.rewards.uncertainty import (
    BleuTokens,
    RZeroForm,
    in_band,
    repetition_penalty,
    rzero_reward,
    uncertainty_reward,
)


@dataclass(frozen=True)
class ScoredQuestion:
    """A questioner output as the reward stages see it: its question (None: a bad format) and the frozen solver's
    agreement with its majority answer, p (None: not scored)."""

    text: str | None
    p: float | None


@dataclass(frozen=True)
class QuestionReward:
    """The reward of one questioner output and the named terms it is made of (logged as ``reward_terms``)."""

    reward: float
    terms: dict[str, float] = field(default_factory=dict)


def uncertainties(questions: Sequence[ScoredQuestion]) -> list[float]:
    """r_unc = 1 - 2|p - 1/2| per question (0 for one without p)."""
    return [uncertainty_reward(q.p) if q.p is not None else 0.0 for q in questions]


def repetition_penalties(questions: Sequence[ScoredQuestion], threshold: float, tokens: BleuTokens,
                         weight: float) -> list[float]:
    """R-Zero's r_rep per question: ``weight`` x the share of the batch in its BLEU cluster (a bad format counts as
    the empty question)."""
    return [float(x) for x in repetition_penalty([q.text or "" for q in questions], threshold, tokens, weight)]


def rzero_rewards(questions: Sequence[ScoredQuestion], penalties: Sequence[float],
                  form: RZeroForm) -> list[QuestionReward]:
    """R-Zero's reward from p and r_rep (``form``: the paper's max(0, r_unc - r_rep) or the code's form)."""
    return [QuestionReward(rzero_reward(q.p, pen, form), {"uncertainty": unc, "repetition": pen})
            for q, unc, pen in zip(questions, uncertainties(questions), penalties, strict=True)]


def prism_rewards(questions: Sequence[ScoredQuestion], rarities: Sequence[float], band: Sequence[float], lam: float,
                  gate: bool = True) -> list[QuestionReward]:
    """Prism's r = zpd(p) (1 + lam d) inside ``band`` (0 outside, -1 for a bad format); ``gate`` false: the band's
    indicator replaces the ZPD gate (ablation). ``rarities``: each question's d (0 where none was assigned)."""
    low, high = band
    out = []
    for q, d in zip(questions, rarities, strict=True):
        g = None if q.p is None else (zpd_gate(q.p, low=low, high=high) if gate else float(in_band(q.p, low, high)))
        out.append(QuestionReward(prism_reward(q.p, d, lam, g), {"zpd": g or 0.0, "rarity": d}))
    return out


def tool_rewards(tool_calls: Sequence[Sequence[int]], weight: float, cap: int) -> list[float]:
    """Agent0's r_tool = ``weight`` x min(N_tool, ``cap``) per question, averaged over the question's counts (one
    count per executor episode, or the one count of the curriculum's own text; none: 0)."""
    return [sum(weight * min(n, cap) for n in calls) / len(calls) if calls else 0.0 for calls in tool_calls]


def agent0_rewards(questions: Sequence[ScoredQuestion], penalties: Sequence[float], tools: Sequence[float],
                   form: RZeroForm) -> list[QuestionReward]:
    """Agent0's curriculum reward from p, r_rep and r_tool: ``paper``, max(0, r_unc + r_tool - r_rep) (0 for a bad
    format); ``code`` (curriculum_reward.py's compute_score), R-Zero's code form plus r_tool: min(p, 1-p) - r_rep +
    r_tool, -1 - r_rep + r_tool for a bad format."""
    out = []
    for q, unc, pen, tool in zip(questions, uncertainties(questions), penalties, tools, strict=True):
        if form == "paper":
            reward = 0.0 if q.p is None else max(0.0, unc + tool - pen)
        else:
            reward = rzero_reward(q.p, pen, "code") + tool
        out.append(QuestionReward(reward, {"uncertainty": unc, "repetition": pen, "tool": tool}))
    return out
