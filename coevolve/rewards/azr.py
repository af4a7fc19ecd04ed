"""Absolute Zero's rewards (arXiv 2505.03335, §3.1): the proposer's learnability, the format-aware composite, and the
``<think>``/``<answer>`` format rule of the authors' code.

Small pure functions on plain values, tested against hand-computed cases (tests/rewards/test_rewards_azr.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

WRONG = -0.5  # Eq. 6: a well-formatted response that is wrong
FORMAT_ERROR = -1.0  # Eq. 6: a response with formatting errors


def learnability(solved: Sequence[bool | float]) -> float:
    """r_propose (Eq. 4) from the solver's n Monte Carlo rollouts on the task: 1 - mean success, and 0 when the mean
    is 0 (unsolvable) or 1 (trivial). No rollouts: 0."""
    if not solved:
        return 0.0
    rate = sum(float(s) for s in solved) / len(solved)
    return 0.0 if rate in (0.0, 1.0) else 1.0 - rate


def proposer_reward(valid: bool, r_propose: float, trivial: float = WRONG) -> float:
    """The proposer's composite reward (Eq. 6). A proposal that is not a valid task has a formatting error (§3.1:
    only responses that produce valid triplets count as correctly formatted): -1. A valid task gets r_propose when
    it is positive; when it is 0 (every rollout solved it or none did), ``trivial``: -0.5 in the authors' code
    (``CodeIORewardManager``: a zero accuracy reward is "wrong but well-formatted"), 0 in a literal reading of Eq. 6
    (a valid proposal is passable and gets its r_propose)."""
    if not valid:
        return FORMAT_ERROR
    return r_propose if r_propose > 0 else trivial


def solver_reward(formatted: bool, correct: bool) -> float:
    """The solver's composite reward (Eq. 5, 6): 1 for a correct answer, -0.5 for a readable wrong one, -1 when no
    answer could be read."""
    if not formatted:
        return FORMAT_ERROR
    return 1.0 if correct else WRONG


def think_answer_format(completion: str) -> bool:
    """Whether a completion that follows R1-Zero's prompt (which ends in ``<think>``) is well formatted as in the
    authors' code (``get_format_reward``, extraction ``answer_*``): the reasoning closed by ``</think>``, then
    ``<answer>...</answer>``, from the start of the completion."""
    return re.match(r"<think>.*?</think>\s*<answer>.*?</answer>", ("<think>" + completion).strip().strip("\"'"),
                    re.DOTALL) is not None


def tagged_answer(completion: str) -> str:
    """The answer of a completion as the code reads it (``extract_answer``): the text after the last ``<answer>`` up
    to ``</answer>``, stripped; empty when there is no ``<answer>``."""
    if "<answer>" not in completion:
        return ""
    return completion.split("<answer>")[-1].split("</answer>")[0].strip()
