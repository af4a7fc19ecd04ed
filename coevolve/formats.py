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
writer format tiny-arith is pretrained on (:func:`arith_format`).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Callable

from coevolve.data.benchmarks import _raw_rows, get_benchmark
from coevolve.tasks import arith

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
    rows = _raw_rows(bench, bench.relpath, data_dir)
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
class GeneratorFormat:
    """A generator's output format in one task world, declared by its recipe (``formats["chat"]``,
    ``formats["arith"]``) and picked once by :class:`~coevolve.recipes.generator.GeneratorRecipe`.

    ``prompt(style, *inputs)`` is the user message that asks for it and ``parse(output, style, *inputs)`` reads one
    generator output; each recipe fixes their inputs (a document, a reference problem, or none) and what ``parse``
    returns. A chat format adds the format help's pieces: what a person reads, a regex for constrained decoding, a
    renderer of worked examples, and the prompt's inputs for one worked example (the format warm-up's user message;
    ``examples`` and ``rng`` supply other examples where the prompt shows one).
    """

    prompt: Callable[..., str]
    parse: Callable[..., Any]
    stop: tuple[str, ...] = ()  # stop strings of the generator's sampling
    grounded: bool = False  # its questions name the document's facts, so the solver is shown the document too
    description: str = ""
    regex: str = ""
    render: Callable[[WorkedExample], str] | None = None
    warmup_inputs: Callable[[WorkedExample, list[WorkedExample], random.Random], tuple] | None = None

    def warmup_prompt(self, example: WorkedExample, examples: list[WorkedExample], rng: random.Random) -> str:
        """The generator's user message for one worked example of the format warm-up (chat formats)."""
        return self.prompt("chat", *self.warmup_inputs(example, examples, rng))


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
    return r"[^\\]{0,%d}\\boxed\{-?[0-9]{1,7}(\.[0-9]{1,4})?\}" % max(3 * max_tokens - 40, 0)


def one_line(text: str) -> str:
    """``text`` with its line breaks as spaces (the formats' questions and PasoDoble's solution are one line)."""
    return " ".join(text.split())


def examples_block(fmt: GeneratorFormat, examples: list[WorkedExample]) -> str:
    """The text appended to a generator prompt by ``params.format_examples``: the examples in the exact format."""
    if not examples:
        return ""
    shown = "\n\n".join(f"Example {i}:\n{fmt.render(e)}" for i, e in enumerate(examples, 1))
    return f"\n\nExamples of the required output format (write a new problem, in exactly this format):\n\n{shown}"


def arith_format(parse: Callable[..., Any], *, grounded: bool = False) -> GeneratorFormat:
    """A generator format of the arithmetic world: its writer prompt (:func:`coevolve.tasks.arith.question_prompt`,
    grounded in a fact sheet where the recipe's generator reads one) and the recipe's reading of the writer's output.
    """
    if grounded:
        return GeneratorFormat(lambda style, doc: arith.question_prompt(style, doc=doc), parse, grounded=True)
    return GeneratorFormat(lambda style: arith.question_prompt(style), parse)
