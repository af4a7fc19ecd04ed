"""Prism against R-Zero on the arithmetic world: held-out accuracy per level, and the paper's curriculum analysis
(Table 2) per iteration: active clusters, normalised entropy, Gini and top-10 share of each iteration's question
pool, in Prism's own fixed cluster space (K = 32 over generated arithmetic questions, all-MiniLM-L6-v2).

    python -m experiments.prism.run [--seeds 0 1 2] [--jobs 2] [--report-only]
"""

import random
import statistics
from collections.abc import Sequence
from pathlib import Path

from coevolve.analytics.diversity import cluster_stats
from coevolve.embeddings import embed
from coevolve.jsonio import read_jsonl
from coevolve.rewards.coverage import cluster_space_for
from experiments.arms import GRPO
from experiments.harness import Arm, ArmResult, Experiment, main, mean_sd, trained_label_errors

# 4 iterations of 30 questioner and 20 solver steps instead of 6 and 20
LONG_QUESTIONER = ("params.questioner_steps=30", "steps=200", "eval_every=50")
# The `small` arms normalise advantages by the group std (the code's form), so lambda changes Prism's bonus but not its
# step size; the paper's mean-only form (eq. 2) lets Prism's rewards (up to 1 + lambda = 6, R-Zero's at most 1) scale
# the step as well. These arms run both methods, and Prism without the bonus, in that form.
MEAN_ONLY = ("params.advantage=dr_grpo",)
ARMS = (
    GRPO,
    Arm("r_zero", "r_zero"),
    Arm("prism", "prism"),
    Arm("prism_no_rarity", "prism", ("params.lam=0",), note="lambda = 0: the ZPD reward alone, no rarity bonus"),
    Arm("r_zero_q30", "r_zero", LONG_QUESTIONER, note="5x the questioner steps: room for R-Zero to collapse"),
    Arm("prism_q30", "prism", LONG_QUESTIONER, note="5x the questioner steps"),
    Arm("prism_q30_no_rarity", "prism", (*LONG_QUESTIONER, "params.lam=0"), note="5x the questioner steps, lambda = 0"),
    Arm("r_zero_mean_only", "r_zero", MEAN_ONLY, note="mean-only advantages (r - mean), as in the paper's eq. 2"),
    Arm("prism_mean_only", "prism", MEAN_ONLY, note="mean-only advantages: lambda scales the step size too"),
    Arm("prism_no_rarity_mean_only", "prism", (*MEAN_ONLY, "params.lam=0"), note="mean-only advantages, lambda = 0"),
)
POOL_SAMPLE = 240  # questions per pool, drawn at random (seed 0): the same N for every run and iteration
STATS = {"active": "active clusters", "normalized_entropy": "normalised entropy", "gini": "Gini",
         "top10_share": "top-10 share"}


def curriculum_measures(run_dir: Path) -> dict[str, float]:
    """Pool coverage per iteration, and how often the solver trained against a wrong majority label."""
    return {**pool_coverage(run_dir), **trained_label_errors(run_dir)}


def pool_coverage(run_dir: Path) -> dict[str, float]:
    """Table 2 for each iteration's pool: statistics of POOL_SAMPLE valid pool questions in Prism's cluster space."""
    space, _ = cluster_space_for("arith", 32)  # the space of `prism --preset small` (arith corpus, K = 32)
    pools: dict[int, list[str]] = {}
    for path in sorted((run_dir / "samples").glob("step_*.jsonl")):
        for r in read_jsonl(path):
            if r.get("role") == "generator" and r.get("phase") == "pool" and r.get("valid") and r.get("question"):
                pools.setdefault(r["iteration"], []).append(r["question"])
    out = {}
    for iteration, questions in sorted(pools.items()):
        sample = random.Random(0).sample(questions, min(POOL_SAMPLE, len(questions)))
        stats = cluster_stats(space.counts(space.assign(embed(sample))))
        out.update({f"iteration {iteration}/{key}": stats[key] for key in STATS})
    return out


