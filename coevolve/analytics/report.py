"""The run report: one self-contained HTML file (plots as base64 PNG data URIs, inline CSS, no
scripts, no external resources) plus the PNG files in ``RUN/report/``.

Sections: evaluation accuracy, training rewards and losses, reward terms, difficulty (solve-rate
and true-level heatmaps over steps), diversity and cluster coverage (Lorenz curves per
iteration), pseudo-label error, validity, cost per phase and role, and sample generated questions
from the first, middle and last iteration (or step). Model text is data: everything is
HTML-escaped. A section without data says "no data".
"""

from __future__ import annotations

import base64
import html
import io
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from coevolve.analytics.collapse import COLLAPSE_K, VOTE_SERIES, collapse_step, heldout_accuracy, vote_summary
from coevolve.analytics.curriculum import (
    RunData,
    analyze_run,
    band_label,
    load_run,
)
from coevolve.analytics.task_types import SUMMARY, invalid_reasons, task_type_summary, task_types
from coevolve.jsonio import atomic_write_bytes

REPORT_DIR = "report"
REPORT_FILE = "report.html"
MAX_BARS = 60
MAX_TEXT = 400
MAX_INVALID_SHOWN = 2  # invalid completions shown per group, after the valid questions

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px auto;
       max-width: 1100px; color: #222; background: #fff; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: 4px; margin-top: 2em; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.text { max-width: 560px; white-space: pre-wrap; word-break: break-word; font-family: monospace; }
img { max-width: 100%; border: 1px solid #eee; } .nodata { color: #999; font-style: italic; }
.note { color: #555; font-size: 0.9em; }
"""


# -- figures ----------------------------------------------------------------------------------------


def new_figure(rows: int = 1, cols: int = 1, height: float = 3.6) -> tuple[Figure, Any]:
    """A figure on the Agg canvas (no pyplot, no global backend state) and its 2-D axes array."""
    fig = Figure(figsize=(10, height * rows), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def png_bytes(fig: Figure) -> bytes:
    """Render a figure to PNG bytes with the Agg canvas."""
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def plot_lines(ax: Any, series: dict[str, tuple[Sequence[float], Sequence[float]]], title: str,
           ylabel: str = "", unit_range: bool = False) -> bool:
    """One line per named (steps, values) series, skipping None values; says "no data" if none drawn."""
    drawn = False
    for name, (xs, ys) in series.items():
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=name)
            drawn = True
    ax.set_title(title)
    ax.set_xlabel("step")
    if ylabel:
        ax.set_ylabel(ylabel)
    if unit_range:
        ax.set_ylim(-0.02, 1.02)
    if drawn:
        ax.legend(fontsize=8, loc="best")
        ax.grid(alpha=0.3)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="#999")
    return drawn


def _metric_lines(run: RunData, keys: Sequence[str], label: Callable[[str], str]) -> dict[str, tuple[list, list]]:
    series = {label(k): run.series(k) for k in keys}
    return {name: xy for name, xy in series.items() if xy[0]}


def _fig_accuracy(run: RunData, an: dict[str, Any]) -> Figure | None:
    sets = run.eval_sets()
    if not sets:
        return None
    fig, ax = new_figure()
    keys = [f"eval/{s}/{key}" for s in sets for key in ("accuracy", "accuracy_lenient")]
    plot_lines(ax[0, 0], _metric_lines(run, keys, lambda k: k.split("/", 1)[1].replace("/accuracy", "")),
           "evaluation accuracy (strict; _lenient: last number or expression)", "accuracy", unit_range=True)
    return fig


def _fig_training(run: RunData, an: dict[str, Any]) -> Figure | None:
    rewards = _metric_lines(run, [k for k in run.keys("") if k.endswith("/reward_mean")], lambda k: k)
    losses = _metric_lines(run, [k for k in run.keys("") if k.endswith("/loss")], lambda k: k)
    if not rewards and not losses:
        return None
    fig, ax = new_figure(1, 2)
    plot_lines(ax[0, 0], rewards, "mean reward per role")
    plot_lines(ax[0, 1], losses, "loss per role")
    return fig


def _fig_reward_terms(run: RunData, an: dict[str, Any]) -> Figure | None:
    terms = _metric_lines(run, run.keys("reward/"), lambda k: k.removeprefix("reward/"))
    if not terms:
        return None
    fig, ax = new_figure()
    plot_lines(ax[0, 0], terms, "reward terms (batch mean)")
    return fig


def _fig_vote(run: RunData, an: dict[str, Any]) -> Figure | None:
    """TTRL's vote telemetry, and held-out accuracy against the training reward with the collapse step marked."""
    vote = _metric_lines(run, list(VOTE_SERIES), VOTE_SERIES.__getitem__)
    if not vote:
        return None
    fig, ax = new_figure(1, 2)
    plot_lines(ax[0, 0], vote, "majority vote per step", unit_range=True)
    steps, accuracy = heldout_accuracy(run)
    reward = run.series("solver/reward_mean")
    plot_lines(ax[0, 1], {"held-out accuracy (mean over sets)": (steps, accuracy), "training reward": reward},
               "rise then fall?", unit_range=True)
    collapse = collapse_step(steps, accuracy, *reward) if accuracy else None
    if collapse is not None:
        ax[0, 1].axvline(collapse, color="red", linestyle="--", label=f"collapse step (K={COLLAPSE_K})")
        ax[0, 1].legend(fontsize=8)
    return fig


def _heatmap(fig: Figure, ax: Any, matrix: np.ndarray, steps: Sequence[int], ylabels: Sequence[str],
             title: str) -> None:
    im = ax.imshow(matrix, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest",
                   vmin=0.0, vmax=max(float(np.nanmax(matrix)), 1e-9) if np.isfinite(matrix).any() else 1.0)
    ax.set_yticks(range(len(ylabels)))
    ax.set_yticklabels(ylabels, fontsize=7)
    ticks = np.unique(np.linspace(0, len(steps) - 1, min(len(steps), 12)).round().astype(int))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(steps[i]) for i in ticks])
    ax.set_xlabel("step")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="share of the step's questions")


