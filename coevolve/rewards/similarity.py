"""Dynamic RL's diversity rewards (Eq. 9-12): R_d(x) = 1 / sum_k S(x, x_k) over the K objects of a batch, x included.

Because the sum includes S(x, x) = 1, R_d lies in [1/K, 1] and equals 1 exactly when x is similar to nothing else.

- Question diversity R_dq (Eq. 10) uses S_q (Eq. 11), the *positional* token-overlap ratio over the shorter length:
  tokens are compared at the same index (prefix-aligned), not as bags or n-grams. A strict prefix of another question
  has similarity 1; an empty question has similarity 0 with every other question (our convention for Eq. 10).
- Answer diversity R_da (Eq. 12) uses the answer equivalence S_a: 1 / (number of majority answers in the batch
  equivalent to this one). Missing labels (None) form one shared class (our reading), so questions without an
  answer penalise each other rather than each scoring 1.
- :func:`malformed_floor` (our reading, not the paper's): an output with no question gets the batch minimum of a
  diversity term; its empty text resembles nothing, so Eq. 10 would otherwise give it the largest R_dq of the batch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from coevolve.grading.equivalence import verify_equivalent
from coevolve.grading.vote import Equivalence, majority_vote


def token_overlap(a: Sequence[int], b: Sequence[int]) -> float:
    """S_q (Eq. 11): the share of positions j < min(|a|, |b|) with a[j] == b[j]; 0 if either sequence is empty."""
    length = min(len(a), len(b))
    if length == 0:
        return 0.0
    return sum(x == y for x, y in zip(a[:length], b[:length])) / length


def question_diversity(token_ids: Sequence[Sequence[int]]) -> list[float]:
    """R_dq (Eq. 10) of each question of a batch: 1 / (1 + sum over the other questions k of S_q(q_i, q_k)).

    The self term is S_q(q_i, q_i) = 1 by definition (also for an empty question); duplicates at other positions
    count fully.
    """
    n = len(token_ids)
    totals = [1.0] * n
    for i in range(n):
        for k in range(i + 1, n):
            s = token_overlap(token_ids[i], token_ids[k])
            totals[i] += s
            totals[k] += s
    return [1.0 / t for t in totals]


def answer_diversity(labels: Sequence[str | None], equivalent: Equivalence | None = verify_equivalent) -> list[float]:
    """R_da (Eq. 12) of each question: 1 / (number of labels in the batch equivalent to its label, itself included).

    Equivalence classes come from :func:`coevolve.grading.vote.majority_vote` (exact fast path, then ``equivalent``
    for undecided pairs; ``None`` = fast path only). None labels share one class.
    """
    classes = majority_vote(labels, equivalent).classes  # -1 for a missing label: the shared NONE class
    sizes = Counter(classes)
    return [1.0 / sizes[c] for c in classes]


def malformed_floor(values: Sequence[float], malformed: Sequence[bool]) -> list[float]:
    """A diversity term with each malformed output's value replaced by the minimum over the well-formed outputs.

    The paper does not say what a malformed output (no question) scores; by Eq. 10 its empty text overlaps nothing,
    so its R_dq would be the batch maximum and, z-scored, the largest question advantage. Flooring it (R_dq and R_da
    alike) ranks it last on diversity. With no well-formed output the values are returned unchanged.
    """
    if len(values) != len(malformed):
        raise ValueError(f"{len(values)} values for {len(malformed)} malformed flags")
    kept = [v for v, bad in zip(values, malformed) if not bad]
    if not kept:
        return list(values)
    floor = min(kept)
    return [floor if bad else v for v, bad in zip(values, malformed)]
