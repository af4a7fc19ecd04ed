"""The program world of the built-in ``tiny-program`` model: AZR's triplets over small integer functions f(x).

A program is an expression in one variable ``x`` over ``+ - *``, parentheses and integers: the arithmetic world's
notation (``x*3+2``, ``(x-1)*x``), parsed and computed exactly by its recursive-descent checker
(:func:`coevolve.tasks.arith.evaluate` with ``x`` bound like a fact-sheet letter), never by Python ``eval``. So a
model-written program is data here: running it is evaluating an expression tree, which cannot loop, allocate without
bound or touch anything. A program has at most ``MAX_PROGRAM_CHARS`` characters and ``MAX_PROGRAM_OPS`` operations;
inputs are integers with ``|x| <= INPUT_BOUND``; an output with ``|f(x)| > VALUE_BOUND`` is an error.

Compact formats (what the character-level model reads and writes; a sample is prompt + completion + EOS):

==========================  ===================================  ====================================================
task                        prompt                               completion
==========================  ===================================  ====================================================
propose deduction           ``R:x*3+2;4;14\\nR:x-1;7;6\\nW:D\\n``   ``P:x*x-3\\nI:5``
propose abduction           ``R:...\\nW:A\\n``                     ``P:(x+1)*2\\nI:3``
propose induction           ``P:x*3+2\\nW:I\\n``                    ``I:1,2,3,4,5,6\\nM:*+``
solve deduction             ``P:x*3+2\\nI:4\\nO?\\n``                ``S:x*3+2=4*3+2;4*3=12;12+2=14\\nO:14`` or ``O:14``
solve abduction             ``P:x*3+2\\nO:14\\nI?\\n``               ``S:0>2;1>5;2>8;3>11;4>14\\nI:4`` or ``I:4``
solve induction             ``E:1>5;2>8;3>11\\nM:*+\\nP?\\n``        ``P:x*3+2``
==========================  ===================================  ====================================================

A reference line ``R:`` is one buffer triplet (program;input;output). The deduction trace substitutes the input and
then applies the arithmetic world's trace steps; the abduction trace tries inputs from 0 up. A solver's answer is the
last line tagged ``O:``, ``I:`` or ``P:`` (the tag must be the task's). The induction message is free text (the
pretraining corpus writes the program's operators in order, ``*+`` for ``x*3+2``).

Held-out evaluation sets ``prog_deduction``, ``prog_abduction`` and ``prog_induction`` (200 tasks each, programs of
1-3 operations, inputs 0-9) register here; their gold answers are check specs (``ded|14``, ``abd|x*3+2|14``,
``ind|4>14;5>17;6>20``) that :func:`check_spec` grades by evaluating the program, so abduction accepts any input
that gives the output and induction any program that maps the hidden pairs. Training samplers
(:func:`training_triplet`) redraw the held-out programs of two and three operations, and at one operation, where there
are only 63 programs, the held-out tasks themselves (:func:`is_held_out`): the level-1 sets measure new inputs of
known programs, the others new programs. (FORMAT_VERSION 1 held out every program of every level, which left 4
one-operation programs to train on: ``experiments/azr/README.md``.)
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

from coevolve.data.benchmarks import Benchmark, EvalItem, Rows, register
from coevolve.grading.guard import parses_model_text
from coevolve.tasks import arith
from coevolve.tasks.triplets import (
    KINDS,
    ExecutionStats,
    Kind,
    ProgramWorld,
    Proposal,
    Triplet,
    Validation,
)

FORMAT_VERSION = 2  # bump when a format, the generators, the held-out sets or what training leaves out change
MAX_PROGRAM_CHARS = 40
MAX_PROGRAM_OPS = 6
INPUT_BOUND = 999
VALUE_BOUND = 10**6
MAX_MESSAGE_CHARS = 24
INDUCTION_INPUTS = 6  # N of the pretraining corpus and the held-out sets (the solver sees N // 2 pairs)
LEVELS = (1, 2, 3)  # operations per program in the corpus and the held-out sets
INPUT_RANGE = (0, 9)  # inputs of the corpus and the held-out sets
HELD_OUT_SEED = 20250506
HELD_OUT_SIZE = 200
TAGS = {"deduction": "O:", "abduction": "I:", "induction": "P:"}  # the solver's answer line per task type
QUERY = {"deduction": "O?", "abduction": "I?", "induction": "P?"}
PROPOSE = {"deduction": "W:D", "abduction": "W:A", "induction": "W:I"}
_PROGRAM = re.compile(r"[0-9x+\-*()]{1,%d}" % MAX_PROGRAM_CHARS)  # noqa: UP031
_INTEGER = re.compile(r"-?[0-9]{1,7}")
_OPS = re.compile(r"[-+*]")


# ----------------------------------------------------------------------------- programs


def read_program(text: str) -> str | None:
    """The program in ``text`` (spaces removed) if it is one: only ``x``, integers, ``+ - *`` and parentheses, at most
    ``MAX_PROGRAM_CHARS`` characters and ``MAX_PROGRAM_OPS`` operations, and it parses; else None."""
    program = "".join(text.split())
    if not _PROGRAM.fullmatch(program):
        return None
    ops = level_of_program(program)
    return program if ops is not None and ops <= MAX_PROGRAM_OPS else None


def level_of_program(program: str) -> int | None:
    """The number of operations of a program (None if it is not one)."""
    return arith.level_of(program, "x=0")


def read_integer(text: str) -> int | None:
    """An integer value as written (at most seven digits; callers bound inputs by ``INPUT_BOUND``), else None."""
    value = text.strip()
    return int(value) if _INTEGER.fullmatch(value) else None


def run(program: str, x: int) -> int | None:
    """f(x) for a program read by :func:`read_program`: the exact integer, or None when it is out of bounds."""
    value = arith.evaluate(program, f"x={x}")
    return value if value is not None and abs(value) <= VALUE_BOUND else None


def program_ops(program: str) -> frozenset[str]:
    """The operators a program uses, and ``()`` if it groups."""
    return frozenset(_OPS.findall(program)) | ({"()"} if "(" in program else set())


def message_of(program: str) -> str:
    """The corpus's induction message: the program's operators in order (``*+`` for ``x*3+2``)."""
    return "".join(_OPS.findall(program))


def _substitute(program: str, x: int) -> str:
    return program.replace("x", str(x) if x >= 0 else f"({x})")


def random_program(ops: int, rng: random.Random) -> str:
    """A random program with ``ops`` operations over ``x`` and constants 0-9, using ``x`` at least once."""
    while True:
        program, _ = arith.random_expression(ops, rng, lambda: "x" if rng.random() < 0.5 else str(rng.randint(0, 9)))
        if "x" in program:
            return program


# ----------------------------------------------------------------------------- triplets


def make_triplet(program: str, inputs: Sequence[int], message: str = "") -> Triplet | None:
    """The triplet of a program on integer inputs (outputs computed twice: AZR's determinism check, which an
    expression evaluator always passes), or None if an input or output leaves the bounds."""
    outputs = []
    for x in inputs:
        if abs(x) > INPUT_BOUND:
            return None
        first, second = run(program, x), run(program, x)
        if first is None or first != second:
            return None
        outputs.append(str(first))
    return Triplet(program, tuple(str(x) for x in inputs), tuple(outputs), message)


def random_triplet(kind: Kind, ops: int, rng: random.Random, n_inputs: int = INDUCTION_INPUTS) -> Triplet:
    """A random valid task of ``kind``: induction gets ``n_inputs`` distinct inputs and the corpus message."""
    while True:
        program = random_program(ops, rng)
        low, high = INPUT_RANGE
        inputs = rng.sample(range(low, high + 1), n_inputs) if kind == "induction" else [rng.randint(low, high)]
        triplet = make_triplet(program, inputs, message_of(program) if kind == "induction" else "")
        if triplet is not None:
            return triplet


# ----------------------------------------------------------------------------- formats


def reference_line(triplet: Triplet) -> str:
    return f"R:{triplet.program};{triplet.inputs[0]};{triplet.outputs[0]}"


def proposer_prompt(kind: Kind, references: Sequence[Triplet]) -> str:
    """The compact proposer prompt: the K references (deduction, abduction) or the program (induction)."""
    if kind == "induction":
        return f"P:{references[0].program}\n{PROPOSE[kind]}\n"
    return "".join(reference_line(t) + "\n" for t in references) + f"{PROPOSE[kind]}\n"


def proposal_completion(kind: Kind, triplet: Triplet) -> str:
    """The proposer's completion that proposes ``triplet`` (pretraining targets)."""
    if kind == "induction":
        return f"I:{','.join(triplet.inputs)}\nM:{triplet.message}"
    return f"P:{triplet.program}\nI:{triplet.inputs[0]}"


