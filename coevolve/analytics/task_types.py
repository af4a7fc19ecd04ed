"""Per-task-type telemetry of recipes that train several task types (``azr``: deduction, abduction, induction).

A recipe logs ``tasks/<type>/<name>`` in ``metrics.jsonl`` (coevolve/recipes/azr.py: proposal validity and why
proposals fail, learnability, solve rate, buffer size and diversity, execution cost). This module summarises them
for ``coevolve report`` (a figure and a table) and ``coevolve compare`` (columns).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coevolve.analytics.curriculum import RunData

# (name, how a run's series is summarised, what the column says)
SUMMARY = (
    ("valid_rate", "mean", "share of proposals that are valid tasks, mean over steps"),
    ("learnability", "mean", "mean proposer learnability r_propose of the valid tasks"),
    ("estimated_solve_rate", "mean", "mean solve rate of the learnability rollouts"),
    ("solve_rate", "mean", "mean solve rate of the solver's training rollouts"),
    ("solve_rate", "last", "solve rate at the last step"),
    ("buffer_size", "last", "triplets in the buffer at the end"),
    ("buffer_distinct_programs", "last", "distinct programs in the buffer at the end"),
    ("buffer_program_chars", "last", "mean program length in the buffer at the end (characters)"),
    ("buffer_distinct_ops", "last", "distinct operations the buffer's programs use at the end"),
    ("executor_s", "sum", "seconds of program execution over the run"),
    ("executor_timeouts", "sum", "program runs that hit the time limit over the run"),
)


def task_types(run: RunData) -> list[str]:
    """The task types a run logged (``tasks/<type>/...``), in first-seen order of the paper's (deduction,
    abduction, induction) where they are those."""
    found = {key.split("/")[1] for key in run.keys("tasks/") if key.count("/") == 2}
    order = ["deduction", "abduction", "induction"]
    return [t for t in order if t in found] + sorted(found - set(order))


def invalid_reasons(run: RunData, kind: str) -> list[str]:
    """The reasons a run counted for invalid proposals of ``kind`` (``tasks/<kind>/invalid_<reason>``)."""
    return [key.rsplit("invalid_", 1)[1] for key in run.keys(f"tasks/{kind}/invalid_")]


def task_type_summary(run: RunData) -> dict[str, Any]:
    """One value per (type, SUMMARY entry), named ``<type>/<name>`` (``_final`` for the last value, ``_total`` for a
    sum), plus the share of proposals lost to each invalid reason over the run (``<type>/invalid_<reason>``)."""
    out: dict[str, Any] = {}
    for kind in task_types(run):
        for name, how, _ in SUMMARY:
            _, values = run.series(f"tasks/{kind}/{name}")
            values = [v for v in values if np.isfinite(v)]
            suffix = {"mean": "", "last": "_final", "sum": "_total"}[how]
            out[f"{kind}/{name}{suffix}"] = (None if not values else float(np.mean(values)) if how == "mean"
                                             else values[-1] if how == "last" else float(np.sum(values)))
        for reason in invalid_reasons(run, kind):
            _, values = run.series(f"tasks/{kind}/invalid_{reason}")
            values = [v for v in values if np.isfinite(v)]
            out[f"{kind}/invalid_{reason}"] = float(np.mean(values)) if values else None
    return out
