"""Free-form math: the one solver prompt, the answer parser and the grader.

The prompt is the Qwen2.5-Math instruction appended to the question as the user turn, so it
works through ``Policy.format_prompt`` (which takes a single user message) and for models
without a chat template alike. Evaluation and every recipe's solver use this template.

Where the papers differ (their prompt figures and appendices):

- dynamic_rl: the solver template is not given; we use this instruction as the
  *system* message with the question as the user message (Dynamic RL §2 "Prompt"; the split is inferred).
- prism / R-Zero: the same instruction as the system message, the raw question as the user
  message; plain ``system: ...\\nuser: ...`` text without a chat template (Prism's code).
- pasodoble: paper Fig. 12 uses the same instruction as the system message; the released code
  asks for ``<answer>`` tags instead (PasoDoble App. I).
- opensir: a system prompt that asks for the last line to read
  ``Therefore, the final answer is: $\\boxed{ANSWER}$`` (OpenSIR Fig. 22).
- infuser: a system persona plus "Solve the following problem step by step", an IMPORTANT line
  asking for the answer in ``\\boxed{}`` and "Now solve the problem:" (INFUSER App. F.4).

All of them end with the answer in ``\\boxed{}``, which is what :func:`parse_answer` reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from coevolve.grading.equivalence import batch_equivalent
from coevolve.grading.extract import extract_answer

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
STRICT_RULE = "last \\boxed{} (else <answer> tags, ####, an 'A:' line, 'the answer is')"


def solver_prompt(question: str) -> str:
    """The user message asking to solve ``question`` with the answer in ``\\boxed{}``."""
    return f"{question.strip()}\n{INSTRUCTION}"


def parse_answer(completion: str) -> str | None:
    """The final answer of a completion (its ``\\boxed{}`` content), or None if it gives none."""
    return extract_answer(completion, kind="math")


def grade(preds: Sequence[str | None], golds: Sequence[str], timeout_s: float = 5.0) -> list[bool]:
    """Whether each extracted answer is mathematically equivalent to its gold answer.

    Missing answers (None) are wrong; the others are checked in one batch.
    """
    if len(preds) != len(golds):
        raise ValueError(f"{len(preds)} predictions for {len(golds)} gold answers")
    present = [i for i, p in enumerate(preds) if p is not None]
    verdicts = batch_equivalent([(preds[i], golds[i]) for i in present], timeout_s=timeout_s) if present else []
    correct = [False] * len(preds)
    for i, ok in zip(present, verdicts):
        correct[i] = bool(ok)
    return correct
