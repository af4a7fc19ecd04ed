"""The python world of the ``azr`` recipe: programs are Python functions ``f``, run only by the sandboxed executor.

A proposer writes a program and an input (deduction, abduction) or N inputs and a message for a given program
(induction); a solver writes an output, an input or a program. Their text is data in this process: the only Python
it parses is with :mod:`ast` (a program's syntax and imports, bounded in size; inputs and outputs as literals with
``ast.literal_eval``); every program runs in :class:`coevolve.execution.Executor` (bubblewrap sandbox, resource
limits; ``docs/execution.md``).

Validation (AZR §3.3.3): the proposal's blocks are present and in bounds; the program parses and defines ``f``; it
imports none of ``FORBIDDEN`` (nor reaches ``os.path``, ``os.environ``, ``os.sys``, ``sys.exit``); each input is a
Python literal argument list; ``f(*input)`` runs and returns a plain literal value (not None), the same in two
independent runs (determinism, j = 2). :class:`Rules` switches to the authors' code's rules (``CODE_RULES``): one
``def`` in all, inputs written as any call arguments (evaluated in the sandbox only: this process checks that the text
is the arguments of one call to ``f``), ``None`` and non-literal outputs (their repr), gold outputs cut to 400
characters. The value comes back through a helper appended after the program that checks
its true type with names the program cannot rebind, so a program cannot pass a forged value (an object whose
``__eq__`` or ``__repr__`` lies) as an output, and every comparison of values happens in this process between plain
literals: deduction compares the solver's output with the gold one, abduction runs ``f`` on the solver's input,
induction runs the solver's ``f`` on the hidden inputs (Python value equality, ``==``, as AZR's templates).

Formats: blocks fenced as ```` ```python ````, ```` ```input ````, ```` ```output ````, ```` ```message ````; when the
text has an ``<answer>`` part, the blocks are read from the last one (AZR's ``answer_conditional`` extraction). A
proposal's first ``python`` and ``input`` blocks count; a solver's last answer block counts. The prompts follow the
structure of AZR's (task, requirements, format, reference snippets) in this project's words.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from coevolve.execution import ExecutionLimits, Executor, Job, Outcome
from coevolve.grading.guard import parses_model_text
from coevolve.tasks.triplets import ExecutionStats, Kind, ProgramWorld, Proposal, Triplet, Validation

# AZR's forbidden modules (its config's banned_words: the paper's Fig. 12 list plus hmac)
FORBIDDEN = ("logging", "random", "multiprocessing", "pebble", "subprocess", "threading", "datetime", "time",
             "hashlib", "hmac", "bcrypt", "calendar", "os.sys", "os.path", "sys.exit", "os.environ")
MAX_PROGRAM_CHARS = 5600  # coevolve's bound on a program's text before it is parsed (the code bounds whole prompts)
MAX_VALUE_CHARS = 2000  # an input or output as text (coevolve's; the code cuts outputs to 400 characters instead)
NOT_A_LITERAL = "__coevolve_not_a_literal__"
SHOWN = "__coevolve_shown__"  # marks the (SHOWN, repr) pair of a value that is not a plain literal
# Appended after a program: returns a value unchanged when its true type is a plain literal one (recursively), else
# NOT_A_LITERAL, or with ``shown`` the pair (SHOWN, repr(value)). ``(0).__class__.__class__`` is ``type`` reached
# without a name the program could rebind; the helper's own names are locals and a closure, and an expression loads it
# before it calls ``f``.
_PLAIN = """

def __coevolve_plain(value, shown=False):
    kind = (0).__class__.__class__
    atoms = (kind(0), kind(0.0), kind(0j), kind(''), kind(b''), kind(True), kind(None))
    sequences = (kind([]), kind(()), kind({0}))
    mapping = kind({})

    def plain(v, depth):
        k = kind(v)
        for atom in atoms:
            if k is atom:
                return True
        if depth > 32:
            return False
        if k is mapping:
            for key in v:
                if not plain(key, depth + 1) or not plain(v[key], depth + 1):
                    return False
            return True
        for sequence in sequences:
            if k is sequence:
                for item in v:
                    if not plain(item, depth + 1):
                        return False
                return True
        return False

    if plain(value, 0):
        return value
    return (%r, repr(value)) if shown else %r
