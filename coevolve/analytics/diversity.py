"""Curriculum diversity measures: small pure functions on texts, embeddings and cluster counts.

Lexical: distinct-n and duplicate rate. Semantic: mean pairwise cosine distance. Coverage over a
fixed cluster space: Prism's Table 2 statistics (arXiv:2603.13309 §6.2) - active clusters, std,
entropy in bits, normalised entropy H/log2 K, Gini, top-10 share and the Lorenz curve.
Undefined values (an empty set, fewer than two items) are ``nan``.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from typing import Literal

import numpy as np

TokenUnit = Literal["word", "char"]

_WS = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """Text as compared for duplicates: Unicode NFKC, case-folded, whitespace runs collapsed, stripped."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def tokenize(text: str, unit: TokenUnit = "word") -> list[str]:
    """Tokens for distinct-n: ``"word"`` splits on whitespace; ``"char"`` takes every character
    after collapsing whitespace runs to one space (suits the arithmetic world, e.g. ``3+4*5=?``)."""
    if unit == "word":
        return text.split()
    if unit == "char":
        return list(_WS.sub(" ", text).strip())
    raise ValueError(f"unknown token unit {unit!r}; use 'word' or 'char'")


def distinct_n(texts: Sequence[str], n: int = 2, unit: TokenUnit = "word") -> float:
    """Distinct-n over a set of texts: #distinct n-grams / #n-grams, pooled over the set.

    N-grams never cross text boundaries; a text shorter than n contributes none. Case is kept.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    seen: set[tuple[str, ...]] = set()
    total = 0
    for text in texts:
        toks = tokenize(text, unit)
        grams = [tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)]
        total += len(grams)
        seen.update(grams)
    return len(seen) / total if total else math.nan


def duplicate_rate(texts: Sequence[str]) -> float:
    """Share of texts whose :func:`normalize_text` form already appeared earlier in the set."""
    if not texts:
        return math.nan
    return 1.0 - len({normalize_text(t) for t in texts}) / len(texts)


def mean_pairwise_distance(embeddings: np.ndarray) -> float:
    """Mean cosine distance ``1 - cos(e_i, e_j)`` over all unordered pairs i < j.

    Computed in O(n d) from the sum of the unit vectors: sum_{i<j} cos = (|sum e|^2 - n) / 2.
    """
    e = np.asarray(embeddings, dtype=np.float64)
    n = e.shape[0] if e.ndim == 2 else 0
    if n < 2:
        return math.nan
    unit = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    total = unit.sum(axis=0)
    sum_sq_norms = float((unit * unit).sum())
    mean_cos = (float(total @ total) - sum_sq_norms) / (n * (n - 1))
    return 1.0 - mean_cos


def _counts(counts: Sequence[int] | np.ndarray) -> np.ndarray:
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim != 1 or c.size == 0 or (c < 0).any():
        raise ValueError("counts must be a non-empty 1-D array of non-negative numbers (one per cluster)")
    return c


def entropy_bits(counts: Sequence[int] | np.ndarray) -> float:
    """Shannon entropy H = -sum_k pi_k log2 pi_k of the cluster distribution, in bits (0 log 0 = 0)."""
    c = _counts(counts)
    total = c.sum()
    if total == 0:
        return math.nan
    p = c[c > 0] / total
    return float(-(p * np.log2(p)).sum())


def gini(counts: Sequence[int] | np.ndarray) -> float:
    """Gini coefficient sum_i sum_j |c_i - c_j| / (2 K^2 mean(c)) over all K clusters, empty ones included."""
    c = np.sort(_counts(counts))
    k = c.size
    mean = c.mean()
    if mean == 0:
        return math.nan
    ranks = np.arange(1, k + 1)
    pair_sum = 2.0 * float(((2 * ranks - k - 1) * c).sum())  # = sum_i sum_j |c_i - c_j|
    return pair_sum / (2.0 * k * k * mean)


def top_share(counts: Sequence[int] | np.ndarray, m: float) -> float:
    """Share of all items held by the m most populated clusters.

    A fractional m counts that fraction of the next cluster (the Lorenz-curve reading), so
    ``top_share(c, 0.1 * K)`` is the share of the top 10% of clusters even when 0.1 K is not whole.
    """
    c = np.sort(_counts(counts))[::-1]
    total = c.sum()
    if total == 0:
        return math.nan
    m = min(max(m, 0.0), float(c.size))
    whole = int(math.floor(m))
    held = c[:whole].sum() + (c[whole] * (m - whole) if whole < c.size else 0.0)
    return float(held / total)


def lorenz_curve(counts: Sequence[int] | np.ndarray) -> tuple[list[float], list[float]]:
    """Lorenz curve: clusters sorted ascending by count; x = cumulative share of clusters,
    y = cumulative share of items; both start at 0 (K + 1 points)."""
    c = np.sort(_counts(counts))
    total = c.sum()
    x = np.arange(c.size + 1) / c.size
    y = np.concatenate([[0.0], np.cumsum(c) / total]) if total else np.full(c.size + 1, math.nan)
    return x.tolist(), y.tolist()


def cluster_stats(counts: Sequence[int] | np.ndarray) -> dict[str, float]:
    """Prism's curriculum-coverage statistics (Table 2) from the counts c_1..c_K of N questions.

    - ``active``: #{k : c_k > 0};
    - ``std``: population std of the counts;
    - ``entropy_bits`` and ``normalized_entropy`` = H / log2 K;
    - ``gini``: over all K clusters;
    - ``top10_share``: share held by the 10 most populated clusters (the paper's "Top-10 %");
    - ``top10pct_share``: share held by the most populated 10% of clusters (0.1 K of them).
    """
    c = _counts(counts)
    k = c.size
    h = entropy_bits(c)
    return {
        "n": float(c.sum()),
        "k": float(k),
        "active": float((c > 0).sum()),
        "std": float(c.std()),
        "entropy_bits": h,
        "normalized_entropy": h / math.log2(k) if k > 1 else math.nan,
        "gini": gini(c),
        "top10_share": top_share(c, 10),
        "top10pct_share": top_share(c, 0.1 * k),
    }
