"""Side-by-side comparison of runs: one summary table (CSV, JSON, HTML) and the runs' accuracy
curves overlaid, one plot per evaluation set.

Diversity columns are means over steps of the per-step values; label error and validity are
pooled over the run. With ``embed=True`` all runs are measured in one shared cluster space
(K-Means over the pooled questions of all runs, saved in ``OUT/cluster_space/``) unless a
``cluster_space`` is given, so coverage statistics are comparable across runs.
"""

from __future__ import annotations

import base64
import csv
import io
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from coevolve.analytics.collapse import vote_summary
from coevolve.analytics.curriculum import (
    DEFAULT_K,
    RunData,
    analyze_run,
    generated_questions,
    load_run,
    question_embeddings,
)
from coevolve.analytics.report import (
    CSS,
    esc,
    fmt,
    html_table,
    new_figure,
    plot_lines,
    png_bytes,
)
from coevolve.analytics.task_types import task_type_summary
from coevolve.embeddings import ClusterSpace, encoder_name
from coevolve.jsonio import atomic_write_bytes, jsonable, write_json

if TYPE_CHECKING:
    from rich.table import Table

TABLE_CSV = "compare.csv"
TABLE_JSON = "compare.json"
PAGE = "compare.html"


def _run_names(runs: Sequence[RunData]) -> list[str]:
    """Folder names, or paths relative to the common parent when folder names collide."""
    names = [r.run_dir.name for r in runs]
    if len(set(names)) == len(names):
        return names
    paths = [str(r.run_dir.resolve()) for r in runs]
    parent = os.path.commonpath(paths)
    return [os.path.relpath(p, parent) if p != parent else Path(p).name for p in paths]


def _step_mean(an: dict[str, Any], *path: str) -> float | None:
    values = []
    for s in an["steps"]:
        node: Any = s
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, (int, float)):
            values.append(float(node))
    return float(np.mean(values)) if values else None


def _wall_s(run: RunData) -> float | None:
    if run.summary and isinstance(run.summary.get("wall_s"), (int, float)):
        return float(run.summary["wall_s"])
    times = [row["time_s"] for row in run.metrics.values() if isinstance(row.get("time_s"), (int, float))]
    return float(max(times)) if times else None


def _row(name: str, run: RunData, an: dict[str, Any], sets: Sequence[str], roles: Sequence[str]) -> dict[str, Any]:
    o = an["overall"]
    row: dict[str, Any] = {
        "run": name,
        "recipe": run.info("recipe"),
        "model": run.info("model"),
        "task": run.info("task"),
        "seed": run.info("seed"),
        "steps": an["last_step"],
        "finished": run.complete,
        "wall_s": _wall_s(run),
        "tokens": o["cost"]["tokens_total"],
    }
    for role in roles:
        row[f"tokens/{role}"] = o["cost"]["tokens"].get(role)
    for s in sets:
        _, values = run.series(f"eval/{s}/accuracy")
        row[f"final/{s}"] = values[-1] if values else None
        row[f"best/{s}"] = max(values) if values else None
    row.update({
        "valid_rate": o["validity"]["valid_rate"],
        "label_error_rate": o["labels"]["error_rate"],
        "mean_distinct_2": _step_mean(an, "diversity", "distinct_2"),
        "mean_duplicate_rate": _step_mean(an, "diversity", "duplicate_rate"),
        "mean_pairwise_distance": _step_mean(an, "diversity", "mean_pairwise_distance"),
        "mean_normalized_entropy": _step_mean(an, "diversity", "clusters", "normalized_entropy"),
        "normalized_entropy": (o["diversity"]["clusters"] or {}).get("normalized_entropy"),
        "gini": (o["diversity"]["clusters"] or {}).get("gini"),
    })
    return row


