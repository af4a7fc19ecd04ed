"""Curriculum analytics of one run directory: difficulty, pseudo-label quality, diversity,
validity and cost, per step, per co-evolution iteration and over the whole run.

Reads ``config.yaml``, ``metrics.jsonl``, ``samples/step_*.jsonl`` and (when finished)
``summary.json``; works on a run that is still being written. Writes
``RUN/analytics/curriculum.json`` and, when embeddings are on, caches under ``RUN/analytics/``:
``embeddings.npz`` (question embeddings keyed by text hash) and ``cluster_space/`` (the fixed
partition the coverage statistics are measured in, Prism §6.2).

Definitions (per group of rows, a group being a step, an iteration or the run):

- *difficulty*: solve rates p(q) of valid generated questions (histogram on 10 equal bins of
  [0, 1]) and, in the arithmetic world, the true level from the oracle;
- *labels*: each (step, question) a solver trained on with a label counts once; ``error_rate`` is
  the share whose label is wrong per the oracle, overall, by solve-rate band of the question (the
  generator's p(q), else the solver row's) and by label source;
- *diversity*: over the valid generated questions: distinct-n, duplicate rate, mean pairwise
  cosine distance and Prism's cluster statistics (the last two need embeddings);
- *validity*: share of generator rows whose question parsed; answer-leak rate (the generator's
  answer appears as a token sequence in its question, among valid rows with an answer); accuracy
  of the generator's own answers per the oracle;
- *cost*: sums of ``tokens/<role>`` and ``time/<phase>_s`` from the training metrics.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from coevolve.analytics.diversity import (
    TokenUnit,
    cluster_stats,
    distinct_n,
    duplicate_rate,
    lorenz_curve,
    mean_pairwise_distance,
)
from coevolve.embeddings import META_FILE, ClusterSpace, corpus_hash, encoder_name
from coevolve.embeddings import embed as embed_texts
from coevolve.jsonio import atomic_write_bytes, jsonable, read_jsonl, write_json
from coevolve.records import SampleRow, current_metric_names

ANALYTICS_DIR = "analytics"
CURRICULUM_FILE = "curriculum.json"
EMBEDDING_CACHE = "embeddings.npz"
CLUSTER_DIR = "cluster_space"
SOLVE_RATE_BINS = 10
LABEL_BANDS = (0.0, 0.25, 0.5, 0.75, 1.0)
NGRAMS = (1, 2, 3)
DEFAULT_K = 32  # K = 32 for the arithmetic world's 2,000 reference questions (the paper's K = 128 is for MATH)
_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")
_TOKEN = re.compile(r"\d+(?:\.\d+)?|[^\W\d_]+|\S")


# -- reading a run directory ------------------------------------------------------------------------


@dataclass
class RunData:
    """What a run directory holds so far. ``metrics`` merges rows per step (later rows win), so a
    step's training and evaluation values sit in one dict."""

    run_dir: Path
    config: dict[str, Any]
    summary: dict[str, Any] | None
    metrics: dict[int, dict[str, Any]]
    sample_files: dict[int, Path] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """True once the run wrote ``summary.json``."""
        return self.summary is not None

    def samples(self, step: int) -> list[dict[str, Any]]:
        """Sample records of one step (empty if the step wrote none)."""
        path = self.sample_files.get(step)
        return read_jsonl(path) if path else []

    def info(self, key: str) -> Any:
        """A run-level value from summary.json, else config.yaml."""
        if self.summary and self.summary.get(key) is not None:
            return self.summary[key]
        return self.config.get(key)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric key, skipping steps where it is missing or null."""
        pairs = [(s, float(row[key])) for s, row in sorted(self.metrics.items())
                 if isinstance(row.get(key), (int, float)) and not isinstance(row.get(key), bool)]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def keys(self, prefix: str) -> list[str]:
        """Sorted metric keys starting with ``prefix``."""
        return sorted({k for row in self.metrics.values() for k in row if k.startswith(prefix)})

    def eval_sets(self) -> list[str]:
        """Evaluation sets with an ``eval/<set>/accuracy`` metric."""
        return [k.split("/")[1] for k in self.keys("eval/") if k.endswith("/accuracy") and k.count("/") == 2]

    def training_steps(self) -> list[int]:
        """Steps with a training row (any key besides step, time_s and eval/*)."""
        return sorted(s for s, row in self.metrics.items()
                      if any(k not in ("step", "time_s") and not k.startswith("eval/") for k in row))


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def load_run(run_dir: str | Path) -> RunData:
    """Read a (possibly unfinished) run directory; raises FileNotFoundError if it is not one."""
    root = Path(run_dir)
    if not (root / "metrics.jsonl").is_file() and not (root / "config.yaml").is_file():
        raise FileNotFoundError(f"{root} is not a run directory (no config.yaml or metrics.jsonl)")
    metrics: dict[int, dict[str, Any]] = {}
    for row in read_jsonl(root / "metrics.jsonl"):
        if isinstance(row.get("step"), int):
            metrics.setdefault(row["step"], {}).update(current_metric_names(row))
    sample_files = {}
    if (root / "samples").is_dir():
        for path in (root / "samples").iterdir():
            match = _STEP_FILE.match(path.name)
            if match:
                sample_files[int(match.group(1))] = path
    summary_path = root / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    return RunData(root, _read_yaml(root / "config.yaml"), summary, metrics, sample_files)


# -- small pure helpers -----------------------------------------------------------------------------


def answer_leaks(question: str, answer: str) -> bool:
    """True if the answer appears in the question as a whole token sequence (case-insensitive).

    Tokens are numbers (``12``, ``3.5``), letter runs and single other characters, so answer ``23``
    leaks in ``"... is 23?"`` but not in ``"123 + 4"`` or ``"2.23"``.
    """
    q = _TOKEN.findall(question.casefold())
    a = _TOKEN.findall(answer.strip().casefold())
    if not a:
        return False
    return any(q[i : i + len(a)] == a for i in range(len(q) - len(a) + 1))


def band_label(lo: float, hi: float, last: bool) -> str:
    """Label of a solve-rate band, e.g. ``[0.25,0.5)``; the last band is closed."""
    return f"[{lo:g},{hi:g}{']' if last else ')'}"


def _band_index(p: float, edges: Sequence[float]) -> int:
    for i in range(len(edges) - 1):
        if edges[i] <= p < edges[i + 1]:
            return i
    return len(edges) - 2  # p == 1.0 falls in the closed last band


def _rate(num: int, den: int) -> float:
    return num / den if den else math.nan


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def default_unit(config: Mapping[str, Any]) -> TokenUnit:
    """Token unit for distinct-n: characters for the arithmetic world, words otherwise."""
    return "char" if str(config.get("task", "")).lower().startswith("arith") else "word"


# -- compact rows -----------------------------------------------------------------------------------


@dataclass
class _Gen:
    """One generator row, reduced to what the analytics need."""

    step: int
    iteration: int | None
    question_id: str
    valid: bool
    question: str | None
    answer: str | None
    solve_rate: float | None
    level: int | None
    answer_correct: bool | None


@dataclass
class _Label:
    """One solver training label (a question the solver trained on in one step)."""

    step: int
    iteration: int | None
    question_id: str
    phase: str
    source: str
    solve_rate: float | None
    wrong: bool


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _collect(run: RunData) -> tuple[list[_Gen], list[_Label], dict[int, int | None]]:
    """Generator rows, solver training labels (once per step and question) and each step's iteration."""
    gens: list[_Gen] = []
    labels: list[_Label] = []
    step_iteration: dict[int, int | None] = {}
    for step in sorted(run.sample_files):
        rows = [SampleRow.from_record(r) for r in run.samples(step)]
        iters = Counter(r.iteration for r in rows if r.iteration is not None)
        step_iteration[step] = iters.most_common(1)[0][0] if iters else None
        seen: set[str] = set()
        for r in rows:
            it = r.iteration if r.iteration is not None else step_iteration[step]
            oracle = r.oracle or {}
            qid = str(r.question_id)
            if r.role == "generator":
                gens.append(_Gen(
                    step=step, iteration=it, question_id=qid, valid=r.valid and r.question is not None,
                    question=r.question, answer=r.answer, solve_rate=_num(r.solve_rate),
                    level=oracle["level"] if isinstance(oracle.get("level"), int) else None,
                    answer_correct=oracle["correct"] if isinstance(oracle.get("correct"), bool) else None,
                ))
            elif (r.role == "solver" and r.label is not None and isinstance(oracle.get("label_correct"), bool)
                  and qid not in seen):
                seen.add(qid)
                labels.append(_Label(
                    step=step, iteration=it, question_id=qid, phase=str(r.phase), source=str(r.label_source),
                    solve_rate=_num(r.solve_rate), wrong=not oracle["label_correct"],
                ))
    generator_rate = {g.question_id: g.solve_rate for g in gens if g.solve_rate is not None}
    for lab in labels:
        lab.solve_rate = generator_rate.get(lab.question_id, lab.solve_rate)
    return gens, labels, step_iteration


# -- sections ---------------------------------------------------------------------------------------


@dataclass
class _Embedded:
    """Embeddings of the run's unique valid questions and, if available, their cluster ids."""

    index: dict[str, int]
    vectors: np.ndarray
    space: ClusterSpace | None = None
    cluster_ids: np.ndarray | None = None


def _difficulty(gens: Sequence[_Gen]) -> dict[str, Any]:
    rates = [min(max(g.solve_rate, 0.0), 1.0) for g in gens if g.valid and g.solve_rate is not None]
    hist, _ = np.histogram(rates, bins=SOLVE_RATE_BINS, range=(0.0, 1.0))
    levels = Counter(g.level for g in gens if g.valid and g.level is not None)
    return {
        "n": len(rates),
        "mean_solve_rate": _mean(rates),
        "solve_rate_hist": hist.tolist(),
        "level_counts": {str(lvl): c for lvl, c in sorted(levels.items())},
        "mean_level": _mean(list(levels.elements())),
    }


def _error_summary(labels: Sequence[_Label]) -> dict[str, Any]:
    return {"n": len(labels), "error_rate": _rate(sum(lab.wrong for lab in labels), len(labels))}


def _label_quality(labels: Sequence[_Label]) -> dict[str, Any]:
    edges = LABEL_BANDS
    bands: list[list[_Label]] = [[] for _ in range(len(edges) - 1)]
    for lab in labels:
        if lab.solve_rate is not None:
            bands[_band_index(lab.solve_rate, edges)].append(lab)
    return {
        **_error_summary(labels),
        "by_band": [
            {"band": band_label(edges[i], edges[i + 1], i == len(bands) - 1), **_error_summary(b)}
            for i, b in enumerate(bands)
        ],
        "n_without_solve_rate": sum(lab.solve_rate is None for lab in labels),
        "by_source": {s: _error_summary([x for x in labels if x.source == s])
                      for s in sorted({x.source for x in labels})},
        "by_phase": {p: _error_summary([x for x in labels if x.phase == p])
                     for p in sorted({x.phase for x in labels})},
    }


def _validity(gens: Sequence[_Gen]) -> dict[str, Any]:
    valid = [g for g in gens if g.valid]
    with_answer = [g for g in valid if g.answer and g.answer.strip()]
    checked = [g for g in valid if g.answer_correct is not None]
    return {
        "n_generated": len(gens),
        "n_valid": len(valid),
        "valid_rate": _rate(len(valid), len(gens)),
        "n_with_answer": len(with_answer),
        "answer_leak_rate": _rate(sum(answer_leaks(g.question or "", g.answer or "") for g in with_answer),
                                  len(with_answer)),
        "generator_answer_accuracy": _rate(sum(bool(g.answer_correct) for g in checked), len(checked)),
    }


def _diversity(gens: Sequence[_Gen], unit: TokenUnit, emb: _Embedded | None, full: bool) -> dict[str, Any]:
    questions = [g.question for g in gens if g.valid and g.question is not None]
    out: dict[str, Any] = {"n": len(questions), "unit": unit, "duplicate_rate": duplicate_rate(questions)}
    for n in NGRAMS:
        out[f"distinct_{n}"] = distinct_n(questions, n, unit)
    out["mean_pairwise_distance"] = None
    out["clusters"] = None
    if emb is None:
        return out
    rows = np.array([emb.index[q] for q in questions], dtype=np.int64)
    out["mean_pairwise_distance"] = mean_pairwise_distance(emb.vectors[rows]) if len(rows) else math.nan
    if emb.space is not None and emb.cluster_ids is not None:
        counts = emb.space.counts(emb.cluster_ids[rows])
        stats: dict[str, Any] = cluster_stats(counts)
        if full and len(rows):
            stats["counts"] = counts.tolist()
            stats["lorenz_x"], stats["lorenz_y"] = lorenz_curve(counts)
        out["clusters"] = stats
    return out


def _cost(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    tokens: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    skipped = 0
    for row in rows:
        skipped += row.get("skipped") is True
        for key, value in row.items():
            v = _num(value)
            if v is None:
                continue
            if key.startswith("tokens/"):
                tokens[key.removeprefix("tokens/")] += v
            elif key.startswith("time/") and key.endswith("_s"):
                seconds[key.removeprefix("time/").removesuffix("_s")] += v
    return {
        "tokens": dict(sorted(tokens.items())),
        "tokens_total": sum(tokens.values()),
        "seconds": dict(sorted(seconds.items())),
        "seconds_total": sum(seconds.values()),
        "n_skipped": skipped,
    }


def _section(gens: Sequence[_Gen], labels: Sequence[_Label], metric_rows: Sequence[Mapping[str, Any]],
             unit: TokenUnit, emb: _Embedded | None, full: bool) -> dict[str, Any]:
    return {
        "difficulty": _difficulty(gens),
        "labels": _label_quality(labels),
        "diversity": _diversity(gens, unit, emb, full),
        "validity": _validity(gens),
        "cost": _cost(metric_rows),
    }


# -- embeddings and the cluster space ---------------------------------------------------------------


def _text_key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def generated_questions(run: RunData) -> list[str]:
    """The run's distinct valid generated questions, in order of first appearance."""
    gens, _, _ = _collect(run)
    return _unique_questions(gens)


def _unique_questions(gens: Sequence[_Gen]) -> list[str]:
    return list(dict.fromkeys(g.question for g in gens if g.valid and g.question is not None))


def question_embeddings(run: RunData, texts: Sequence[str], encoder: str | Path | None = None) -> np.ndarray:
    """Embeddings of distinct ``texts``, reusing and extending the run's ``analytics/embeddings.npz``."""
    if not texts:
        return np.zeros((0, 1), dtype=np.float32)
    cache = run.run_dir / ANALYTICS_DIR / EMBEDDING_CACHE
    name = encoder_name(encoder)
    stored: dict[str, np.ndarray] = {}
    if cache.is_file():
        with np.load(cache, allow_pickle=False) as z:
            if str(z["encoder"]) == name:
                stored = dict(zip(z["keys"].tolist(), z["vectors"]))
    keys = [_text_key(t) for t in texts]
    missing = [t for t, k in zip(texts, keys) if k not in stored]
    if missing:
        stored.update(zip((_text_key(t) for t in missing), embed_texts(missing, path=encoder)))
        buf = io.BytesIO()
        np.savez(buf, encoder=np.array(name), keys=np.array(list(stored), dtype="<U40"),
                 vectors=np.stack(list(stored.values())).astype(np.float32))
        atomic_write_bytes(cache, buf.getvalue())
    return np.stack([stored[k] for k in keys]).astype(np.float32)


def _resolve_space(run: RunData, vectors: np.ndarray, *, corpus: Sequence[str] | None,
                   cluster_space: ClusterSpace | str | Path | None, k: int, seed: int,
                   encoder: str | Path | None, rebuild: bool) -> ClusterSpace | None:
    """The fixed cluster space: given, cached in ``analytics/cluster_space/``, or built once.

    Default reference set: the run's unique valid generated questions pooled over all steps. A
    space built from an unfinished run is kept while the run is live (so coverage stays comparable
    between analyses) and rebuilt once after the run finishes.
    """
    name = encoder_name(encoder)
    if isinstance(cluster_space, ClusterSpace):
        space = cluster_space
    elif cluster_space is not None:
        space = ClusterSpace.load(cluster_space)
    else:
        folder = run.run_dir / ANALYTICS_DIR / CLUSTER_DIR
        reference = "run" if corpus is None else "corpus"
        space = ClusterSpace.load(folder) if (folder / META_FILE).is_file() and not rebuild else None
        reusable = (
            space is not None and space.encoder == name and space.seed == seed
            and space.info.get("reference") == reference and space.info.get("k_requested") == k
            and ((space.info.get("run_complete") or not run.complete) if corpus is None
                 else space.corpus_sha256 == corpus_hash(list(corpus)))
        )
        if not reusable:
            info = {"reference": reference, "k_requested": k, "run_complete": run.complete}
            if corpus is not None:
                texts = list(corpus)
                space = ClusterSpace.build(texts, min(k, len(texts)), seed, encoder=name,
                                           embed_fn=lambda t: embed_texts(t, path=encoder), info=info)
            elif len(vectors) >= 2:
                space = ClusterSpace.build(vectors, min(k, len(vectors)), seed, encoder=name, info=info)
            else:
                return None
            space.save(folder)
    if space.encoder != name:
        raise ValueError(f"cluster space was built with encoder {space.encoder!r}, but analytics embed with {name!r}")
    return space


# -- the analysis -----------------------------------------------------------------------------------


def analyze_run(
    run_dir: str | Path,
    embed: bool = True,
    *,
    corpus: Sequence[str] | None = None,
    cluster_space: ClusterSpace | str | Path | None = None,
    k: int = DEFAULT_K,
    seed: int = 42,
    unit: TokenUnit | None = None,
    encoder: str | Path | None = None,
    rebuild_clusters: bool = False,
    write: bool = True,
) -> dict[str, Any]:
    """Curriculum analytics of a finished or running run, per step, per iteration and overall.

    ``embed=False`` skips the sentence encoder (no mean pairwise distance, no cluster statistics).
    The cluster space is ``cluster_space`` (a ``ClusterSpace`` or a saved folder) if given, else
    K-Means (``k``, ``seed``; Prism: n_init 10) over ``corpus`` or, by default, over the run's own
    generated questions; it is cached in ``RUN/analytics/cluster_space/``. ``unit`` is the distinct-n
    token unit (default: ``char`` for the arithmetic task, ``word`` otherwise). Writes
    ``RUN/analytics/curriculum.json`` atomically unless ``write=False``; returns the same dict.
    """
    run = load_run(run_dir)
    unit = unit or default_unit(run.config)
    gens, labels, step_iteration = _collect(run)

    emb: _Embedded | None = None
    if embed:
        texts = _unique_questions(gens)
        vectors = question_embeddings(run, texts, encoder)
        space = _resolve_space(run, vectors, corpus=corpus, cluster_space=cluster_space, k=k, seed=seed,
                               encoder=encoder, rebuild=rebuild_clusters)
        emb = _Embedded({t: i for i, t in enumerate(texts)}, vectors, space,
                        space.assign(vectors) if space is not None and len(texts) else None)

    steps = sorted(set(run.training_steps()) | set(run.sample_files))
    gens_at: dict[int, list[_Gen]] = {}
    labels_at: dict[int, list[_Label]] = {}
    for g in gens:
        gens_at.setdefault(g.step, []).append(g)
    for lab in labels:
        labels_at.setdefault(lab.step, []).append(lab)
    step_rows = [
        {"step": s, "iteration": step_iteration.get(s),
         **_section(gens_at.get(s, []), labels_at.get(s, []), [run.metrics.get(s, {})], unit, emb, full=False)}
        for s in steps
    ]
    iteration_rows = []
    for it in sorted({i for i in step_iteration.values() if i is not None}):
        in_it = [s for s in steps if step_iteration.get(s) == it]
        iteration_rows.append({
            "iteration": it, "first_step": in_it[0], "last_step": in_it[-1],
            **_section([g for g in gens if g.iteration == it], [x for x in labels if x.iteration == it],
                       [run.metrics.get(s, {}) for s in in_it], unit, emb, full=True),
        })
    result = {
        "run_dir": str(run.run_dir),
        "recipe": run.info("recipe"),
        "model": run.info("model"),
        "task": run.info("task"),
        "complete": run.complete,
        "last_step": steps[-1] if steps else None,
        "settings": {
            "embed": embed, "unit": unit, "ngrams": list(NGRAMS),
            "solve_rate_bin_edges": np.linspace(0.0, 1.0, SOLVE_RATE_BINS + 1).tolist(),
            "label_band_edges": list(LABEL_BANDS),
            "cluster_space": _space_meta(emb.space) if emb is not None and emb.space is not None else None,
        },
        "overall": _section(gens, labels, [run.metrics[s] for s in run.training_steps()], unit, emb, full=True),
        "iterations": iteration_rows,
        "steps": step_rows,
    }
    result = jsonable(result)
    if write:
        write_json(run.run_dir / ANALYTICS_DIR / CURRICULUM_FILE, result)
    return result


def _space_meta(space: ClusterSpace) -> dict[str, Any]:
    return {"k": space.k, "dim": space.dim, "seed": space.seed, "encoder": space.encoder,
            "corpus_sha256": space.corpus_sha256, "n_corpus": space.n_corpus, "info": space.info}
