r"""Format help for generators that cannot yet write their recipe's output format (small chat models).

Each self-evolving recipe reads its generator's output with a fixed parser (R-Zero's ``<question>`` block and
``\boxed{}``, PasoDoble's ``<problem>``/``<answer>``, INFUSER's JSON, ...). A 135M chat model almost never writes
these, so no question reaches the solver. Three switchable helps, all off by default and in ``paper`` presets
(PasoDoble's paper has a cold-start SFT, which ``coevolve sft`` plays the part of; its presets do not run it):

- ``params.format_examples: N``: N worked examples of the output format, built from GSM8K-train problems with their
  answers rendered in the recipe's exact format, appended to the generator prompt (:func:`examples_block`);
- ``params.generator_init: DIR``: start the generator (the one policy of ``opensir`` / ``dynamic_rl``) from the model a
  ``coevolve sft`` format warm-up wrote (:mod:`coevolve.sft`);
- ``params.format_constraint: true``: constrained decoding of the format with xgrammar (HF engine) or vLLM's
  structured outputs (``OutputFormat.regex``; see :mod:`coevolve.rollout.constrained` for the log-probs).

Each recipe declares its :class:`GeneratorFormat` per task world in its own file (``formats``): ``chat`` for the chat
tasks (``math`` and the document variants), where the help applies, and ``arith`` for the arithmetic world, whose
writer format tiny-arith is pretrained on (:func:`arith_format`, :func:`grounded_arith_format`). A format's prompt and
parser take the prompt style and keyword inputs (``document=``, ``reference=``, ``rules=``: whatever the recipe's
generator reads), typed by protocols with exactly those keywords (:class:`PromptBuilder`,
:class:`DocumentPromptBuilder`, ...), and the parser returns a :class:`Generation`. :class:`FormatWatch` warns when
none of a generator's outputs parse for several steps.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from coevolve.data.benchmarks import _raw_rows, get_benchmark
from coevolve.rollout.base import Completion
from coevolve.tasks import arith

log = logging.getLogger(__name__)

_CALC = re.compile(r"<<[^>]*>>")  # GSM8K's calculator annotations


@dataclass(frozen=True)
class WorkedExample:
    """One real problem: its question, its worked solution (no final line) and its final answer."""

    question: str
    solution: str
    answer: str


def load_worked_examples(count: int, seed: int = 0, data_dir: str | None = None) -> list[WorkedExample]:
    """``count`` GSM8K-train problems (a seeded sample) with solutions and answers, for examples and warm-up data;
    only problems whose question and solution fit the formats' length bounds (``MAX_CHARS``, ``MAX_SOLUTION_CHARS``)."""
    bench = get_benchmark("gsm8k_train")
    rows = _raw_rows(bench, bench.relpath or "", data_dir)
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    examples = []
    for i in order:
        worked, _, final = rows[i]["answer"].rpartition("####")
        example = WorkedExample(rows[i]["question"].strip(), _CALC.sub("", worked).strip(),
                                final.strip().replace(",", ""))
        if len(one_line(example.question)) <= MAX_CHARS and len(one_line(example.solution)) <= MAX_SOLUTION_CHARS:
            examples.append(example)
            if len(examples) == count:
                break
    return examples


def concepts_of(example: WorkedExample) -> list[str]:
    """At most three operation names the worked solution uses (OpenSIR's ``<concepts>``), from its symbols."""
    ops = [("+", "addition"), ("-", "subtraction"), ("*", "multiplication"), ("/", "division")]
    found = [name for symbol, name in ops if symbol in example.solution]
    return (found or ["arithmetic"])[:3]


@dataclass(frozen=True)
class Generation:
    """One generator output as its recipe reads it: the question (None when the output has none), the generator's
    own answer where its format carries one, what else the format names (OpenSIR's concepts and format score), and
    ``rejected`` for an output that has a question but breaks the format's other rules (OpenSIR's teacher)."""

    question: str | None
    answer: str | None = None
    concepts: tuple[str, ...] = ()
    format_score: float = 0.0
    rejected: bool = False

    @property
    def valid(self) -> bool:
        """The output has a question and keeps the format's rules."""
        return self.question is not None and not self.rejected


