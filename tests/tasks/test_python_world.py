"""The python world of azr (coevolve/tasks/python_programs.py): proposals validated as in AZR (§3.3.3: parses, no
forbidden module, runs and returns, deterministic over two runs), answers checked by running the program in the
sandboxed executor, and model text never run in this process."""

from __future__ import annotations

import pytest

from coevolve.execution import sandbox_problem
from coevolve.tasks.python_programs import program_ops, python_world, read_arguments, read_value
from coevolve.tasks.triplets import Triplet


@pytest.fixture(scope="module")
def world():
    # the sandbox where it runs (it does on CI); these programs are harmless either way
    w = python_world(3.0, 2, unconfined=sandbox_problem() is not None, n_inputs=4)
    yield w
    w.close()


def fenced(program: str, argument: str) -> str:
    return f"I will write a program.\n```python\n{program}\n```\n```input\n{argument}\n```"


PROPOSALS = {  # name: (proposer text, what validation makes of it)
    "valid": (fenced("def f(a, b):\n    return sorted([a, b, a * b])", "3, 4"), ("[3, 4, 12]",)),
    "string": ("<think>reverse</think><answer>" + fenced("def f(s):\n    return s[::-1]", "'abc'") + "</answer>",
               ("'cba'",)),
    "no input block": ("```python\ndef f(x):\n    return x\n```", "format"),
    "no f": (fenced("def g(x):\n    return x", "1"), "syntax"),
    "syntax": (fenced("def f(x)\n    return x", "1"), "syntax"),
    "input is a call": (fenced("def f(x):\n    return x", "__import__('os').getcwd()"), "syntax"),
    "forbidden import": (fenced("import random\ndef f(x):\n    return random.random()", "1"), "forbidden"),
    "forbidden name": (fenced("import os\ndef f(x):\n    return os.environ.get('HOME')", "1"), "forbidden"),
    "raises": (fenced("def f(x):\n    return 1 / 0", "1"), "error"),
    "returns nothing": (fenced("def f(x):\n    x + 1", "1"), "error"),
    "not a literal": (fenced("def f(x):\n    return object()", "1"), "error"),
    "forged output": (fenced("class A:\n    def __eq__(self, other):\n        return True\n    def __repr__(self):\n"
                             "        return '5'\ndef f(x):\n    return A()", "1"), "error"),
    "nondeterministic": (fenced("import os\ndef f(x):\n    return os.urandom(8)", "1"), "nondeterministic"),
    "loops": (fenced("def f(x):\n    while True:\n        x += 1", "1"), "timeout"),
}


def test_validation_as_in_azr(world):
    names = list(PROPOSALS)
    read = [world.read_proposal("deduction", PROPOSALS[n][0]) for n in names]
    readable = [(n, r) for n, r in zip(names, read) if not isinstance(r, str)]
    results = dict(zip([n for n, _ in readable], world.validate([r for _, r in readable])))
    for name, proposal in zip(names, read):
        expected = PROPOSALS[name][1]
        got = proposal if isinstance(proposal, str) else (
            results[name].triplet.outputs if results[name].triplet else results[name].reason)
        assert got == expected, name
    stats = world.pop_execution_stats()
    assert stats.jobs == 2 * len(readable) and stats.timeouts == 2  # two runs each: determinism


def test_answers_are_checked_by_running_the_program(world):
    task = Triplet("def f(a, b):\n    return sorted([a, b, a * b])", ("3, 4",), ("[3, 4, 12]",))
    assert world.check("deduction", [task] * 4, ["[3, 4, 12]", "[3,4,12]", "(3, 4, 12)", None]) == \
        [True, True, False, False]
    assert world.check("abduction", [task] * 4, ["4, 3", "3, 4", "1, 12", "__import__('os')"]) == \
        [True, True, False, False]
    induction = Triplet(task.program, ("1, 2", "2, 3", "5, 1", "0, 0"), ("[1, 2, 2]", "[2, 3, 6]", "[1, 5, 5]",
                                                                        "[0, 0, 0]"), "sorted with the product")
    answers = ["def f(x, y):\n    return sorted([x, y, x * y])",
               "def f(x, y):\n    return [1, 5, 5]",  # right on the first hidden pair only
               "class A:\n    def __eq__(self, o):\n        return True\ndef f(x, y):\n    return A()",  # forged
               "import time\ndef f(x, y):\n    return sorted([x, y, x * y])",  # forbidden
               "def f(x, y):\n    return sorted([x, y, x * y]"]  # syntax
    assert world.check("induction", [induction] * len(answers), answers) == [True, False, False, False, False]


def test_induction_proposals_and_the_solver_view(world):
    program = "def f(x):\n    return x * 2"
    text = "".join(f"```input\n{i}\n```\n" for i in (1, 2, 3, 4)) + "```message\ndoubles it\n```"
    proposal = world.read_proposal("induction", text, program)
    task = world.validate([proposal])[0].triplet
    assert task == Triplet(program, ("1", "2", "3", "4"), ("2", "4", "6", "8"), "doubles it")
    prompt = world.solver_prompt("induction", task, "chat")
    assert "```input\n1\n```\n```output\n2\n```" in prompt and "```input\n3\n```" not in prompt  # the hidden half
    assert world.read_proposal("induction", text.replace("```input\n4\n```\n", ""), program) == "format"  # 3 of 4
    assert world.read_answer("deduction", "so it is\n```output\n1\n```\n```output\n2\n```") == "2"  # the last block
    assert world.read_answer("abduction", "no block") is None


def test_model_text_is_parsed_as_literals_only():
    assert read_arguments("'John', {'age': 20}") == ("John", {"age": 20})
    assert read_arguments("1") == (1,)
    for text in ("__import__('os').system('true')", "1), (2", "f(1)", "[x for x in ()]", "", "9" * 5000):
        assert read_arguments(text) is None, text
    assert read_value("{1, 2}") == (True, {1, 2}) and read_value("os") == (False, None)
    assert program_ops("def f(x):\n    for i in range(x):\n        x += i\n    return x") >= {"For", "AugAssign",
                                                                                            "Call"}
