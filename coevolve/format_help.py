r"""Format help for generators that cannot yet write their recipe's output format (small chat models).

Each self-evolving recipe reads its generator's output with a fixed parser (R-Zero's ``<question>`` block and
``\boxed{}``, PasoDoble's ``<problem>``/``<answer>``, INFUSER's JSON, ...). A 135M chat model almost never writes
these, so no question reaches the solver. Three switchable helps, all off by default and in ``paper`` presets
(PasoDoble's paper has a cold-start SFT, which ``coevolve sft`` plays the part of; its presets do not run it):

- ``params.format_examples: N``: N worked examples of the output format, built from GSM8K-train problems with their
  answers rendered in the recipe's exact format, appended to the generator prompt (:func:`examples_block`);
- ``params.generator_init: DIR``: start the generator (the one policy of ``opensir`` / ``dynamic_rl``) from the model a
  ``coevolve sft`` format warm-up wrote (:mod:`coevolve.sft`, trained on :func:`warmup_pairs`);
- ``params.format_constraint: true``: constrained decoding of the format with xgrammar (HF engine) or vLLM's
  structured outputs (``OutputFormat.regex``; see :mod:`coevolve.rollout.constrained` for the log-probs).

Formats exist for the chat tasks (``math`` and the document variants); tiny-arith has its own pretrained formats.
"""

from __future__ import annotations

import json
import logging
import random
import re
from dataclasses import dataclass
from typing import Callable

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
    from coevolve.evaluation.benchmarks import _raw_rows, get_benchmark

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
class OutputFormat:
    """A generator's output format: what a person reads, a regex for constrained decoding, and a renderer."""

    description: str
    regex: str
    render: Callable[[WorkedExample], str]


# Regexes for constrained decoding. The question is one line of at most 300 characters: a newline token can then
# only close it, and a small model cannot ramble past its token budget inside an open tag.
MAX_CHARS = 300  # longest question a format allows: about 75 tokens
MAX_SOLUTION_CHARS = 200  # longest PasoDoble solution: with the question, about 200 tokens (digits are one token each)
_ANSWER = r"[^{}<>\n]{1,40}"
_LINE = r"[^<>\n]{10,300}"
_R_ZERO = OutputFormat(
    "<question>\\n{the problem}\\n</question>\\n\\n\\boxed{final answer}",
    r"<question>\n" + _LINE + r"\n</question>\n\n\\boxed\{" + _ANSWER + r"\}",
    lambda e: f"<question>\n{one_line(e.question)}\n</question>\n\n\\boxed{{{e.answer}}}")
FORMATS: dict[str, OutputFormat] = {
    "r_zero": _R_ZERO,
    "prism": _R_ZERO,
    "pasodoble": OutputFormat(
        "<problem>{the problem}</problem> <answer>{worked solution} \\boxed{final answer}</answer>",
        r"<problem>" + _LINE + r"</problem> <answer>[^<>{}\n]{0,%d}\\boxed\{" % MAX_SOLUTION_CHARS + _ANSWER
        + r"\}</answer>",
        lambda e: (f"<problem>{one_line(e.question)}</problem> <answer>{one_line(e.solution)} "
                   f"\\boxed{{{e.answer}}}</answer>")),
    "infuser": OutputFormat(
        '{"question_text": "{the question}", "ground_truth": "{final answer}"}',
        r'\{"question_text": "[^"\\\n]{10,300}", "ground_truth": "[^"\\\n{}]{1,40}"\}',
        lambda e: json.dumps({"question_text": one_line(e.question), "ground_truth": e.answer})),
    "opensir": OutputFormat(
        "<think>{how it differs}</think>\\n<problem>{the problem}</problem>\\n<concepts>{1-3 concepts, comma "
        "separated}</concepts>",
        r"<think>[^<>\n]{0,120}</think>\n<problem>" + _LINE
        + r"</problem>\n<concepts>[a-z ]{3,30}(, [a-z ]{3,30}){0,2}</concepts>",
        lambda e: (f"<think>A word problem that needs {' and '.join(concepts_of(e))}.</think>\n"
                   f"<problem>{one_line(e.question)}</problem>\n<concepts>{', '.join(concepts_of(e))}</concepts>")),
    "dynamic_rl": OutputFormat(
        "Question: {the question}\\nSolution: {step-by-step solution} (generation stops at 'Solution:')",
        r"Question: [^\n]{10,300}\nSolution:",
        lambda e: f"Question: {one_line(e.question)}\nSolution: {e.solution}\nThe answer is {e.answer}."),
}


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


