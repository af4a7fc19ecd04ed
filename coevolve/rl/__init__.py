"""RL math: group-relative advantages and the token-level clipped policy loss."""

from coevolve.rl.advantages import (
    ESTIMATORS,
    advantage_estimator,
    batch_norm_advantages,
    compute_advantages,
    decomposed_advantages,
    dr_grpo_advantages,
    dugrpo_advantages,
    grpo_advantages,
    nonzero_variance_mask,
)
from coevolve.rl.losses import AGG_MODES, k3_kl, policy_loss

__all__ = [
    "AGG_MODES",
    "ESTIMATORS",
    "advantage_estimator",
    "batch_norm_advantages",
    "compute_advantages",
    "decomposed_advantages",
    "dr_grpo_advantages",
    "dugrpo_advantages",
    "grpo_advantages",
    "k3_kl",
    "nonzero_variance_mask",
    "policy_loss",
]
