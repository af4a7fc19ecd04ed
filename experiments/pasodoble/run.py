"""PasoDoble on the arithmetic world, grounded in fact sheets: held-out accuracy vs the untrained model, a frozen
Proposer (the paper's "frozen proposer" baseline) and ground-truth GRPO; online vs offline training; and how often
the Solver was trained against a wrong Proposer answer (checked by the world's oracle).

    python -m experiments.pasodoble.run [--seeds 0 1 2] [--jobs 2] [--report-only]
"""

from pathlib import Path

from experiments.arms import GRPO
from experiments.harness import Arm, Experiment, main, trained_label_errors

ARMS = (
    GRPO,
    Arm("pasodoble", "pasodoble", note="online: Proposer and Solver updated every step"),
    Arm("pasodoble_offline", "pasodoble", preset="small_offline",
        note="offline: Proposer steps fill the buffer, Solver steps replay it"),
    Arm("pasodoble_frozen_proposer", "pasodoble", ("frozen_generator=true",),
        note="the Proposer is never updated"),
)


EXPERIMENT = Experiment("PasoDoble on tiny-arith", Path(__file__).resolve().parent, ARMS, measure=trained_label_errors)

if __name__ == "__main__":
    main(EXPERIMENT)
