r"""R-Zero's questioner reward and solver-pool filter (arXiv:2508.05004, as Prism §3 describes it, and R-Zero's code).

- :func:`uncertainty_reward`: r_unc(q) = 1 - 2|p(q) - 1/2|, peaking at p = 1/2 (p = the solver's majority agreement).
- :func:`bleu_distance_matrix` / :func:`repetition_penalty`: pairwise distance d_ij = 1 - BLEU(q_i, q_j) over the
  step's batch (invalid outputs as empty strings), agglomerative clustering (precomputed metric, average linkage,
  distance threshold 0.5), r_rep(q_i) = |C(q_i)| / B.
- :func:`rzero_reward`: the composite, in the paper's form ``max(0, r_unc - r_rep)`` (0 for a bad format) or the
  released code's ``min(p, 1-p) - r_rep`` (``-1 - r_rep`` for a bad format).
- :func:`in_band` and :func:`pool_filter_reasons`: which labelled questions enter the solver's pool.

BLEU. R-Zero's code calls NLTK's ``sentence_bleu`` on whitespace tokens with smoothing method1 (a zero n-gram
precision becomes 0.1 / #n-grams), hypothesis q_i against reference q_j for i < j, the matrix filled symmetrically.
Here the maintained sacreBLEU computes it with the same floor smoothing (0.1) and ``effective_order``: identical for
questions of four or more tokens with a shared token; a shorter question averages only the n-gram orders it has
(NLTK floors the missing orders at 0.1, so two identical one-word questions score 0.18 there and 1.0 here), and a
pair with no shared token scores a floored small value instead of NLTK's 0. ``tokenize="char"`` (characters) is
for the arithmetic world, whose questions (``3+4*5``) contain no spaces.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

import numpy as np

BleuTokens = Literal["none", "char"]  # sacreBLEU tokenizers: whitespace split, or characters
RZeroForm = Literal["paper", "code"]
BAND_TOLERANCE = 1e-9  # p is a ratio such as 9/10 held as a float; band ends are inclusive

_ENGLISH_PROOF = re.compile(r"\bprove\b|\bshow that\b", re.IGNORECASE)


def uncertainty_reward(p: float) -> float:
    """R-Zero's uncertainty reward r_unc = 1 - 2|p - 1/2| (1 at p = 0.5, 0 at p = 0 and 1)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must lie in [0, 1], got {p}")
    return 1.0 - 2.0 * abs(p - 0.5)


def bleu_distance_matrix(texts: Sequence[str], tokenize: BleuTokens = "none") -> np.ndarray:
    """d_ij = 1 - BLEU(hypothesis q_i, reference q_j) for i < j, symmetric, zero diagonal (BLEU in [0, 1])."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(tokenize=tokenize, smooth_method="floor", smooth_value=0.1, effective_order=True)
    n = len(texts)
    dist = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            score = bleu.sentence_score(texts[i], [texts[j]]).score / 100.0 if texts[i] and texts[j] else 0.0
            dist[i, j] = dist[j, i] = 1.0 - min(max(score, 0.0), 1.0)
    return dist


def repetition_penalty(texts: Sequence[str], threshold: float = 0.5, tokenize: BleuTokens = "none",
                       weight: float = 1.0) -> np.ndarray:
    """r_rep(q_i) = weight * |C(q_i)| / B: C the BLEU-distance cluster of q_i, B = len(texts) (invalid = "")."""
    n = len(texts)
    if n == 0:
        return np.zeros(0)
    if n == 1:
        return np.full(1, weight)
    from sklearn.cluster import AgglomerativeClustering

    labels = AgglomerativeClustering(n_clusters=None, metric="precomputed", linkage="average",
                                     distance_threshold=threshold).fit_predict(bleu_distance_matrix(texts, tokenize))
    sizes = np.bincount(labels)
    return weight * sizes[labels] / n


def rzero_reward(p: float | None, penalty: float, form: RZeroForm = "paper") -> float:
    """The R-Zero challenger reward of one output; ``p=None`` means it failed the format check.

    ``paper``: max(0, r_unc - r_rep), 0 for a bad format. ``code``: min(p, 1-p) - r_rep (= r_unc/2 - r_rep),
    -1 - r_rep for a bad format.
    """
    if form == "paper":
        return 0.0 if p is None else max(0.0, uncertainty_reward(p) - penalty)
    if form == "code":
        return -1.0 - penalty if p is None else min(p, 1.0 - p) - penalty
    raise ValueError(f"form must be 'paper' or 'code', got {form!r}")


def in_band(p: float, low: float, high: float) -> bool:
    """low <= p <= high with a tolerance, so that a float 0.9 from 9/10 counts as inside [0.5, 0.9]."""
    return low - BAND_TOLERANCE <= p <= high + BAND_TOLERANCE


def pool_filter_reasons(question: str, label: str | None, english_proofs: bool = True) -> list[str]:
    """Why R-Zero's pool drops a labelled question: ``no_answer`` (no majority answer, or the string "None"),
    ``proof`` (the question contains "证明"; with ``english_proofs`` also "prove" / "show that", from
    R-Zero's paper, which neither released code applies), ``box`` (the question mentions a box) or ``text_answer`` (the
    answer contains "text"). The box and text checks ignore case: R-Zero's code lower-cases both strings first."""
    reasons = []
    if label is None or label.strip() in ("", "None"):
        reasons.append("no_answer")
    if "证明" in question or (english_proofs and _ENGLISH_PROOF.search(question)):
        reasons.append("proof")
    if "box" in question.lower():
        reasons.append("box")
    if label is not None and "text" in label.lower():
        reasons.append("text_answer")
    return reasons
