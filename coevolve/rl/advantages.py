"""Group-relative advantage estimators (pure functions on rewards and group ids).

Every function takes ``rewards`` as a 1-D array-like (list, numpy array or torch tensor) and ``groups`` as integer
group ids of the same length. A group is the set of samples drawn from one prompt (GRPO's "group": the G answers to one
question, or the n questions generated from one document). Ids need not be contiguous or sorted, and groups may have
unequal sizes. Results are float64 numpy arrays aligned with the input.

Conventions shared by all estimators:

- **Standard deviation.** ``unbiased=True`` (the default) uses the sample std with Bessel's correction (n - 1), as
  ``torch.std`` does in TRL's and verl's GRPO and as every method's released code here does. ``unbiased=False``
  gives the population std (divide by n). A group of size 1 has std 0 under both conventions.
- **Zero-variance groups** (all rewards exactly equal, tested as max == min so float round-off cannot leak through)
  get an advantage of exactly 0 from every estimator.
- **eps** only guards the division. The specs use 1e-6 (verl, INFUSER) or 1e-4 (TRL: OpenSIR, PasoDoble).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator

ArrayLike = Any  # list, numpy array or torch tensor
Estimator = Callable[..., np.ndarray]  # (rewards, groups, *, eps, ...) -> advantages

# The group-relative estimators by name, filled by :func:`advantage_estimator`: recipes choose one with
# ``compute_advantages(name, ...)`` and type their ``advantage`` setting as ``AdvantageName``; a user's package
# registers its own estimator with the same decorator.
ESTIMATORS: dict[str, Estimator] = {}


def advantage_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Register the decorated function as the advantage estimator ``name`` (a name registered twice is an error)."""
    def register(fn: Estimator) -> Estimator:
        if name in ESTIMATORS and ESTIMATORS[name] is not fn:
            raise ValueError(f"advantage estimator {name!r} is registered twice: {ESTIMATORS[name].__module__}."
                             f"{ESTIMATORS[name].__qualname__} and {fn.__module__}.{fn.__qualname__}")
        ESTIMATORS[name] = fn
        return fn
    return register


def _to_numpy(x: ArrayLike, dtype: type) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor, without importing torch here
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


@dataclass(frozen=True)
class _GroupStats:
    """Per-sample view of the group statistics of one reward vector."""

    centred: np.ndarray  # r - mean_g, exactly 0 in zero-variance groups
    std: np.ndarray  # std_g of each sample's group, exactly 0 in zero-variance groups
    group_std: np.ndarray  # one std per group (indexed by dense group index)
    group_varies: np.ndarray  # one bool per group: rewards not all equal
    varies: np.ndarray  # the same, per sample


def _group_stats(rewards: ArrayLike, groups: ArrayLike, unbiased: bool) -> _GroupStats:
    r = _to_numpy(rewards, np.float64)
    g = _to_numpy(groups, np.int64)
    if r.ndim != 1 or g.shape != r.shape:
        raise ValueError(f"rewards and groups must be 1-D of equal length, got {r.shape} and {g.shape}")
    if not np.all(np.isfinite(r)):
        raise ValueError("rewards contain non-finite values")
    _, idx = np.unique(g, return_inverse=True)
    n_groups = int(idx.max()) + 1 if idx.size else 0
    count = np.bincount(idx, minlength=n_groups).astype(np.float64)
    mean = np.bincount(idx, weights=r, minlength=n_groups) / np.maximum(count, 1.0)
    gmax = np.full(n_groups, -np.inf)
    gmin = np.full(n_groups, np.inf)
    np.maximum.at(gmax, idx, r)
    np.minimum.at(gmin, idx, r)
    varies = gmax > gmin
    centred = np.where(varies[idx], r - mean[idx], 0.0)
    sq = np.bincount(idx, weights=centred**2, minlength=n_groups)
    dof = count - 1.0 if unbiased else count
    group_std = np.where(varies, np.sqrt(sq / np.maximum(dof, 1.0)), 0.0)
    return _GroupStats(
        centred=centred, std=group_std[idx], group_std=group_std, group_varies=varies, varies=varies[idx]
    )