def _fig_difficulty(run: RunData, an: dict[str, Any]) -> Figure | None:
    rows = [s for s in an["steps"] if s["difficulty"]["n"]]
    if not rows:
        return None
    steps = [s["step"] for s in rows]
    hist = np.array([s["difficulty"]["solve_rate_hist"] for s in rows], dtype=float).T
    hist /= np.maximum(hist.sum(axis=0, keepdims=True), 1)
    edges = an["settings"]["solve_rate_bin_edges"]
    levels = sorted({int(lvl) for s in rows for lvl in s["difficulty"]["level_counts"]})
    fig, ax = new_figure(2 if levels else 1, 1, height=3.4)
    _heatmap(fig, ax[0, 0], hist, steps, [f"{edges[i]:.1f}-{edges[i + 1]:.1f}" for i in range(len(edges) - 1)],
             "solve rate p(q) of generated questions")
    if levels:
        lv = np.array([[s["difficulty"]["level_counts"].get(str(lvl), 0) for s in rows] for lvl in levels], float)
        lv /= np.maximum(lv.sum(axis=0, keepdims=True), 1)
        _heatmap(fig, ax[1, 0], lv, steps, [f"level {lvl}" for lvl in levels], "true level (oracle)")
    return fig


def _step_values(an: dict[str, Any], path: Sequence[str]) -> tuple[list[int], list[float | None]]:
    xs, ys = [], []
    for s in an["steps"]:
        node: Any = s
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        xs.append(s["step"])
        ys.append(node if isinstance(node, (int, float)) else None)
    return xs, ys


def _has_values(series: dict[str, tuple[list, list]]) -> bool:
    return any(y is not None for _, ys in series.values() for y in ys)


def _fig_diversity(run: RunData, an: dict[str, Any]) -> Figure | None:
    lexical = {
        "distinct-2": _step_values(an, ["diversity", "distinct_2"]),
        "duplicate rate": _step_values(an, ["diversity", "duplicate_rate"]),
        "mean pairwise cosine distance": _step_values(an, ["diversity", "mean_pairwise_distance"]),
    }
    coverage = {
        "normalised entropy": _step_values(an, ["diversity", "clusters", "normalized_entropy"]),
        "Gini": _step_values(an, ["diversity", "clusters", "gini"]),
        "top-10% share": _step_values(an, ["diversity", "clusters", "top10pct_share"]),
    }
    xs, active = _step_values(an, ["diversity", "clusters", "active"])
    _, ks = _step_values(an, ["diversity", "clusters", "k"])
    coverage["active clusters / K"] = (xs, [a / k if a is not None and k else None for a, k in zip(active, ks)])
    if not _has_values(lexical) and not _has_values(coverage):
        return None
    fig, ax = new_figure(1, 2)
    plot_lines(ax[0, 0], lexical, f"diversity per step ({an['settings']['unit']} n-grams)", unit_range=True)
    plot_lines(ax[0, 1], coverage, "cluster coverage per step", unit_range=True)
    return fig