def _shared_space(runs: Sequence[RunData], out_dir: Path, k: int, seed: int,
                  encoder: str | Path | None) -> ClusterSpace | None:
    """One cluster space over the distinct questions of all runs (comparable coverage statistics)."""
    seen: dict[str, np.ndarray] = {}
    for run in runs:
        texts = [t for t in generated_questions(run) if t not in seen]
        seen.update(zip(texts, question_embeddings(run, texts, encoder)))
    if len(seen) < 2:
        return None
    space = ClusterSpace.build(np.stack(list(seen.values())), min(k, len(seen)), seed,
                               encoder=encoder_name(encoder),
                               info={"reference": "compared runs", "runs": [str(r.run_dir) for r in runs]})
    space.save(out_dir / "cluster_space")
    return space


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def compare_runs(run_dirs: Sequence[str | Path], out_dir: str | Path, *, embed: bool = False,
                 cluster_space: ClusterSpace | str | Path | None = None, k: int = DEFAULT_K, seed: int = 42,
                 encoder: str | Path | None = None) -> tuple[list[dict[str, Any]], Path]:
    """Compare runs: returns the table rows and the path of ``OUT/compare.html``.

    Also writes ``OUT/compare.csv``, ``OUT/compare.json`` and ``OUT/accuracy_<set>.png``. Analytics
    are recomputed without touching each run's ``analytics/curriculum.json``.
    """
    if not run_dirs:
        raise ValueError("compare_runs needs at least one run directory")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = [load_run(d) for d in run_dirs]
    names = _run_names(runs)
    if embed and cluster_space is None:
        cluster_space = _shared_space(runs, out, k, seed, encoder)
    analyses = [analyze_run(r.run_dir, embed=embed, cluster_space=cluster_space, k=k, seed=seed,
                            encoder=encoder, write=False) for r in runs]
    sets = sorted({s for r in runs for s in r.eval_sets()})
    roles = sorted({role for an in analyses for role in an["overall"]["cost"]["tokens"]})
    rows = [jsonable(_row(n, r, an, sets, roles)) for n, r, an in zip(names, runs, analyses)]
    votes = [vote_summary(r) for r in runs]  # TTRL's vote telemetry and the collapse step: columns some run has
    for row, vote in zip(rows, votes):
        row.update({k: vote[k] for k in vote if any(v[k] is not None for v in votes)})
    tasks = [task_type_summary(r) for r in runs]  # per task type (AZR): columns some run has
    for row, summary in zip(rows, tasks):
        row.update({f"tasks/{k}": summary.get(k) for k in dict.fromkeys(k for t in tasks for k in t)})

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
    atomic_write_bytes(out / TABLE_CSV, buf.getvalue().encode("utf-8"))
    write_json(out / TABLE_JSON, rows)

    body = ["<h1>coevolve run comparison</h1>", "<h2>Summary</h2>",
            html_table(*transposed(rows))]
    if embed:
        body.append('<p class="note">Cluster statistics use one shared cluster space for all runs.</p>')
    body.append("<h2>Accuracy</h2>")
    if not sets:
        body.append('<p class="nodata">no data</p>')
    for s in sets:
        fig, ax = new_figure()
        plot_lines(ax[0, 0], {n: r.series(f"eval/{s}/accuracy") for n, r in zip(names, runs)},
               f"{s}: accuracy", "accuracy", unit_range=True)
        data = png_bytes(fig)
        atomic_write_bytes(out / f"accuracy_{_slug(s)}.png", data)
        body.append(f'<h3>{esc(s)}</h3><img alt="{esc(s)} accuracy" '
                    f'src="data:image/png;base64,{base64.b64encode(data).decode()}">')
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>coevolve comparison</title><style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")
    html_path = out / PAGE
    atomic_write_bytes(html_path, page.encode("utf-8"))
    return rows, html_path


def transposed(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Runs side by side: header ``["metric", run...]`` and one line per metric with any value."""
    header = ["metric"] + [str(r["run"]) for r in rows]
    keys = [k for k in (rows[0] if rows else {}) if k != "run"]
    return header, [[k] + [r.get(k) for r in rows] for k in keys if any(r.get(k) is not None for r in rows)]


def rich_table(rows: Sequence[dict[str, Any]]) -> Table:
    """The comparison as a rich Table for the terminal: one column per run, one line per metric."""
    from rich.table import Table

    header, lines = transposed(rows)
    table = Table(title="run comparison")
    table.add_column(header[0])
    for name in header[1:]:
        table.add_column(name, justify="right")
    for line in lines:
        table.add_row(*(fmt(v) for v in line))
    return table

