"""The program world of the tiny model (coevolve/tasks/program.py): programs are read, never executed as Python;
the evaluator's bounds; the formats read back what they write; abduction and induction are checked by evaluating the
program; the held-out sets and the training sampler."""

from __future__ import annotations

import random

import pytest

from coevolve.data.benchmarks import load_benchmark
from coevolve.tasks import program as P
from coevolve.tasks.registry import get_task
from coevolve.tasks.triplets import KINDS, Triplet


def test_programs_are_the_notation_and_nothing_else():
    assert P.read_program(" x * 3 + 2 ") == "x*3+2"
    assert P.read_program("(x-1)*x") == "(x-1)*x"
    assert P.read_program("x") == "x"  # the identity: the seed triplet's program
    for text in ("__import__('os')", "x**2", "3x", "x*", "y+1", "x/2", "", "x+" * 30 + "x", "x" + "+1" * 7):
        assert P.read_program(text) is None, text


def test_running_a_program_is_exact_and_bounded():
    assert P.run("x*3+2", 4) == 14
    assert P.run("x*x-3", -5) == 22
    assert P.run("(x-1)*(x+1)", 7) == 48
    assert P.run("x*x*x*x*x", 20) is None  # 3,200,000 > VALUE_BOUND
    assert P.make_triplet("x*x", [P.INPUT_BOUND + 1]) is None  # input out of bounds
    assert P.make_triplet("x*2", [1, 2, 3], "*") == Triplet("x*2", ("1", "2", "3"), ("2", "4", "6"), "*")


@pytest.mark.parametrize("kind", KINDS)
def test_the_formats_read_back_what_they_write(kind):
    rng = random.Random(kind)
    for level in P.LEVELS:
        task = P.random_triplet(kind, level, rng)
        proposal = P.read_proposal(kind, P.proposal_completion(kind, task), task.program)
        assert (proposal.program, proposal.inputs, proposal.message) == (task.program, task.inputs, task.message)
        for worked in (True, False):
            answer = P.read_answer(kind, P.solve_completion(kind, task, worked))
            assert P.check(kind, task, answer)


def test_worked_solutions_by_hand():
    task = P.make_triplet("x*3+2", [4])
    assert P.solve_completion("deduction", task, True) == "S:x*3+2=4*3+2;4*3=12;12+2=14\nO:14"
    assert P.solve_completion("abduction", task, True) == "S:0>2;1>5;2>8;3>11;4>14\nI:4"
    assert P.solver_prompt("abduction", task) == "P:x*3+2\nO:14\nI?\n"
    induction = P.make_triplet("x*3+2", [1, 2, 3, 4, 5, 6], "*+")
    assert P.solver_prompt("induction", induction) == "E:1>5;2>8;3>11\nM:*+\nP?\n"
    assert P.proposer_prompt("deduction", [task]) == "R:x*3+2;4;14\nW:D\n"


def test_proposals_that_are_not_tasks_say_why():
    assert P.read_proposal("deduction", "Q:x+1") == "format"
    assert P.read_proposal("deduction", "P:x+1") == "format"
    assert P.read_proposal("deduction", "P:x+\nI:3") == "syntax"
    assert P.read_proposal("abduction", "P:x+1\nI:three") == "syntax"
    assert P.read_proposal("induction", "I:1,2,3\nM:+", "x+1") == "format"  # 3 inputs, 6 wanted
    assert P.read_proposal("induction", "I:1,2,3,4,5,x\nM:+", "x+1") == "syntax"
    assert P.read_proposal("induction", "I:1,2,3,4,5,6", "x+1") == "format"  # no message
    world = P.TinyProgramWorld()
    valid, invalid = world.validate([P.read_proposal("deduction", "P:x*x\nI:9"),
                                     P.read_proposal("deduction", "P:x*x*x*x*x\nI:99")])
    assert valid.triplet == Triplet("x*x", ("9",), ("81",))
    assert invalid.triplet is None and invalid.reason == "error"  # 99 ** 5 is out of bounds


