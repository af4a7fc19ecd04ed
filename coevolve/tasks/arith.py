"""The arithmetic world: integer expressions over + - * and parentheses, with an exact checker.

Difficulty level 1..6 is the number of binary operations in a question. Every operand (and every
fact-sheet value) is an integer drawn uniformly from ``0..OPERAND_MAX[level]``; the range grows
slowly with the level (0..12 at levels 1-2, 0..15 at 3-4, 0..20 at 5-6), so higher levels are
harder both for their length and for the size of their intermediate values. Questions are
rendered with the fewest parentheses that keep their meaning. Level 1 has only 507 distinct
questions, so its 200-question held-out set is 39% of them; filter generated questions with
:func:`held_out_keys` where that leakage matters.

Fact sheets ("documents", ``a=3,b=7,c=2``) bind the first 3-5 letters to values and grounded
questions use only those letters: a fixed letter order keeps the look-up learnable for a
1M-parameter model. The checker accepts any single lowercase letter that a sheet binds.

The exact checker (:func:`evaluate`, :func:`level_of`) is a recursive-descent parser of its own
(never Python ``eval``). It is for evaluation and analytics only (held-out accuracy, how often a
majority-vote pseudo-label is wrong, question difficulty); a self-evolving recipe must never use
it as a training reward.

Compact formats (what the character-level tiny-arith model reads and writes; a sample is prompt
+ completion + EOS):

=========================  ===============================  ================================================
task                       prompt                           completion
=========================  ===============================  ================================================
solve                      ``Q:3+4*5=?\\n``                  ``S:4*5=20;3+20=23\\nA:23``
grounded solve             ``D:a=3,b=7,c=2\\nQ:a+b*c=?\\n``   ``S:a+b*c=3+7*2;7*2=14;3+14=17\\nA:17``
write a question           ``W:\\n``                         ``Q:3+4*5``
write like examples        ``E:3+4\\nE:(2-7)*3\\nW:\\n``       ``Q:6*(1+2)``
write a grounded question  ``D:a=3,b=7,c=2\\nW:\\n``           ``Q:a+b*c\\nS:a+b*c=3+7*2;7*2=14;3+14=17\\nA:17``
=========================  ===============================  ================================================

One rule parses every completion: the question is the first line's text after ``Q:``, the
answer is the text after ``A:`` on the last line that starts with ``A:``. The grounded writer
works its answer out (``S:`` line) before stating it, so its answer is as good as the model's
solving, which matters where the writer's answer is the solver's label.

Trace steps apply one operation each, in this order: the deepest parenthesised operation first,
then multiplication before addition and subtraction, then the leftmost. Each step is written
``<left><op><right>=<value>`` with plain integers, so a negative right operand reads ``3--5=8``
(which the checker parses as 3 - (-5)). A grounded trace starts with the substitution step
``<question>=<question with the values filled in>``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

from coevolve.data.benchmarks import Benchmark, EvalItem, register
from coevolve.grading.extract import extract_boxed, extract_prefixed
from coevolve.grading.guard import parses_model_text

FORMAT_VERSION = 2  # bump when a format, the generator or the held-out sets change
LEVELS = (1, 2, 3, 4, 5, 6)
OPERAND_MAX = {1: 12, 2: 12, 3: 15, 4: 15, 5: 20, 6: 20}
MAX_OPS = 12
MAX_CHARS = 200
HELD_OUT_SEED = 20240601
HELD_OUT_SIZE = 200  # questions reserved per level (plain and grounded each); held_out(n) takes a prefix
STYLES = ("compact", "chat")

_TOKEN = re.compile(r"\s*(?:([0-9]+)|([a-z])|([-+*()]))")
_PREC = {"+": 1, "-": 1, "*": 2}


@dataclass(frozen=True)
class ArithProblem:
    """One question with its exact answer, difficulty level, optional fact sheet and worked solution.

    ``doc`` is the fact sheet's text without the ``D:`` prefix (``a=3,b=7,c=2``); ``trace`` is
    the ``S:`` line's content (``4*5=20;3+20=23``).
    """

    question: str
    answer: int
    level: int
    doc: str | None = None
    trace: str = ""


@dataclass(frozen=True)
class ParsedQuestion:
    """A question read from a writer's completion, with the answer the writer gave (if any)."""

    question: str
    answer: str | None = None


# ----------------------------------------------------------------------------- parsing


