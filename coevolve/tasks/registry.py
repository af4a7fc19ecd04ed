"""Tasks as recipes and evaluation see them: prompts, answer parsing, ground-truth grading, training problems, oracle.

``arith`` is the toy world with an exact checker; ``program`` is AZR's triplet tasks over the tiny model's integer
functions (deduction, abduction, induction; checked by evaluating the program); ``math`` is free-form answers in
``\\boxed{}`` (training problems from GSM8K train); ``mcq`` (evaluation only) is a lettered choice in ``\\boxed{}``.
A recipe only calls the methods of ``Task``; the evaluation harness reaches an item's task with :func:`task_for`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from coevolve.data.benchmarks import EvalItem, load_benchmark
from coevolve.grading.equivalence import answers_equivalent, verify_equivalent
from coevolve.grading.extract import extract_lenient
from coevolve.tasks import arith
from coevolve.tasks import math as math_task
from coevolve.tasks import mcq as mcq_task
from coevolve.tasks import program as program_task

LENIENT_RULE = "last number or expression (a number, a/b, \\frac{a}{b} or \\boxed{}, whichever ends last)"


class TaskDataError(RuntimeError):
    """A task's data is missing or empty; the message says what to pass."""


@dataclass(frozen=True)
class Problem:
    """A question with its reference answer as text (and, in the toy world, its fact sheet and level)."""

    question: str
    answer: str
    doc: str | None = None
    level: int | None = None


class Task:
    """Interface every task implements."""

    name: str
    exact_answers: bool = False  # answers are integers, compared exactly (votes take their fast path); else math-verify
    documents: str = "openstax"  # the corpus a grounded generator reads unless told (:mod:`coevolve.documents`)

    def answers_agree(self, answer: str | None, label: str | None) -> bool:
        """Whether a solver's answer agrees with a label (a majority vote's, a generator's): exactly, or by
        math-verify after the fast path."""
        return answers_equivalent(answer, label, use_math_verify=not self.exact_answers)

    @property
    def vote_equivalence(self) -> Callable[[str, str], bool] | None:
        """How a majority vote groups answers beyond equal normal forms: None (exact) or math-verify."""
        return None if self.exact_answers else verify_equivalent

    def solver_prompt(self, question: str, doc: str | None, style: str) -> str:
        raise NotImplementedError

    def parse_answer(self, completion: str, style: str) -> str | None:
        raise NotImplementedError

    def is_correct(self, answer: str | None, gold: str) -> bool:
        """Ground-truth grading (only the ``grpo`` baseline and evaluation use it)."""
        raise NotImplementedError

    def training_problems(self, rng: random.Random, n: int, **options: Any) -> list[Problem]:
        raise NotImplementedError

    def oracle(self, question: str | None, doc: str | None, answer: str | None = None,
               label: str | None = None) -> dict[str, Any] | None:
        """Exact-checker facts for analytics (toy world only; None elsewhere). Never a training reward."""
        return None

    # --- evaluation items (coevolve.evaluation.harness) ---
    def item_prompt(self, item: EvalItem, style: str) -> str:
        return self.solver_prompt(item.question, None, style)

    def item_answer(self, item: EvalItem, completion: str, style: str) -> str | None:
        """The strict answer: what the task's answer format (:meth:`strict_rule`) gives."""
        return self.parse_answer(completion, style)

    def item_lenient_answer(self, item: EvalItem, completion: str, style: str) -> str | None:
        """The lenient answer: the last number or expression in the completion (:data:`LENIENT_RULE`)."""
        return extract_lenient(completion)

    def strict_rule(self, style: str) -> str:
        """How :meth:`item_answer` reads a completion, in words (named in evaluation summaries)."""
        raise NotImplementedError

    def lenient_rule(self, style: str) -> str:
        """How :meth:`item_lenient_answer` reads a completion, in words."""
        return LENIENT_RULE

    def grade(self, preds: Sequence[str | None], golds: Sequence[str], timeout_s: float) -> list[bool]:
        """Evaluation grading of a batch of extracted answers against gold answers."""
        return [self.is_correct(p, g) for p, g in zip(preds, golds)]


def _as_int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip().replace(",", ""))
    except ValueError:
        return None


class ArithTask(Task):
    name = "arith"
    exact_answers = True
    documents = "arith"  # fact sheets

    def solver_prompt(self, question, doc, style):
        return arith.solver_prompt(question, doc, style)

    def parse_answer(self, completion, style):
        return arith.parse_answer(completion, style)

    def strict_rule(self, style):
        """Compact (tiny-arith): the last ``A:`` line; chat: the last ``\\boxed{}``."""
        return "last 'A:' line" if style == "compact" else "last \\boxed{}"

    def is_correct(self, answer, gold):
        value = _as_int(answer)
        return value is not None and value == _as_int(gold)

    def grade(self, preds, golds, timeout_s):
        """Evaluation asks for the integer as written (no thousands separators)."""
        return [_same_integer(p, g) for p, g in zip(preds, golds)]

    def training_problems(self, rng, n, *, levels: Sequence[int] = (1, 2, 3), grounded: bool = False, **_):
        return [Problem(p.question, str(p.answer), p.doc, p.level)
                for p in arith.sample_problems(n, rng, levels=levels, grounded=grounded)]

    def oracle(self, question, doc, answer=None, label=None):
        truth = arith.evaluate(question, doc) if question else None
        if truth is None:
            return None
        return {"answer": str(truth), "level": arith.level_of(question, doc),
                "correct": _as_int(answer) == truth if answer is not None else None,
                "label_correct": _as_int(label) == truth if label is not None else None}