def _fig_lorenz(run: RunData, an: dict[str, Any]) -> Figure | None:
    curves = [(f"iteration {it['iteration']}", it["diversity"]["clusters"]) for it in an["iterations"]]
    curves.append(("whole run", an["overall"]["diversity"]["clusters"]))
    curves = [(name, c) for name, c in curves if c and c.get("lorenz_x")]
    if not curves:
        return None
    fig, ax = new_figure(1, 2, height=4.0)
    a = ax[0, 0]
    a.plot([0, 1], [0, 1], color="#bbb", linestyle="--", label="uniform")
    for name, c in curves:
        a.plot(c["lorenz_x"], c["lorenz_y"], label=f"{name} (Gini {c['gini']:.2f})")
    a.set_xlabel("cumulative share of clusters (ascending)")
    a.set_ylabel("cumulative share of questions")
    a.set_title("Lorenz curves of cluster counts")
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    b = ax[0, 1]
    width = 0.8 / len(curves)
    for j, (name, c) in enumerate(curves):
        counts = np.array(c["counts"], float)
        b.bar(np.arange(len(counts)) + j * width, counts / max(counts.sum(), 1), width=width, label=name)
    b.set_xlabel("cluster")
    b.set_ylabel("share of questions")
    b.set_title("cluster histogram")
    b.legend(fontsize=8)
    return fig


def _fig_labels(run: RunData, an: dict[str, Any]) -> Figure | None:
    overall = {"label error rate": _step_values(an, ["labels", "error_rate"])}
    if not _has_values(overall):
        return None
    fig, ax = new_figure(1, 2)
    plot_lines(ax[0, 0], overall, "wrong pseudo-labels (oracle) per step", unit_range=True)
    groups = [(f"iteration {it['iteration']}", it["labels"]) for it in an["iterations"]] or [
        ("whole run", an["overall"]["labels"])]
    bands = [b["band"] for b in an["overall"]["labels"]["by_band"]]
    b = ax[0, 1]
    width = 0.8 / len(groups)
    for j, (name, lab) in enumerate(groups):
        rates = [x["error_rate"] if x["error_rate"] is not None else np.nan for x in lab["by_band"]]
        b.bar(np.arange(len(bands)) + j * width, rates, width=width, label=name)
    b.set_xticks(np.arange(len(bands)) + 0.4 - width / 2)
    b.set_xticklabels(bands)
    b.set_xlabel("solve-rate band of the question")
    b.set_ylim(0, 1.02)
    b.set_title("label error rate by solve-rate band")
    b.legend(fontsize=8)
    return fig


def _fig_validity(run: RunData, an: dict[str, Any]) -> Figure | None:
    series = {
        "valid rate": _step_values(an, ["validity", "valid_rate"]),
        "answer-leak rate": _step_values(an, ["validity", "answer_leak_rate"]),
        "generator answer accuracy (oracle)": _step_values(an, ["validity", "generator_answer_accuracy"]),
    }
    if not _has_values(series):
        return None
    fig, ax = new_figure()
    plot_lines(ax[0, 0], series, "generated questions: validity", unit_range=True)
    return fig