class PromptBuilder(Protocol):
    """The user message of a generator that reads nothing but its instructions: ``prompt(style)`` for the prompt
    style (R-Zero, Prism, Dynamic-RL)."""

    def __call__(self, style: str, /) -> str: ...


class OutputParser(Protocol):
    """The reading of one output of a generator that reads nothing but its instructions: ``parse(output, style)``
    for the completion (with its finish reason) and the prompt style."""

    def __call__(self, output: Completion, style: str, /) -> Generation: ...


class DocumentPromptBuilder(Protocol):
    """The user message of a generator that writes over a document (INFUSER, PasoDoble): ``prompt(style,
    document=...)``; None where the run has none (PasoDoble without a knowledge source)."""

    def __call__(self, style: str, /, *, document: str | None) -> str: ...


class DocumentOutputParser(Protocol):
    """The reading of one output of a generator that wrote over ``document``."""

    def __call__(self, output: Completion, style: str, /, *, document: str | None) -> Generation: ...


# A format's prompt builder and output parser, typed by the keyword inputs its recipe calls them with (the protocols
# above, or a recipe's own): a builder that wants another keyword is a type error where the recipe declares it.
PromptT = TypeVar("PromptT", bound=Callable[..., str], covariant=True)
ParserT = TypeVar("ParserT", bound=Callable[..., Generation], covariant=True)


@dataclass(frozen=True)
class GeneratorFormat(Generic[PromptT, ParserT]):
    """A generator's output format in one task world, declared by its recipe (``formats["chat"]``,
    ``formats["arith"]``) and picked once by :class:`~coevolve.recipes.generator.GeneratorRecipe`.

    ``prompt(style, **inputs)`` is the user message that asks for it and ``parse(output, style, **inputs)`` reads one
    generator output into a :class:`Generation`; each recipe names its keyword inputs (a ``document``, a
    ``reference`` problem, or none) in the types of the two (``GeneratorFormat[DocumentPromptBuilder,
    DocumentOutputParser]``, or protocols of its own). A chat format adds the format help's pieces: what a person
    reads, a regex for constrained decoding, a renderer of worked examples, and the prompt's inputs for one worked
    example (the format warm-up's user message; ``examples`` and ``rng`` supply other examples where the prompt shows
    one).
    """

    prompt: PromptT
    parse: ParserT
    stop: tuple[str, ...] = ()  # stop strings of the generator's sampling
    grounded: bool = False  # its questions name the document's facts, so the solver is shown the document too
    description: str = ""
    regex: str = ""
    render: Callable[[WorkedExample], str] | None = None
    warmup_inputs: Callable[[WorkedExample, list[WorkedExample], random.Random], dict[str, Any]] | None = None

    def warmup_prompt(self, example: WorkedExample, examples: list[WorkedExample], rng: random.Random) -> str:
        """The generator's user message for one worked example of the format warm-up (chat formats)."""
        inputs = self.warmup_inputs(example, examples, rng) if self.warmup_inputs else {}
        return self.prompt("chat", **inputs)


# Regex pieces for constrained decoding. The question is one line of at most 300 characters: a newline token can then
# only close it, and a small model cannot ramble past its token budget inside an open tag.
MAX_CHARS = 300  # longest question a format allows: about 75 tokens
MAX_SOLUTION_CHARS = 200  # longest PasoDoble solution: with the question, about 200 tokens (digits are one token each)
ANSWER = r"[^{}<>\n]{1,40}"
LINE = r"[^<>\n]{10,300}"


