"""Dynamic RL on the arithmetic world: held-out accuracy vs the untrained model and ground-truth GRPO, and the
paper's central ablation (no question diversity R_dq -> question and answer mode collapse).

    python -m experiments.dynamic_rl.run [--seeds 0 1 2] [--jobs 2] [--report-only]
"""

from pathlib import Path

from experiments.arms import GRPO
from experiments.harness import Arm, Experiment, generator_collapse, main

ARMS = (
    GRPO,
    Arm("dynamic_rl", "dynamic_rl"),
    Arm("dynamic_rl_no_question_diversity", "dynamic_rl", ("params.question_diversity=false",),
        note="the paper's w/o R_dq ablation"),
)


EXPERIMENT = Experiment("Dynamic RL on tiny-arith", Path(__file__).resolve().parent, ARMS, measure=generator_collapse)

if __name__ == "__main__":
    main(EXPERIMENT)