def base_model_coverage(seeds: Sequence[int]) -> dict[str, list[float]]:
    """The untrained questioner M_0 as Table 2's "base model" row: one pool of POOL_SAMPLE questions per seed."""
    from coevolve.models import load_policy
    from coevolve.rollout.base import SamplingParams
    from coevolve.rollout.hf import HFRolloutEngine
    from coevolve.tasks import arith

    space, _ = cluster_space_for("arith", 32)
    policy = load_policy("tiny-arith")
    engine = HFRolloutEngine(policy.model, policy.tokenizer, batch_size=64, eos_token_ids=policy.eos_token_ids)
    prompt = policy.format_prompt(arith.question_prompt(policy.prompt_style))
    stats: dict[str, list[float]] = {}
    for seed in seeds:  # temperature 1 and the 48-token budget of `r_zero --preset small`'s pool
        outputs = engine.generate([prompt] * 2 * POOL_SAMPLE, SamplingParams(max_new_tokens=48), seed)
        parsed = [arith.parse_question(o.text, policy.prompt_style) for o in outputs]
        questions = [q.question for q in parsed if q is not None][:POOL_SAMPLE]
        for key, value in cluster_stats(space.counts(space.assign(embed(questions)))).items():
            stats.setdefault(key, []).append(value)
    return stats


def coverage_report(results: Sequence[ArmResult], here: Path, seeds: Sequence[int]) -> list[str]:
    """Per-iteration coverage table (mean ± sd over seeds) and ``curriculum.png``."""
    shown = [r for r in results if any(k.startswith("iteration") for k in r.extra)]  # not grpo
    iterations = sorted({int(k.split("/")[0].split()[1]) for r in shown for k in r.extra if k.startswith("iteration")})
    lines = [f"Curriculum coverage of each iteration's question pool ({POOL_SAMPLE} questions sampled per pool, "
             "Prism's cluster space, K = 32; mean ± sd over seeds):", "",
             "| arm | iteration | " + " | ".join(STATS.values()) + " |", "|---|---|" + "---|" * len(STATS)]
    base = base_model_coverage(seeds)
    lines.append("| untrained questioner (M_0) | – | " + " | ".join(mean_sd(base[key]) for key in STATS) + " |")
    for r in shown:
        for it in iterations:
            lines.append(f"| {r.arm.name} | {it} | " + " | ".join(
                mean_sd(r.extra.get(f"iteration {it}/{key}", [])) for key in STATS) + " |")
    _plot(shown, iterations, base, here / "curriculum.png")
    lines += ["", "Majority-vote labels the solver trained on that the arithmetic oracle says are wrong "
              "(mean ± sd over seeds):", "", "| arm | share of trained questions | share of trained samples |",
              "|---|---|---|"]
    lines += [f"| {r.arm.name} | {mean_sd(r.extra.get('trained_questions_wrong_key', []))} | "
              f"{mean_sd(r.extra.get('trained_rows_wrong_key', []))} |" for r in results if r.extra]
    return lines


def _plot(results: Sequence[ArmResult], iterations: list[int], base: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(STATS), figsize=(13, 3.2))
    for ax, (key, label) in zip(axes, STATS.items()):
        for r in results:
            series = [r.extra.get(f"iteration {it}/{key}", []) for it in iterations]
            means = [statistics.fmean(v) for v in series]
            sds = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in series]
            ax.errorbar(iterations, means, yerr=sds, label=r.arm.name, capsize=2, marker="o")
        ax.axhline(statistics.fmean(base[key]), color="grey", linestyle="--", label="untrained questioner")
        ax.set_title(label)
        ax.set_xlabel("iteration")
        ax.set_xticks(iterations)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


EXPERIMENT = Experiment("Prism and R-Zero on tiny-arith", Path(__file__).resolve().parent, ARMS,
                        measure=curriculum_measures, extra_report=coverage_report)

if __name__ == "__main__":
    main(EXPERIMENT)
