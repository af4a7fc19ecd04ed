"""Arms shared by several experiments (run once, in the shared runs folder)."""

from experiments.harness import Arm

# ground-truth RLVR on the same model and world: the upper bound every self-evolving recipe is compared with
GRPO = Arm("grpo", "grpo", note="ground-truth labels")