""" % (SHOWN, NOT_A_LITERAL)  # noqa: UP031  (the code's own braces would need doubling)
_REASONS = {"syntax": "syntax", "error": "error", "forbidden": "forbidden", "timeout": "timeout",
            "memory": "resource", "output": "resource", "killed": "resource"}

SEED_PROGRAM = "def f(a):\n    return a"
# Format help (constrained decoding, params.format_constraint): a function f of up to three arguments with one to four
# body lines in a python block; an input of up to three simple literals (integers, short strings, integer lists).
_FUNCTION = r"```python\ndef f\([a-z_]{1,12}(, [a-z_]{1,12}){0,2}\):\n(    [^\n`]{1,60}\n){1,4}```"
_LITERAL = r"""(-?[0-9]{1,6}|"[A-Za-z0-9 ]{0,20}"|'[A-Za-z0-9 ]{0,20}'|\[(-?[0-9]{1,4}(, -?[0-9]{1,4}){0,7})?\])"""
_ARGUMENTS = _LITERAL + "(, " + _LITERAL + "){0,2}"


@dataclass(frozen=True)
class Rules:
    """What counts as a valid program, input and output. The defaults are coevolve's (helpers allowed, positional
    literal inputs read here, plain literal outputs other than None, outputs over ``MAX_VALUE_CHARS`` invalid);
    ``CODE_RULES`` are those of the authors' code (``docs/recipes/azr.md`` cites each)."""

    single_function: bool = False  # reject a program with more than one def (nested ones and methods included)
    expression_inputs: bool = False  # an input is any call arguments (``dict(a=1, b=2)``, ``x=3``), run in the sandbox
    any_output: bool = False  # accept None and values that are not plain literals (their repr is the output)
    output_chars: int | None = None  # cut a gold output longer than this to its first and last halves around "..."


CODE_RULES = Rules(single_function=True, expression_inputs=True, any_output=True, output_chars=400)


def truncate(text: str, limit: int) -> str:
    """``text`` when it is at most ``limit`` characters, else its first and last ``limit // 2`` around "..."."""
    half = limit // 2
    return text if len(text) <= limit else text[:half] + "..." + text[-half:]


def strip_program(program: str) -> str:
    """A seed program without its comments and docstrings and without top-level statements other than imports,
    functions and classes (the code's ``remove_comments`` and ``remove_after_return``), rebuilt from its syntax tree
    with ``ast.unparse`` (which keeps no comments); the program unchanged when it does not parse."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return program
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            while node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
                    and isinstance(node.body[0].value.value, str):
                node.body.pop(0)  # a docstring
            if not node.body and not isinstance(node, ast.Module):
                node.body.append(ast.Pass())
    tree.body = [node for node in tree.body if isinstance(
        node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    try:
        return "\n".join(line for line in ast.unparse(tree).splitlines() if line.strip())
    except (ValueError, RecursionError):
        return program


# ----------------------------------------------------------------------------- reading model text


def answer_part(text: str) -> str:
    """The last ``<answer>`` part of ``text`` when it has one, else all of it (AZR's answer_conditional)."""
    start = text.rfind("<answer>")
    if start < 0:
        return text
    end = text.find("</answer>", start)
    return text[start + len("<answer>"):end if end >= 0 else None]


def blocks(text: str, tag: str) -> list[str]:
    """The contents of the ```` ```tag ```` fenced blocks of ``text``, in order."""
    return [m.group(1) for m in re.finditer(rf"```{tag}[ \t]*\n?(.*?)\n?```", text, re.DOTALL | re.IGNORECASE)]


def parse_program(program: str, single_function: bool = False) -> ast.Module | None:
    """The syntax tree of a program that defines a top-level ``f`` and is at most ``MAX_PROGRAM_CHARS`` long (with
    ``single_function``: and has no other ``def`` anywhere, nested functions and methods included); None otherwise (a
    program the parser cannot take, nested too deeply or too large, included)."""
    if len(program) > MAX_PROGRAM_CHARS:
        return None
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    defines_f = any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "f"
                    for node in tree.body)
    functions = sum(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) for node in ast.walk(tree))
    if single_function and functions > 1:
        return None
    return tree if defines_f else None