def read_proposal(kind: Kind, text: str, program: str | None = None, n_inputs: int = INDUCTION_INPUTS
                  ) -> Proposal | str:
    """The proposal in a proposer's completion, or why it is invalid: "format" (the lines are missing, or an induction
    proposal has not exactly ``n_inputs`` inputs) or "syntax" (the program or an input does not parse)."""
    return _read_proposal(text, kind, program, n_inputs)


@parses_model_text(invalid="format")
def _read_proposal(text: str, kind: Kind, program: str | None, n_inputs: int) -> Proposal | str:
    lines = text.strip().splitlines()
    if kind == "induction":
        if len(lines) < 2 or not lines[0].startswith("I:") or not lines[1].startswith("M:"):
            return "format"
        values = [read_integer(v) for v in lines[0][2:].split(",")]
        if len(values) != n_inputs:
            return "format"
        if any(v is None for v in values):
            return "syntax"
        message = lines[1][2:].strip()
        if len(message) > MAX_MESSAGE_CHARS:
            return "format"
        return Proposal(kind, program or "", tuple(str(v) for v in values), message)
    if len(lines) < 2 or not lines[0].startswith("P:") or not lines[1].startswith("I:"):
        return "format"
    parsed, value = read_program(lines[0][2:]), read_integer(lines[1][2:])
    if parsed is None or value is None:
        return "syntax"
    return Proposal(kind, parsed, (str(value),))