def _stacked(ax: Any, steps: Sequence[int], parts: dict[str, list[float]], title: str, ylabel: str) -> None:
    """Stacked bars per step; more than MAX_BARS steps are summed in consecutive chunks."""
    chunks = np.array_split(np.arange(len(steps)), min(len(steps), MAX_BARS))
    labels = [str(steps[c[0]]) if len(c) == 1 else f"{steps[c[0]]}-{steps[c[-1]]}" for c in chunks]
    bottom = np.zeros(len(chunks))
    for name, values in parts.items():
        v = np.array([sum(values[i] for i in c) for c in chunks])
        ax.bar(range(len(chunks)), v, bottom=bottom, label=name)
        bottom += v
    ticks = np.unique(np.linspace(0, len(chunks) - 1, min(len(chunks), 15)).round().astype(int))
    ax.set_xticks(ticks)
    ax.set_xticklabels([labels[i] for i in ticks], fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _fig_cost(run: RunData, an: dict[str, Any]) -> Figure | None:
    rows = [s for s in an["steps"] if s["cost"]["seconds"] or s["cost"]["tokens"]]
    if not rows:
        return None
    steps = [s["step"] for s in rows]
    phases = sorted({p for s in rows for p in s["cost"]["seconds"]})
    roles = sorted({r for s in rows for r in s["cost"]["tokens"]})
    fig, ax = new_figure(1, 2)
    _stacked(ax[0, 0], steps, {p: [s["cost"]["seconds"].get(p, 0.0) for s in rows] for p in phases},
             "seconds per phase", "seconds")
    _stacked(ax[0, 1], steps, {r: [s["cost"]["tokens"].get(r, 0) for s in rows] for r in roles},
             "tokens per role", "tokens")
    return fig


TASK_PANELS = (("valid_rate", "valid proposals", True), ("learnability", "learnability r_propose (valid tasks)", True),
               ("solve_rate", "solve rate (solver rollouts)", True), ("buffer_size", "buffer size", False),
               ("buffer_distinct_ops", "distinct operations in the buffer", False),
               ("executor_s", "execution seconds", False))


def _fig_task_types(run: RunData, an: dict[str, Any]) -> Figure | None:
    """Per task type: validity, learnability, solve rate, buffer size and diversity, execution time; then why
    proposals were invalid, one panel per type."""
    kinds = task_types(run)
    if not kinds:
        return None
    fig, ax = new_figure(3, 3, height=3.2)
    for n, (name, title, unit) in enumerate(TASK_PANELS):
        plot_lines(ax[n // 3, n % 3], _metric_lines(run, [f"tasks/{k}/{name}" for k in kinds],
                                                    lambda key: key.split("/")[1]), title, unit_range=unit)
    for n in range(3):
        if n < len(kinds):
            reasons = [f"tasks/{kinds[n]}/invalid_{r}" for r in invalid_reasons(run, kinds[n])]
            plot_lines(ax[2, n], _metric_lines(run, reasons, lambda key: key.rsplit("invalid_", 1)[1]),
                       f"{kinds[n]}: invalid, by reason", unit_range=True)
        else:
            ax[2, n].axis("off")
    return fig


SECTIONS: list[tuple[str, str, Callable[[RunData, dict[str, Any]], Figure | None], str]] = [
    ("accuracy", "Evaluation accuracy", _fig_accuracy, "Accuracy of the solver on each evaluation set."),
    ("training", "Training rewards and losses", _fig_training, ""),
    ("reward_terms", "Reward terms", _fig_reward_terms, "Batch mean of each reward term over steps."),
    ("difficulty", "Difficulty", _fig_difficulty,
     "Per step, the share of valid generated questions in each solve-rate bin (and true level, if an oracle exists)."),
    ("diversity", "Diversity and cluster coverage", _fig_diversity,
     "Lexical diversity and coverage of the fixed cluster space (Prism's statistics) per step. Coverage "
     "statistics depend on the number of questions: compare steps or runs with similar counts."),
    ("coverage", "Cluster coverage per iteration", _fig_lorenz,
     "Lorenz curves and histograms of cluster counts; the closer to the diagonal, the more even the coverage."),
    ("vote", "Majority vote (TTRL)", _fig_vote,
     "Per step: how often the majority answer is the ground truth (analytics only), its support and margin, the share "
     "of questions whose majority changed since they were last voted on, and the rewards. Right: held-out accuracy "
     f"and the training reward; the dashed line is the collapse step (accuracy falls at {COLLAPSE_K} consecutive "
     "evaluations while the reward rises)."),
    ("label_error", "Pseudo-label quality", _fig_labels,
     "Share of solver training labels that are wrong according to the exact checker (analytics only)."),
    ("validity", "Validity", _fig_validity,
     "Share of generator outputs that parse, answers leaked into the question, generator answers that are right."),
    ("task_types", "Task types", _fig_task_types,
     "Per task type (AZR's deduction, abduction, induction): the share of proposals that are valid tasks, the "
     "proposer's learnability reward, the solver's solve rate, the size and diversity of the task buffer, the seconds "
     "spent running programs, and why proposals were not valid tasks."),
    ("cost", "Cost", _fig_cost, "Seconds per phase and tokens per role, from metrics.jsonl."),
]


# -- html -------------------------------------------------------------------------------------------


def esc(value: Any) -> str:
    """HTML-escape any value (model text is data)."""
    return html.escape(str(value), quote=True)


def fmt(value: Any) -> str:
    """Cell text: floats to 4 significant digits, None as "-"."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.1f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def html_table(header: Sequence[str], rows: Sequence[Sequence[Any]], text_cols: Sequence[int] = ()) -> str:
    """An escaped HTML table; ``text_cols`` are shown as wrapped monospace text."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for i, v in enumerate(row):
            cls = "text" if i in text_cols else "num" if isinstance(v, (int, float)) else ""
            cells.append(f'<td class="{cls}">{esc(fmt(v))}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _clip(text: Any) -> str:
    s = "" if text is None else str(text)
    return s if len(s) <= MAX_TEXT else s[:MAX_TEXT] + "…"


def _sample_groups(an: dict[str, Any]) -> list[tuple[str, list[int]]]:
    """First, middle and last iteration (or step with generated questions)."""
    if an["iterations"]:
        its = an["iterations"]
        picks = sorted({0, len(its) // 2, len(its) - 1})
        return [(f"iteration {its[i]['iteration']}",
                 [s["step"] for s in an["steps"] if s["iteration"] == its[i]["iteration"]]) for i in picks]
    steps = [s["step"] for s in an["steps"] if s["validity"]["n_generated"]]
    if not steps:
        return []
    picks = sorted({0, len(steps) // 2, len(steps) - 1})
    return [(f"step {steps[i]}", [steps[i]]) for i in picks]


def _pick(rows: list[dict[str, Any]], n: int, rng: random.Random) -> list[dict[str, Any]]:
    """Up to n rows, a reproducible random subset kept in file order."""
    return rows if len(rows) <= n else [rows[i] for i in sorted(rng.sample(range(len(rows)), n))]


def _samples_html(run: RunData, an: dict[str, Any], per_group: int) -> str:
    parts = []
    for title, steps in _sample_groups(an):
        rows = [r for s in steps for r in run.samples(s) if r.get("role") == "generator"]
        if not rows:
            continue
        rng = random.Random(0)
        valid = [r for r in rows if r.get("valid")]
        invalid = [r for r in rows if not r.get("valid")]
        picked = _pick(valid, per_group, rng) + _pick(invalid, MAX_INVALID_SHOWN, rng)
        table_rows = []
        for r in picked:
            oracle = r.get("oracle") if isinstance(r.get("oracle"), dict) else {}
            question = r.get("question") if r.get("valid") else f"(invalid) {r.get('completion', '')}"
            table_rows.append([r.get("step"), _clip(question), _clip(r.get("answer")), r.get("solve_rate"),
                               r.get("reward"), oracle.get("answer"), oracle.get("level")])
        parts.append(f"<h3>{esc(title)}</h3>" + html_table(
            ["step", "question", "generator answer", "solve rate", "reward", "true answer", "level"],
            table_rows, text_cols=(1, 2)))
    return "".join(parts) or '<p class="nodata">no data</p>'


def _summary_html(run: RunData, an: dict[str, Any]) -> str:
    info = [("run", run.run_dir.name)] + [(k, run.info(k)) for k in ("recipe", "model", "task", "seed", "steps")]
    info += [("last logged step", an["last_step"]), ("finished", run.complete), ("wall seconds", run.info("wall_s"))]
    parts = [html_table(["field", "value"], info)]
    acc_rows = []
    for s in run.eval_sets():
        steps, values = run.series(f"eval/{s}/accuracy")
        if not values:  # logged, but never as a number
            continue
        best = int(np.argmax(values))
        lenient = dict(zip(*run.series(f"eval/{s}/accuracy_lenient")))
        acc_rows.append([s, values[-1], lenient.get(steps[-1]), steps[-1], values[best], steps[best]])
    if acc_rows:
        parts.append(html_table(["eval set", "final accuracy (strict)", "lenient", "at step", "best accuracy",
                                 "at step"], acc_rows))
    o = an["overall"]
    clusters = o["diversity"]["clusters"] or {}
    parts.append(html_table(["whole run", "value"], [
        ("generated questions", o["validity"]["n_generated"]),
        ("valid rate", o["validity"]["valid_rate"]),
        ("answer-leak rate", o["validity"]["answer_leak_rate"]),
        ("mean solve rate", o["difficulty"]["mean_solve_rate"]),
        ("label error rate (oracle)", o["labels"]["error_rate"]),
        ("duplicate rate", o["diversity"]["duplicate_rate"]),
        ("distinct-2", o["diversity"]["distinct_2"]),
        ("mean pairwise cosine distance", o["diversity"]["mean_pairwise_distance"]),
        ("active clusters", clusters.get("active")),
        ("normalised entropy", clusters.get("normalized_entropy")),
        ("Gini", clusters.get("gini")),
        ("top-10 share", clusters.get("top10_share")),
        ("top-10% share", clusters.get("top10pct_share")),
        ("tokens", o["cost"]["tokens_total"]),
        ("phase seconds", o["cost"]["seconds_total"]),
    ]))
    votes = vote_summary(run)
    if any(v is not None for v in votes.values()):
        parts.append(html_table(["majority vote and collapse", "value"], list(votes.items())))
    space = an["settings"]["cluster_space"]
    if space:
        ref = space["info"].get("reference", "given")
        parts.append(f'<p class="note">Cluster space: K={space["k"]}, encoder {esc(space["encoder"])}, '
                     f'seed {space["seed"]}, built from {space["n_corpus"]} {esc(ref)} questions '
                     f'(sha256 {esc(space["corpus_sha256"][:12])}).</p>')
    bands = ", ".join(band_label(e[0], e[1], i == len(an["settings"]["label_band_edges"]) - 2)
                      for i, e in enumerate(zip(an["settings"]["label_band_edges"],
                                                an["settings"]["label_band_edges"][1:])))
    parts.append(f'<p class="note">Solve-rate bands for label quality: {esc(bands)}.</p>')
    return "".join(parts)


def _task_types_html(run: RunData) -> str:
    """The per-task-type summary as a table: one line per type, one column per summary value."""
    summary, kinds = task_type_summary(run), task_types(run)
    columns = list(dict.fromkeys(key.split("/", 1)[1] for key in summary))
    notes = {f"{name}{ {'mean': '', 'last': '_final', 'sum': '_total'}[how] }": what for name, how, what in SUMMARY}
    header = ["task type", *columns]
    table = html_table(header, [[kind, *(summary.get(f"{kind}/{c}") for c in columns)] for kind in kinds],
                       text_cols=[0])
    legend = "; ".join(f"{c}: {notes.get(c, 'share of proposals invalid for this reason, mean over steps')}"
                       for c in columns)
    return table + f'<p class="note">{esc(legend)}</p>'


def write_report(run_dir: str | Path, out: str | Path | None = None, *, embed: bool = True,
                 analytics: dict[str, Any] | None = None, samples_per_group: int = 8) -> Path:
    """Write the HTML report of a (finished or running) run and return its path.

    ``out`` defaults to ``RUN/report/report.html``; PNGs always go to ``RUN/report/``. Analytics
    are recomputed with :func:`analyze_run` (``embed`` as there) unless ``analytics`` is given.
    """
    run = load_run(run_dir)
    an = analytics if analytics is not None else analyze_run(run.run_dir, embed=embed)
    report_dir = run.run_dir / REPORT_DIR
    html_path = Path(out) if out is not None else report_dir / REPORT_FILE
    body = [f"<h1>coevolve run report: {esc(run.run_dir.name)}</h1>",
            f'<p class="note">{esc(run.run_dir)}, generated {esc(time.strftime("%Y-%m-%d %H:%M:%S"))}</p>',
            "<h2>Summary</h2>", _summary_html(run, an)]
    for name, title, plot, caption in SECTIONS:
        body.append(f'<h2 id="{name}">{esc(title)}</h2>')
        if caption:
            body.append(f'<p class="note">{esc(caption)}</p>')
        fig = plot(run, an)
        png_path = report_dir / f"{name}.png"
        if fig is None:
            png_path.unlink(missing_ok=True)
            body.append('<p class="nodata">no data</p>')
            continue
        data = png_bytes(fig)
        atomic_write_bytes(png_path, data)
        body.append(f'<img alt="{esc(title)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">')
        if name == "task_types":
            body.append(_task_types_html(run))
    body += ["<h2>Sample generated questions</h2>", _samples_html(run, an, samples_per_group)]
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>coevolve report: {esc(run.run_dir.name)}</title><style>{CSS}</style></head>"
            f"<body>{''.join(body)}</body></html>\n")
    atomic_write_bytes(html_path, page.encode("utf-8"))
    return html_path
