"""Absolute Zero in the tiny program world: held-out accuracy on the three task types against the untrained model and
against GRPO with ground-truth tasks of the same world and model, with AZR's per-type telemetry.

    python -m experiments.azr.run --arms grpo_program azr [--seeds 0 1 2] [--jobs 2] [--report-only]
    python -m experiments.azr.run --arms grpo_program_300 azr_300 --seeds 0      # the longer horizon, one seed

results.md holds the 100-step arms, 3 seeds (azr seed 2 stopped at step 75 and was resumed from that checkpoint with the
same code after main's contract was merged; the resumed steps' losses match a fresh run's, as
tests/recipes/test_azr.py's kill-and-resume test checks). The 300-step arms are defined but not run yet.
"""

import statistics
from collections.abc import Sequence
from pathlib import Path

from coevolve.analytics.curriculum import load_run
from coevolve.analytics.task_types import task_type_summary
from coevolve.jsonio import read_jsonl
from experiments.harness import Arm, ArmResult, Experiment, main, mean_sd, run_dir

KINDS = ("deduction", "abduction", "induction")
SETS = [f"prog_{kind}" for kind in KINDS]
STEPS = ("steps=100", "eval_every=20")
GRPO_WORLD = ("model=tiny-program", "task=program", f"eval_sets=[{','.join(SETS)}]", "params.levels=[1,2,3]")
LONG = ("steps=300", "eval_every=50")
ARMS = (
    Arm("grpo_program", "grpo", (*GRPO_WORLD, *STEPS),
        note="ground-truth tasks of the three types (16 tasks x 8 rollouts a step)"),
    Arm("azr", "azr", STEPS, note="self-proposed tasks, B = 16 per type and role, n = 4"),
    Arm("grpo_program_300", "grpo", (*GRPO_WORLD, *LONG), note="300 steps"),
    Arm("azr_300", "azr", LONG, note="300 steps"),
)
TELEMETRY = ("valid_rate", "learnability", "solve_rate", "buffer_size_final", "buffer_distinct_programs_final")


def measure(run: Path) -> dict[str, float]:
    """AZR's per-type telemetry of a run (none for grpo)."""
    summary = task_type_summary(load_run(run))
    return {key: value for key, value in summary.items() if value is not None
            and key.split("/", 1)[1] in TELEMETRY}


def curves(results: Sequence[ArmResult], here: Path, seeds: Sequence[int]) -> list[str]:
    """Accuracy per type over steps (mean over seeds) as ``curves.png``, and the telemetry table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, kind in zip(axes, KINDS):
        key = f"eval/prog_{kind}/accuracy"
        for r in results:
            series: dict[int, list[float]] = {}
            for seed in seeds:
                metrics = run_dir(here.parent / "runs", r.arm, seed) / "metrics.jsonl"
                for row in read_jsonl(metrics) if metrics.exists() else []:
                    if key in row:
                        series.setdefault(row["step"], []).append(row[key])
            steps = sorted(series)
            ax.plot(steps, [statistics.fmean(series[s]) for s in steps], marker="o", markersize=3, label=r.arm.name)
        ax.set_title(kind)
        ax.set_xlabel("step")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("greedy accuracy (held-out, mean over seeds)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(here / "curves.png", dpi=110)
    plt.close(fig)
    lines = ["AZR telemetry per task type (means over steps, buffers at the end; mean ± sd over seeds):", "",
             "| task type | " + " | ".join(TELEMETRY) + " |", "|---|" + "---|" * len(TELEMETRY)]
    azr = next((r for r in results if r.arm.name == "azr" and r.extra), None)
    for kind in KINDS if azr else ():
        lines.append(f"| {kind} | " + " | ".join(mean_sd(azr.extra.get(f"{kind}/{name}", [])) for name in TELEMETRY)
                     + " |")
    return lines + ["", "![accuracy over steps](curves.png)"]


EXPERIMENT = Experiment(
    "AZR vs GRPO in the program world (tiny-program)", Path(__file__).parent, ARMS, measure=measure,
    extra_report=curves, columns=tuple((f"eval/{s}/accuracy", s.removeprefix("prog_")) for s in SETS),
    mean_column=("mean", (0, 1, 2)),
    accuracy_note="Greedy accuracy on the 200 held-out tasks of each type, after the last step.")

if __name__ == "__main__":
    main(EXPERIMENT)