class _Node:
    """Expression tree node: kind is "num", "var", "neg" or "bin" (``op``, ``depth``, ``pos`` set)."""

    __slots__ = ("kind", "value", "op", "left", "right", "depth", "pos")

    def __init__(self, kind: str, value: int | str | None = None, op: str = "", left: _Node | None = None,
                 right: _Node | None = None, depth: int = 0, pos: int = 0):
        self.kind, self.value, self.op = kind, value, op
        self.left, self.right, self.depth, self.pos = left, right, depth, pos


class _ParseError(ValueError):
    pass


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            if text[pos:].strip() == "":
                break
            raise _ParseError(f"unexpected character at {pos}")
        tokens.append(match.group(match.lastindex))
        pos = match.end()
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)* ; term := factor ('*' factor)* ; factor := '-' factor | atom ;
    atom := INT | VAR | '(' expr ')'."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.i, self.depth, self.ops = tokens, 0, 0, 0

    def parse(self) -> _Node:
        node = self._expr()
        if self.i != len(self.tokens):
            raise _ParseError("trailing tokens")
        return node

    def _peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _binary(self, op: str, left: _Node, right_fn) -> _Node:
        pos, depth = self.i, self.depth
        self.i += 1
        self.ops += 1
        if self.ops > MAX_OPS:
            raise _ParseError("too many operations")
        return _Node("bin", op=op, left=left, right=right_fn(), depth=depth, pos=pos)

    def _expr(self) -> _Node:
        node = self._term()
        while self._peek() in ("+", "-"):
            node = self._binary(self._peek(), node, self._term)
        return node

    def _term(self) -> _Node:
        node = self._factor()
        while self._peek() == "*":
            node = self._binary("*", node, self._factor)
        return node

    def _factor(self) -> _Node:
        tok = self._peek()
        if tok == "-":
            self.i += 1
            return _Node("neg", left=self._factor())
        if tok is None:
            raise _ParseError("unexpected end")
        self.i += 1
        if tok.isdigit():
            return _Node("num", int(tok))
        if tok.isalpha():
            return _Node("var", tok)
        if tok == "(":
            self.depth += 1
            node = self._expr()
            if self._peek() != ")":
                raise _ParseError("missing ')'")
            self.i += 1
            self.depth -= 1
            return node
        raise _ParseError(f"unexpected {tok!r}")


def parse_doc(doc: str | None) -> dict[str, int] | None:
    """The variable bindings of a fact sheet (``a=3,b=7`` or ``D:a=3,b=7``); None if malformed.

    A missing sheet (None) binds nothing and gives ``{}``.
    """
    if doc is None:
        return {}
    text = doc.strip()
    if text.startswith("D:"):
        text = text[2:]
    bindings: dict[str, int] = {}
    for item in text.split(","):
        match = re.fullmatch(r"\s*([a-z])\s*=\s*(-?[0-9]{1,12})\s*", item)
        if match is None or match.group(1) in bindings:
            return None
        bindings[match.group(1)] = int(match.group(2))
    return bindings


def _parse(question: str, doc: str | None) -> tuple[_Node, dict[str, int]] | None:
    if not isinstance(question, str) or len(question) > MAX_CHARS:
        return None
    bindings = parse_doc(doc)
    if bindings is None:
        return None
    try:
        tree = _Parser(_tokenize(question)).parse()
    except (_ParseError, RecursionError):
        return None
    if any(name not in bindings for name in _variables(tree)):
        return None
    return tree, bindings


def _variables(node: _Node | None) -> list[str]:
    if node is None:
        return []
    if node.kind == "var":
        return [str(node.value)]
    return _variables(node.left) + _variables(node.right)


def _value(node: _Node, bindings: dict[str, int]) -> int:
    if node.kind == "num":
        return int(node.value)
    if node.kind == "var":
        return bindings[str(node.value)]
    if node.kind == "neg":
        return -_value(node.left, bindings)
    left, right = _value(node.left, bindings), _value(node.right, bindings)
    return left + right if node.op == "+" else left - right if node.op == "-" else left * right


def evaluate(question: str, doc: str | None = None) -> int | None:
    """The exact integer value of ``question`` (variables bound by the fact sheet ``doc``).

    None if it does not parse, uses an unbound variable, is longer than 200 characters or has
    more than 12 operations. Exact checker: for evaluation and analytics only, never a reward.
    """
    parsed = _parse(question, doc)
    return None if parsed is None else _value(*parsed)


