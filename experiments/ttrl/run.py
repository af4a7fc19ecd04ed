"""TTRL against GRPO with ground truth on the same level-2 questions of the arithmetic world: held-out accuracy per
level, and whether TTRL's accuracy rises and then falls while its majority-agreement reward keeps rising (URLVR's
collapse step, ``coevolve.analytics.collapse``); and whether the two label-free rewards that claim not to collapse
(EVOL-RL, RESTRAIN: ``params.label_free_reward``) hold past the step where majority voting falls.

    python -m experiments.ttrl.run [--seeds 0 1 2] [--jobs 1] [--report-only]
"""

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

from coevolve.analytics.collapse import COLLAPSE_K, collapse_step, heldout_accuracy
from coevolve.analytics.curriculum import RunData, load_run
from coevolve.analytics.diversity import entropy_bits
from coevolve.jsonio import read_jsonl
from experiments.harness import Arm, ArmResult, Experiment, main, mean_sd, run_dir, trained_label_errors

# 120 steps of 8 questions from a fixed pool of 256 level-2 training problems (about 4 passes), evaluated every 20
LONG = ("steps=120", "eval_every=20")
ARMS = (
    Arm("ttrl", "ttrl", LONG, note="majority-vote rewards, no labels"),
    Arm("grpo_l2_pool", "ttrl", (*LONG, "params.label_source=ground_truth"),
        note="GRPO with ground-truth rewards on the same pool, samples and update"),
    Arm("evol_rl", "ttrl", LONG, preset="small_evol_rl",
        note="EVOL-RL: majority-anchored novelty reward, asymmetric clipping, entropy bonus; no labels"),
    Arm("restrain", "ttrl", LONG, preset="small_restrain",
        note="RESTRAIN: vote-share pseudo-labels, low-consistency penalty, prompt weights; no labels"),
)
HELD_OUT = [f"arith_l{level}" for level in (1, 2, 3, 4)]
SMOOTH = 10  # steps in the running mean of the per-step curves


def running_mean(series: tuple[list[int], list[float]], window: int = SMOOTH) -> tuple[list[int], list[float]]:
    """The mean of each value and the ``window - 1`` before it (from the ``window``-th step on)."""
    steps, values = series
    return steps[window - 1:], [statistics.fmean(values[i - window + 1:i + 1]) for i in range(window - 1, len(values))]


def answer_entropy(run: RunData) -> tuple[list[int], list[float]]:
    """Per step, the mean over the step's questions of the entropy (bits) of the answers of their N vote samples (an
    unparseable answer is one class of its own): 0 when all N agree, log2(16) = 4 at most. Read from the sample rows,
    so it exists for every arm alike (the trainer logs token entropy only when ``train.entropy_coef`` is not 0)."""
    steps, values = [], []
    for step, path in sorted(run.sample_files.items()):
        answers: dict[str, list] = defaultdict(list)
        for row in read_jsonl(path):
            if row.get("role") == "solver":
                answers[row["question_id"]].append(row.get("answer"))
        if answers:
            steps.append(step)
            values.append(statistics.fmean(entropy_bits(list(Counter(a).values())) for a in answers.values()))
    return steps, values


CURVES = {  # panel title -> series of a run: (steps, values)
    "held-out accuracy, mean of L1-L4": lambda run: heldout_accuracy(run, HELD_OUT),
    "held-out accuracy, L2 (the trained level)": lambda run: heldout_accuracy(run, ["arith_l2"]),
    f"training reward ({SMOOTH}-step mean; ttrl: agreement; evol_rl: in [-1, 1])":
        lambda run: running_mean(run.series("solver/reward_mean")),
    f"majority label = ground truth ({SMOOTH}-step mean)": lambda run: running_mean(run.series("ttrl/label_accuracy")),
    f"answer entropy of the N votes, bits ({SMOOTH}-step mean)": lambda run: running_mean(answer_entropy(run)),
}