def _batch_sigma(stats: _GroupStats, include_zero_variance: bool) -> float:
    """INFUSER's sigma_B: the mean of the group stds over the batch (eq. 2.14's definition)."""
    stds = stats.group_std if include_zero_variance else stats.group_std[stats.group_varies]
    return float(stds.mean()) if stds.size else 0.0


@advantage_estimator("grpo")
def grpo_advantages(rewards: ArrayLike, groups: ArrayLike, eps: float = 1e-6, unbiased: bool = True) -> np.ndarray:
    """GRPO advantage A_i = (r_i - mean_g) / (std_g + eps).

    INFUSER calls it ``group_std`` (eq. 2.15, A_GRPO); OpenSIR eq. 8; Dynamic RL's per-reward z-score Z_G.
    """
    s = _group_stats(rewards, groups, unbiased)
    return s.centred / (s.std + eps)


@advantage_estimator("dr_grpo")
def dr_grpo_advantages(rewards: ArrayLike, groups: ArrayLike, eps: float = 1e-6, unbiased: bool = True) -> np.ndarray:
    """Dr.GRPO advantage A_i = r_i - mean_g (mean baseline, no std scaling; INFUSER's solver advantage, §2.3).
    ``eps`` and ``unbiased`` are taken as every estimator takes them and change nothing here (no std, no division)."""
    return _group_stats(rewards, groups, unbiased).centred


@advantage_estimator("dugrpo")
def dugrpo_advantages(
    rewards: ArrayLike,
    groups: ArrayLike,
    eps: float = 1e-6,
    unbiased: bool = True,
    include_zero_variance_in_sigma_b: bool = False,
) -> np.ndarray:
    """INFUSER's DuGRPO generator advantage (eq. 2.14): A = (s_k - mu_d) / (sigma_d + sigma_B + eps).

    mu_d, sigma_d: mean and std of the rewards of document d's group; sigma_B: mean of the group stds over the
    batch. The paper removes zero-variance groups before the update and averages over the groups of the batch; the
    released code averages the non-zero group stds. Both mean the same thing, so sigma_B excludes zero-variance groups
    by default; ``include_zero_variance_in_sigma_b=True`` averages over every group instead. The within-group std of
    the result is sigma_d / (sigma_d + sigma_B + eps) (same std convention).
    """
    s = _group_stats(rewards, groups, unbiased)
    sigma_b = _batch_sigma(s, include_zero_variance_in_sigma_b)
    return s.centred / (s.std + sigma_b + eps)


@advantage_estimator("batch_norm")
def batch_norm_advantages(
    rewards: ArrayLike,
    groups: ArrayLike,
    eps: float = 1e-6,
    unbiased: bool = True,
    include_zero_variance_in_sigma_b: bool = False,
) -> np.ndarray:
    """INFUSER's ``batch_std`` ablation (eq. 2.15, A_BN): A = (s_k - mu_d) / (sigma_B + eps).

    This is the paper's version, with sigma_B defined exactly as in :func:`dugrpo_advantages`. The released code's
    ``batch_std`` mode divides instead by the std of all group-centred scores pooled over the batch;
    we keep the paper's form.
    """
    s = _group_stats(rewards, groups, unbiased)
    sigma_b = _batch_sigma(s, include_zero_variance_in_sigma_b)
    return s.centred / (sigma_b + eps)


def decomposed_advantages(
    terms: Mapping[str, ArrayLike],
    weights: Mapping[str, float],
    groups: ArrayLike,
    eps: float = 1e-6,
    unbiased: bool = True,
) -> np.ndarray:
    """Dynamic RL's advantage decomposition (eq. 14): A = sum_k lambda_k * Z_G(R_k).

    Each reward term R_k is z-scored within its group separately (:func:`grpo_advantages`), then the z-scores are
    summed with weights lambda_k. Normalising before summing keeps one high-variance reward from swamping the others.
    A term whose group has zero variance contributes exactly 0 there. ``weights`` must name exactly the keys of
    ``terms``.
    """
    if set(terms) != set(weights):
        raise ValueError(f"terms {sorted(terms)} and weights {sorted(weights)} must have the same keys")
    if not terms:
        raise ValueError("decomposed_advantages needs at least one reward term")
    return sum(
        float(weights[name]) * grpo_advantages(values, groups, eps=eps, unbiased=unbiased)
        for name, values in terms.items()
    )


