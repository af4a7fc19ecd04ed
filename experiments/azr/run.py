"""Absolute Zero in the tiny program world: held-out accuracy on the three task types against the untrained model and
against GRPO with ground-truth tasks of the same world and model, with AZR's per-type telemetry, the solver's training
signal per type and held-out accuracy by program level.

    python -m experiments.azr.run --arms grpo_lr2e-4 azr_lr2e-4 [--seeds 0 1 2] [--jobs 2] [--report-only]

README.md gives every command behind results.md and says what the runs show. The world is tiny-program of format
version 2 (coevolve/models/tiny_program.py); the arms and results of version 1 are in git (experiments/azr at
da6e516).
"""

import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from coevolve.analytics.curriculum import load_run
from coevolve.analytics.task_types import task_type_summary
from coevolve.jsonio import read_jsonl
from experiments.harness import Arm, ArmResult, Experiment, main, mean_sd

KINDS = ("deduction", "abduction", "induction")
SETS = [f"prog_{kind}" for kind in KINDS]
# The world of FORMAT_VERSION 2 (issue 43): tiny-program rebuilt for 12,000 steps with 75% solving samples, and the
# one-operation programs back in training (held out by task, not by program); GRPO with ground truth trains on
# programs of 1-3 operations. The FORMAT_VERSION 1 arms and results are in git (experiments/azr at da6e516).
WORLD = ("model=tiny-program", "task=program", f"eval_sets=[{','.join(SETS)}]")
SCHEDULE = ("steps=100", "eval_every=20")
CODE_OPTIM = ("train.weight_decay=0.01", "train.entropy_coef=0.001", "train.clip_high=0.2",
              "params.token_weighted_baseline=true")
ARMS = (
    Arm("grpo", "grpo", (*WORLD, "params.levels=[1,2,3]", "train.lr=5e-5", *SCHEDULE),
        note="ground-truth tasks of the three types (16 tasks x 8 rollouts a step), lr 5e-5 (azr small's)"),
    Arm("grpo_lr2e-4", "grpo", (*WORLD, "params.levels=[1,2,3]", "train.lr=2e-4", *SCHEDULE),
        note="grpo at lr 2e-4"),
    Arm("grpo_lr1e-4", "grpo", (*WORLD, "params.levels=[1,2,3]", "train.lr=1e-4", *SCHEDULE),
        note="grpo at lr 1e-4"),
    Arm("grpo_lr1e-4_300", "grpo", (*WORLD, "params.levels=[1,2,3]", "train.lr=1e-4", "steps=300", "eval_every=50"),
        note="grpo_lr1e-4 for 300 steps"),
    Arm("azr", "azr", SCHEDULE, note="the small preset: self-proposed tasks, B = 16 per type and role, n = 4, lr 5e-5"),
    Arm("azr_lr2e-4", "azr", ("train.lr=2e-4", *SCHEDULE), note="azr at lr 2e-4"),
    Arm("azr_lr1e-4_300", "azr", ("train.lr=1e-4", "steps=300", "eval_every=50"), note="azr at lr 1e-4 for 300 steps"),
    Arm("azr_code_optim", "azr", ("train.lr=2e-4", *SCHEDULE, *CODE_OPTIM),
        note="azr_lr2e-4 with the paper branch's optimizer rules that apply to the program world (weight decay 0.01, "
             "entropy 0.001, clip 0.2 both sides without dual clip, TRR++ over tokens)"),
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
    curve = {f"curve/{kind}/{row['step']}": row[f"eval/prog_{kind}/accuracy"]
             for row in read_jsonl(run / "metrics.jsonl") for kind in KINDS if f"eval/prog_{kind}/accuracy" in row}
    return {**out, **training_signal(run), **held_out_detail(evals[-1]), **curve,
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
        prefix = f"curve/{kind}/"
        for r in results:
            series = {int(key.removeprefix(prefix)): values
                      for key, values in r.extra.items() if key.startswith(prefix)}
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
             "the worked form (an S: line); L1 measures new inputs of programs seen in training (one-operation "
             "programs are held out by task), L2 and L3 programs never trained on:", "",
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
