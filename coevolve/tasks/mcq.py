"""Multiple choice: the one solver prompt, the answer parser and the grader.

The question is rendered as INFUSER renders it (``Question: <text>`` then one ``A) <choice>``
line per choice, INFUSER App. F.4), followed by an instruction to reason and put only the
letter in ``\\boxed{}``. INFUSER additionally uses a system persona, "Solve the following
multiple choice question step by step." before the question and an IMPORTANT line with an
example ``\\boxed{<letter>}``; ``Policy.format_prompt`` takes one user message, so the
instruction lives in the user turn here. PasoDoble evaluates GPQA / SuperGPQA 0-shot with its
math solver prompt (PasoDoble §4); the other papers have no MCQ evaluation.

INFUSER's paper parses the *first* ``\\boxed{}`` at evaluation and its code the *last* during
training (INFUSER App. F.4: the first \\boxed{} span); :func:`parse_answer` follows ``coevolve.grading.extract_choice``.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

from coevolve.grading.extract import extract_choice

LETTERS = string.ascii_uppercase
STRICT_RULE = "choice letter: \\boxed{}, <answer> tags, 'the answer is', a lone last line, the last '(X)'"
INSTRUCTION = (
    "Think step by step, then give your final answer as the letter of the correct choice only, "
    "within \\boxed{} (for example \\boxed{A})."
)


def render_question(question: str, choices: Sequence[str]) -> str:
    """``Question: ...`` followed by one lettered line per choice."""
    if not 2 <= len(choices) <= len(LETTERS):
        raise ValueError(f"an MCQ needs 2 to {len(LETTERS)} choices, got {len(choices)}")
    lines = [f"Question: {question.strip()}"]
    lines += [f"{LETTERS[i]}) {choice.strip()}" for i, choice in enumerate(choices)]
    return "\n".join(lines)


def solver_prompt(question: str, choices: Sequence[str]) -> str:
    """The user message asking to answer the question with a boxed letter."""
    return f"{render_question(question, choices)}\n\n{INSTRUCTION}"


def parse_answer(completion: str, n_choices: int) -> str | None:
    """The chosen letter (``"A"``...), or None if the completion names no valid choice."""
    return extract_choice(completion, n_choices)


def grade(preds: Sequence[str | None], golds: Sequence[str]) -> list[bool]:
    """Exact letter match; a missing answer is wrong."""
    if len(preds) != len(golds):
        raise ValueError(f"{len(preds)} predictions for {len(golds)} gold answers")
    return [p is not None and p.strip().upper() == g.strip().upper() for p, g in zip(preds, golds)]