def level_of(question: str, doc: str | None = None) -> int | None:
    """The number of binary operations in ``question`` (its true difficulty level); None if invalid."""
    parsed = _parse(question, doc)
    return None if parsed is None else _count_ops(parsed[0])


def _count_ops(node: _Node | None) -> int:
    if node is None or node.kind in ("num", "var"):
        return 0
    return (node.kind == "bin") + _count_ops(node.left) + _count_ops(node.right)


# ----------------------------------------------------------------------------- traces


def _leaf(node: _Node) -> int | None:
    """The value of a number, or of a negated number (unary minus folds away without a step)."""
    if node.kind == "num":
        return int(node.value)
    if node.kind == "neg":
        inner = _leaf(node.left)
        return None if inner is None else -inner
    return None


def _ready(node: _Node | None) -> list[_Node]:
    if node is None or node.kind in ("num", "var"):
        return []
    if node.kind == "bin" and _leaf(node.left) is not None and _leaf(node.right) is not None:
        return [node]
    return _ready(node.left) + _ready(node.right)


def _substitute(question: str, bindings: dict[str, int]) -> str:
    return "".join(str(bindings[c]) if c in bindings else c for c in question)


def self_contained(question: str, doc: str | None) -> str | None:
    """``question`` with the fact sheet's values written in (a negative one in parentheses), so it can be solved
    without the sheet; None if it is not a valid question over ``doc``."""
    parsed = _parse(question, doc)
    if parsed is None:
        return None
    bindings = {name: str(v) if v >= 0 else f"({v})" for name, v in parsed[1].items()}
    return "".join(bindings.get(c, c) for c in question)


def solution_trace(question: str, doc: str | None = None) -> str | None:
    """The step-by-step solution (the ``S:`` line's content) of ``question``; None if invalid.

    One operation per step: deepest parentheses first, then ``*`` before ``+``/``-``, then leftmost.
    """
    parsed = _parse(question, doc)
    if parsed is None:
        return None
    tree, bindings = parsed
    canonical = "".join(question.split())
    steps: list[str] = []
    if _variables(tree):
        steps.append(f"{canonical}={_substitute(canonical, bindings)}")
        _bind(tree, bindings)
    while True:
        ready = _ready(tree)
        if not ready:
            break
        node = min(ready, key=lambda n: (-n.depth, -_PREC[n.op], n.pos))
        left, right = _leaf(node.left), _leaf(node.right)
        result = left + right if node.op == "+" else left - right if node.op == "-" else left * right
        steps.append(f"{left}{node.op}{right}={result}")
        node.kind, node.value, node.left, node.right = "num", result, None, None
    return ";".join(steps)


def _bind(node: _Node | None, bindings: dict[str, int]) -> None:
    if node is None:
        return
    if node.kind == "var":
        value = bindings[str(node.value)]
        if value < 0:
            node.kind, node.left = "neg", _Node("num", -value)
        else:
            node.kind, node.value = "num", value
        return
    _bind(node.left, bindings)
    _bind(node.right, bindings)


# ----------------------------------------------------------------------------- generation


def random_expression(n_ops: int, rng: random.Random, leaf) -> tuple[str, int]:
    """A random expression with ``n_ops`` operations, as (text, precedence of its top operator)."""
    if n_ops == 0:
        return leaf(), 3
    n_left = rng.randint(0, n_ops - 1)
    op = rng.choice("+-*")
    left, left_prec = random_expression(n_left, rng, leaf)
    right, right_prec = random_expression(n_ops - 1 - n_left, rng, leaf)
    if left_prec < _PREC[op]:
        left = f"({left})"
    if right_prec < _PREC[op] or (right_prec == _PREC[op] and op == "-"):
        right = f"({right})"
    return f"{left}{op}{right}", _PREC[op]


def random_doc(level: int, rng: random.Random) -> str:
    """A fact sheet binding the first 3-5 letters (``a``, ``b``, ...) to values in the level's operand range."""
    names = "abcde"[:rng.randint(3, 5)]
    return ",".join(f"{name}={rng.randint(0, OPERAND_MAX[level])}" for name in names)


