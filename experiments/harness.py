"""Small-scale reproductions: run arms x seeds with ``coevolve run``, then one results table and plots.

Each ``experiments/<method>/run.py`` defines an ``Experiment`` (its arms: recipe, preset, ``--set``
overrides) and calls ``main``. Runs go to ``experiments/runs/<arm>/seed_<s>/`` (git-ignored, shared by
the experiments so that common arms run once); a finished run is skipped and an interrupted one
resumed, so the script can be stopped and started again. The "untrained" row is the step-0
evaluation every run makes before its first update (greedy, so the same for every seed). Diversity
is measured in one cluster space shared by all runs of the experiment
(``coevolve.analytics.compare``). Results: ``results.json``, ``results.md`` and PNG plots next to
the script.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coevolve.jsonio import read_jsonl
from coevolve.records import current_metric_names

LEVELS = range(1, 7)
LEVEL_KEYS = [f"eval/arith_l{level}/accuracy" for level in LEVELS]
# The accuracy table's columns: (metrics key, header); and a column of the mean over some of them (header, indices)
ARITH_COLUMNS = tuple((key, f"L{level}") for key, level in zip(LEVEL_KEYS, LEVELS))
ARITH_NOTE = "Greedy accuracy on the 200-question held-out set of each level, after the last step."


@dataclass(frozen=True)
class Arm:
    """One configuration of the experiment: a recipe, its preset and overrides."""

    name: str
    recipe: str
    overrides: tuple[str, ...] = ()
    preset: str = "small"
    note: str = ""


Measure = Callable[[Path], dict[str, float]]  # run folder -> named per-run numbers
ExtraReport = Callable[[Sequence["ArmResult"], Path, Sequence[int]], list[str]]  # (results, here, seeds) -> markdown


@dataclass(frozen=True)
class Experiment:
    """One small-scale reproduction: its arms, where its results go, and what it measures beyond accuracy.

    ``measure(run_dir) -> {name: value}`` adds per-run numbers; ``extra_report(results, here, seeds)`` turns them
    into markdown lines (default: one table of their means).
    """

    title: str
    here: Path
    arms: tuple[Arm, ...]
    measure: Measure | None = None
    extra_report: ExtraReport | None = None
    columns: tuple[tuple[str, str], ...] = ARITH_COLUMNS
    mean_column: tuple[str, tuple[int, ...]] | None = ("L3+L4", (2, 3))
    accuracy_note: str = ARITH_NOTE


@dataclass
class ArmResult:
    """What the runs of one arm measured, one value per seed."""

    arm: Arm
    final: dict[str, list[float]] = field(default_factory=dict)  # eval key -> per-seed final accuracy
    start: dict[str, float] = field(default_factory=dict)  # eval key -> step-0 accuracy
    wall_s: list[float] = field(default_factory=list)
    compare_rows: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, list[float]] = field(default_factory=dict)  # arm-level summaries from ``measure``


def run_dir(root: Path, arm: Arm, seed: int) -> Path:
    return root / arm.name / f"seed_{seed}"


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    return [current_metric_names(json.loads(line)) for line in (path / "metrics.jsonl").read_text().splitlines()
            if line.strip()]


def launch(arm: Arm, seed: int, root: Path) -> tuple[list[str], Path]:
    """The ``coevolve run`` command for one (arm, seed): fresh, resumed or nothing to do (empty)."""
    out = run_dir(root, arm, seed)
    if (out / "summary.json").exists():
        return [], out
    cli = [sys.executable, "-m", "coevolve.cli", "run"]
    if (out / "config.yaml").exists():
        return cli + ["--resume", str(out), "--quiet"], out
    args = cli + [arm.recipe, "--preset", arm.preset, "--out", str(out), "--quiet", "--set", f"seed={seed}",
                  "--set", "keep_checkpoints=1"]
    for override in arm.overrides:
        args += ["--set", override]
    return args, out


def run_all(arms: Sequence[Arm], seeds: Sequence[int], root: Path, jobs: int) -> None:
    """Run every (arm, seed) with ``jobs`` processes at a time, one torch thread each, pinned to a core."""
    pending = [(arm, seed) for seed in seeds for arm in arms]
    running: list[tuple[subprocess.Popen, Path, int, float]] = []
    cores = list(range(os.cpu_count() or 1))
    while pending or running:
        while pending and len(running) < jobs:
            arm, seed = pending.pop(0)
            args, out = launch(arm, seed, root)
            if not args:
                continue
            free = [c for c in cores if c not in {r[2] for r in running}] or cores
            core = free[0]
            out.parent.mkdir(parents=True, exist_ok=True)
            log = open(out.parent / f"seed_{seed}.log", "a")  # noqa: SIM115 - the child process owns it
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            pin = ["taskset", "-c", str(core)] if shutil.which("taskset") else []
            print(f"start  {arm.name} seed {seed} on core {core}: {shlex.join(args[3:])}", flush=True)
            running.append((subprocess.Popen(pin + args, stdout=log, stderr=subprocess.STDOUT, env=env), out, core,
                            time.time()))
            log.close()
        time.sleep(2)
        for entry in list(running):
            proc, out, _, started = entry
            if proc.poll() is not None:
                running.remove(entry)
                status = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode}, see {out}.log)"
                print(f"{status:6} {out.relative_to(root)} in {time.time() - started:.0f} s", flush=True)


def collect(arms: Sequence[Arm], seeds: Sequence[int], root: Path, compare_dir: Path,
            measure: Measure | None = None, keys: Sequence[str] = LEVEL_KEYS) -> list[ArmResult]:
    """Final and starting accuracy per arm and seed, plus the comparison rows (shared cluster space)."""
    from coevolve.analytics.compare import compare_runs

    results = [ArmResult(arm) for arm in arms]
    dirs, owners = [], []
    for result in results:
        for seed in seeds:
            out = run_dir(root, result.arm, seed)
            if not (out / "summary.json").exists():
                print(f"missing: {out} has not finished; left out", file=sys.stderr)
                continue
            rows = _read_metrics(out)
            evals = [r for r in rows if keys[0] in r]
            for key in keys:
                result.final.setdefault(key, []).append(evals[-1][key])
                result.start[key] = evals[0][key]
            result.wall_s.append(json.loads((out / "summary.json").read_text()).get("wall_s")
                                 or rows[-1].get("time_s", float("nan")))
            if measure is not None:
                for key, value in measure(out).items():
                    result.extra.setdefault(key, []).append(value)
            dirs.append(out)
            owners.append(result)
    rows, _ = compare_runs(dirs, compare_dir, embed=True)
    for row, owner in zip(rows, owners):
        owner.compare_rows.append(row)
    return results

def generator_collapse(run_dir: Path, window: int = 10) -> dict[str, float]:
    """Mode collapse over the last ``window`` steps: distinct questions and distinct majority answers per step."""
    files = sorted((run_dir / "samples").glob("step_*.jsonl"))[-window:]
    distinct_q, distinct_a = [], []
    for path in files:
        rows = [r for r in read_jsonl(path) if r.get("role") == "generator"]
        if not rows:
            continue
        distinct_q.append(len({r.get("question") for r in rows}) / len(rows))
        labels = [r.get("label") for r in rows if r.get("label") is not None]
        distinct_a.append(len(set(labels)) / len(rows))
    if not distinct_q:  # no generator (grpo)
        return {}
    return {"late_distinct_question_share": statistics.fmean(distinct_q),
            "late_distinct_answer_share": statistics.fmean(distinct_a)}


def trained_label_errors(run_dir: Path) -> dict[str, float]:
    """How often the solver was trained against a wrong label (a generator-written key or a majority vote).

    Over the solver rows that entered an update (``trained``; rows without the flag come from recipes that
    train on every solver sample) whose key the task's oracle could check: the share of rows, and of
    distinct questions, whose key was wrong.
    """
    rows, questions = [], {}
    for path in sorted((run_dir / "samples").glob("step_*.jsonl")):
        for r in read_jsonl(path):
            correct = (r.get("oracle") or {}).get("label_correct")
            if r.get("role") == "solver" and r.get("trained", True) and correct is not None:
                rows.append(bool(correct))
                questions[(r.get("step"), r.get("question_id"))] = bool(correct)
    if not rows:
        return {}
    return {"trained_rows_wrong_key": 1 - statistics.fmean(rows),
            "trained_questions_wrong_key": 1 - statistics.fmean(questions.values()),
            "trained_questions": float(len(questions))}


def mean_sd(values: Sequence[float]) -> str:
    """``mean ± sd`` of the values over seeds (one value: itself; none: a dash)."""
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


DIVERSITY_COLUMNS = ("valid_rate", "label_error_rate", "mean_distinct_2", "mean_duplicate_rate",
                     "mean_pairwise_distance", "normalized_entropy", "gini")


def write_results(results: Sequence[ArmResult], seeds: Sequence[int], here: Path, title: str,
                  extra_report: ExtraReport | None = None, columns: Sequence[tuple[str, str]] = ARITH_COLUMNS,
                  mean_column: tuple[str, tuple[int, ...]] | None = ("L3+L4", (2, 3)),
                  accuracy_note: str = ARITH_NOTE) -> str:
    """``results.json``, ``results.md`` (tables) and ``accuracy.png``; returns the markdown.

    ``columns`` are the accuracy table's (metrics key, header) pairs (default: the arithmetic levels), with a column
    of the mean over ``mean_column``'s indices. ``extra_report(results, here, seeds)`` returns markdown lines that
    replace the generic table of ``measure``'s values (and may write its own figures into ``here``).
    """
    keys, headers = [k for k, _ in columns], [h for _, h in columns]
    untrained = next((r.start for r in results if r.start), {})
    mean_header, mean_of = mean_column if mean_column else ("", ())

    def combined(values: dict[str, Any], per_seed: bool) -> Any:
        parts = [values[keys[i]] for i in mean_of]
        return [statistics.fmean(v) for v in zip(*parts)] if per_seed else statistics.fmean(parts)

    extra_header = f" {mean_header} |" if mean_column else ""
    lines = [f"# {title}: measured results", "",
             f"Seeds {', '.join(map(str, seeds))}; mean ± sample standard deviation over seeds. {accuracy_note}", "",
             "| arm | " + " | ".join(headers) + f" |{extra_header} wall s |",
             "|---|" + "---|" * (len(keys) + 1 + bool(mean_column))]
    if untrained:
        lines.append("| untrained (step 0) | " + " | ".join(f"{untrained[k]:.3f}" for k in keys)
                     + (f" | {combined(untrained, False):.3f}" if mean_column else "") + " | – |")
    for r in results:
        if not r.final:
            continue
        lines.append(f"| {r.arm.name} | " + " | ".join(mean_sd(r.final[k]) for k in keys)
                     + (f" | {mean_sd(combined(r.final, True))}" if mean_column else "")
                     + f" | {statistics.fmean(r.wall_s):.0f} |")
    lines += ["", "Curriculum (generated questions; pooled over each run, then mean ± sd over seeds):", "",
              "| arm | " + " | ".join(DIVERSITY_COLUMNS) + " |", "|---|" + "---|" * len(DIVERSITY_COLUMNS)]
    for r in results:
        if r.compare_rows and any(row.get("valid_rate") is not None for row in r.compare_rows):
            lines.append(f"| {r.arm.name} | " + " | ".join(
                mean_sd([row.get(c) for row in r.compare_rows]) for c in DIVERSITY_COLUMNS) + " |")
    extra_keys = sorted({k for r in results for k in r.extra})
    if extra_report is not None:
        lines += ["", *extra_report(results, here, seeds)]
    elif extra_keys:
        lines += ["", "| arm | " + " | ".join(extra_keys) + " |", "|---|" + "---|" * len(extra_keys)]
        for r in results:
            if r.extra:
                lines.append(f"| {r.arm.name} | " + " | ".join(mean_sd(r.extra.get(k, [])) for k in extra_keys)
                             + " |")
    lines += ["", "Arms:", ""] + [f"- `{r.arm.name}`: `coevolve run {r.arm.recipe} --preset {r.arm.preset}"
                                  + "".join(f" --set {o}" for o in r.arm.overrides) + "`"
                                  + (f" ({r.arm.note})" if r.arm.note else "") for r in results]
    markdown = "\n".join(lines) + "\n"
    (here / "results.md").write_text(markdown)
    payload = {"seeds": list(seeds), "untrained": untrained, "arms": [
        {"name": r.arm.name, "recipe": r.arm.recipe, "preset": r.arm.preset, "overrides": list(r.arm.overrides),
         "final": r.final, "wall_s": r.wall_s, "extra": r.extra, "runs": r.compare_rows} for r in results]}
    (here / "results.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    _plot_accuracy(results, untrained, here / "accuracy.png", title, columns)
    return markdown


def _plot_accuracy(results: Sequence[ArmResult], untrained: dict[str, float], path: Path, title: str,
                   columns: Sequence[tuple[str, str]] = ARITH_COLUMNS) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    keys = [k for k, _ in columns]
    shown = [r for r in results if r.final]
    names = (["untrained"] if untrained else []) + [r.arm.name for r in shown]
    width = 0.8 / max(len(names), 1)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    x = np.arange(len(keys))
    for i, name in enumerate(names):
        if name == "untrained":
            means, sds = [untrained[k] for k in keys], [0.0] * len(keys)
        else:
            r = shown[i - (1 if untrained else 0)]
            means = [statistics.fmean(r.final[k]) for k in keys]
            sds = [statistics.stdev(r.final[k]) if len(r.final[k]) > 1 else 0.0 for k in keys]
        ax.bar(x + i * width - 0.4 + width / 2, means, width, yerr=sds, label=name, capsize=2)
    ax.set_xticks(x, [h for _, h in columns])
    ax.set_ylabel("greedy accuracy (held-out)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(experiment: Experiment, argv: Sequence[str] | None = None) -> None:
    """Command line shared by the experiment scripts: run what is missing, then write the results."""
    arms, here = experiment.arms, experiment.here
    parser = argparse.ArgumentParser(description=experiment.title)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", choices=[a.name for a in arms], default=[a.name for a in arms])
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (one core and one thread each)")
    parser.add_argument("--runs-dir", type=Path, default=here.parent / "runs",
                        help="shared by all experiments, so common arms (grpo) run once")
    parser.add_argument("--report-only", action="store_true", help="only summarise the finished runs")
    args = parser.parse_args(argv)
    chosen = [a for a in arms if a.name in args.arms]
    if not args.report_only:
        started = time.time()
        run_all(chosen, args.seeds, args.runs_dir, args.jobs)
        print(f"all runs finished in {time.time() - started:.0f} s", flush=True)
    results = collect(chosen, args.seeds, args.runs_dir, args.runs_dir / f"compare_{here.name}", experiment.measure,
                      [key for key, _ in experiment.columns])
    print(write_results(results, args.seeds, here, experiment.title, experiment.extra_report, experiment.columns,
                        experiment.mean_column, experiment.accuracy_note))
