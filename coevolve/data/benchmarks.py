"""Evaluation sets: a registry of loaders, each with its answer type and a seeded subset cut (generated sets, such
as the arithmetic world's, register from their task with :func:`register`).

Files are read from a data directory holding the folders of ``shared/data`` (``gsm8k/``,
``math500/``, ...). The directory is, in order: the ``data_dir`` argument (a folder, or the
benchmark file itself), the ``COEVOLVE_DATA_DIR`` environment variable, or ``../shared/data``
next to the current directory or next to the repository. Only when none of these was given
explicitly and no file is found, a hub dataset id is tried through ``datasets`` if that
package is installed (online users). Otherwise :class:`BenchmarkDataNotFound` says what was
tried and how to pass ``--data-dir``.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coevolve.grading.extract import extract_boxed, extract_hash_answer

DATA_DIR_ENV = "COEVOLVE_DATA_DIR"


class BenchmarkDataNotFound(FileNotFoundError):
    """A benchmark file is missing; the message names the set, the paths tried and the fix."""


@dataclass(frozen=True)
class EvalItem:
    """One evaluation question.

    ``kind`` is the answer type ("math", "mcq" or "arith"); ``answer`` is the gold answer as
    text (a choice letter for MCQ, the integer for arith); ``choices`` is set for MCQ only.
    """

    id: str
    set_name: str
    kind: str
    question: str
    answer: str
    choices: tuple[str, ...] | None = None
    meta: dict = field(default_factory=dict, compare=False)


Rows = list[dict]


@dataclass(frozen=True)
class Benchmark:
    """A registered evaluation set.

    ``relpath`` is the file under the data directory (None for generated sets such as arith);
    ``hub`` is ``(dataset id, config, split)`` for an online fallback whose rows have the
    same fields as the local file; ``build`` turns raw rows into items.
    """

    name: str
    kind: str
    description: str
    build: Callable[[Rows], list[EvalItem]]
    relpath: str | None = None
    hub: tuple[str, str | None, str] | None = None
    expected_rows: int | None = None


def _read_jsonl(path: Path) -> Rows:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _gsm8k(rows: Rows, set_name: str = "gsm8k") -> list[EvalItem]:
    items = []
    for i, row in enumerate(rows):
        final = extract_hash_answer(row["answer"])  # "#### 2,125" -> "2125"
        if final is None:
            raise ValueError(f"GSM8K row {i} has no '#### <answer>' line")
        items.append(EvalItem(f"{set_name}/{i}", set_name, "math", row["question"], final,
                              meta={"solution": row["answer"]}))
    return items


def _math500(rows: Rows) -> list[EvalItem]:
    return [
        EvalItem(row["unique_id"], "math500", "math", row["problem"], row["answer"],
                 meta={"solution": row["solution"], "subject": row["subject"], "level": int(row["level"])})
        for row in rows
    ]


def _math_full(rows: Rows) -> list[EvalItem]:
    items = []
    for row in rows:
        gold = extract_boxed(row["solution"])  # the last \boxed{} (90 solutions box twice, identically)
        if gold is None:
            raise ValueError(f"MATH row {row['idx']} has no \\boxed{{}} answer in its solution")
        level = row["level"].removeprefix("Level ")
        items.append(EvalItem(f"math/{row['idx']}", "math", "math", row["problem"], gold,
                              meta={"solution": row["solution"], "subject": row["type"],
                                    "level": int(level) if level.isdigit() else level}))
    return items


def _strip_math_delimiters(answer: str) -> str:
    """``$x=1$`` -> ``x=1`` when the whole answer is one inline-math span; other answers unchanged."""
    inner = answer.strip()
    if len(inner) > 1 and inner[0] == inner[-1] == "$" and "$" not in inner[1:-1]:
        return inner[1:-1].strip()
    return answer


def _college_math(rows: Rows) -> list[EvalItem]:
    return [
        EvalItem(f"{row['data_source']}/{row['question_number']}", "college_math", "math", row["question"],
                 _strip_math_delimiters(row["answer"]),
                 meta={"subject": row["data_topic"].removeprefix("college_math.")})
        for row in rows
    ]


_OPTIONS_MARK = "Options are:"


def split_options(text: str) -> tuple[str, list[str]]:
    """Split a SuperGPQA question (``stem\\n Options are:\\nA. ...\\nB. ...``) into stem and choices.

    Options may span several lines; a new option starts at a line beginning with the next
    letter in sequence followed by ``". "``.
    """
    stem, mark, body = text.partition(_OPTIONS_MARK)
    if not mark:
        raise ValueError("no 'Options are:' marker in the question")
    choices: list[str] = []
    current: list[str] | None = None
    for line in body.strip("\n").split("\n"):
        expected = chr(ord("A") + len(choices) + (current is not None))
        if line.startswith(f"{expected}. "):
            if current is not None:
                choices.append("\n".join(current).strip())
            current = [line[3:]]
        elif current is not None:
            current.append(line)
    if current is not None:
        choices.append("\n".join(current).strip())
    return stem.strip(), choices


def _supergpqa(rows: Rows) -> list[EvalItem]:
    items = []
    for i, row in enumerate(rows):
        stem, choices = split_options(row["question"])
        letter, _, text = row["answer"].partition(". ")
        index = ord(letter) - ord("A")
        if not 0 <= index < len(choices) or choices[index] != text.strip():
            raise ValueError(f"SuperGPQA row {i}: answer {row['answer'][:40]!r} is not one of its options")
        items.append(EvalItem(f"supergpqa/{i}", "supergpqa", "mcq", stem, letter, tuple(choices)))
    return items


def _register(benchmarks: Sequence[Benchmark]) -> dict[str, Benchmark]:
    return {b.name: b for b in benchmarks}


BENCHMARKS: dict[str, Benchmark] = _register([
    Benchmark("gsm8k", "math", "GSM8K test, 1319 grade-school word problems (numeric answers)",
              _gsm8k, "gsm8k/test.jsonl", ("openai/gsm8k", "main", "test"), 1319),
    Benchmark("gsm8k_train", "math",
              "GSM8K train, 7473 problems (training data for the grpo baseline, never evaluated)",
              lambda rows: _gsm8k(rows, "gsm8k_train"), "gsm8k/train.jsonl", ("openai/gsm8k", "main", "train"), 7473),
    Benchmark("math500", "math", "MATH-500, the PRM800K 500-problem subset of the MATH test set",
              _math500, "math500/test.jsonl", ("HuggingFaceH4/MATH-500", None, "test"), 500),
    Benchmark("math", "math", "MATH test set, 5000 competition problems (levels 1-5, 7 subjects)",
              _math_full, "math_full_test/test.jsonl", None, 5000),
    Benchmark("college_math", "math", "College Math test (MathScale), 2818 textbook exercises",
              _college_math, "college_math/test.jsonl", None, 2818),
    Benchmark("supergpqa", "mcq", "SuperGPQA sample, 300 multiple-choice questions with 4-10 options",
              _supergpqa, "supergpqa_sample/test.jsonl", None, 300),
])


def register(*benchmarks: Benchmark) -> None:
    """Add generated sets (a task's own) to the registry."""
    BENCHMARKS.update(_register(benchmarks))


def get_benchmark(name: str) -> Benchmark:
    """The registered set called ``name``; unknown names list the known ones."""
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise KeyError(f"unknown evaluation set {name!r}; known sets: {', '.join(BENCHMARKS)}") from None


def default_data_dirs() -> list[Path]:
    """``../shared/data`` next to the current directory, then next to the repository."""
    repo = Path(__file__).resolve().parents[2]
    dirs = [Path.cwd().parent / "shared" / "data", repo.parent / "shared" / "data"]
    return list(dict.fromkeys(d.resolve() for d in dirs))


def _candidates(relpath: str, data_dir: str | os.PathLike | None) -> tuple[list[Path], bool]:
    """Files to try for a set stored at ``relpath`` and whether the location was given explicitly."""
    given = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV) or None
    if given is not None:
        root = Path(given).expanduser()
        return [root if root.is_file() or root.suffix == ".jsonl" else root / relpath], True
    return [d / relpath for d in default_data_dirs()], False