def output_format(recipe: str) -> OutputFormat:
    """The generator output format of ``recipe`` (one-line KeyError for a recipe without a generator)."""
    try:
        return FORMATS[recipe]
    except KeyError:
        raise KeyError(f"recipe {recipe!r} has no generator output format (known: {', '.join(FORMATS)})") from None


def examples_block(recipe: str, examples: list[WorkedExample]) -> str:
    """The text appended to a generator prompt by ``params.format_examples``: the examples in the exact format."""
    if not examples:
        return ""
    fmt = output_format(recipe)
    shown = "\n\n".join(f"Example {i}:\n{fmt.render(e)}" for i, e in enumerate(examples, 1))
    return f"\n\nExamples of the required output format (write a new problem, in exactly this format):\n\n{shown}"


def warmup_pairs(recipe: str, examples: list[WorkedExample], seed: int = 0) -> list[tuple[str, str]]:
    """(generator user message, target output) pairs for the format warm-up of ``recipe``.

    The user message is the recipe's own generator prompt. Where that prompt carries a document (PasoDoble's
    knowledge passage, INFUSER's document), the document is the example's worked solution, so the target question
    is grounded in it; OpenSIR's reference problem is another example's question.
    """
    from coevolve.recipes.dynamic_rl import Z0
    from coevolve.recipes.infuser import GENERATOR_PROMPT
    from coevolve.recipes.opensir import TEACHER_PROMPT
    from coevolve.recipes.pasodoble import KNOWLEDGE, PROPOSER_PROMPT
    from coevolve.recipes.r_zero import QUESTIONER_PROMPT

    fmt, rng = output_format(recipe), random.Random(seed)
    pairs = []
    for e in examples:
        if recipe in ("r_zero", "prism"):
            prompt = QUESTIONER_PROMPT
        elif recipe == "pasodoble":
            prompt = PROPOSER_PROMPT.format(knowledge=KNOWLEDGE.format(passage=e.solution))
        elif recipe == "infuser":
            prompt = GENERATOR_PROMPT.format(text=e.solution)
        elif recipe == "opensir":
            prompt = TEACHER_PROMPT.replace("{problem}", rng.choice(examples).question)
        else:
            prompt = Z0
        pairs.append((prompt, fmt.render(e)))
    return pairs


class FormatWatch:
    """Counts consecutive generator steps with no valid output; warns once after ``after`` of them (``chat``: the
    chat format and the format help switches; otherwise the arithmetic world's writer format)."""

    def __init__(self, recipe: str, after: int, chat: bool = True):
        self.recipe, self.after, self.chat, self.empty, self.warned = recipe, after, chat, 0, False

    def observe(self, step: int, valid: int, total: int) -> bool:
        """Record one step's ``valid`` of ``total`` generator outputs; True when this call logged the warning."""
        if total == 0:
            return False
        self.empty = 0 if valid else self.empty + 1
        if self.empty < self.after or self.warned:
            return False
        self.warned = True
        if not self.chat:
            log.warning("step %d: the %s generator wrote no valid output for %d consecutive steps (expected the "
                        "arithmetic world's writer format, Q:<expression>), so nothing reaches the solver; is the "
                        "model the pretrained tiny-arith?", step, self.recipe, self.empty)
            return True
        log.warning("step %d: the %s generator wrote no valid output for %d consecutive steps (expected: %s), so "
                    "nothing reaches the solver; turn on format help: params.format_examples=N (worked examples in "
                    "the prompt), params.format_constraint=true (constrained decoding) or params.generator_init=DIR "
                    "(a `coevolve sft %s` format warm-up)", step, self.recipe, self.empty,
                    FORMATS[self.recipe].description, self.recipe)
        return True
