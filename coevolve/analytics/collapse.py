"""Majority-vote telemetry of a run (TTRL's ``ttrl/*`` metrics) and URLVR's collapse step, read from metrics.jsonl.

URLVR (He et al. 2026, arXiv:2603.08660) finds that intrinsic rewards such as TTRL's majority agreement rise and then
fall, and measures the step where the model collapses. Here the collapse step of a run is the evaluation step after
which held-out accuracy (the mean over the run's evaluation sets) falls at K consecutive evaluations while the
training reward (``solver/reward_mean``: the majority agreement for ``ttrl``) still rises: its mean over those K
evaluation intervals exceeds its mean over the same number of steps before. None when that never happens.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean
from typing import Any

from coevolve.analytics.curriculum import RunData

COLLAPSE_K = 3  # consecutive falling evaluations
REWARD_KEY = "solver/reward_mean"
EDGE_STEPS = 10  # the first and last steps whose vote telemetry the summary averages
VOTE_SERIES = {  # metric -> name in reports
    "ttrl/label_accuracy": "majority-label accuracy (vs ground truth)",
    "ttrl/majority_ratio": "majority ratio (support / N)",
    "ttrl/vote_margin": "vote margin ((winner - runner-up) / N)",
    "ttrl/majority_changed_rate": "majority changed since last seen",
    "reward/agree": "majority-agreement reward",
    "reward/correct": "ground-truth reward (trained samples)",
}


def heldout_accuracy(run: RunData, sets: Sequence[str] | None = None) -> tuple[list[int], list[float]]:
    """(steps, mean accuracy over ``sets``, default all the run's evaluation sets) at each evaluation that has them
    all."""
    sets = list(sets if sets is not None else run.eval_sets())
    if not sets:
        return [], []
    by_set = [dict(zip(*run.series(f"eval/{s}/accuracy"))) for s in sets]
    steps = sorted(set.intersection(*(set(values) for values in by_set)))
    return steps, [fmean(values[step] for values in by_set) for step in steps]


def collapse_step(eval_steps: Sequence[int], accuracy: Sequence[float], reward_steps: Sequence[int],
                  rewards: Sequence[float], k: int = COLLAPSE_K) -> int | None:
    """The first evaluation step s_i (not the first evaluation) with a_{i+1} < a_i, ..., a_{i+k} < a_{i+k-1} while
    the mean training reward over (s_i, s_{i+k}] exceeds its mean over the same number of steps up to s_i."""
    reward_at = dict(zip(reward_steps, rewards))
    for i in range(1, len(accuracy) - k):
        if not all(accuracy[j + 1] < accuracy[j] for j in range(i, i + k)):
            continue
        start, end = eval_steps[i], eval_steps[i + k]
        after = [r for s, r in reward_at.items() if start < s <= end]
        before = [r for s, r in reward_at.items() if start - (end - start) < s <= start]
        if after and before and fmean(after) > fmean(before):
            return start
    return None


def _edge_mean(run: RunData, key: str, last: bool) -> float | None:
    values = run.series(key)[1]
    chosen = values[-EDGE_STEPS:] if last else values[:EDGE_STEPS]
    return fmean(chosen) if chosen else None


def vote_summary(run: RunData, k: int = COLLAPSE_K) -> dict[str, Any]:
    """Per run: the majority label's accuracy over the first and last EDGE_STEPS steps, mean vote margin and
    majority-changed rate (None without ``ttrl/*`` metrics), and held-out accuracy's peak, final value and collapse
    step (any run with evaluations and a solver reward)."""
    steps, accuracy = heldout_accuracy(run)
    reward_steps, rewards = run.series(REWARD_KEY)
    peak = max(range(len(accuracy)), key=accuracy.__getitem__) if accuracy else None

    def mean_of(key: str) -> float | None:
        values = run.series(key)[1]
        return fmean(values) if values else None

    return {
        "label_accuracy_first": _edge_mean(run, "ttrl/label_accuracy", last=False),
        "label_accuracy_last": _edge_mean(run, "ttrl/label_accuracy", last=True),
        "vote_margin_mean": mean_of("ttrl/vote_margin"),
        "majority_changed_rate_mean": mean_of("ttrl/majority_changed_rate"),
        "heldout_peak": accuracy[peak] if peak is not None else None,
        "heldout_peak_step": steps[peak] if peak is not None else None,
        "heldout_final": accuracy[-1] if accuracy else None,
        f"collapse_step_k{k}": collapse_step(steps, accuracy, reward_steps, rewards, k) if accuracy else None,
    }
