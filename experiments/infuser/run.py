"""INFUSER on the arithmetic world, grounded in fact sheets: held-out accuracy vs the untrained model, a frozen
generator (the paper's Fix-gen) and ground-truth GRPO, plus the paper's Table 10 ablations: GRPO's group normaliser
instead of DuGRPO, and plain SGD cosine instead of the AdamW-preconditioned one. The dev set is 128 grounded held-out
questions of levels 1-4 x 8 rollouts (``infuser --preset small``), and the runs log whether the influence reward is
signal: informative dev groups, the cosine between two half-dev gradients and, every 20 steps, the rank correlation
between each question's score and the dev-reward change of one update on it alone.

    python -m experiments.infuser.run [--seeds 0 1 2] [--jobs 2] [--report-only]
"""

from pathlib import Path

from experiments.arms import GRPO
from experiments.harness import Arm, Experiment, main, trained_label_errors

ARMS = (
    GRPO,
    Arm("infuser", "infuser"),
    Arm("infuser_grpo_advantage", "infuser", ("params.generator_advantage=grpo",),
        note="generator advantages normalised by the group std (GRPO) instead of DuGRPO"),
    Arm("infuser_sgd_cosine", "infuser", ("params.influence=sgd_cosine",),
        note="influence = cosine of raw gradients, no AdamW preconditioning"),
    Arm("infuser_frozen_generator", "infuser", ("frozen_generator=true",), note="Fix-gen"),
)


EXPERIMENT = Experiment("INFUSER on tiny-arith", Path(__file__).resolve().parent, ARMS, measure=trained_label_errors)

if __name__ == "__main__":
    main(EXPERIMENT)
