"""The python world's validity rules (coevolve/tasks/python_programs.py, ``Rules``): coevolve's defaults and the
authors' code's (``CODE_RULES``: one def in all, inputs as any call arguments run in the sandbox only, None and
non-literal outputs, gold outputs cut to 400 characters), and seed-program stripping, on worked examples."""

from __future__ import annotations

import os

import pytest

from coevolve.execution import sandbox_problem
from coevolve.tasks.python_programs import CODE_RULES, Rules, call_arguments, python_world, strip_program, truncate
from coevolve.tasks.triplets import Triplet


def worlds():
    unconfined = sandbox_problem() is not None  # the sandbox where it runs (it does on CI); harmless programs
    return {name: python_world(3.0, 1, unconfined, n_inputs=6, rules=rules)
            for name, rules in (("default", Rules()), ("code", CODE_RULES))}


@pytest.fixture(scope="module")
def world():
    made = worlds()
    yield made
    for w in made.values():
        w.close()


def fenced(program: str, argument: str) -> str:
    return f"```python\n{program}\n```\n```input\n{argument}\n```"


def validated(w, program: str, argument: str):
    """A deduction proposal's outputs when valid, else why not."""
    read = w.read_proposal("deduction", fenced(program, argument))
    if isinstance(read, str):
        return read
    validation, = w.validate([read])
    return validation.triplet.outputs if validation.triplet else validation.reason


CASES = {  # name: (program, input, under coevolve's rules, under the code's rules)
    "nested helper": ("def f(x):\n    def g(y):\n        return y * 2\n    return g(x)", "3", ("6",), "syntax"),
    "class method": ("class A:\n    def twice(self, y):\n        return y * 2\ndef f(x):\n    return A().twice(x)",
                     "3", ("6",), "syntax"),
    "second top-level def": ("def g(y):\n    return y\ndef f(x):\n    return g(x)", "3", ("3",), "syntax"),
    "keyword arguments": ("def f(a, b=0):\n    return a - b", "b=2, a=5", "syntax", ("3",)),
    "expression input": ("def f(d):\n    return sorted(d.items())", "dict(a=1, b=2)", "syntax",
                         ("[('a', 1), ('b', 2)]",)),
    "None output": ("def f(x):\n    x + 1", "1", "error", ("None",)),
    "non-literal output": ("def f(x):\n    return frozenset({x})", "1", "error", ("frozenset({1})",)),
    "long output": ("def f(n):\n    return 'ab' * n", "1100", "error",
                    ("'" + "ab" * 99 + "a" + "..." + "b" + "ab" * 99 + "'",)),  # 200 characters, "...", 200
}


@pytest.mark.parametrize("name", list(CASES))
def test_validity_rules_worked_examples(world, name):
    program, argument, default, code = CASES[name]
    assert validated(world["default"], program, argument) == default
    assert validated(world["code"], program, argument) == code


def test_the_codes_own_seed_triplet_with_dict_a_1_b_2(world):
    """The code's induction seed (azr_ray_trainer.py, _init_seed_dataset): the identity on six inputs, one of them
    ``dict(a=1, b=2)``. Valid under the code's rules (the dict is built in the sandbox), not under coevolve's."""
    inputs = ('"Hello world"', "1", "dict(a=1, b=2)", "(1.1, 1.2, 1.3)", '"[[1, 0, 0], [0, 0, 0], [0, 0, 0]]"',
              "1001101100010001")
    text = "".join(f"```input\n{i}\n```\n" for i in inputs) + "```message\nreturns its argument\n```"
    program = "def f(a):\n    return a"
    assert world["default"].read_proposal("induction", text, program) == "syntax"
    proposal = world["code"].read_proposal("induction", text, program)
    validation, = world["code"].validate([proposal])
    assert validation.triplet.outputs == ("'Hello world'", "1", "{'a': 1, 'b': 2}", "(1.1, 1.2, 1.3)",
                                          "'[[1, 0, 0], [0, 0, 0], [0, 0, 0]]'", "1001101100010001")
    task = validation.triplet
    # induction answers run on the hidden inputs (the dict among them), abduction answers as call arguments
    assert world["code"].check("induction", [task, task], ["def f(a):\n    return a", "def f(a):\n    return 1"]) \
        == [True, False]
    assert world["code"].check("abduction", [Triplet(program, ("x=1",), ("{'a': 1, 'b': 2}",))] * 2,
                               ["a=dict(a=1, b=2)", "dict(a=1)"]) == [True, False]


def test_expression_inputs_run_in_the_sandbox_never_here(world):
    """An input is only parsed here (one call to f, nothing outside its parentheses); its value is the sandbox's."""
    w = world["code"]
    assert validated(w, "def f(x):\n    return x", "__import__('os').getpid()") != (str(os.getpid()),)
    for escape in ("1), print('out'", "1) + (2", "1)\nimport os\nf(1"):
        assert call_arguments(escape) is None, escape
    assert call_arguments("1 # )") == "1 # )"  # the comment ends at the newline the call puts after it
    assert validated(w, "def f(x):\n    return x", "1 # )") == ("1",)


def test_outputs_that_are_not_literals_are_compared_by_their_text(world):
    w = world["code"]
    frozen = Triplet("def f(x):\n    return frozenset({x})", ("1",), ("frozenset({1})",))
    assert w.check("deduction", [frozen] * 3, ["frozenset({1})", "{1}", None]) == [True, False, False]
    assert w.check("abduction", [frozen] * 2, ["1", "2"]) == [True, False]
    none = Triplet("def f(x):\n    return None", ("1",), ("None",))
    assert w.check("deduction", [none], ["None"]) == [True]
    assert truncate("x" * 10, 4) == "xx...xx" and truncate("abc", 4) == "abc"


def test_seed_programs_are_stripped_of_comments_docstrings_and_top_level_code(world):
    program = ('import math  # for sqrt\n\nLIMIT = 10\n\ndef f(x):\n    """Square root, rounded."""\n'
               '    # the root\n    return round(math.sqrt(x), 2)  # two places\n\nprint(f(LIMIT))\nf(4)')
    assert strip_program(program) == "import math\ndef f(x):\n    return round(math.sqrt(x), 2)"
    assert strip_program("def f(x):\n    '''only a docstring'''") == "def f(x):\n    pass"
    assert strip_program("def f(x:\n") == "def f(x:\n"  # does not parse: unchanged (and then invalid)
    w = world["default"]
    read = w.read_proposal("deduction", fenced(program.replace("LIMIT)", "2)"), "9"), strip=True)
    assert read.program == "import math\ndef f(x):\n    return round(math.sqrt(x), 2)"
    assert w.read_proposal("deduction", fenced(program, "9")).program == program  # not seeding: as written


def test_prompts_state_the_rules_in_force(world):
    """The proposer's and abduction solver's prompts say what the rules accept (coevolve's wording unchanged)."""
    t = Triplet("def f(a):\n    return a", ("1",), ("1",))
    default, code = (world[name].proposer_prompt("deduction", [t], "chat") for name in ("default", "code"))
    assert "it may define helper functions inside it" in default and "Every argument is a Python literal" in default
    assert "it is the only function" in code and "keyword arguments included" in code
    assert "keyword arguments included" in world["code"].solver_prompt("abduction", t, "chat")
    assert "as Python literals" in world["default"].solver_prompt("abduction", t, "chat")
