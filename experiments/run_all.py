"""Run every experiment's arms in one queue (shared arms such as grpo once), then write each results table.

    python -m experiments.run_all [--seeds 0 1 2] [--jobs 2]
"""

import argparse
import time
from pathlib import Path

from experiments.dynamic_rl.run import ARMS as DYNAMIC_RL_ARMS
from experiments.harness import generator_collapse, main, run_all
from experiments.opensir.run import ARMS as OPENSIR_ARMS

EXPERIMENTS = {"dynamic_rl": ("Dynamic RL on tiny-arith", DYNAMIC_RL_ARMS),
               "opensir": ("OpenSIR on tiny-arith", OPENSIR_ARMS)}
HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    arms = list({arm.name: arm for _, experiment_arms in EXPERIMENTS.values() for arm in experiment_arms}.values())
    started = time.time()
    run_all(arms, args.seeds, HERE / "runs", args.jobs)
    print(f"all runs finished in {time.time() - started:.0f} s", flush=True)
    for name, (title, experiment_arms) in EXPERIMENTS.items():
        main(experiment_arms, title, HERE / name, measure=generator_collapse,
             argv=["--report-only", "--seeds", *map(str, args.seeds)])
