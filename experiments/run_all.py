"""Run every experiment's arms in one queue (shared arms such as grpo once), then write each results table.

    python -m experiments.run_all [--seeds 0 1 2] [--jobs 2]
"""

import argparse
import time
from pathlib import Path

from experiments.agent0.run import EXPERIMENT as AGENT0
from experiments.azr.run import EXPERIMENT as AZR
from experiments.dynamic_rl.run import EXPERIMENT as DYNAMIC_RL
from experiments.harness import main, run_all
from experiments.infuser.run import EXPERIMENT as INFUSER
from experiments.opensir.run import EXPERIMENT as OPENSIR
from experiments.pasodoble.run import EXPERIMENT as PASODOBLE
from experiments.prism.run import EXPERIMENT as PRISM
from experiments.spice.run import EXPERIMENT as SPICE
from experiments.ttrl.run import EXPERIMENT as TTRL

EXPERIMENTS = (DYNAMIC_RL, OPENSIR, PRISM, PASODOBLE, INFUSER, TTRL, AZR, SPICE, AGENT0)
HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    arms = list({arm.name: arm for experiment in EXPERIMENTS for arm in experiment.arms}.values())
    started = time.time()
    run_all(arms, args.seeds, HERE / "runs", args.jobs)
    print(f"all runs finished in {time.time() - started:.0f} s", flush=True)
    for experiment in EXPERIMENTS:
        main(experiment, argv=["--report-only", "--seeds", *map(str, args.seeds)])
