"""TTRL's majority-vote reward (Zuo et al. 2025, arXiv:2504.16084, §3): the pseudo-label is the most frequent answer
among N samples of a question, and a sample's reward is 1 if its answer agrees with it, else 0.

- :func:`seeded_vote`: the vote of :func:`coevolve.grading.vote.majority_vote` (unparseable answers never form a
  class) with ties between the largest classes broken by a seeded draw, so that a tie does not always favour the answer
  sampled first and a run with the same seed breaks it the same way.
- :func:`vote_margin`: (support of the winner - support of the runner-up) / N, TTRL's confidence of the label.
- :func:`agreement_rewards`: the reward r(y_i, y*) = 1[y_i agrees with y*] of each sample.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from coevolve.grading.vote import Equivalence, VoteResult, majority_vote


def seeded_vote(answers: Sequence[str | None], seed: int, equivalent: Equivalence | None = None) -> VoteResult:
    """Majority vote over ``answers`` (None: unparseable, never a label); a tie between the largest classes goes to
    one of them drawn with ``random.Random(seed)``. No parseable answer: label None, every reward 0."""
    vote = majority_vote(answers, equivalent)
    sizes = Counter(c for c in vote.classes if c >= 0)
    if not sizes:
        return vote
    top = max(sizes.values())
    tied = sorted(c for c, size in sizes.items() if size == top)  # classes in order of first appearance
    best = tied[0] if len(tied) == 1 else random.Random(seed).choice(tied)
    label = answers[vote.classes.index(best)]
    return replace(vote, label=label, agree=[c == best for c in vote.classes])


def vote_margin(vote: VoteResult) -> float:
    """(winner's support - runner-up's support) / N; 0 for a tie or no parseable answer."""
    sizes = sorted(Counter(c for c in vote.classes if c >= 0).values(), reverse=True)
    if not sizes or vote.n == 0:
        return 0.0
    return (sizes[0] - (sizes[1] if len(sizes) > 1 else 0)) / vote.n


def agreement_rewards(vote: VoteResult, indices: Sequence[int]) -> list[float]:
    """TTRL's reward of the samples at ``indices``: 1.0 where the answer is in the majority class, else 0.0."""
    return [float(vote.agree[i]) for i in indices]
