r"""Prism: R-Zero's schedule with a cluster-coverage questioner reward and a Solver-initialised Questioner.

Paper: "Preventing Curriculum Collapse in Self-Evolving Reasoning Systems" (Mishra, arXiv:2603.13309, §4,
Algorithm 1). Offline, once per reference corpus: embed its questions, K-Means with K clusters, save
the L2-normalised centroids mu_k (reused by every later run). Then n_k <- alpha and, for each iteration t:

    4.     Q_t <- S_{t-1}, with a fresh optimizer (``questioner_init: previous_questioner`` is the ablation and the
           released loop's choice)
    5-6.   n carried over from the end of iteration t-1 (saved with every checkpoint; ``count_reset: iteration``
           resets it to alpha, as each questioner job of the released code starts afresh)
    8.     for each of the ``questioner_steps`` GRPO steps:
    9.       B_Q x G_Q questions from Q_t
    10.      p(q) from m_s samples of the frozen S_{t-1} (agreement with their majority answer)
    11-12.   every q with p(q) >= 0.5: c(q) = argmax_k <f(q), mu_k>
    13.      d(q) = exp(-n_c(q) / mean_k n_k), from the counts before this batch
    14.      r(q) = zpd(p) (1 + lambda d) inside [0.5, 0.9], 0 outside, -1 for a bad format
    16.      GRPO update of Q_t
    17.      n_k <- gamma n_k once, then + (1 - gamma) per assigned question
    20.    pool of N_pool questions from Q_t labelled by S_{t-1}, filtered to p in [0.5, 0.9] (``pool_band``; the
           released script's [0.49, 0.81] in ``reference_code``)
    21.    S_t from S_{t-1} by GRPO on the pool with majority-vote rewards (R-Zero's solver phase, unchanged)

Everything but lines 4 and 11-17 is :mod:`coevolve.recipes.r_zero`. The pool's questions are assigned too (logged as
``cluster`` in the ``pool`` sample rows: N_pool raw generations per iteration, the sample the coverage
statistics of §6.2 use); they do not touch n.

Tasks, paper vs released code, step structure, presets and ablations: ``docs/recipes/prism.md``.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field

from coevolve.analytics.diversity import cluster_stats
from coevolve.embeddings import ClusterSpace, embed
from coevolve.recipes.base import mean, register
from coevolve.recipes.r_zero import (
    PAPER_PARAMS,
    PAPER_SCALE,
    PRISM_CODE,
    PRISM_CODE_PARAMS,
    SMALL_TRAIN,
    Question,
    RZero,
    RZeroParams,
    give_rewards,
    scored_questions,
)
from coevolve.rewards.coverage import CoverageCounts, ReferenceCorpus, cluster_space_for
from coevolve.rewards.questioner import prism_rewards
from coevolve.rewards.uncertainty import in_band

# The reference corpus and K of the cluster space per task world, where params leave them unset: generated arithmetic
# questions with K = 32; the MATH test problems outside MATH-500 with the paper's K = 128.
CLUSTER_SPACES: dict[str, tuple[ReferenceCorpus, int]] = {"arith": ("arith", 32), "chat": ("math_minus_math500", 128)}


class PrismParams(RZeroParams):
    """R-Zero's schedule with Prism's band and initialisation, plus the coverage reward's settings."""

    band: list[float] = Field([0.5, 0.9], min_length=2, max_length=2,
                              description="the ZPD band (and the pool band unless pool_band is set)")
    questioner_init: Literal["previous_questioner", "solver"] = Field("solver", description="Q_t from S_{t-1}")
    lam: float = Field(5.0, ge=0, description="lambda, weight of the rarity bonus (0: no rarity bonus)")
    gamma: float = Field(0.99, gt=0, lt=1, description="EMA decay of the visit counts")
    alpha: float = Field(1.0, gt=0, description="initial visit count of every cluster")
    k: int | None = Field(None, gt=1, description="K clusters; default 32 for arith, 128 otherwise")
    reference_corpus: ReferenceCorpus | None = Field(
        None, description="corpus of the cluster space; default arith for the arith task, math_minus_math500 else")
    cluster_space: str | None = Field(None, description="folder of a saved cluster space (overrides the corpus)")
    encoder: str | None = Field(None, description="sentence-transformers folder; default: packaged all-MiniLM-L6-v2")
    zpd_gate: bool = Field(True, description="false: the band's indicator replaces the ZPD gate (ablation)")
    solvable: float = Field(0.5, ge=0, le=1, description="majority-vote threshold for cluster assignment")
    count_scope: Literal["solvable", "in_band", "all_valid"] = Field(
        "solvable", description="which questions are assigned and counted: p >= solvable, p in band, or all valid")
    count_reset: Literal["never", "iteration"] = Field(
        "never", description="n carried over from iteration to iteration (the paper) or reset to alpha at each "
        "iteration's questioner phase (the released code: each questioner job starts with fresh counts)")


