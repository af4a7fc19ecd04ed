"""OpenSIR's format scores and solution-length score (§2.3; Eqs. 3 and 6; prompts of Figs. 21-22).

Two rule sets for the teacher's output (OpenSIR §2.3.1 and Fig. 21, and its released code):

- ``"paper"``: valid when a problem tag and a concepts tag with one to three concepts are present;
  the problem tag is ``<problem>`` (Fig. 21) or ``<question>`` (the tag §2.3.1 names).
  score_fom^T = 1 exactly for valid outputs.
- ``"code"`` (the released code's ``parse_xml``): ``<problem>`` only, at least 10 characters and not
  "..."; the concepts string non-empty, at most 3 comma-separated items, no line break; concepts
  shorter than 10 characters are dropped and at least one must remain. score_fom^T additionally
  needs a ``<think>...</think>`` block.

Concepts are lowercased and stripped under both rule sets (so counts of unique concepts agree).

The student's format (Eq. 6, score_fom^S): ``"boxed"`` (paper §2.3.2: the answer is in
``\\boxed{}``) or ``"phrase"`` (the code: the line ``Therefore, the final answer is: $\\boxed{..}$``,
with the dollar signs optional).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from coevolve.grading.extract import extract_boxed, tag_blocks
from coevolve.grading.guard import parses_model_text

TeacherRules = Literal["paper", "code"]
StudentFormat = Literal["boxed", "phrase"]

MAX_CONCEPTS = 3
CODE_MIN_PROBLEM_CHARS = 10
CODE_MIN_CONCEPT_CHARS = 10

_FINAL_PHRASE = re.compile(r"Therefore, the final answer is: \$?\\boxed\{")


@dataclass(frozen=True)
class TeacherOutput:
    """A parsed teacher completion: the problem q, its concepts C_q, validity and score_fom^T."""

    problem: str | None
    concepts: tuple[str, ...]
    valid: bool
    format_score: float


def _first(tag: str, text: str) -> str | None:
    """Content of the first ``<tag>..</tag>`` block (tags in any case), stripped; None if there is none."""
    block = next(tag_blocks(text, tag, ignore_case=True), None)
    return text[block[1]:block[2]].strip() if block else None


_INVALID = TeacherOutput(None, (), False, 0.0)


@parses_model_text(invalid=_INVALID)
def parse_teacher_output(text: str, rules: TeacherRules = "paper") -> TeacherOutput:
    """Read ``<problem>`` and ``<concepts>`` from a teacher completion and score its format (§2.3.1)."""
    problem = _first("problem", text)
    if problem is None and rules == "paper":
        problem = _first("question", text)
    raw_concepts = _first("concepts", text)
    invalid = TeacherOutput(problem or None, (), False, 0.0)
    if not problem or raw_concepts is None:
        return invalid
    items = [c.strip().lower() for c in raw_concepts.split(",")]
    if rules == "paper":
        concepts = tuple(c for c in items if c)
        valid = 1 <= len(concepts) <= MAX_CONCEPTS
        return TeacherOutput(problem, concepts if valid else (), valid, float(valid))
    if (problem == "..." or len(problem) < CODE_MIN_PROBLEM_CHARS or not raw_concepts
            or len(items) > MAX_CONCEPTS or "\n" in raw_concepts or "\r" in raw_concepts):
        return invalid
    concepts = tuple(c for c in items if len(c) >= CODE_MIN_CONCEPT_CHARS)
    if not concepts:
        return invalid
    return TeacherOutput(problem, concepts, True, float(_first("think", text) is not None))


@parses_model_text(invalid=0.0)
def student_format_score(completion: str, rule: StudentFormat = "boxed") -> float:
    """score_fom^S (Eq. 6): 1 if the final answer is presented as ``rule`` asks, else 0."""
    if rule == "boxed":
        return float(extract_boxed(completion) is not None)
    return float(_has_final_phrase(completion))


def _has_final_phrase(text: str) -> bool:
    """Whether a line holds ``Therefore, the final answer is: $\\boxed{..}`` with something before a later ``}`` (the
    regex ``..\\boxed\\{(.+)\\}`` in linear time: one look for a ``}`` per line, from its first phrase)."""
    checked_to = -1  # end of the last line searched: a later phrase on it finds no "}" either
    for match in _FINAL_PHRASE.finditer(text):
        if match.start() < checked_to:
            continue
        end = text.find("\n", match.end())
        checked_to = len(text) if end < 0 else end
        if text.find("}", match.end() + 1, checked_to) >= 0:
            return True
    return False


def length_score(mean_length: float, l_base: float = 1000.0, l_cap: float | None = 1000.0) -> float:
    """score_len (Eq. 3): min(l̄ / l_base, l_cap / l_base), l̄ the mean solution length in tokens.

    ``l_cap`` is not given in the paper; the released code uses 1000 (= l_base). None means no cap.
    """
    if l_base <= 0:
        raise ValueError(f"l_base must be positive, got {l_base}")
    capped = mean_length if l_cap is None else min(mean_length, l_cap)
    return max(capped, 0.0) / l_base
