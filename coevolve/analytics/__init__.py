"""Curriculum analytics, the HTML run report and run comparison.

- :func:`analyze_run`: difficulty, pseudo-label quality, diversity, validity and cost of a run
  directory, per step, per iteration and overall (``RUN/analytics/curriculum.json``);
- :func:`write_report`: one self-contained HTML report (``RUN/report/report.html``);
- :func:`compare_runs`: side-by-side table and overlaid accuracy curves of several runs;
- the diversity measures of :mod:`coevolve.analytics.diversity`.

``write_report``, ``compare_runs`` and ``rich_table`` are imported on first use, so importing
this package does not load matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

from coevolve.analytics.curriculum import RunData, analyze_run, answer_leaks, load_run
from coevolve.analytics.diversity import (
    cluster_stats,
    distinct_n,
    duplicate_rate,
    entropy_bits,
    gini,
    lorenz_curve,
    mean_pairwise_distance,
    normalize_text,
    top_share,
)

_LAZY = {
    "write_report": "coevolve.analytics.report",
    "compare_runs": "coevolve.analytics.compare",
    "rich_table": "coevolve.analytics.compare",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "RunData", "analyze_run", "answer_leaks", "load_run", "write_report", "compare_runs", "rich_table",
    "cluster_stats", "distinct_n", "duplicate_rate", "entropy_bits", "gini", "lorenz_curve",
    "mean_pairwise_distance", "normalize_text", "top_share",
]