def solver_prompt(kind: Kind, task: Triplet) -> str:
    """The compact solver prompt of a task."""
    return question_text(kind, task) + "\n"


def question_text(kind: Kind, task: Triplet) -> str:
    """The solver prompt without its final newline (the evaluation sets' question)."""
    if kind == "deduction":
        return f"P:{task.program}\nI:{task.inputs[0]}\n{QUERY[kind]}"
    if kind == "abduction":
        return f"P:{task.program}\nO:{task.outputs[0]}\n{QUERY[kind]}"
    pairs = ";".join(f"{i}>{o}" for i, o in task.given)
    return f"E:{pairs}\nM:{task.message}\n{QUERY[kind]}"


def solve_completion(kind: Kind, task: Triplet, worked: bool) -> str:
    """The solver's completion (pretraining targets): ``worked`` adds the deduction trace or the abduction search."""
    if kind == "induction":
        return f"P:{task.program}"
    if kind == "deduction":
        x = int(task.inputs[0])
        if not worked:
            return f"O:{task.outputs[0]}"
        substituted = _substitute(task.program, x)
        steps = arith.solution_trace(substituted)
        trace = f"{task.program}={substituted}" + (f";{steps}" if steps else "")
        return f"S:{trace}\nO:{task.outputs[0]}"
    target = int(task.inputs[0])
    if not worked or not 0 <= target <= 9:
        return f"I:{task.inputs[0]}"
    tries = ";".join(f"{x}>{run(task.program, x)}" for x in range(target + 1))
    return f"S:{tries}\nI:{task.inputs[0]}"


