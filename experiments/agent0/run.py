"""GRPO without the tool, GRPO with the python tool (Agent0's "base model with tool" baseline) and agent0, on tiny-calc
(the arithmetic world whose pretraining corpus calls the tool at times): held-out accuracy and tool-call rate over
steps.

    python -m experiments.agent0.run [--seeds 0 1 2] [--jobs 1] [--report-only]

The held-out evaluation is greedy on 50 questions of each level 1-6; with ``rollout.tools`` it runs episodes, as the
solver trains. The tool-call rate of an evaluation is the share of its answers that wrote a call (a ```` ```python````
block closed by ```` ```output````): the sandbox ran it in the tool arms; without the tool nothing runs it and the model
goes on writing after ```` ```output```` itself.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from coevolve.rollout.episodes import TOOL_CALL_STOP
from experiments.harness import Arm, ArmResult, Experiment, main, mean_sd, run_dir

LEVELS = range(1, 7)
WORLD = ("model=tiny-calc", "eval_limit=50", "eval_max_new_tokens=128", "rollout.max_new_tokens=128")
GRPO = (*WORLD, "params.levels=[1,2,3,4,5,6]", "steps=30", "eval_every=10", "train.lr=2e-4")
TOOL = ("rollout.tools=[python]", "rollout.max_tool_calls=2")
ARMS = (
    Arm("grpo_calc", "grpo", GRPO, note="ground-truth rewards, single turns: a call is never run"),
    Arm("grpo_calc_tool", "grpo", (*GRPO, *TOOL), note="ground-truth rewards, tool-using episodes"),
    Arm("agent0_calc", "agent0", WORLD, note="the small preset: 2 iterations of 2 curriculum and 4 executor steps, "
                                             "tool-using episodes (max 2 calls), lr 3e-5"),
    Arm("agent0_calc_long", "agent0", (*WORLD, "steps=60", "eval_every=12", "train.lr=2e-4"),
        note="the small preset for 10 iterations at the GRPO arms' lr"),
)


def eval_calls(run: Path) -> tuple[list[int], list[float], dict[int, float]]:
    """Per evaluation step the share of held-out answers (all levels) that wrote a tool call, and the last
    evaluation's share per level."""
    steps, rates, last = [], [], {}
    for folder in sorted((run / "eval").glob("step_*")):
        per_level = {}
        for level in LEVELS:
            path = folder / f"arith_l{level}" / "results.jsonl"
            if path.exists():
                rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
                texts = [text for row in rows for text in row["completions"]]
                per_level[level] = sum(TOOL_CALL_STOP in text for text in texts) / max(1, len(texts))
        if per_level:
            steps.append(int(folder.name.removeprefix("step_")))
            rates.append(statistics.fmean(per_level.values()))
            last = per_level
    return steps, rates, last


def accuracy_curve(run: Path) -> tuple[list[int], list[float]]:
    """Held-out accuracy, the mean over levels 1-6, at each evaluation."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in rows if "eval/arith_l1/accuracy" in r]
    return ([r["step"] for r in evals],
            [statistics.fmean(r[f"eval/arith_l{level}/accuracy"] for level in LEVELS) for r in evals])


def measure(run: Path) -> dict[str, float]:
    """The tool-call rate of the first and last evaluation (mean over levels, and per level at the end), the mean of
    the training episodes' calls per episode, and the held-out accuracy's mean over levels at the start and end."""
    steps, rates, last = eval_calls(run)
    acc_steps, accuracy = accuracy_curve(run)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train_calls = [r["tool/calls_per_episode"] for r in rows if isinstance(r.get("tool/calls_per_episode"), float)
                   and "solver/reward_mean" in r]  # solver steps (agent0's first executor step: the pool's votes too)
    return {"accuracy L1-6 start": accuracy[0], "accuracy L1-6 end": accuracy[-1],
            "eval call rate start": rates[0], "eval call rate end": rates[-1],
            **{f"eval call rate end L{level}": rate for level, rate in last.items()},
            "train calls per episode": statistics.fmean(train_calls) if train_calls else 0.0}


REPORTED = ("accuracy L1-6 start", "accuracy L1-6 end", "eval call rate start", "eval call rate end",
            *(f"eval call rate end L{level}" for level in LEVELS), "train calls per episode")


def report(results: Sequence[ArmResult], here: Path, seeds: Sequence[int]) -> list[str]:
    """The tool-use table per seed and mean ± sd, and ``curves.png``."""
    lines = ["Tool use (eval call rate: the share of greedy held-out answers, levels 1-6, that wrote a call; train "
             "calls per episode: the mean over solver steps of the episodes' calls, 0 without the tool; agent0's first "
             "executor step of an iteration also counts the pool's label votes):", "",
             "| arm | seed | " + " | ".join(REPORTED) + " |", "|---|---|" + "---|" * len(REPORTED)]
    for r in results:
        done = [s for s in seeds if (run_dir(here.parent / "runs", r.arm, s) / "summary.json").exists()]
        for i, seed in enumerate(done):
            lines.append(f"| {r.arm.name} | {seed} | " + " | ".join(
                f"{r.extra[key][i]:.3f}" if key in r.extra else "–" for key in REPORTED) + " |")
        if len(done) > 1:
            lines.append(f"| {r.arm.name} | mean ± sd | " + " | ".join(mean_sd(r.extra.get(key, []))
                                                                       for key in REPORTED) + " |")
    _plot(results, here, seeds)
    return lines + ["", "![held-out accuracy and tool-call rate over steps](curves.png)"]


def _plot(results: Sequence[ArmResult], here: Path, seeds: Sequence[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for colour, r in zip(("tab:blue", "tab:orange", "tab:green", "tab:red"), results):
        runs = [run_dir(here.parent / "runs", r.arm, s) for s in seeds]
        for k, run in enumerate(p for p in runs if (p / "summary.json").exists()):
            label = r.arm.name if k == 0 else None
            axes[0].plot(*accuracy_curve(run), color=colour, marker="o", markersize=3, alpha=0.8, label=label)
            axes[1].plot(*eval_calls(run)[:2], color=colour, marker="o", markersize=3, alpha=0.8, label=label)
    for ax, title in zip(axes, ("held-out greedy accuracy, mean of L1-L6", "held-out answers that call the tool")):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(here / "curves.png", dpi=110)
    plt.close(fig)


EXPERIMENT = Experiment("GRPO without and with the python tool, and agent0, on tiny-calc",
                        Path(__file__).resolve().parent, ARMS, measure=measure, extra_report=report,
                        mean_column=("L4-L6", (3, 4, 5)),
                        accuracy_note="Greedy accuracy on 50 questions of each level's held-out set (a seeded subset, "
                                      "the same for every run), after the last step; wall s: the run's own time.")

if __name__ == "__main__":
    main(EXPERIMENT)