def collapse_measures(out: Path) -> dict[str, float]:
    """Peak and final held-out accuracy (L1-L4 mean and L2), the collapse step, and the vote's label accuracy."""
    run = load_run(out)
    steps, accuracy = heldout_accuracy(run, HELD_OUT)
    l2_steps, l2 = heldout_accuracy(run, ["arith_l2"])
    peak, l2_peak = accuracy.index(max(accuracy)), l2.index(max(l2))
    labels = run.series("ttrl/label_accuracy")[1]
    entropy = answer_entropy(run)[1]
    reward = run.series("solver/reward_mean")
    return {"peak L1-4": accuracy[peak], "peak step": steps[peak], "final L1-4": accuracy[-1],
            "collapse step": collapse_step(steps, accuracy, *reward, k=COLLAPSE_K),
            "peak L2": l2[l2_peak], "L2 peak step": l2_steps[l2_peak], "final L2": l2[-1],
            "L2 collapse step": collapse_step(l2_steps, l2, *reward, k=COLLAPSE_K),
            "label accuracy, first 10 steps": statistics.fmean(labels[:10]),
            "label accuracy, last 10 steps": statistics.fmean(labels[-10:]),
            "answer entropy, first 10 steps": statistics.fmean(entropy[:10]),
            "answer entropy, steps 31-40": statistics.fmean(entropy[30:40]),
            "answer entropy, last 10 steps": statistics.fmean(entropy[-10:]), **trained_label_errors(out)}


PER_SEED = ("peak L1-4", "peak step", "final L1-4", "collapse step", "peak L2", "L2 peak step", "final L2",
            "L2 collapse step", "label accuracy, first 10 steps", "label accuracy, last 10 steps",
            "answer entropy, first 10 steps", "answer entropy, steps 31-40", "answer entropy, last 10 steps")


def collapse_report(results: Sequence[ArmResult], here: Path, seeds: Sequence[int]) -> list[str]:
    """Per-seed rise-then-fall table, mean ± sd, and ``curves.png``."""
    lines = [f"Rise then fall, per seed (held-out = greedy accuracy on the 200-question sets of levels 1-4; collapse "
             f"step: the evaluation after which the L1-L4 mean (L2 collapse step: L2 alone) falls at {COLLAPSE_K} "
             "consecutive evaluations while the training reward still rises; – = none):", "",
             "| arm | seed | " + " | ".join(PER_SEED) + " |", "|---|---|" + "---|" * len(PER_SEED)]
    for r in results:
        for i, seed in enumerate(s for s in seeds if (run_dir(here.parent / "runs", r.arm, s) / "summary.json")
                                 .exists()):
            cells = [r.extra.get(key, [None] * (i + 1))[i] for key in PER_SEED]
            lines.append(f"| {r.arm.name} | {seed} | " + " | ".join(
                "–" if v is None else (f"{v:.0f}" if key.endswith("step") else f"{v:.3f}")
                for key, v in zip(PER_SEED, cells))
                + " |")
        lines.append(f"| {r.arm.name} | mean ± sd | " + " | ".join(mean_sd(r.extra.get(key, [])) for key in PER_SEED)
                     + " |")
    _plot(results, here, seeds)
    return lines


def _plot(results: Sequence[ArmResult], here: Path, seeds: Sequence[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVES), figsize=(20, 3.6))
    for ax, (title, series) in zip(axes, CURVES.items()):
        for colour, r in zip(("tab:blue", "tab:orange", "tab:green", "tab:red"), results):
            runs: list[RunData] = [load_run(run_dir(here.parent / "runs", r.arm, s)) for s in seeds
                                   if (run_dir(here.parent / "runs", r.arm, s) / "summary.json").exists()]
            for k, run in enumerate(runs):
                xs, ys = series(run)
                if xs:
                    ax.plot(xs, ys, color=colour, alpha=0.8, linewidth=1,
                            label=r.arm.name if k == 0 else None, marker="o" if len(xs) < 20 else None, markersize=3)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylim(*((-0.05, 4.05) if "bits" in title else (-1.05, 1.05) if "reward" in title else (-0.02, 1.02)))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(here / "curves.png", dpi=110)
    plt.close(fig)


EXPERIMENT = Experiment("Label-free rewards (majority, EVOL-RL, RESTRAIN) and GRPO on the same level-2 questions of "
                        "tiny-arith", Path(__file__).resolve().parent, ARMS, measure=collapse_measures,
                        extra_report=collapse_report)

if __name__ == "__main__":
    main(EXPERIMENT)
