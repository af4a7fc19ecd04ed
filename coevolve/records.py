"""Typed rows of a run's ``samples/*.jsonl``: the fields every recipe writes, and a recipe's own in ``extra``.

A recipe builds one row per generator output (:func:`generator_row`) and one per solver rollout (:func:`solver_row`);
``extra`` holds what only that recipe has (INFUSER's document, R-Zero's cluster, OpenSIR's concepts, ...). Rows are
written flat: the shared fields, then the extra ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from coevolve.rollout.base import Completion


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
    label_source: str  # majority | generator | proposer | ground_truth
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


def generator_row(step: int, iteration: int | None, phase: str, output: Completion, **values: Any) -> dict[str, Any]:
    """A generator output's row; ``values``: the shared fields not read off ``output``, then the recipe's own."""
    return _row(step, iteration, "generator", phase, output, values)


def solver_row(step: int, iteration: int | None, phase: str, output: Completion, **values: Any) -> dict[str, Any]:
    """A solver rollout's row (valid: the rollout exists; its answer may not parse)."""
    return _row(step, iteration, "solver", phase, output, {"valid": True, **values})


_SHARED = {f.name for f in fields(SampleRow)} - {"step", "iteration", "role", "phase", "prompt", "completion", "tokens",
                                                 "extra"}


def _row(step: int, iteration: int | None, role: str, phase: str, output: Completion,
         values: dict[str, Any]) -> dict[str, Any]:
    shared = {k: v for k, v in values.items() if k in _SHARED}
    extra = {k: v for k, v in values.items() if k not in _SHARED}
    return SampleRow(step, iteration, role, phase, output.prompt, output.text, tokens=len(output.token_ids),
                     extra=extra, **shared).as_record()
