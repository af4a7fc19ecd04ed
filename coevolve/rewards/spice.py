"""SPICE's rewards (arXiv:2510.24684, §3): the Reasoner's correctness and the Challenger's variance-shaped reward.

- Reasoner: r_R = 1[a ≡ a*], the answer checked against the Challenger's document-grounded answer a*.
- Challenger, for a valid task whose K Reasoner answers scored r_1..r_K in {0, 1}:
  r_C = exp(-(Var(r) - 0.25)^2 / (2 * 0.01)), Var the population variance p(1 - p) of the K scores (p their mean),
  so r_C = 1 at p = 1/2 (Var = 0.25, its maximum) and exp(-3.125) ≈ 0.044 at p = 0 or 1; an invalid task
  (unparseable, or without a usable answer) gets the penalty ρ = -0.1 instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

VARIANCE_TARGET = 0.25  # the variance of a 50% success rate, the maximum of p(1 - p)
VARIANCE_WIDTH = 0.01  # σ² of the Gaussian in Var
INVALID_PENALTY = -0.1  # ρ, the reward of an invalid task


def reasoner_reward(correct: bool) -> float:
    """r_R: 1 for an answer equivalent to the Challenger's a*, else 0."""
    return 1.0 if correct else 0.0


def success_variance(scores: Sequence[float]) -> float:
    """The population variance of the Reasoner's K scores: p(1 - p) for 0/1 scores with mean p."""
    if not scores:
        raise ValueError("success_variance needs at least one Reasoner score")
    p = math.fsum(scores) / len(scores)
    return math.fsum((s - p) ** 2 for s in scores) / len(scores)


def challenger_reward(scores: Sequence[float] | None, *, target: float = VARIANCE_TARGET,
                      width: float = VARIANCE_WIDTH, invalid: float = INVALID_PENALTY) -> float:
    """r_C: the Gaussian exp(-(Var - target)^2 / (2 width)) of the Reasoner's score variance for a valid task
    (``scores``: its K scores), ``invalid`` for an invalid one (``scores`` None)."""
    if scores is None:
        return invalid
    return math.exp(-(success_variance(scores) - target) ** 2 / (2 * width))