def uses_forbidden(tree: ast.AST) -> bool:
    """Whether a program imports a forbidden module (or a submodule of one), calls ``__import__`` on one, or reaches
    one of the forbidden dotted names (``os.path``, ``os.environ``, ``os.sys``, ``sys.exit``)."""
    def forbidden(name: str) -> bool:
        parts = name.split(".")
        return any(".".join(parts[:i]) in FORBIDDEN for i in range(1, len(parts) + 1))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(forbidden(alias.name) for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module and (
                forbidden(node.module) or any(forbidden(f"{node.module}.{a.name}") for a in node.names)):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__" and \
                node.args and isinstance(node.args[0], ast.Constant) and forbidden(str(node.args[0].value)):
            return True
        if isinstance(node, ast.Attribute) and "." in (dotted := _dotted(node) or "") and dotted in FORBIDDEN:
            return True
    return False


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def read_arguments(text: str) -> tuple | None:
    """An input as the tuple of its arguments (``"'John', {'age': 20}"``), when the text is an argument list of
    Python literals (positional, not starred) of at most ``MAX_VALUE_CHARS`` characters; else None. Parsed with
    :mod:`ast` as the arguments of a call and each read with ``ast.literal_eval``: never run."""
    text = text.strip()
    if not text or len(text) > MAX_VALUE_CHARS:
        return None
    try:
        call = ast.parse(f"f({text})", mode="eval").body
        if not isinstance(call, ast.Call) or call.keywords or not isinstance(call.func, ast.Name):
            return None
        return tuple(ast.literal_eval(arg) for arg in call.args)
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None


def call_arguments(text: str) -> str | None:
    """An input written as any call arguments (``dict(a=1, b=2)``, ``x=3``, ``*[1, 2]``): the stripped text when
    ``f(<text>)`` parses as exactly one call to ``f`` (so the text cannot reach outside the call's parentheses) and it
    is at most ``MAX_VALUE_CHARS`` characters; else None. Only parsed here: it is evaluated in the sandbox."""
    text = text.strip()
    if not text or len(text) > MAX_VALUE_CHARS:
        return None
    try:
        call = ast.parse(f"f({text}\n)", mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return text if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "f" else None


def read_value(text: str | None, limit: int | None = MAX_VALUE_CHARS) -> tuple[bool, Any]:
    """(True, the value) of a Python literal of at most ``limit`` characters; (False, None) otherwise."""
    if text is None or limit is not None and len(text) > limit:
        return False, None
    try:
        return True, ast.literal_eval(text.strip())
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return False, None


def readable_input(text: str, rules: Rules) -> bool:
    """Whether an input's text is one under ``rules``: literal arguments, or (expression_inputs) any call arguments."""
    return (call_arguments(text) if rules.expression_inputs else read_arguments(text)) is not None


@parses_model_text(invalid="format")
def _read_proposal(text: str, kind: Kind, program: str | None, n_inputs: int, rules: Rules,
                   strip: bool) -> Proposal | str:
    answer = answer_part(text)
    inputs = blocks(answer, "input")
    if kind == "induction":
        messages = blocks(answer, "message")
        if len(inputs) != n_inputs or not messages:
            return "format"
        if not all(readable_input(i, rules) for i in inputs):
            return "syntax"
        return Proposal(kind, program or "", tuple(i.strip() for i in inputs), messages[0].strip()[:MAX_VALUE_CHARS])
    programs = blocks(answer, "python")
    if not programs or not inputs:
        return "format"
    code = programs[0].strip("\n")
    if strip and parse_program(code, rules.single_function) is not None:
        code = strip_program(code)
    tree = parse_program(code, rules.single_function)
    if tree is None:
        return "syntax"
    if uses_forbidden(tree):
        return "forbidden"
    if not readable_input(inputs[0], rules):
        return "syntax"
    return Proposal(kind, code, (inputs[0].strip(),))


@parses_model_text()
def _read_answer(text: str, kind: Kind) -> str | None:
    found = blocks(answer_part(text), {"deduction": "output", "abduction": "input", "induction": "python"}[kind])
    if not found:
        return None
    answer = found[-1].strip("\n") if kind == "induction" else found[-1].strip()
    return answer if len(answer) <= (MAX_PROGRAM_CHARS if kind == "induction" else MAX_VALUE_CHARS) else None


# ----------------------------------------------------------------------------- prompts

_RULES = """### Requirements for the program
- Name the entry function `f` (for example `def f(x): ...`); {functions}
- `f` takes at least one argument and returns a value
- It is deterministic: no randomness, no clock or date, no files, no network, no printing, no outside state
- It finishes within {timeout} seconds on an ordinary CPU
- Imports and class definitions go at the top of the snippet
- Do not use any of these modules or names, anywhere, not even in comments: {forbidden}

### Requirements for the input
- Exactly one input: the arguments of `f`, separated by commas
- {arguments}

### Format
```python
def f(...):
    # the program
    return ...
```
```input
arg1, arg2, ...
```
"""

_PROPOSE = {
    "deduction": """## Task: write a new Python program and one input for it

Look at the reference programs below, then write a new one that is clearly different from them, and one input. A
test subject will be given your program and your input and must work out the output by reasoning alone. Make the
program need careful step-by-step tracking of values through several transformations.

""",
    "abduction": """## Task: write a new Python program and one input for it

Look at the reference programs below, then write a new one that is clearly different from them, and one input. A
test subject will be given your program and the output your input produces, and must find an input that produces
that output. Make working backwards from the output take real reasoning.

""",
}

_PROPOSE_INDUCTION = """## Task: write {n} inputs for a Python program, and a message about it

Here is a program. Write {n} inputs for it that together cover what it does, and a short message. A test subject
will see half of your inputs with their outputs and your message, and must write a program that gives the right
outputs for the other half. The message may describe the task in words, but must not contain the code.

### Requirements
- Each input is the arguments of `f`, separated by commas{arguments}
- Put each input in its own ```input block, and the message in one ```message block

### Format
```input
arg1, arg2, ...
```
(... {n} input blocks in all ...)
```message
what the program does, in words
```

### Program
```python
{program}
```
"""

_SOLVE = {
    "deduction": """# Task: work out the output of a Python program
Given the program and the input below, reason step by step, then give the value `f` returns for that input in an
```output block, as a Python literal (quote strings; a tuple for several values).

# Program
```python
{program}
```

# Input
```input
{input}
```

# Answer format
```output
the value
```
""",
    "abduction": """# Task: find an input of a Python program that gives an output
Given the program and the output below, reason step by step, then give one input for which `f` returns that output,
in an ```input block: the arguments of `f`{arguments}, separated by commas.

# Program
```python
{program}
```

# Output
```output
{output}
```

# Answer format
```input
arg1, arg2, ...
```
""",
    "induction": """# Task: write the Python function behind some inputs and outputs
Given the input/output pairs and the message below, reason step by step, then write a function `f` that maps every
input to its output (it will be checked on other inputs too), in a ```python block.

# Inputs and outputs
{pairs}

# Message
```message
{message}
```

# Answer format
```python
def f(...):
    return ...
```
""",
}


_FUNCTIONS = {False: "it may define helper functions inside it",
              True: "it is the only function: no helper, nested function or method"}
# how inputs are written, in the proposer's rules, the induction proposer's and the abduction solver's prompts
_ARGUMENT_RULES = {False: ("Every argument is a Python literal (quote strings)",
                           ", every argument a Python literal (quote strings)", " as Python literals"),
                   True: ("Arguments may be any Python expressions, keyword arguments included (quote strings)",
                          ", any Python expressions, keyword arguments included (quote strings)",
                          " (any Python expressions, keyword arguments included)")}


def _snippets(references: Sequence[Triplet]) -> str:
    return "".join(f"<snippet_{i}>\n```python\n{t.program}\n```\n```input\n{t.inputs[0]}\n```\n"
                   f"```output\n{t.outputs[0]}\n```\n</snippet_{i}>\n" for i, t in enumerate(references))


# ----------------------------------------------------------------------------- the world


class PythonWorld(ProgramWorld):
    """Python functions run by the sandboxed ``executor`` (owned: :meth:`close` stops it)."""

    name = "python"

    def __init__(self, executor: Executor, n_inputs: int = 10, rules: Rules = Rules()):
        self.executor, self.n_inputs, self.rules = executor, n_inputs, rules
        self._stats = ExecutionStats()

    def seed_triplet(self) -> Triplet:
        return Triplet(SEED_PROGRAM, ('"Hello world"',), ("'Hello world'",))

    def proposer_prompt(self, kind, references, style):
        proposer, induction, _ = _ARGUMENT_RULES[self.rules.expression_inputs]
        if kind == "induction":
            return _PROPOSE_INDUCTION.format(n=self.n_inputs, program=references[0].program, arguments=induction)
        rules = _RULES.format(timeout=int(self.executor.limits.wall_seconds), forbidden=", ".join(FORBIDDEN),
                              functions=_FUNCTIONS[self.rules.single_function], arguments=proposer)
        return _PROPOSE[kind] + rules + "\n### Reference programs\n" + _snippets(references)

    def read_proposal(self, kind, text, program=None, strip=False):
        return _read_proposal(text, kind, program, self.n_inputs, self.rules, strip)

    def call(self, program: str, arguments: Sequence[str]) -> Job:
        """The run of ``f`` on each input (one: its value; several: the list of values), each value passed through
        the plain-literal helper: literal inputs are read here and passed as values, expression inputs (checked by
        :func:`call_arguments`) are evaluated in the sandbox."""
        shown = ", True" if self.rules.any_output else ""
        calls = [f"__coevolve_plain(f({call_arguments(a)}\n){shown})" if self.rules.expression_inputs
                 else f"__coevolve_plain(f(*{read_arguments(a)!r}){shown})" for a in arguments]
        return Job(program + _PLAIN, calls[0] if len(calls) == 1 else "[" + ", ".join(calls) + "]")

    def validate(self, proposals):
        jobs = [self.call(p.program, [i]) for p in proposals for i in p.inputs for _ in range(2)]
        outcomes = iter(self._run(jobs))
        out = []
        for p in proposals:
            outputs, reason = [], None
            for _ in p.inputs:
                first, second = next(outcomes), next(outcomes)
                if reason is None:
                    reason = _run_reason(first, second)
                    output = None if reason else self.output(first.value)
                    reason = reason or ("error" if output is None else None)
                    outputs.append(output)
            out.append(Validation(Triplet(p.program, p.inputs, tuple(o for o in outputs if o is not None), p.message))
                       if reason is None else Validation(None, reason))
        return out

    def output(self, raw: str | None) -> str | None:
        """A run's value (the repr the helper's result came back as) as an output's text under the rules, or None when
        it is not one: NOT_A_LITERAL, None (unless any_output), too long (unless cut to ``output_chars``)."""
        ok, value = read_value(raw, limit=None)
        return self.shown(value, raw) if ok else None

    def shown(self, value: Any, raw: str | None = None) -> str | None:
        """The output text of a value the helper returned (see :meth:`output`): the sandbox's repr ``raw`` of a plain
        value when given (its text does not depend on this process's string hashing), else its repr here."""
        if isinstance(value, tuple) and len(value) == 2 and value[0] == SHOWN and isinstance(value[1], str):
            text = value[1].strip() if self.rules.any_output else None
        elif isinstance(value, str) and value == NOT_A_LITERAL or value is None and not self.rules.any_output:
            text = None
        else:
            text = raw if raw is not None else repr(value)
        if text is None:
            return None
        if self.rules.output_chars is not None:
            return truncate(text, self.rules.output_chars)
        return text if len(text) <= MAX_VALUE_CHARS else None

    def same(self, answer: str | None, gold: str) -> bool:
        """Whether an output (the solver's text, or one a run gave) is the gold one: Python value equality when both
        read as literals, else the same text (a repr of a value that is not a literal, a cut output)."""
        if answer is None:
            return False
        a, g = read_value(answer), read_value(gold)
        return _same(a, g) if a[0] and g[0] else answer.strip() == gold.strip()

    def solver_prompt(self, kind, task, style):
        if kind == "induction":
            pairs = "\n".join(f"```input\n{i}\n```\n```output\n{o}\n```" for i, o in task.given)
            return _SOLVE[kind].format(pairs=pairs, message=task.message)
        return _SOLVE[kind].format(program=task.program, input=task.inputs[0], output=task.outputs[0],
                                   arguments=_ARGUMENT_RULES[self.rules.expression_inputs][2])

    def read_answer(self, kind, text):
        return _read_answer(text, kind)

    def check(self, kind, tasks, answers):
        if kind == "deduction":  # two outputs compared here: nothing to run
            return [self.same(answer, t.outputs[0]) for t, answer in zip(tasks, answers)]
        jobs, owners = [], []
        for n, (task, answer) in enumerate(zip(tasks, answers)):
            job = self._check_job(kind, task, answer)
            if job is not None:
                jobs.append(job)
                owners.append(n)
        verdicts = [False] * len(tasks)
        for n, outcome in zip(owners, self._run(jobs)):
            task = tasks[n]
            if outcome.status != "ok":
                continue
            if kind == "abduction":
                verdicts[n] = self.same(self.output(outcome.value), task.outputs[0])
            else:
                ok, values = read_value(outcome.value, limit=None)
                gold = [o for _, o in task.hidden]
                if len(gold) == 1:
                    values = [values]
                verdicts[n] = ok and isinstance(values, list) and len(values) == len(gold) and all(
                    self.same(self.shown(v), g) for v, g in zip(values, gold))
        return verdicts

    def _check_job(self, kind: Kind, task: Triplet, answer: str | None) -> Job | None:
        """The run that checks an answer, or None when it cannot be right without running (unreadable input, a
        program that does not parse or uses a forbidden module)."""
        if answer is None:
            return None
        if kind == "abduction":
            return self.call(task.program, [answer]) if readable_input(answer, self.rules) else None
        tree = parse_program(answer)
        if tree is None or uses_forbidden(tree):
            return None
        return self.call(answer, [i for i, _ in task.hidden])

    def program_ops(self, program):
        return program_ops(program)

    def proposer_regex(self, kind):
        if kind == "induction":
            inputs = r"(```input\n%s\n```\n){%d}" % (_ARGUMENTS, self.n_inputs)  # noqa: UP031
            return inputs + r"```message\n[^\n`]{1,80}\n```"
        return _FUNCTION + r"\n```input\n" + _ARGUMENTS + r"\n```"

    def solver_regex(self, kind):
        if kind == "induction":
            return _FUNCTION
        block = r"```output\n[^\n`]{1,60}\n```" if kind == "deduction" else r"```input\n" + _ARGUMENTS + r"\n```"
        return r"[^`]{0,100}" + block  # a short reasoning, then the block, within a small model's budget

    def pop_execution_stats(self) -> ExecutionStats:
        stats, self._stats = self._stats, ExecutionStats()
        return stats

    def close(self) -> None:
        self.executor.close()

    def _run(self, jobs: list[Job]) -> list[Outcome]:
        outcomes = self.executor.run(jobs) if jobs else []
        self._stats.add(ExecutionStats(len(jobs), sum(o.seconds for o in outcomes),
                                       sum(o.status == "timeout" for o in outcomes)))
        return outcomes


def _run_reason(first: Outcome, second: Outcome) -> str | None:
    """Why two runs of a proposal's program on one input do not make a valid output (None when they do)."""
    for outcome in (first, second):
        if outcome.status != "ok":
            return _REASONS.get(outcome.status, "error")
    if first.value != second.value:
        return "nondeterministic"
    return None


def _same(a: tuple[bool, Any], b: tuple[bool, Any]) -> bool:
    """Python value equality of two read literals (both readable)."""
    try:
        return a[0] and b[0] and bool(a[1] == b[1])
    except (RecursionError, MemoryError):
        return False


@lru_cache(maxsize=65536)
def program_ops(program: str) -> frozenset[str]:
    """The kinds of syntax a program uses (its AST node types beyond names, constants and contexts)."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return frozenset()
    trivial = {"Module", "Name", "Load", "Store", "Del", "Constant", "arguments", "arg", "Expr", "FunctionDef",
               "Return", "keyword", "alias"}
    return frozenset(type(node).__name__ for node in ast.walk(tree)) - trivial


def python_world(timeout_s: float, workers: int | None, unconfined: bool, n_inputs: int = 10,
                 rules: Rules = Rules()) -> PythonWorld:
    """A python world over a new executor: bubblewrap unless ``unconfined`` (raises ``SandboxUnavailable`` with one
    line when bubblewrap cannot run)."""
    limits = ExecutionLimits(cpu_seconds=timeout_s, wall_seconds=timeout_s, output_bytes=64 * 1024)
    return PythonWorld(Executor(limits, workers, confinement="none" if unconfined else "bwrap"), n_inputs, rules)
