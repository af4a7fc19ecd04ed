"""OpenSIR on the arithmetic world: held-out accuracy vs the untrained model and ground-truth GRPO, and the
paper's central ablation (no diversity reward: compare diversity metrics and accuracy).

    python -m experiments.opensir.run [--seeds 0 1 2] [--jobs 2] [--report-only]
"""

from pathlib import Path

from experiments.arms import GRPO
from experiments.harness import Arm, Experiment, generator_collapse, main

ARMS = (
    GRPO,
    Arm("opensir", "opensir"),
    Arm("opensir_no_diversity", "opensir", ("params.w_div=0",), note="the paper's no-diversity ablation"),
)


EXPERIMENT = Experiment("OpenSIR on tiny-arith", Path(__file__).resolve().parent, ARMS, measure=generator_collapse)

if __name__ == "__main__":
    main(EXPERIMENT)