# The solver's answer format (every recipe's chat solver prompt asks for it): reasoning without backslashes, then
# \boxed{answer}. A small model rarely boxes its answer (smollm2-135m: 3 of 60 solver samples), so majority votes and
# agreement with a generator's answer have nothing to compare; with ``params.solver_format_constraint`` the solver's
# training rollouts end in a boxed number (LaTeX commands in the reasoning are then not possible).
def solver_answer_regex(max_tokens: int) -> str:
    """Reasoning without backslashes, then \\boxed{a number}; the box is forced after 3 characters per token of the
    budget, so that it fits in ``max_tokens`` (English text averages about 4 characters a token). The answer is a
    number (GSM8K's are; MATH's LaTeX answers are not possible): with free text in the box, a 135M solver's answers
    never agreed with each other or with a generator's answer."""
    return r"[^\\]{0,%d}\\boxed\{-?[0-9]{1,7}(\.[0-9]{1,4})?\}" % max(3 * max_tokens - 40, 0)  # noqa: UP031


def one_line(text: str) -> str:
    """``text`` with its line breaks as spaces (the formats' questions and PasoDoble's solution are one line)."""
    return " ".join(text.split())


def examples_block(fmt: GeneratorFormat, examples: list[WorkedExample]) -> str:
    """The text appended to a generator prompt by ``params.format_examples``: the examples in the exact format."""
    if not examples:
        return ""
    if fmt.render is None:
        raise ValueError(f"the format {fmt.description!r} has no worked-example renderer")
    shown = "\n\n".join(f"Example {i}:\n{fmt.render(e)}" for i, e in enumerate(examples, 1))
    return f"\n\nExamples of the required output format (write a new problem, in exactly this format):\n\n{shown}"


def read_arith_question(output: Completion, style: str, document: str | None = None) -> Generation:
    """The arithmetic world's writer output (over the fact sheet ``document``, where the writer read one): the
    question and the writer's own answer; no question if malformed."""
    parsed = arith.parse_question(output.text, style, document)
    return Generation(parsed.question, parsed.answer) if parsed else Generation(None)


def arith_format() -> GeneratorFormat[PromptBuilder, OutputParser]:
    """The generator format of the arithmetic world: its writer prompt
    (:func:`coevolve.tasks.arith.question_prompt`) and the reading of the writer's output (:func:`read_arith_question`).
    """
    return GeneratorFormat(arith.question_prompt, read_arith_question)


def grounded_arith_format(parse: DocumentOutputParser = read_arith_question,
                          ) -> GeneratorFormat[DocumentPromptBuilder, DocumentOutputParser]:
    """:func:`arith_format` grounded in a fact sheet (``document=``) that the writer reads and the solver is shown;
    ``parse`` reads the writer's output (default: :func:`read_arith_question`)."""
    return GeneratorFormat(lambda style, document: arith.question_prompt(style, doc=document), parse, grounded=True)


class FormatWatch:
    """Counts consecutive generator steps with no valid output; warns once after ``after`` of them, naming the
    format the recipe expected (``description``; None: the arithmetic world's writer format) and, for a chat format,
    the format help switches."""

    def __init__(self, recipe: str, after: int, description: str | None):
        self.recipe, self.after, self.description, self.empty, self.warned = recipe, after, description, 0, False

    def observe(self, step: int, valid: int, total: int) -> bool:
        """Record one step's ``valid`` of ``total`` generator outputs; True when this call logged the warning."""
        if total == 0:
            return False
        self.empty = 0 if valid else self.empty + 1
        if self.empty < self.after or self.warned:
            return False
        self.warned = True
        if self.description is None:
            log.warning("step %d: the %s generator wrote no valid output for %d consecutive steps (expected the "
                        "arithmetic world's writer format, Q:<expression>), so nothing reaches the solver; is the "
                        "model the pretrained tiny-arith?", step, self.recipe, self.empty)
            return True
        log.warning("step %d: the %s generator wrote no valid output for %d consecutive steps (expected: %s), so "
                    "nothing reaches the solver; turn on format help: params.format_examples=N (worked examples in "
                    "the prompt), params.format_constraint=true (constrained decoding) or params.generator_init=DIR "
                    "(a `coevolve sft %s` format warm-up)", step, self.recipe, self.empty, self.description,
                    self.recipe)
        return True