def generate_problem(level: int, rng: random.Random, grounded: bool = False) -> ArithProblem:
    """A random problem with exactly ``level`` operations; grounded ones are over a new fact sheet."""
    if level not in OPERAND_MAX:
        raise ValueError(f"level must be one of {LEVELS}, got {level}")
    if grounded:
        doc = random_doc(level, rng)
        names = [item[0] for item in doc.split(",")]
        question, _ = random_expression(level, rng, lambda: rng.choice(names))
    else:
        doc = None
        question, _ = random_expression(level, rng, lambda: str(rng.randint(0, OPERAND_MAX[level])))
    return ArithProblem(question=question, answer=evaluate(question, doc), level=level, doc=doc,
                        trace=solution_trace(question, doc))


def problem_key(question: str, doc: str | None = None) -> str:
    """Identity of a problem for deduplication and held-out exclusion (question plus its fact sheet)."""
    canonical = "".join(question.split())
    return canonical if doc is None else f"{doc}|{canonical}"


@cache
def _held_out_full(level: int, seed: int, grounded: bool) -> tuple[ArithProblem, ...]:
    rng = random.Random(f"held-out/{seed}/{level}/{grounded}")
    problems: dict[str, ArithProblem] = {}
    while len(problems) < HELD_OUT_SIZE:
        problem = generate_problem(level, rng, grounded)
        problems.setdefault(problem_key(problem.question, problem.doc), problem)
    return tuple(problems.values())


def held_out(level: int, n: int = HELD_OUT_SIZE, seed: int = HELD_OUT_SEED,
             grounded: bool = False) -> list[ArithProblem]:
    """The fixed held-out test set of ``level``: ``n`` distinct problems, the same on every call.

    Training samplers exclude the default-seed sets (all levels, plain and grounded), so use the
    default seed for evaluation unless you exclude your own set; ``n`` is at most 200.
    """
    if not 0 <= n <= HELD_OUT_SIZE:
        raise ValueError(f"n must be in 0..{HELD_OUT_SIZE}, got {n}")
    return list(_held_out_full(level, seed, grounded)[:n])


@lru_cache(maxsize=1)
def held_out_keys() -> frozenset[str]:
    """Keys (:func:`problem_key`) of every default held-out problem, plain and grounded, levels 1-6."""
    return frozenset(problem_key(p.question, p.doc) for level in LEVELS for grounded in (False, True)
                     for p in _held_out_full(level, HELD_OUT_SEED, grounded))


def sample_problems(n: int, rng: random.Random | int, levels: Sequence[int] = (1, 2, 3), grounded: bool = False,
                    exclude: Collection[str] | None = None) -> list[ArithProblem]:
    """``n`` training problems, each of a level drawn uniformly from ``levels``.

    Problems whose key is in ``exclude`` (default: :func:`held_out_keys`) are redrawn.
    ``rng`` is a seed or a ``random.Random`` (which advances, so successive calls continue the stream).
    """
    rng = random.Random(rng) if isinstance(rng, int) else rng
    exclude = held_out_keys() if exclude is None else exclude
    out: list[ArithProblem] = []
    while len(out) < n:
        problem = generate_problem(rng.choice(levels), rng, grounded)
        if problem_key(problem.question, problem.doc) not in exclude:
            out.append(problem)
    return out


# ----------------------------------------------------------------------------- prompts and parsers