@register
class Prism(RZero):
    name = "prism"
    summary = ("R-Zero's schedule; questioner reward zpd(p) * (1 + lambda * rarity of its embedding cluster) with "
               "persistent decayed cluster counts; questioner re-initialised from the solver each iteration")
    Params = PrismParams
    params: PrismParams
    presets = {
        "small": {"model": "tiny-arith", "task": "arith", "steps": 104, "eval_every": 26, "train": SMALL_TRAIN,
                  "params": {"gamma": 0.95}},
        "paper": {**PAPER_SCALE, "params": {**PAPER_PARAMS, "advantage": "dr_grpo", "k": 128,
                                             "reference_corpus": "math_minus_math500"}},
        "reference_code": {**PRISM_CODE, "params": {**PRISM_CODE_PARAMS, "k": 128,
                                                    "reference_corpus": "math_minus_math500_gsm8k_train",
                                                    "pool_band": [0.49, 0.81],
                                                    "questioner_init": "previous_questioner",
                                                    "count_reset": "iteration"}},
    }

    def __init__(self, config, params: PrismParams):
        super().__init__(config, params)
        if params.cluster_space:
            self.space = ClusterSpace.load(params.cluster_space)
        else:  # built once per corpus, K, seed and encoder; reused from the cache afterwards
            corpus, k = CLUSTER_SPACES[self.world]
            self.space, _ = cluster_space_for(params.reference_corpus or corpus, params.k or k,
                                              encoder=params.encoder, data_dir=config.data_dir)
        self.coverage = CoverageCounts(self.space.k, params.gamma, params.alpha)  # n_k <- alpha

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """f(q): L2-normalised sentence embeddings."""
        return embed(texts, path=self.params.encoder)

    def assign(self, questions: list[Question]) -> np.ndarray:
        """c(q) = argmax_k <f(q), mu_k> (eq. 9), stored on each question."""
        texts = [q.text for q in questions if q.text is not None]
        if len(texts) != len(questions):
            raise ValueError("only questions with a text are assigned a cluster")
        ids = self.space.assign(self.embed_texts(texts)) if questions else np.zeros(0, int)
        for q, c in zip(questions, ids):
            q.cluster = int(c)
        return ids

    def questioner_resets(self) -> tuple[str, ...]:
        """Lines 5-6 with ``count_reset: iteration``: n <- alpha at the questioner phase's start."""
        return ("coverage",) if self.params.count_reset == "iteration" else ()

    def reset_state(self, name: str) -> None:
        if name != "coverage":
            super().reset_state(name)
        self.coverage = CoverageCounts(self.space.k, self.params.gamma, self.params.alpha)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "coverage": self.coverage.state_dict()}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.coverage.load_state_dict(state["coverage"])

    # --- Algorithm 1, lines 11-17 -----------------------------------------------------------------
    def questioner_rewards(self, questions: list[Question]) -> dict[str, float]:
        p, band = self.params, self.params.band
        counted = [q for q in questions if q.p is not None and self.counts_towards_coverage(q.p)]
        counted_ids = {id(q) for q in counted}
        scored = [q for q in questions if q.p is not None and (in_band(q.p, *band) or id(q) in counted_ids)]
        ids = self.assign(scored)  # line 12
        rarity = dict(zip(map(id, scored), self.coverage.rarity(ids)))  # line 13, counts before this batch
        give_rewards(questions, prism_rewards(scored_questions(questions),  # line 14
                                              [float(rarity.get(id(q), 0.0)) for q in questions], band, p.lam,
                                              p.zpd_gate))
        # line 17, after the rewards (line 16 follows in step)
        self.coverage.update([int(c) for q, c in zip(scored, ids) if id(q) in counted_ids])
        d_values = [float(x) for x in rarity.values()]
        counts = self.coverage.counts
        return {"prism/assigned": len(counted), "prism/rarity_mean": mean(d_values),
                "prism/rarity_spread": max(d_values) - min(d_values) if d_values else float("nan"),
                "prism/count_max_over_mean": float(counts.max() / counts.mean()),
                "prism/step_clusters": len({q.cluster for q in counted})}

    def counts_towards_coverage(self, p: float) -> bool:
        """Whether a scored question is assigned and counted (``count_scope``)."""
        scope = self.params.count_scope
        if scope == "solvable":
            return p >= self.params.solvable - 1e-9
        return scope == "all_valid" or in_band(p, *self.params.band)

    # --- the pool's coverage (logged, never counted) ------------------------------------------------
    def describe_pool(self, candidates: list[Question]) -> None:
        self.assign([q for q in candidates if q.text is not None])

    def pool_metrics(self, candidates: list[Question]) -> dict[str, float]:
        generated = cluster_stats(self.space.counts(np.array([q.cluster for q in candidates if q.cluster is not None],
                                                             dtype=np.int64)))
        kept = cluster_stats(self.space.counts(np.array([q.cluster for q in candidates if self.keep(q)],
                                                        dtype=np.int64)))
        return {**super().pool_metrics(candidates),
                **{f"coverage/generated_{k}": generated[k] for k in ("active", "normalized_entropy", "gini",
                                                                     "top10pct_share")},
                **{f"coverage/pool_{k}": kept[k] for k in ("active", "normalized_entropy")}}
