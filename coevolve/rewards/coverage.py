r"""Prism's cluster-coverage reward (arXiv:2603.13309 §4.1-§4.2, eqs. 6-13, Algorithm 1).

- :func:`zpd_gate`: zpd(p) = max(0, 1 - |p - 0.75| / 0.4) inside [0.5, 0.9], 0 outside (eq. 11). The width is wider
  than the band, so the gate jumps from 0.375 / 0.625 to 0 at the band edges (kept as the paper writes it).
- :class:`CoverageCounts`: the persistent visit counts n_k, initialised to alpha, updated per batch with
  n_k <- gamma n_k + (1 - gamma) m_k (eq. 6 / 13; no decay for a batch with no assigned question, as the code);
  the rarity bonus d(q) = exp(-n_c(q) / mean_k n_k) (eq. 10) read from the counts *before* the batch's update.
- :func:`prism_reward`: r = zpd(p) (1 + lambda d) (eq. 12), -1 for an output that fails the format check.
- :func:`reference_questions` / :func:`cluster_space_for`: the offline partition (§4.1): a reference corpus embedded,
  K-Means with K clusters, centroids saved once under ``$COEVOLVE_CACHE/cluster_spaces`` and reused by every run
  on the same corpus, K, seed and encoder.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from coevolve.data.benchmarks import load_benchmark
from coevolve.embeddings import META_FILE, ClusterSpace, corpus_hash, embed, encoder_name
from coevolve.rewards.uncertainty import in_band

ReferenceCorpus = Literal["arith", "math_minus_math500", "gsm8k_train", "math_minus_math500_gsm8k_train"]
FORMAT_PENALTY = -1.0  # reward of an output without a question (and, for free-form math, a boxed answer)


def zpd_gate(p: float, peak: float = 0.75, width: float = 0.4, low: float = 0.5, high: float = 0.9) -> float:
    """The ZPD gate g(p) = max(0, 1 - |p - peak| / width) on [low, high] (inclusive, with tolerance), else 0."""
    if not in_band(p, low, high):
        return 0.0
    return max(0.0, 1.0 - abs(p - peak) / width)


def rarity_bonus(counts: np.ndarray, ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """d(q) = exp(-n_c(q) / n_bar), n_bar = mean_k n_k (guarded at 1e-8), for each cluster id (eq. 10)."""
    counts = np.asarray(counts, dtype=np.float64)
    mean = max(float(counts.mean()), 1e-8)
    return np.exp(-counts[np.asarray(ids, dtype=np.int64)] / mean)


def prism_reward(p: float | None, rarity: float, lam: float, gate: float | None = None) -> float:
    """Prism's questioner reward r = zpd(p) (1 + lambda d) (eq. 12); ``p=None`` (bad format) gives -1.

    ``gate`` overrides zpd(p) (the no-ZPD-gate ablation passes the band indicator).
    """
    if p is None:
        return FORMAT_PENALTY
    g = zpd_gate(p) if gate is None else gate
    return g * (1.0 + lam * rarity)


class CoverageCounts:
    """Prism's EMA visit counts n in R^K (Algorithm 1 lines 1, 17), carried across steps, iterations and resumes."""

    def __init__(self, k: int, gamma: float = 0.99, alpha: float = 1.0):
        if k < 1 or not 0.0 < gamma < 1.0 or alpha <= 0:
            raise ValueError(f"need k >= 1, 0 < gamma < 1 and alpha > 0, got {k}, {gamma}, {alpha}")
        self.gamma, self.alpha = gamma, alpha
        self.counts: np.ndarray = np.full(k, alpha, dtype=np.float64)
        self.updates = 0  # batches that changed the counts

    def rarity(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """d for each cluster id from the current counts (call before :meth:`update` of the same batch)."""
        return rarity_bonus(self.counts, ids)

    def update(self, ids: Sequence[int] | np.ndarray) -> None:
        """Decay every n_k once by gamma, then add 1 - gamma per assigned question; nothing for an empty batch."""
        if len(ids) == 0:
            return
        self.counts *= self.gamma
        np.add.at(self.counts, np.asarray(ids, dtype=np.int64), 1.0 - self.gamma)
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: the counts and the number of updates."""
        return {"counts": self.counts.tolist(), "updates": self.updates}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (K must match)."""
        counts = np.asarray(state["counts"], dtype=np.float64)
        if counts.shape != self.counts.shape:
            raise ValueError(f"saved counts have K={counts.size}, this run has K={self.counts.size}")
        self.counts, self.updates = counts, int(state["updates"])


# -- the offline cluster space ----------------------------------------------------------------------


def _text_key(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def reference_questions(corpus: ReferenceCorpus, *, data_dir: str | None = None, n_arith: int = 2000,
                        seed: int = 42) -> tuple[list[str], dict[str, Any]]:
    """The questions of a reference corpus and what was checked about them.

    ``arith``: ``n_arith`` generated questions, levels 1-6 uniformly. ``math_minus_math500``: the MATH
    test problems whose text (whitespace collapsed) is not a MATH-500 problem (the paper's "MATH training split" is
    not available offline; this is the paper's MATH training split restricted to the test file). ``gsm8k_train``:
    GSM8K train. ``math_minus_math500_gsm8k_train``: both, the closest offline stand-in for the released code's
    corpus, MATH train plus GSM8K train (``cluster_space/download_corpus.py``): 4,500 MATH problems instead of 7,500.
    """
    if corpus == "arith":
        from coevolve.tasks import arith

        problems = arith.sample_problems(n_arith, random.Random(seed), levels=arith.LEVELS)
        return [p.question for p in problems], {"corpus": corpus, "n": n_arith, "levels": list(arith.LEVELS)}
    if corpus == "gsm8k_train":
        texts = [item.question for item in load_benchmark("gsm8k_train", data_dir=data_dir)]
        return texts, {"corpus": corpus, "n": len(texts)}
    if corpus == "math_minus_math500_gsm8k_train":
        math, math_info = reference_questions("math_minus_math500", data_dir=data_dir)
        gsm8k, _ = reference_questions("gsm8k_train", data_dir=data_dir)
        return math + gsm8k, {**math_info, "corpus": corpus, "n": len(math) + len(gsm8k), "gsm8k_train": len(gsm8k)}
    if corpus == "math_minus_math500":
        held_out = {_text_key(item.question) for item in load_benchmark("math500", data_dir=data_dir)}
        full = [item.question for item in load_benchmark("math", data_dir=data_dir)]
        texts = [q for q in full if _text_key(q) not in held_out]
        return texts, {"corpus": corpus, "n": len(texts), "math_test": len(full), "math500": len(held_out),
                       "overlap_by_text": len(full) - len(texts)}
    raise ValueError(f"unknown reference corpus {corpus!r}")


def default_space_root() -> Path:
    """Where cluster spaces live: ``$COEVOLVE_CACHE/cluster_spaces``, else ``~/.cache/coevolve/cluster_spaces``."""
    root = os.environ.get("COEVOLVE_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "coevolve") / "cluster_spaces"


def cluster_space_for(corpus: ReferenceCorpus, k: int, *, seed: int = 42, encoder: str | None = None,
                      data_dir: str | None = None, root: str | Path | None = None) -> tuple[ClusterSpace, Path]:
    """The fixed partition of ``corpus`` into ``k`` clusters: loaded from its folder, or built and saved once.

    The folder name holds the corpus name, K, the seed, the encoder and the corpus hash, so a changed corpus or
    encoder builds a new space and every run on the same inputs measures coverage in the same one.
    """
    texts, info = reference_questions(corpus, data_dir=data_dir, seed=seed)
    name = encoder_name(encoder)
    folder = Path(root or default_space_root()) / f"{corpus}-k{k}-seed{seed}-{name}-{corpus_hash(texts)[:12]}"
    if (folder / META_FILE).is_file():
        return ClusterSpace.load(folder), folder
    space = ClusterSpace.build(texts, k, seed, encoder=name, embed_fn=lambda t: embed(t, path=encoder), info=info)
    space.save(folder)
    return space, folder