def test_abduction_accepts_any_input_that_gives_the_output_and_induction_is_checked_on_hidden_pairs():
    square = P.make_triplet("x*x", [3])
    assert [P.check("abduction", square, a) for a in ("3", "-3", "2", None, "x")] == [True, True, False, False, False]
    task = P.make_triplet("x*2", [1, 2, 3, 4], "*")
    assert task.given == [("1", "2"), ("2", "4")] and task.hidden == [("3", "6"), ("4", "8")]
    assert P.check("induction", task, "x+x") and P.check("induction", task, "2*x")
    assert not P.check("induction", task, "x*x")  # maps the given pair 2 -> 4, not the hidden ones
    assert not P.check("induction", task, "x+3")  # maps the hidden 3 -> 6 only
    assert P.read_answer("deduction", "S:1+1=2\nO:2") == "2"
    assert P.read_answer("deduction", "O:2\nI:5") is None  # the last tagged line is not the task's


def test_the_held_out_sets_are_fixed_and_graded_by_evaluation():
    items = {kind: load_benchmark(f"prog_{kind}") for kind in KINDS}
    assert all(len(v) == P.HELD_OUT_SIZE for v in items.values())
    assert [i.answer for i in load_benchmark("prog_abduction")] == [i.answer for i in items["abduction"]]
    assert {i.meta["level"] for i in items["deduction"]} == set(P.LEVELS)
    task = get_task("program")
    abd = next(i for i in items["abduction"] if i.answer.startswith("abd|x*x|"))
    root = int(abd.answer.rsplit("|", 1)[1]) ** 0.5
    assert task.is_correct(f"I:{int(root)}", abd.answer) and task.is_correct(f"I:-{int(root)}", abd.answer)
    assert not task.is_correct(f"O:{int(root)}", abd.answer)  # the wrong tag
    ded = items["deduction"][0]
    assert task.is_correct("O:" + ded.answer.split("|")[1], ded.answer)
    assert task.parse_answer("S:...\nO:7", "compact") == "O:7"


def test_training_problems_avoid_the_held_out_programs_and_one_operation_tasks():
    held = P.held_out_programs()
    problems = get_task("program").training_problems(random.Random(0), 600, levels=[1, 2])
    assert [p.answer.split("|")[0] for p in problems[:3]] == ["ded", "abd", "ind"]
    assert {p.level for p in problems} == {1, 2}
    programs = {p.question.splitlines()[0][2:] for p in problems if p.question.startswith("P:")}
    assert programs and not programs & held
    # one-operation programs (63 in all) stay in training: only the held-out tasks themselves are left out
    one_op = {t.triplet.program for kind in KINDS for t in P.held_out_tasks(kind) if t.level == 1}
    assert not one_op & held and len(programs & one_op) >= 20
    held_pairs = {(t.triplet.program, t.triplet.inputs[0]) for kind in ("deduction", "abduction")
                  for t in P.held_out_tasks(kind) if t.level == 1}
    questions = [p.question.splitlines() for p in problems if p.level == 1 and p.question.startswith("P:")]
    trained_pairs = {(q[0][2:], q[1][2:]) for q in questions if q[1].startswith("I:")}
    assert trained_pairs and not trained_pairs & held_pairs


def test_is_held_out_by_program_from_two_operations_and_by_task_at_one():
    deduction = {t.level: t.triplet for t in reversed(P.held_out_tasks("deduction"))}
    two_ops = deduction[2]
    other_input = P.make_triplet(two_ops.program, [(int(two_ops.inputs[0]) + 1) % 10])
    assert P.is_held_out("deduction", two_ops) and P.is_held_out("abduction", other_input)
    one_op = deduction[1]
    assert P.is_held_out("deduction", one_op) and P.is_held_out("abduction", one_op)  # the same triplet answers both
    fresh = [x for x in range(10) if not P.is_held_out("deduction", P.make_triplet(one_op.program, [x]))]
    assert fresh and len(fresh) < 10
    rng = random.Random(1)
    assert not any(P.is_held_out(kind, P.training_triplet(kind, 1, rng)) for kind in KINDS for _ in range(200))


