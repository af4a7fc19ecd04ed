"""OpenSIR's diversity and novelty scores (Eqs. 4, 5, 10) and its sample selection (Algorithm 1, lines 15-16).

Diversity of a new problem q against the pool P_{t-1} (OpenSIR §2.3.1, Eqs. 4 and 10), three variants:

- ``"min_pool"`` (paper, Eq. 4): min over the pool of the cosine distance 1 - cos(e_q, e_q'); in [0, 2].
- ``"top5_batch_and_pool"`` (released code): m = mean of the 5 largest cosine similarities of q to the
  other candidates of the same batch and to the pool; score (1 - m) / 2, in [0, 1].
- ``"concepts"`` (App. C.2, Eq. 10): (|C_q| - |C_q ∩ C_P|) / 3, the share of q's (at most 3) concept
  slots that are new to the pool; needs no encoder.

Embeddings are L2-normalised rows (as :func:`coevolve.embeddings.embed` returns them), so a dot
product is a cosine similarity.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from itertools import groupby
from typing import Literal

import numpy as np

from coevolve.pool import ProblemPool

DiversityMode = Literal["min_pool", "top5_batch_and_pool", "concepts"]
EmbedFn = Callable[[Sequence[str]], np.ndarray]

_NUMBER = re.compile(r"\d+")


def min_distance_diversity(candidates: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """Eq. 4: score_div(q) = min_{q' in P_{t-1}} (1 - cos(e_q, e_q')) for each candidate row."""
    if len(pool) == 0:
        raise ValueError("the pool has no embeddings")
    if len(candidates) == 0:
        return np.zeros(0)
    return 1.0 - (np.asarray(candidates, np.float64) @ np.asarray(pool, np.float64).T).max(axis=1)


def top_k_mean_diversity(candidates: np.ndarray, pool: np.ndarray, k: int = 5) -> np.ndarray:
    """The released code's diversity: (1 - m) / 2, m the mean of the k largest cosine similarities of each
    candidate to the other candidates (itself excluded) and to the pool (all of them when fewer than k)."""
    c = np.asarray(candidates, np.float64)
    if len(c) == 0:
        return np.zeros(0)
    batch = c @ c.T
    np.fill_diagonal(batch, -np.inf)
    sims = np.concatenate([batch, c @ np.asarray(pool, np.float64).reshape(-1, c.shape[1]).T], axis=1)
    n_neighbours = min(k, sims.shape[1] - 1)
    if n_neighbours < 1:
        raise ValueError("no other candidate and no pool problem to compare with")
    top = -np.sort(-sims, axis=1)[:, :n_neighbours]
    return (1.0 - top.mean(axis=1)) / 2.0


def concept_novelty(concepts: Sequence[str], pool_concepts: AbstractSet[str], max_concepts: int = 3) -> float:
    """Eq. 10: r_con(q) = (|C_q| - |C_q ∩ C_{P_{t-1}}|) / 3."""
    own = set(concepts)
    return (len(own) - len(own & pool_concepts)) / max_concepts


def expression_concepts(expression: str) -> tuple[str, ...]:
    """Three structural tags of an arithmetic expression, standing in for C_q where the writer emits no
    concept list (tiny-arith): its form with numbers as ``n`` (``form:(n+n)*n``), its operator set
    (``ops:*+``) and the digit count of its longest operand (``digits:2``)."""
    text = "".join(expression.split())
    operators = "".join(sorted({c for c in text if c in "+-*/"}))
    digits = max((len(m) for m in _NUMBER.findall(text)), default=0)
    return f"form:{_NUMBER.sub('n', text)}", f"ops:{operators}", f"digits:{digits}"


class PoolEmbeddings:
    """Cached embeddings e_q' of a growing pool, each computed once (OpenSIR caches them on insertion).

    Missing rows (after a restore) are embedded in the same batches they were first embedded in, one
    call per step that added them, so a resumed run reproduces the scores of an uninterrupted one.
    """

    def __init__(self, embed_fn: EmbedFn):
        self.embed_fn = embed_fn
        self._rows: list[np.ndarray] = []

    def matrix(self, pool: ProblemPool) -> np.ndarray:
        """Embeddings of every pool problem, oldest first (embedding the ones not cached yet)."""
        missing = pool.entries[len(self._rows):]
        for _, batch in groupby(missing, key=lambda e: e.step):
            self.append(self.embed_fn([e.text for e in batch]))
        return np.stack(self._rows) if self._rows else np.zeros((0, 0), np.float32)

    def append(self, vectors: np.ndarray) -> None:
        """Cache the embeddings of problems just added to the pool (in the order they were added)."""
        self._rows.extend(np.asarray(vectors, np.float32))

    def clear(self) -> None:
        """Forget every cached row (after the pool is replaced)."""
        self._rows = []


def novelty_score(sol: float, length: float, div: float, fmt: float, *, w_sol: float = 1.0, w_len: float = 1.0,
                  w_div: float = 1.0, w_fmt: float = 0.1) -> float:
    """Eq. 5: score_novel = alpha * score_sol + lambda * score_len + gamma * score_div + delta * score_fom^T."""
    return w_sol * sol + w_len * length + w_div * div + w_fmt * fmt


def group_variance(scores: Sequence[float], valid: Sequence[bool] | None = None) -> float:
    """Var_j of a teacher group's scores (population variance; Algorithm 1, line 15).

    With ``valid`` (the released code), only valid outputs count and a group without any scores -1.
    """
    values = list(scores) if valid is None else [s for s, ok in zip(scores, valid) if ok]
    return float(np.var(values)) if values else -1.0


def top_indices(scores: Sequence[float], n: int) -> list[int]:
    """Indices of the ``n`` largest scores, best first; ties go to the earlier index."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])[:max(n, 0)]
