"""SPICE against R-Zero and PasoDoble on the arithmetic world: does grounding the task writer in documents help?

SPICE and PasoDoble read the same document source (the ``arith`` fact sheets); R-Zero reads none (ungrounded
self-play). All three at the ``small`` preset's scale of about 100 loop steps. Held-out accuracy, the curriculum's
diversity (the shared ``coevolve.analytics.compare`` space) and the distribution of the task writer's success rate
(the share of its tasks the solver answers right, from the generator rows' ``solve_rate``).

    python -m experiments.spice.run [--seeds 0 1 2] [--jobs 1] [--report-only]
"""

import statistics
from collections.abc import Sequence
from pathlib import Path

from coevolve.analytics.curriculum import load_run
from coevolve.jsonio import read_jsonl
from experiments.harness import Arm, ArmResult, Experiment, main, mean_sd, run_dir, trained_label_errors

ARMS = (
    Arm("spice", "spice", note="Challenger reads a fact sheet, Reasoner answers without it; 100 steps"),
    Arm("pasodoble_100", "pasodoble", ("steps=100", "eval_every=25"),
        note="the same fact sheets (knowledge_source arith); 100 of the preset's 300 steps, for the same budget"),
    Arm("r_zero", "r_zero", note="ungrounded: the Questioner reads no document; 104 steps (4 iterations of 6 + 20)"),
)
BINS = ("p = 0", "0 < p < 0.5", "p = 0.5", "0.5 < p < 1", "p = 1")


def solve_rates(out: Path, last_share: float = 1.0) -> list[float]:
    """The solver's success rate on every task the writer produced that was solved at all (``solve_rate`` set), over
    the last ``last_share`` of the run's steps."""
    files = sorted((out / "samples").glob("step_*.jsonl"))
    rates = []
    for path in files[int(len(files) * (1 - last_share)):]:
        rates += [float(r["solve_rate"]) for r in read_jsonl(path)
                  if r.get("role") == "generator" and r.get("solve_rate") is not None]
    return rates


def bin_of(p: float) -> str:
    if p == 0:
        return BINS[0]
    if p == 1:
        return BINS[4]
    return BINS[1] if p < 0.5 else BINS[2] if p == 0.5 else BINS[3]


def grounding_measures(out: Path) -> dict[str, float]:
    """The success-rate distribution (whole run and last quarter), the tokens generated, and wrong keys trained on."""
    rates, late = solve_rates(out), solve_rates(out, 0.25)
    run = load_run(out)
    tokens = sum(v for row in run.metrics.values() for k, v in row.items()
                 if k.startswith("tokens/") and isinstance(v, (int, float)))
    return {"tasks scored": float(len(rates)), "mean p": statistics.fmean(rates),
            **{f"share {b}": statistics.fmean(bin_of(p) == b for p in rates) for b in BINS},
            "mean p, last quarter": statistics.fmean(late),
            "share 0 < p < 1, last quarter": statistics.fmean(0 < p < 1 for p in late),
            "tokens generated": float(tokens), **trained_label_errors(out)}


SHOWN = ("tasks scored", "mean p", *(f"share {b}" for b in BINS), "mean p, last quarter",
         "share 0 < p < 1, last quarter", "tokens generated", "trained_questions_wrong_key")


def grounding_report(results: Sequence[ArmResult], here: Path, seeds: Sequence[int]) -> list[str]:
    """The success-rate table (mean ± sd over seeds) and ``success_rate.png`` (pooled histogram per arm)."""
    lines = ["The task writer's success rate p: per task, the share of the solver's samples that were right (SPICE, "
             "PasoDoble: against the writer's document-grounded answer; R-Zero: agreement with the solver's own "
             "majority answer, its pseudo-label), over every task that reached the solver; mean ± sd over seeds:", "",
             "| arm | " + " | ".join(SHOWN) + " |", "|---|" + "---|" * len(SHOWN)]
    for r in results:
        if r.extra:
            lines.append(f"| {r.arm.name} | " + " | ".join(mean_sd(r.extra.get(k, [])) for k in SHOWN) + " |")
    _plot(results, here, seeds)
    return lines


def _plot(results: Sequence[ArmResult], here: Path, seeds: Sequence[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.4), squeeze=False)
    for ax, r in zip(axes[0], results):
        rates = [p for s in seeds if (run_dir(here.parent / "runs", r.arm, s) / "summary.json").exists()
                 for p in solve_rates(run_dir(here.parent / "runs", r.arm, s))]
        if rates:
            ax.hist(rates, bins=[i / 16 - 1 / 32 for i in range(18)], color="tab:blue", alpha=0.8,
                    weights=[1 / len(rates)] * len(rates))
        ax.set_title(f"{r.arm.name}: solver success per task ({len(rates)} tasks)", fontsize=9)
        ax.set_xlabel("p")
        ax.set_ylabel("share of tasks")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(here / "success_rate.png", dpi=110)
    plt.close(fig)


EXPERIMENT = Experiment("SPICE, PasoDoble and R-Zero on tiny-arith (fact sheets)", Path(__file__).resolve().parent,
                        ARMS, measure=grounding_measures, extra_report=grounding_report)

if __name__ == "__main__":
    main(EXPERIMENT)
