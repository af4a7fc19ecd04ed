"""The arithmetic world: exact checker, generator, held-out sets, traces, prompts and parsers."""

from __future__ import annotations

import random

import pytest

from coevolve.tasks import arith
from coevolve.tasks.arith import (
    evaluate,
    generate_problem,
    held_out,
    level_of,
    parse_answer,
    parse_question,
    question_prompt,
    solution_trace,
    solver_prompt,
)

DOC = "a=3,b=7,c=2"


@pytest.mark.parametrize("question, value, level", [
    ("3+4*5", 23, 2),
    ("(3+4)*5", 35, 2),
    ("10-4-3", 3, 2),
    ("10-(4-3)", 9, 2),
    ("2*3*4", 24, 2),
    ("(2-7)*3", -15, 2),
    ("-3+5", 2, 1),
    ("2*-3", -6, 1),
    ("3--5", 8, 1),
    ("-(2+3)*4", -20, 2),
    ("--4", 4, 0),
    ("7", 7, 0),
    (" 1 + 2 * ( 3 - 4 ) ", -1, 3),
    ("((((1))))+1", 2, 1),
    ("(-" * 66 + "1" + ")" * 66, 1, 0),
    ("0*99999999999999999999+1", 1, 2),
    ("12*12*12*12", 20736, 3),
])
def test_evaluate_and_level_hand_computed(question, value, level):
    assert evaluate(question) == value
    assert level_of(question) == level


@pytest.mark.parametrize("question, value", [("a+b*c", 17), ("(a+b)*c", 20), ("a-b", -4), ("c*c*c-a", 5)])
def test_variables_bound_by_fact_sheet(question, value):
    assert evaluate(question, DOC) == value
    assert evaluate(question, "D:" + DOC) == value
    assert evaluate(question) is None  # unbound without the sheet


@pytest.mark.parametrize("question", [
    "", "3+", "+3", "3++4", "(3+4", "3+4)", "3 4", "ab", "a+d", "3/4", "3**2", "2^3", "3.5+1", "1e3",
    "__import__('os').system('touch /tmp/coevolve_pwned')", "open('/etc/passwd').read()", "lambda: 1",
    "(" * 300 + "1" + ")" * 300, "1" * 201, "+".join(["1"] * 14), "1+2\n3", "Q:3+4", "３+4",
])
def test_hostile_or_malformed_strings_give_none(question):
    assert evaluate(question, DOC) is None
    assert level_of(question, DOC) is None
    assert solution_trace(question, DOC) is None


def test_hostile_string_has_no_side_effect(tmp_path):
    marker = tmp_path / "pwned"
    assert evaluate(f"__import__('os').system('touch {marker}')") is None
    assert not marker.exists()


def test_operation_and_length_limits():
    assert level_of("+".join(["1"] * 13)) == 12
    assert evaluate("+".join(["1"] * 13)) == 13
    assert evaluate("+".join(["1"] * 14)) is None
    assert evaluate("1" * 200) == int("1" * 200)
    assert evaluate("1" * 201) is None


@pytest.mark.parametrize("doc", ["a=3,a=4", "a=x", "A=3", "a=3;b=4", ""])
def test_malformed_fact_sheets(doc):
    assert arith.parse_doc(doc) is None
    assert evaluate("1+1", doc) is None


def test_trace_examples_from_the_formats():
    assert solution_trace("3+4*5") == "4*5=20;3+20=23"
    assert solution_trace("a+b*c", DOC) == "a+b*c=3+7*2;7*2=14;3+14=17"
    assert solution_trace("3-(2-7)") == "2-7=-5;3--5=8"
    assert solution_trace("2*3+(4+5)") == "4+5=9;2*3=6;6+9=15"
    assert solution_trace("1+2+3*4") == "3*4=12;1+2=3;3+12=15"
    assert solution_trace("-(2+3)*4") == "2+3=5;-5*4=-20"


def _check_trace(problem: arith.ArithProblem) -> None:
    steps = problem.trace.split(";")
    if problem.doc is not None:
        lhs, rhs = steps.pop(0).split("=")
        assert lhs == problem.question
        assert evaluate(rhs) == evaluate(lhs, problem.doc) == problem.answer
    assert len(steps) == problem.level
    for step in steps:
        lhs, rhs = step.rsplit("=", 1)
        assert level_of(lhs) == 1
        assert evaluate(lhs) == int(rhs)
    assert int(steps[-1].rsplit("=", 1)[1]) == problem.answer


@pytest.mark.parametrize("grounded", [False, True])
def test_generated_problems_are_consistent(grounded):
    rng = random.Random(7)
    for level in arith.LEVELS:
        for _ in range(30):
            p = generate_problem(level, rng, grounded)
            assert p.level == level == level_of(p.question, p.doc)
            assert p.answer == evaluate(p.question, p.doc)
            assert (p.doc is not None) == grounded
            _check_trace(p)
            completion = arith.solve_completion(p)
            assert parse_answer(completion) == str(p.answer)


