"""Dynamic RL on the arithmetic world: held-out accuracy vs the untrained model and ground-truth GRPO, and the
paper's central ablation (no question diversity R_dq -> question and answer mode collapse), also over 900 steps
(the paper's question collapse appears at about step 750).

    python -m experiments.dynamic_rl.run [--seeds 0 1 2] [--jobs 2] [--report-only]
    python -m experiments.dynamic_rl.run --arms dynamic_rl_900 dynamic_rl_no_question_diversity_900 --seeds 0
"""

import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from coevolve.jsonio import read_jsonl
from experiments.arms import GRPO
from experiments.harness import Arm, ArmResult, Experiment, generator_collapse, main, mean_sd

LONG = ("steps=900", "eval_every=100")
WINDOW = 100  # steps per row of the collapse trajectory
ARMS = (
    GRPO,
    Arm("dynamic_rl", "dynamic_rl"),
    Arm("dynamic_rl_no_question_diversity", "dynamic_rl", ("params.question_diversity=false",),
        note="the paper's w/o R_dq ablation"),
    Arm("dynamic_rl_900", "dynamic_rl", LONG, note="900 steps: past the paper's collapse at ~750"),
    Arm("dynamic_rl_no_question_diversity_900", "dynamic_rl", ("params.question_diversity=false", *LONG),
        note="900 steps without R_dq"),
)
TRAJECTORY = {"distinct_questions": "distinct questions", "top_question": "largest identical-question share",
              "top_answer": "largest same-answer share"}  # shares, plotted
DRIFT = {"question_chars": "question length (characters)", "question_level": "level (arithmetic oracle)",
         "solver_tokens": "solver tokens per answer"}  # where the questions and answers drift, in the table only


def collapse_trajectory(run_dir: Path) -> dict[str, float]:
    """Per step, then averaged over windows of ``WINDOW`` steps: the share of distinct questions in a batch, the
    share taken by its most frequent question (the paper's collapse: 30 of 32 equivalent; ours counts exact
    duplicates only) and by its most frequent majority answer (the paper's answer collapse to one value); with the
    mean length and oracle level of the valid questions and the mean length of the solver's answers."""
    per_window: dict[int, dict[str, list[float]]] = {}
    for path in sorted((run_dir / "samples").glob("step_*.jsonl")):
        step_rows = read_jsonl(path)
        rows = [r for r in step_rows if r.get("role") == "generator"]
        if not rows:
            continue
        end = ((rows[0]["step"] - 1) // WINDOW + 1) * WINDOW
        questions = Counter(r.get("question") for r in rows)
        answers = Counter(r.get("label") for r in rows if r.get("label") is not None)
        window = per_window.setdefault(end, {key: [] for key in (*TRAJECTORY, *DRIFT)})
        window["distinct_questions"].append(len(questions) / len(rows))
        window["top_question"].append(max(questions.values()) / len(rows))
        window["top_answer"].append(max(answers.values(), default=0) / len(rows))
        valid = [r for r in rows if r.get("valid")]
        window["question_chars"] += [len(r["question"]) for r in valid]
        window["question_level"] += [r["oracle"]["level"] for r in valid if (r.get("oracle") or {}).get("level")]
        window["solver_tokens"] += [r["tokens"] for r in step_rows if r.get("role") == "solver"]
    return {f"{key}@{end}": statistics.fmean(values) for end, window in per_window.items()
            for key, values in window.items() if values}


def measure(run_dir: Path) -> dict[str, float]:
    return {**generator_collapse(run_dir), **collapse_trajectory(run_dir)}


def report(results: Sequence[ArmResult], here: Path, seeds: Sequence[int]) -> list[str]:
    """The late-step collapse table of every arm, then the trajectory of the arms that ran past one window."""
    late = ("late_distinct_question_share", "late_distinct_answer_share")
    lines = ["| arm | " + " | ".join(late) + " |", "|---|---|---|"]
    lines += [f"| {r.arm.name} | " + " | ".join(mean_sd(r.extra.get(k, [])) for k in late) + " |"
              for r in results if r.extra]
    long_runs = [r for r in results if any(k.startswith(f"distinct_questions@{2 * WINDOW}") for k in r.extra)]
    if long_runs:
        lines += ["", f"Collapse trajectory (generator batches, mean per window of {WINDOW} steps; mean ± sd over "
                      "the seeds that ran):", "",
                  "| arm | steps | " + " | ".join([*TRAJECTORY.values(), *DRIFT.values()]) + " |",
                  "|---|---|" + "---|" * (len(TRAJECTORY) + len(DRIFT))]
        for r in long_runs:
            ends = sorted({int(k.split("@")[1]) for k in r.extra if "@" in k})
            lines += [f"| {r.arm.name} | {end - WINDOW + 1}-{end} | "
                      + " | ".join(mean_sd(r.extra.get(f"{key}@{end}", [])) for key in (*TRAJECTORY, *DRIFT)) + " |"
                      for end in ends]
        _plot_trajectory(long_runs, here / "collapse.png")
    return lines


def _plot_trajectory(results: Sequence[ArmResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(TRAJECTORY), figsize=(12, 3.4))
    for ax, (key, title) in zip(axes, TRAJECTORY.items()):
        for r in results:
            ends = sorted(int(k.split("@")[1]) for k in r.extra if k.startswith(f"{key}@"))
            ax.plot(ends, [statistics.fmean(r.extra[f"{key}@{end}"]) for end in ends], marker="o", label=r.arm.name)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step (end of window)")
        ax.set_ylim(0, 1.02)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


EXPERIMENT = Experiment("Dynamic RL on tiny-arith", Path(__file__).resolve().parent, ARMS, measure=measure,
                        extra_report=report)

if __name__ == "__main__":
    main(EXPERIMENT)
