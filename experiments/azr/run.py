"""Absolute Zero in the tiny program world: held-out accuracy on the three task types against the untrained model and
against GRPO with ground-truth tasks of the same world and model, with AZR's per-type telemetry, the solver's training
signal per type and held-out accuracy by program level.

    python -m experiments.azr.run --arms grpo_l23 azr_lr2e-4 [--seeds 0 1 2] [--jobs 1] [--report-only]
    python -m experiments.azr.run --arms grpo_l23_300 --seeds 0          # GRPO for 300 steps, one seed

results.md holds grpo_l23 and azr_lr2e-4 (levels 2-3, lr 2e-4, 100 steps) and grpo_l23_300; README.md says what they
show. The first experiment's arms (grpo_program, azr: levels 1-3, lr 5e-5) are kept for its command; their results
are in git (commit 6994189). azr_code_optim and the 300-step azr arm are defined but not run.
"""

import statistics
from collections import defaultdict
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
# The learnable setting (issue 43): level-1 programs are nearly all held out (59 of the 63 the sampler draws), so the
# training level-1 tasks are a handful of memorised programs with saturated rewards; train on levels 2-3 only, at 4x
# the learning rate, and give azr the same learning rate and steps.
LEARNABLE = ("train.lr=2e-4", "steps=100", "eval_every=25")
ARMS = (
    Arm("grpo_l23", "grpo", (*GRPO_WORLD[:3], "params.levels=[2,3]", *LEARNABLE),
        note="ground-truth tasks of the three types, programs of 2-3 operations, lr 2e-4"),
    Arm("grpo_l23_300", "grpo", (*GRPO_WORLD[:3], "params.levels=[2,3]", "train.lr=2e-4", *LONG),
        note="grpo_l23 for 300 steps"),
    Arm("azr_lr2e-4", "azr", LEARNABLE, note="self-proposed tasks, B = 16 per type and role, n = 4, lr 2e-4"),
    Arm("azr_code_optim", "azr", (*LEARNABLE, "train.weight_decay=0.01", "train.entropy_coef=0.001",
                                  "train.clip_high=0.2", "params.token_weighted_baseline=true"),
        note="as azr_lr2e-4 with the paper branch's optimizer rules that apply to the program world (weight decay "
             "0.01, entropy 0.001, clip 0.2 both sides without dual clip, TRR++ over tokens)"),
    Arm("grpo_program", "grpo", (*GRPO_WORLD, *STEPS),
        note="ground-truth tasks of the three types (16 tasks x 8 rollouts a step)"),
    Arm("azr", "azr", STEPS, note="self-proposed tasks, B = 16 per type and role, n = 4"),
    Arm("grpo_program_300", "grpo", (*GRPO_WORLD, *LONG), note="300 steps"),
    Arm("azr_300", "azr", LONG, note="300 steps"),
)
TELEMETRY = ("valid_rate", "learnability", "solve_rate", "buffer_size_final", "buffer_distinct_programs_final")


QUERY_KIND = {"O?": "deduction", "I?": "abduction", "P?": "induction"}
LEVELS = (1, 2, 3)
SIGNAL = ("train_solve_rate", "mixed_groups", "worked_share", "worked_solve_rate", "bare_solve_rate")


def measure(run: Path) -> dict[str, float]:
    """Per task type: AZR's telemetry (none for grpo), the solver's training signal, and held-out accuracy by program
    level with the share of worked answers, at the first and the last evaluation."""
    summary = task_type_summary(load_run(run))
    out = {key: value for key, value in summary.items() if value is not None and key.split("/", 1)[1] in TELEMETRY}
    evals = sorted((run / "eval").glob("step_*"))
    return {**out, **training_signal(run), **held_out_detail(evals[-1]),
            **{f"start/{k}": v for k, v in held_out_detail(evals[0]).items()}}


def training_signal(run: Path) -> dict[str, float]:
    """What the solver's updates could learn from, per task type: the share of trained solver rollouts that were
    correct, the share of rollout groups with both right and wrong answers (grpo: the G rollouts of a task; azr: the n
    learnability rollouts of a proposed task), and the share of trained rollouts in the worked form (an ``S:`` line:
    the deduction trace or the abduction search)."""
    trained: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    groups: dict[tuple[int, str], list[float]] = defaultdict(list)
    kinds: dict[tuple[int, str], str] = {}
    for path in sorted((run / "samples").glob("step_*.jsonl")):
        for row in read_jsonl(path):
            correct = (row.get("reward_terms") or {}).get("correct")
            if row.get("role") != "solver" or correct is None:
                continue
            kind = row.get("task_type") or QUERY_KIND[row["question"].rstrip()[-2:]]
            if row.get("phase") == "solve":
                trained[kind].append((correct, row["completion"].startswith("S:")))
            if row.get("phase") in ("solve", "estimate"):
                key = (row["step"], row["question_id"])
                groups[key].append(correct)
                kinds[key] = kind
    out = {}
    for kind, rows in trained.items():
        mixed = [0 < sum(g) < len(g) for key, g in groups.items() if kinds[key] == kind and len(g) > 1]
        out |= {f"{kind}/train_solve_rate": statistics.fmean(c for c, _ in rows),
                f"{kind}/worked_share": statistics.fmean(w for _, w in rows)}
        for form, worked in (("worked", True), ("bare", False)):
            if any(w == worked for _, w in rows):
                out[f"{kind}/{form}_solve_rate"] = statistics.fmean(c for c, w in rows if w == worked)
        if mixed:
            out[f"{kind}/mixed_groups"] = statistics.fmean(mixed)
    return out


