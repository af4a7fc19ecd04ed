"""Majority vote over answer equivalence classes (Dynamic RL Eq. 4-5; OpenSIR's solve rate)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .equivalence import fast_equivalent, normalize_answer, verify_equivalent
from .guard import VOTE_OVER_BUDGET, count_bound

Equivalence = Callable[[str, str], bool]
# Seconds of slow comparisons one vote may start (math-verify's 5 s timeout per pair would let 8 distinct answers that
# each time out take 140 s).
VOTE_BUDGET_S = 10.0


@dataclass(frozen=True)
class VoteResult:
    """Outcome of a majority vote over ``n`` answers.

    label: first-seen member of the largest class (ties: the class that appeared first); None if no answer.
    support: size of that class (r(q) in Dynamic RL); 0 if no answer.
    n: number of answers, missing ones included.
    n_valid: number of non-missing answers.
    p: support / n (0.0 if n == 0); OpenSIR's code variant is support / n_valid.
    classes: class index per answer in order of first appearance, -1 for a missing answer.
    agree: whether each answer is in the majority class.
    """

    label: str | None
    support: int
    n: int
    n_valid: int
    p: float
    classes: list[int]
    agree: list[bool]


def majority_vote(answers: Sequence[str | None], equivalent: Equivalence | None = verify_equivalent,
                  budget_s: float = VOTE_BUDGET_S) -> VoteResult:
    """Group answers into equivalence classes and pick the largest.

    Each new answer is compared with one representative (the first member) per class: first with the
    exact fast path for every class, then with ``equivalent(answer, representative)`` only for the classes
    the fast path could not decide. ``equivalent=None`` uses the fast path alone. Answers that are None or
    empty after normalisation are missing: they never form or win a class.

    No slow comparison starts after ``budget_s`` seconds of the vote: the rest are decided by the fast path alone
    (undecided pairs count as different), and the vote counts once in ``bounds/vote_over_budget``. A vote so takes
    at most ``budget_s`` plus one comparison's timeout.
    """
    deadline = time.monotonic() + budget_s
    skipped_slow = False
    representatives: list[str] = []
    sizes: list[int] = []
    class_of_key: dict[str, int] = {}
    classes: list[int] = []
    for answer in answers:
        key = normalize_answer(answer) if answer is not None else ""
        if not key:
            classes.append(-1)
            continue
        if key not in class_of_key:
            found, skipped = _find_class(answer, representatives, equivalent, deadline)
            skipped_slow |= skipped
            if found is None:
                representatives.append(answer)
                sizes.append(0)
                found = len(sizes) - 1
            class_of_key[key] = found
        sizes[class_of_key[key]] += 1
        classes.append(class_of_key[key])

    if skipped_slow:
        count_bound(VOTE_OVER_BUDGET)
    n, n_valid = len(classes), sum(sizes)
    if not sizes:
        return VoteResult(None, 0, n, 0, 0.0, classes, [False] * n)
    best = max(range(len(sizes)), key=sizes.__getitem__)  # max keeps the first of equal sizes
    return VoteResult(
        label=representatives[best],
        support=sizes[best],
        n=n,
        n_valid=n_valid,
        p=sizes[best] / n,
        classes=classes,
        agree=[c == best for c in classes],
    )


def _find_class(answer: str, representatives: list[str], equivalent: Equivalence | None,
                deadline: float) -> tuple[int | None, bool]:
    """Index of the first class the answer belongs to, trying every fast verdict before any slow one (none after
    ``deadline``), and whether a slow comparison was skipped for the deadline."""
    undecided = []
    for index, representative in enumerate(representatives):
        verdict = fast_equivalent(answer, representative)
        if verdict:
            return index, False
        if verdict is None:
            undecided.append(index)
    if equivalent is not None:
        for index in undecided:
            if time.monotonic() >= deadline:
                return None, True
            if equivalent(answer, representatives[index]):
                return index, False
    return None, False
