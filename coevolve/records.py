"""Typed rows of a run's ``samples/*.jsonl``, and the shared names of its ``metrics.jsonl``.

A recipe builds one row per generator output (:func:`generator_row`) and one per solver rollout (:func:`solver_row`),
the shared fields by name and in ``extra`` what only that recipe has (INFUSER's document, R-Zero's cluster, OpenSIR's
concepts, ...). A step hands its rows to the loop as :class:`SampleRow` objects; the run store writes them flat, the
shared fields then the extra ones (:meth:`SampleRow.as_record`).

Metrics a recipe computes about its questions and answers carry the side, not the role's name: ``generator/`` and
``solver/reward_mean``, ``generator/`` and ``solver/advantage_abs_mean``, ``tokens/generator`` and ``tokens/solver``,
``questions/valid_rate``, whatever the recipe calls its roles (questioner, proposer, policy). What a trainer reports
(``<role>/loss``, ``<role>/optimizer_steps``, ``<role>/grad_norm``) keeps the role's name. Run folders written before
the names were pinned read back with today's names (:func:`current_metric_names`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

from coevolve.rollout.base import Completion

# whose answer the solver is rewarded against (AZR's "execution": running the task's program checks the answer)
LabelSource = Literal["majority", "generator", "ground_truth", "execution"]
OLD_LABEL_SOURCES = {"proposer": "generator"}  # what older runs wrote for "generator" (PasoDoble's Proposer)


@dataclass
class SampleRow:
    """One sampled completion and what the step made of it."""

    step: int
    iteration: int | None  # the recipe's outer iteration (R-Zero, Prism), else None
    role: str  # generator | solver
    phase: str
    prompt: str
    completion: str
    question: str | None
    question_id: str | None
    valid: bool
    answer: str | None  # what this completion answered (a generator: its own answer, if it writes one)
    label: str | None  # the label the solver is rewarded against
    label_source: LabelSource | None
    solve_rate: float | None
    reward: float | None
    reward_terms: dict[str, Any] | None
    advantage: float | None
    tokens: int
    oracle: dict[str, Any] | None  # the arithmetic checker's facts (analytics only)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_record(self) -> dict[str, Any]:
        """The flat JSON row."""
        row = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**row, **self.extra}

    @classmethod
    def from_record(cls, row: dict[str, Any]) -> SampleRow:
        """A row read back from any run folder, old or hand-edited: a field of the wrong type (or missing) reads as
        None (``valid``: its truth value; the text fields: as text)."""
        def of(key: str, *types: type) -> Any:
            value = row.get(key)
            return value if isinstance(value, types) and not (isinstance(value, bool) and bool not in types) else None

        def text(key: str) -> str | None:
            return None if row.get(key) is None else str(row[key])

        return cls(
            step=of("step", int), iteration=of("iteration", int, bool), role=text("role") or "",
            phase=text("phase") or "", prompt=text("prompt") or "", completion=text("completion") or "",
            question=of("question", str),
            question_id=text("question_id"), valid=bool(row.get("valid")), answer=of("answer", str),
            label=text("label"), label_source=_label_source(row.get("label_source")),
            solve_rate=of("solve_rate", int, float),
            reward=of("reward", int, float), reward_terms=of("reward_terms", dict),
            advantage=of("advantage", int, float), tokens=of("tokens", int), oracle=of("oracle", dict),
            extra={k: v for k, v in row.items() if k not in _FIELDS})


def generator_row(step: int, iteration: int | None, phase: str, output: Completion, *, question: str | None,
                  question_id: str | None, valid: bool, label_source: LabelSource, answer: str | None = None,
                  label: str | None = None, solve_rate: float | None = None, reward: float | None = None,
                  reward_terms: dict[str, Any] | None = None, advantage: float | None = None,
                  oracle: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> SampleRow:
    """A generator output's row; ``extra``: what only this recipe records (written after the shared fields)."""
    return SampleRow(step, iteration, "generator", phase, output.prompt, output.text, question, question_id, valid,
                     answer, label, label_source, solve_rate, reward, reward_terms, advantage, len(output.token_ids),
                     oracle, extra or {})