def test_generator_is_deterministic_per_seed():
    assert arith.sample_problems(50, 3) == arith.sample_problems(50, 3)
    assert arith.sample_problems(50, 3) != arith.sample_problems(50, 4)
    assert arith.sample_problems(20, 3, grounded=True) == arith.sample_problems(20, 3, grounded=True)


def test_operand_ranges_follow_the_level():
    rng = random.Random(0)
    for level in arith.LEVELS:
        for _ in range(50):
            p = generate_problem(level, rng)
            operands = [int(t) for t in arith._tokenize(p.question) if t.isdigit()]
            assert all(0 <= v <= arith.OPERAND_MAX[level] for v in operands)


def test_held_out_sets_are_fixed_distinct_and_disjoint_from_training():
    for level in arith.LEVELS:
        first = held_out(level)
        assert first == held_out(level)
        assert len(first) == 200 and len({p.question for p in first}) == 200
        assert all(p.level == level for p in first)
        assert held_out(level, n=10) == first[:10]
    keys = arith.held_out_keys()
    training = arith.sample_problems(3000, 0, levels=arith.LEVELS) + arith.sample_problems(500, 0, grounded=True)
    assert not {arith.problem_key(p.question, p.doc) for p in training} & keys
    with pytest.raises(ValueError):
        held_out(1, n=201)


def test_compact_prompts_match_the_formats():
    assert solver_prompt("3+4*5") == "Q:3+4*5=?\n"
    assert solver_prompt("a+b*c", DOC) == "D:a=3,b=7,c=2\nQ:a+b*c=?\n"
    assert question_prompt() == "W:\n"
    assert question_prompt(examples=["3+4", "(2-7)*3"]) == "E:3+4\nE:(2-7)*3\nW:\n"
    assert question_prompt(doc=DOC) == "D:a=3,b=7,c=2\nW:\n"
    p = arith.ArithProblem("a+b*c", 17, 2, DOC, solution_trace("a+b*c", DOC))
    assert arith.question_completion(p) == "Q:a+b*c\nS:a+b*c=3+7*2;7*2=14;3+14=17\nA:17"


def test_chat_prompts():
    assert solver_prompt("3+4*5", style="chat") == "Compute 3+4*5. Give the final answer in \\boxed{}."
    assert "a = 3, b = 7, c = 2" in solver_prompt("a+b", DOC, style="chat")
    assert "Question:" in question_prompt("chat") and "Answer:" in question_prompt("chat", doc=DOC)
    assert "(2-7)*3" in question_prompt("chat", examples=["(2-7)*3"])
    with pytest.raises(ValueError):
        solver_prompt("1+1", style="fancy")


@pytest.mark.parametrize("completion, style, expected", [
    ("S:4*5=20;3+20=23\nA:23", "compact", "23"),
    ("S:2-7=-5;-5*3=-15\nA:-15", "compact", "-15"),
    ("A:1\nA:-4", "compact", "-4"),
    ("S:4*5=20", "compact", None),
    ("A:", "compact", None),
    ("so it is \\boxed{23}.", "chat", "23"),
    ("\\boxed{1} then \\boxed{-4}", "chat", "-4"),
    ("\\boxed{\\frac{1}{2}}", "chat", "\\frac{1}{2}"),
    ("no answer", "chat", None),
])
def test_parse_answer(completion, style, expected):
    assert parse_answer(completion, style) == expected


@pytest.mark.parametrize("completion, doc, expected", [
    ("Q:3+4*5", None, ("3+4*5", None)),
    ("Q:(2-7)*3\n", None, ("(2-7)*3", None)),
    ("Q:a+b*c\nS:a+b*c=3+7*2;7*2=14;3+14=17\nA:17", DOC, ("a+b*c", "17")),
    ("Q:a+b*c\nA:17", None, None),  # unbound variable without the sheet
    ("Q:a+z", DOC, None),
    ("Q:7", None, None),  # no operation
    ("Q:3+", None, None),
    ("3+4", None, None),
    ("", None, None),
])
def test_parse_question_compact(completion, doc, expected):
    parsed = parse_question(completion, "compact", doc)
    assert (None if parsed is None else (parsed.question, parsed.answer)) == expected


@pytest.mark.parametrize("completion, doc, expected", [
    ("Question: 3 + 4 * 5", None, ("3+4*5", None)),
    ("Sure!\nQuestion: What is 3 × (4 + 5)?\nAnswer: 27", None, ("3*(4+5)", "27")),
    ("Question: $a + b*c$\nAnswer: 17", DOC, ("a+b*c", "17")),
    ("Question: compute 12 - 20 =\nSolving... \\boxed{-8}", None, ("12-20", "-8")),
    ("Here is a problem: 3+4", None, None),
    ("Question: what is the capital of France?", None, None),
])
def test_parse_question_chat(completion, doc, expected):
    parsed = parse_question(completion, "chat", doc)
    assert (None if parsed is None else (parsed.question, parsed.answer)) == expected