@advantage_estimator("task_relative")
def task_relative_advantages(
    rewards: ArrayLike,
    groups: ArrayLike,
    eps: float = 1e-6,
    unbiased: bool = True,
    weights: ArrayLike | None = None,
) -> np.ndarray:
    """Task-Relative REINFORCE++ (Absolute Zero, arXiv 2505.03335, §3.3.5): A = (r - mu_g) / (sigma_g + eps), where a
    group g is one (task type, role) pair: six baselines for AZR's three task types and two roles, between GRPO's
    per-question baseline and REINFORCE++'s one global baseline.

    ``weights=None`` is the paper's Eq. 8: one term per sample, which is :func:`grpo_advantages` with the task-role
    pairs as groups. With ``weights`` (each sample's token count) the mean and std are taken over tokens instead, as
    AZR's code does: verl's REINFORCE++ whitens the token-level returns of each task-role batch (``masked_whiten``,
    the variance with Bessel's correction over tokens when ``unbiased``), so a long response weighs more.
    """
    if weights is None:
        return grpo_advantages(rewards, groups, eps=eps, unbiased=unbiased)
    r = _to_numpy(rewards, np.float64)
    w = _to_numpy(weights, np.float64)
    s = _group_stats(rewards, groups, unbiased)  # checks shapes and finiteness; gives the zero-variance groups
    if w.shape != r.shape or np.any(w <= 0):
        raise ValueError("weights must be positive and aligned with rewards")
    _, idx = np.unique(_to_numpy(groups, np.int64), return_inverse=True)
    total = np.bincount(idx, weights=w)
    mean = np.bincount(idx, weights=w * r) / total
    centred = np.where(s.varies, r - mean[idx], 0.0)
    dof = total - 1.0 if unbiased else total
    std = np.sqrt(np.bincount(idx, weights=w * centred**2) / np.maximum(dof, 1.0))
    return np.where(s.varies, centred / (std[idx] + eps), 0.0)


def nonzero_variance_mask(rewards: ArrayLike, groups: ArrayLike) -> np.ndarray:
    """True for members of groups whose rewards are not all equal.

    Used to drop zero-variance groups (DAPO's dynamic sampling; INFUSER's variance filter, §2.3), which carry no
    group-relative signal.
    """
    return _group_stats(rewards, groups, unbiased=True).varies


def _known_estimator(name: str) -> str:
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r} (known: {', '.join(sorted(ESTIMATORS))})")
    return name


# A recipe's ``advantage`` setting: the name of a registered estimator, checked when the config resolves.
AdvantageName = Annotated[str, AfterValidator(_known_estimator)]


def compute_advantages(kind: str, rewards: ArrayLike, groups: ArrayLike, *, eps: float = 1e-6,
                       **kwargs: Any) -> np.ndarray:
    """The advantages of estimator ``kind`` (a name in ``ESTIMATORS``), with ``eps`` guarding its division (the
    specs' 1e-6, or TRL's 1e-4). Further keyword arguments go to the estimator (``unbiased``,
    ``include_zero_variance_in_sigma_b``, ``weights``)."""
    return ESTIMATORS[_known_estimator(kind)](rewards, groups, eps=eps, **kwargs)


def ambiguity_scale(p: float, low: float, high: float, min_scale: float) -> float:
    """ADPO's advantage scale of a task with self-consistency ``p`` (Agent0's ``compute_adpo_outcome_advantage``):
    ``min_scale + (1 - min_scale) * clamp((p - low) / (high - low), 0, 1)``: a label the executor agreed on less is
    trusted less (``min_scale`` at p <= low, 1 at p >= high)."""
    return min_scale + (1.0 - min_scale) * min(max((p - low) / (high - low), 0.0), 1.0)