class ProgramTask(Task):
    """AZR's three task types over the tiny model's programs (:mod:`coevolve.tasks.program`). A question is a task's
    compact solver prompt; its answer is a check spec, which grading checks by evaluating the program."""

    name = "program"
    exact_answers = True

    def solver_prompt(self, question, doc, style):
        if style == "compact":
            return question + "\n"
        return (f"{question}\nAnswer with one line: O:<output> for O?, I:<input> for I?, P:<program in x> for P?. "
                "Programs use x, integers, +, -, * and parentheses.")

    def parse_answer(self, completion, style):
        return program_task.read_tagged(completion)

    def strict_rule(self, style):
        return "last line tagged O:, I: or P: (the task's tag), checked by evaluating the program"

    def item_lenient_answer(self, item, completion, style):
        """The strict answer: a program-world answer is checked by running it, there is no looser reading."""
        return self.item_answer(item, completion, style)

    def lenient_rule(self, style):
        return "same as strict"

    def is_correct(self, answer, gold):
        return program_task.check_against_spec(answer, gold)

    def training_problems(self, rng, n, *, levels: Sequence[int] = program_task.LEVELS, **_):
        """``n`` tasks of the three types in turn, with programs of a number of operations drawn from ``levels``
        (held-out programs and tasks redrawn: :func:`coevolve.tasks.program.training_triplet`)."""
        ops = [lv for lv in levels if 1 <= lv <= program_task.MAX_PROGRAM_OPS] or list(program_task.LEVELS)
        problems = []
        for i in range(n):
            kind = program_task.KINDS[i % 3]
            level = rng.choice(ops)
            task = program_task.training_triplet(kind, level, rng)
            problems.append(Problem(program_task.question_text(kind, task), program_task.check_spec(kind, task),
                                    level=level))
        return problems


class MathTask(Task):
    name = "math"

    def __init__(self, data_dir: str | None = None):
        self.data_dir = data_dir
        self._train: list[Problem] | None = None

    def solver_prompt(self, question, doc, style):
        return math_task.solver_prompt(question)

    def parse_answer(self, completion, style):
        return math_task.parse_answer(completion)

    def grade(self, preds, golds, timeout_s):
        return math_task.grade(preds, golds, timeout_s)

    def strict_rule(self, style):
        return math_task.STRICT_RULE

    def is_correct(self, answer, gold):
        return answers_equivalent(answer, gold)

    def training_problems(self, rng, n, *, split: str = "train", **_):
        if self._train is None:
            items = load_benchmark("gsm8k_train" if split == "train" else split, data_dir=self.data_dir)
            self._train = [Problem(item.question, item.answer) for item in items]
            if not self._train:
                raise TaskDataError(f"the math training split {split!r} is empty")
        return rng.sample(self._train, min(n, len(self._train)))


class MCQTask(Task):
    """Multiple choice, evaluation only: the item's choices shape its prompt and which letters parse."""

    name = "mcq"

    def item_prompt(self, item, style):
        return mcq_task.solver_prompt(item.question, item.choices or ())

    def item_answer(self, item, completion, style):
        return mcq_task.parse_answer(completion, len(item.choices or ()))

    def item_lenient_answer(self, item, completion, style):
        """The strict choice letter: its extraction already falls back to free text (a number is no choice)."""
        return self.item_answer(item, completion, style)

    def strict_rule(self, style):
        return mcq_task.STRICT_RULE

    def lenient_rule(self, style):
        return "same as strict"

    def grade(self, preds, golds, timeout_s):
        return mcq_task.grade(preds, golds)


def _same_integer(pred: str | None, gold: str) -> bool:
    try:
        return pred is not None and int(pred.strip()) == int(gold)
    except ValueError:
        return False


_EVAL_TASKS: dict[str, Task] = {"arith": ArithTask(), "math": MathTask(), "mcq": MCQTask(),
                                "program": ProgramTask()}


def task_for(item: EvalItem) -> Task:
    """The task that prompts, parses and grades an evaluation item (by its answer type)."""
    if item.kind not in _EVAL_TASKS:
        raise ValueError(f"unknown answer type {item.kind!r} for {item.id}")
    return _EVAL_TASKS[item.kind]


def get_task(name: str, data_dir: str | None = None) -> Task:
    """The task called ``name`` (arith, program or math)."""
    if name == "arith":
        return ArithTask()
    if name == "program":
        return ProgramTask()
    if name == "math":
        return MathTask(data_dir)
    raise TaskDataError(f"unknown task {name!r} (known: arith, program, math)")
