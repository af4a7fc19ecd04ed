"""Accuracy metrics over sampled answers: pass@k (unbiased), avg@k and greedy accuracy."""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i), which never forms the large binomials
    (Chen et al., 2021, "Evaluating Large Language Models Trained on Code").
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def mean_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over questions; ``correct[q]`` holds the flags of question q's samples."""
    if not correct:
        raise ValueError("no questions")
    return sum(pass_at_k(len(flags), sum(map(bool, flags)), k) for flags in correct) / len(correct)


def avg_at_k(correct: Sequence[Sequence[bool]]) -> float:
    """avg@k: each question's share of correct samples, averaged over questions."""
    if not correct or any(not flags for flags in correct):
        raise ValueError("avg@k needs at least one sample for every question")
    return sum(sum(map(bool, flags)) / len(flags) for flags in correct) / len(correct)


def accuracy(flags: Sequence[bool]) -> float:
    """Share of correct answers (greedy accuracy when there is one greedy answer per question)."""
    if not flags:
        raise ValueError("no answers")
    return sum(map(bool, flags)) / len(flags)


def default_ks(n: int) -> list[int]:
    """The k reported for n samples: powers of two below n, and n itself."""
    ks = [1]
    while ks[-1] * 2 < n:
        ks.append(ks[-1] * 2)
    return ks if ks[-1] == n else ks + [n]