def _check_style(style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")


def _doc_sentence(doc: str) -> str:
    bindings = parse_doc(doc) or {}
    return "Facts: " + ", ".join(f"{k} = {v}" for k, v in bindings.items()) + "."


def solver_prompt(question: str, doc: str | None = None, style: str = "compact") -> str:
    """The prompt asking to solve ``question`` (over the fact sheet ``doc``, if given)."""
    _check_style(style)
    if style == "compact":
        return (f"D:{doc}\n" if doc else "") + f"Q:{question}=?\n"
    facts = f"{_doc_sentence(doc)}\n" if doc else ""
    return f"{facts}Compute {question}. Give the final answer in \\boxed{{}}."


def question_prompt(style: str = "compact", examples: Sequence[str] = (), doc: str | None = None) -> str:
    """The prompt asking to write a new question (like ``examples``; grounded in ``doc`` with its answer)."""
    _check_style(style)
    if style == "compact":
        return (f"D:{doc}\n" if doc else "") + "".join(f"E:{e}\n" for e in examples) + "W:\n"
    parts = ["Write a new arithmetic problem: one expression with integers, +, -, * and parentheses."]
    if examples:
        parts.append("Here are example problems:\n" + "\n".join(examples)
                     + "\nMake the new problem about as hard as these, but different.")
    if doc:
        parts.append(f"{_doc_sentence(doc)}\nUse these variables (single letters) in the expression. "
                     "Put the problem after 'Question:' on one line, then solve it and put its value after 'Answer:'.")
    else:
        parts.append("Put the problem after 'Question:' on one line.")
    return "\n".join(parts)


def solve_completion(problem: ArithProblem) -> str:
    """The compact solve target: ``S:<trace>\\nA:<answer>``."""
    return f"S:{problem.trace}\nA:{problem.answer}"


def question_completion(problem: ArithProblem) -> str:
    """The compact question-writing target: ``Q:<question>``, plus trace and answer when grounded."""
    if problem.doc is None:
        return f"Q:{problem.question}"
    return f"Q:{problem.question}\n{solve_completion(problem)}"


def parse_answer(completion: str, style: str = "compact") -> str | None:
    """The final answer of a solver completion: last ``A:`` line (compact) or last ``\\boxed{}`` (chat)."""
    _check_style(style)
    return extract_prefixed(completion, "A:") if style == "compact" else extract_boxed(completion)


_CHAT_NORMALIZE = str.maketrans({"×": "*", "·": "*", "−": "-", "–": "-"})


def _chat_expression(line: str, doc: str | None) -> str | None:
    """The longest run of expression characters in ``line`` that parses (chat writers add words)."""
    allowed = "0123456789+-*() " + "".join((parse_doc(doc) or {}).keys())
    text = line.translate(_CHAT_NORMALIZE).replace("$", " ").replace("`", " ")
    runs = sorted(re.findall(f"[{re.escape(allowed)}]+", text), key=len, reverse=True)
    for run in runs:
        candidate = "".join(run.split()).rstrip("=")
        if candidate and evaluate(candidate, doc) is not None:
            return candidate
    return None


def parse_question(completion: str, style: str = "compact", doc: str | None = None) -> ParsedQuestion | None:
    """The question a writer produced (and the answer it gave); None if malformed or not a valid question.

    Valid means: parses, has at least one operation, and uses only variables bound by ``doc``.
    Compact: the first line must be ``Q:<question>``; chat: the text after the last ``Question:``.
    """
    _check_style(style)
    return _parse_question(completion, style, doc)


@parses_model_text()
def _parse_question(completion: str, style: str, doc: str | None) -> ParsedQuestion | None:
    if style == "compact":
        lines = completion.strip().splitlines()
        if not lines or not lines[0].startswith("Q:"):
            return None
        question = "".join(lines[0][2:].split())
        answer = extract_prefixed(completion, "A:")
    else:
        marker = completion.rfind("Question:")
        if marker < 0:
            return None
        rest = completion[marker + len("Question:"):].strip()
        question = _chat_expression(rest.splitlines()[0] if rest else "", doc)
        answer_at = completion.rfind("Answer:")
        answer_text = completion[answer_at + len("Answer:"):] if answer_at > marker else ""
        number = re.search(r"-?[0-9]+", answer_text.translate(_CHAT_NORMALIZE).replace(",", ""))
        answer = number.group(0) if number else extract_boxed(completion)
    if question is None or not level_of(question, doc):
        return None
    return ParsedQuestion(question=question, answer=answer)


def _held_out_items(levels: Sequence[int], set_name: str) -> list[EvalItem]:
    """The held-out problems of ``levels`` as evaluation items."""
    items = []
    for level in levels:
        for i, prob in enumerate(held_out(level, n=HELD_OUT_SIZE)):
            items.append(EvalItem(f"arith_l{level}/{i}", set_name, "arith", prob.question, str(prob.answer),
                                  meta={"level": level}))
    return items


register(
    *[Benchmark(f"arith_l{lv}", "arith", f"arithmetic world, held-out level {lv} ({HELD_OUT_SIZE} problems)",
                lambda _rows, lv=lv: _held_out_items([lv], f"arith_l{lv}"), expected_rows=HELD_OUT_SIZE)
      for lv in LEVELS],
    Benchmark("arith", "arith", f"arithmetic world, held-out levels 1-6 ({HELD_OUT_SIZE} each)",
              lambda _rows: _held_out_items(LEVELS, "arith"), expected_rows=HELD_OUT_SIZE * 6),
)