def held_out_detail(step_dir: Path) -> dict[str, float]:
    """Greedy held-out accuracy per task type and program level, and the share of answers in the worked form."""
    out = {}
    for kind in KINDS:
        rows = list(read_jsonl(step_dir / f"prog_{kind}" / "results.jsonl"))
        for level in LEVELS:
            out[f"{kind}/L{level}"] = statistics.fmean(r["correct"][0] for r in rows if r["meta"]["level"] == level)
        out[f"{kind}/eval_worked_share"] = statistics.fmean(r["completions"][0].startswith("S:") for r in rows)
    return out


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
    level_keys = [f"{kind}/L{level}" for kind in KINDS for level in LEVELS]
    worked_keys = [f"{kind}/eval_worked_share" for kind in KINDS]
    first = next((r for r in results if r.extra), None)
    lines = ["Held-out accuracy by program level (operations) after the last step, and the share of greedy answers in "
             "the worked form (an S: line); level-1 programs are nearly all held out of training (59 of the 63 the "
             "sampler draws), so L1 measures programs the model never trained on:", "",
             "| arm | " + " | ".join(f"{k[:3]} L{k[-1]}" for k in level_keys) + " | "
             + " | ".join(f"{k[:3]} worked" for k in worked_keys) + " |",
             "|---|" + "---|" * (len(level_keys) + len(worked_keys))]
    if first is not None:
        lines.append("| untrained (step 0) | " + " | ".join(f"{first.extra[f'start/{k}'][0]:.3f}"
                                                            for k in level_keys + worked_keys) + " |")
    for r in results:
        if r.extra:
            lines.append(f"| {r.arm.name} | "
                         + " | ".join(mean_sd(r.extra.get(k, [])) for k in level_keys + worked_keys) + " |")
    lines += ["", "Solver training signal per task type (pooled over each run's steps; mean ± sd over seeds): "
              "train_solve_rate, the share of trained solver rollouts that were right; mixed_groups, the share of "
              "rollout groups with both right and wrong answers (grpo: G = 8 rollouts of a task; azr: n = 4 "
              "learnability rollouts of a proposed task), the only groups with a nonzero advantage in grpo; "
              "worked_share, the share of trained rollouts in the worked form, and the solve rate of worked and of "
              "bare rollouts (in tiny-arith, most of what RL teaches is to write out the work: README.md):", "",
              "| arm | task type | " + " | ".join(SIGNAL) + " |", "|---|---|" + "---|" * len(SIGNAL)]
    for r in results:
        for kind in KINDS if r.extra else ():
            lines.append(f"| {r.arm.name} | {kind} | "
                         + " | ".join(mean_sd(r.extra.get(f"{kind}/{name}", [])) for name in SIGNAL) + " |")
    lines += ["", "AZR telemetry per task type (means over steps, buffers at the end; mean ± sd over seeds):", "",
              "| arm | task type | " + " | ".join(TELEMETRY) + " |", "|---|---|" + "---|" * len(TELEMETRY)]
    for r in results:
        for kind in KINDS if r.arm.recipe == "azr" and r.extra else ():
            lines.append(f"| {r.arm.name} | {kind} | "
                         + " | ".join(mean_sd(r.extra.get(f"{kind}/{name}", [])) for name in TELEMETRY) + " |")
    return lines + ["", "![accuracy over steps](curves.png)"]


EXPERIMENT = Experiment(
    "AZR vs GRPO in the program world (tiny-program)", Path(__file__).parent, ARMS, measure=measure,
    extra_report=curves, columns=tuple((f"eval/{s}/accuracy", s.removeprefix("prog_")) for s in SETS),
    mean_column=("mean", (0, 1, 2)),
    accuracy_note="Greedy accuracy on the 200 held-out tasks of each type, after the last step.")

if __name__ == "__main__":
    main(EXPERIMENT)