def _from_hub(hub: tuple[str, str | None, str]) -> Rows | None:
    """Rows of a hub dataset when ``datasets`` is installed and the hub answers; None otherwise."""
    try:
        import datasets
    except ImportError:
        return None
    repo_id, config, split = hub
    try:
        return [dict(row) for row in datasets.load_dataset(repo_id, config, split=split)]
    except Exception:  # offline, renamed, gated: fall through to the not-found error
        return None


def _raw_rows(bench: Benchmark, relpath: str, data_dir: str | os.PathLike | None) -> Rows:
    candidates, explicit = _candidates(relpath, data_dir)
    for path in candidates:
        if path.is_file():
            return _read_jsonl(path)
    hub_tried = not explicit and bench.hub is not None
    rows = _from_hub(bench.hub) if hub_tried else None
    if rows is not None:
        return rows
    tried = ", ".join(str(p) for p in candidates)
    hub_note = f"; hub dataset {bench.hub[0]} unavailable (needs `datasets` and a connection)" if hub_tried else ""
    raise BenchmarkDataNotFound(
        f"evaluation set {bench.name!r}: file not found (tried {tried}){hub_note}. Pass the folder that holds "
        f"{relpath} with --data-dir DIR (or data_dir=...), or set {DATA_DIR_ENV}=DIR."
    )


def subset(items: Sequence[EvalItem], limit: int | None, seed: int = 0) -> list[EvalItem]:
    """A seeded random subset of ``limit`` items, kept in file order; all items when limit is None."""
    if limit is None or limit >= len(items):
        return list(items)
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    keep = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[i] for i in keep]


def load_benchmark(
    name: str, *, data_dir: str | os.PathLike | None = None, limit: int | None = None, seed: int = 0
) -> list[EvalItem]:
    """Load a registered set, optionally cut to a seeded subset of ``limit`` questions."""
    bench = get_benchmark(name)
    rows = _raw_rows(bench, bench.relpath, data_dir) if bench.relpath is not None else []
    return subset(bench.build(rows), limit, seed)


def available_sets() -> dict[str, str]:
    """Set name -> one-line description, for ``--help`` texts and listings."""
    return {name: b.description for name, b in BENCHMARKS.items()}