def solver_row(step: int, iteration: int | None, phase: str, output: Completion, *, question: str | None,
               question_id: str | None, label_source: LabelSource, answer: str | None = None,
               label: str | None = None, solve_rate: float | None = None, reward: float | None = None,
               reward_terms: dict[str, Any] | None = None, advantage: float | None = None,
               oracle: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> SampleRow:
    """A solver rollout's row (valid: the rollout exists; its answer may not parse); an episode's adds its tool calls
    and the token ranges its tools wrote (:func:`tool_record`)."""
    return SampleRow(step, iteration, "solver", phase, output.prompt, output.text, question, question_id, True,
                     answer, label, label_source, solve_rate, reward, reward_terms, advantage, len(output.token_ids),
                     oracle, {**(extra or {}), **tool_record(output)})


def tool_record(output: Completion) -> dict[str, Any]:
    """An episode's ``tool_calls`` and ``tool_spans`` (the [start, end) token ranges of its observations: its
    ``tool_mask`` run-length coded); nothing for a single-turn sample."""
    if not output.tool_mask:
        return {}
    return {"tool_calls": output.tool_calls, "tool_spans": [list(span) for span in output.tool_token_spans()]}


# Names older runs logged -> the pinned names (``proposer/`` was PasoDoble's, ``questioner/`` R-Zero's and Prism's,
# ``opensir/valid_rate`` OpenSIR's)
RENAMED_METRICS = {"proposer/reward_mean": "generator/reward_mean", "questioner/reward_mean": "generator/reward_mean",
                   "proposer/advantage_abs_mean": "generator/advantage_abs_mean",
                   "questioner/advantage_abs_mean": "generator/advantage_abs_mean",
                   "tokens/proposer": "tokens/generator", "opensir/valid_rate": "questions/valid_rate"}


def current_metric_names(row: dict[str, Any]) -> dict[str, Any]:
    """A ``metrics.jsonl`` row with today's names (a row that has both an old and its new name keeps the new)."""
    current = {}
    for key, value in row.items():
        new = RENAMED_METRICS.get(key)
        if new is None:
            current[key] = value
        elif new not in row:
            current[new] = value
    return current


def evaluation_table(row: dict[str, Any]) -> dict[str, dict[str, float]]:
    """An evaluation's metrics row (``eval/<set>/accuracy``, strict, and ``eval/<set>/accuracy_lenient``) as
    set -> {``accuracy``, ``accuracy_lenient``}; empty for a training row."""
    table: dict[str, dict[str, float]] = {}
    for key, value in row.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "eval" and parts[2] in ("accuracy", "accuracy_lenient"):
            table.setdefault(parts[1], {})[parts[2]] = value
    return table



def is_evaluation(row: dict[str, Any]) -> bool:
    """Whether a ``metrics.jsonl`` row is an evaluation's (``eval/<set>/...`` keys), not a training step's."""
    return any(key.startswith("eval/") for key in row)


def accuracy_line(row: dict[str, Any]) -> str:
    """An evaluation row's accuracies on one line: ``<set> <strict>  <set>_lenient <lenient>`` per set."""
    return "  ".join(f"{name} {scores['accuracy']:.3f}  {name}_lenient {scores['accuracy_lenient']:.3f}"
                     for name, scores in evaluation_table(row).items()
                     if isinstance(scores.get("accuracy"), float) and isinstance(scores.get("accuracy_lenient"), float))


def _label_source(value: Any) -> LabelSource | None:
    """A row's label source read back: today's names, an older name as today's, anything else None."""
    value = OLD_LABEL_SOURCES.get(str(value), value)
    return next((source for source in get_args(LabelSource) if value == source), None)


_FIELDS = {f.name for f in fields(SampleRow)} - {"extra"}