@parses_model_text()
def read_tagged(text: str) -> str | None:
    """The last line tagged ``O:``, ``I:`` or ``P:`` (tag included), or None."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line[:2] in ("O:", "I:", "P:"):
            return line
    return None


def read_answer(kind: Kind, text: str) -> str | None:
    """The solver's answer for ``kind``: the value of the last tagged line when its tag is the task's, else None."""
    tagged = read_tagged(text)
    return tagged[2:].strip() if tagged is not None and tagged[:2] == TAGS[kind] else None


def check(kind: Kind, task: Triplet, answer: str | None) -> bool:
    """Whether ``answer`` solves ``task``: the output (deduction), an input with f(i) = o (abduction), a program that
    maps every hidden pair (induction)."""
    if answer is None:
        return False
    if kind == "deduction":
        value = read_integer(answer)
        return value is not None and str(value) == task.outputs[0]
    if kind == "abduction":
        value = read_integer(answer)
        return value is not None and abs(value) <= INPUT_BOUND and str(run(task.program, value)) == task.outputs[0]
    return maps_pairs(answer, task.hidden)


def maps_pairs(answer: str, pairs: Sequence[Sequence[str]]) -> bool:
    """Whether the program in ``answer`` maps every (input, output) pair."""
    program = read_program(answer)
    return program is not None and all(str(run(program, int(i))) == o for i, o in pairs)


# ----------------------------------------------------------------------------- the world


class TinyProgramWorld(ProgramWorld):
    """The program world of the tiny model (compact formats only: it is what ``tiny-program`` is pretrained on)."""

    name = "program"

    def __init__(self, n_inputs: int = INDUCTION_INPUTS):
        self.n_inputs = n_inputs
        self._stats = ExecutionStats()

    def seed_triplet(self) -> Triplet:
        triplet = make_triplet("x", [1])
        if triplet is None:
            raise ValueError("the identity program on input 1 left the program world's bounds")
        return triplet

    def proposer_prompt(self, kind, references, style):
        _compact_only(style)
        return proposer_prompt(kind, references)

    def read_proposal(self, kind, text, program=None, strip=False):
        return read_proposal(kind, text, program, self.n_inputs)  # an expression of one line: nothing to strip

    def validate(self, proposals):
        started, out = time.perf_counter(), []
        for p in proposals:
            triplet = make_triplet(p.program, [int(i) for i in p.inputs], p.message)
            out.append(Validation(triplet) if triplet is not None else Validation(None, "error"))
        self._count(2 * sum(len(p.inputs) for p in proposals), started)
        return out

    def solver_prompt(self, kind, task, style):
        _compact_only(style)
        return solver_prompt(kind, task)

    def read_answer(self, kind, text):
        return read_answer(kind, text)

    def check(self, kind, tasks, answers):
        started = time.perf_counter()
        verdicts = [check(kind, t, a) for t, a in zip(tasks, answers)]
        self._count(sum(len(t.hidden) if kind == "induction" else 1 for t, a in zip(tasks, answers) if a), started)
        return verdicts

    def _count(self, runs: int, started: float) -> None:
        """Count ``runs`` evaluations of a program and the seconds since ``started`` (the world's execution cost)."""
        self._stats.add(ExecutionStats(runs, time.perf_counter() - started))

    def program_ops(self, program):
        return program_ops(program)

    def pop_execution_stats(self) -> ExecutionStats:
        stats, self._stats = self._stats, ExecutionStats()
        return stats


def _compact_only(style: str) -> None:
    if style != "compact":
        raise ValueError("the program world's formats are the tiny-program model's compact ones; chat models use "
                         "task=python")


# ----------------------------------------------------------------------------- evaluation sets and check specs


@dataclass(frozen=True)
class HeldOutTask:
    kind: Kind
    triplet: Triplet
    level: int


@cache
def _held_out(kind: Kind) -> tuple[HeldOutTask, ...]:
    rng = random.Random(f"program-held-out/{HELD_OUT_SEED}/{kind}")
    tasks: dict[str, HeldOutTask] = {}
    while len(tasks) < HELD_OUT_SIZE:
        level = LEVELS[len(tasks) % len(LEVELS)]
        triplet = random_triplet(kind, level, rng)
        tasks.setdefault(f"{triplet.program}|{triplet.inputs}", HeldOutTask(kind, triplet, level))
    return tuple(tasks.values())


def held_out_tasks(kind: Kind, n: int = HELD_OUT_SIZE) -> list[HeldOutTask]:
    """The first ``n`` held-out tasks of ``kind`` (the same on every call)."""
    return list(_held_out(kind)[:n])


@lru_cache(maxsize=1)
def held_out_programs() -> frozenset[str]:
    """The programs of the held-out tasks of two and more operations (training samplers redraw them)."""
    return frozenset(t.triplet.program for kind in KINDS for t in _held_out(kind) if t.level >= 2)


@lru_cache(maxsize=1)
def _held_out_one_operation_tasks() -> frozenset[tuple[str, tuple[str, ...]]]:
    """(program, inputs) of the held-out one-operation tasks; deduction and abduction share their keys, since one
    (program, input, output) triplet answers both."""
    return frozenset((t.triplet.program, t.triplet.inputs if kind == "induction" else t.triplet.inputs[:1])
                     for kind in KINDS for t in _held_out(kind) if t.level == 1)


def is_held_out(kind: Kind, triplet: Triplet) -> bool:
    """Whether training must leave ``triplet`` out: its program is a held-out program of two or more operations, or it
    is a held-out one-operation task (the same program and input; for induction the same program and inputs)."""
    inputs = triplet.inputs if kind == "induction" else triplet.inputs[:1]
    return triplet.program in held_out_programs() or (triplet.program, inputs) in _held_out_one_operation_tasks()


def training_triplet(kind: Kind, ops: int, rng: random.Random) -> Triplet:
    """A random task of ``kind`` for training (pretraining corpus, GRPO's ground-truth tasks): held-out ones redrawn."""
    while True:
        triplet = random_triplet(kind, ops, rng)
        if not is_held_out(kind, triplet):
            return triplet


def check_spec(kind: Kind, task: Triplet) -> str:
    """The gold answer of a task as a check spec: ``ded|<output>``, ``abd|<program>|<output>``,
    ``ind|<in>><out>;...`` (the hidden pairs)."""
    if kind == "deduction":
        return f"ded|{task.outputs[0]}"
    if kind == "abduction":
        return f"abd|{task.program}|{task.outputs[0]}"
    return "ind|" + ";".join(f"{i}>{o}" for i, o in task.hidden)


_KIND_CODES: dict[str, Kind] = {"ded": "deduction", "abd": "abduction", "ind": "induction"}  # check_spec's codes


def check_against_spec(tagged_answer: str | None, spec: str) -> bool:
    """Whether a tagged answer (:func:`read_tagged`) satisfies a check spec (:func:`check_spec`)."""
    code, _, rest = spec.partition("|")
    kind = _KIND_CODES.get(code)
    if kind is None or tagged_answer is None or tagged_answer[:2] != TAGS[kind]:
        return False
    answer = tagged_answer[2:].strip()
    if kind == "deduction":
        return check(kind, Triplet("", ("",), (rest,)), answer)
    if kind == "abduction":
        program, _, output = rest.rpartition("|")
        return check(kind, Triplet(program, ("",), (output,)), answer)
    return maps_pairs(answer, [tuple(pair.split(">")) for pair in rest.split(";")])


def _items(kind: Kind, set_name: str) -> list[EvalItem]:
    return [EvalItem(f"{set_name}/{i}", set_name, "program", question_text(kind, t.triplet),
                     check_spec(kind, t.triplet), meta={"level": t.level, "task_type": kind})
            for i, t in enumerate(_held_out(kind))]


PROGRAM_SETS = tuple(f"prog_{kind}" for kind in KINDS)


def _build_items(kind: Kind) -> Callable[[Rows], list[EvalItem]]:
    """The held-out set of ``kind`` as a benchmark builds it (the rows it is given are not read)."""
    return lambda _rows: _items(kind, f"prog_{kind}")


register(*[Benchmark(f"prog_{kind}", "program", f"program world, held-out {kind} tasks ({HELD_OUT_SIZE}, programs "
                     f"of 1-3 operations)", _build_items(kind), expected_rows=HELD_OUT_SIZE) for kind in KINDS])
