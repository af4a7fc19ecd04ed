r"""SPICE: one model plays a corpus-grounded Challenger and a Reasoner that answers without the document.

Paper: SPICE: Self-Play In Corpus Environments Improves Reasoning (Liu et al., FAIR at Meta, arXiv:2510.24684,
§3 and Algorithm 1). No code was released: every choice the paper leaves open is listed in ``docs/recipes/spice.md``.
One policy π_θ, one AdamW. One step is one iteration t:

1. B documents d walked without replacement from the corpus (reshuffled each epoch); a task form per document,
   multiple choice with probability ``mcq_share``, else free-form.
2. Challenger: G outputs per document, each read as a task (q, a*) in that form, or invalid.
3. Reasoner: K answers to each valid q, shown without d; r_R = 1[a ≡ a*]
   (:func:`coevolve.rewards.spice.reasoner_reward`).
4. Challenger reward: r_C = exp(-(Var(r_R) - 0.25)^2 / (2·0.01)) for a valid task, ρ = -0.1 for an invalid one
   (:func:`coevolve.rewards.spice.challenger_reward`).
5. Role-specific Dr.GRPO advantages, Â = r - mean(group): the Challenger's over each document's G outputs, the
   Reasoner's over each question's K answers.
6. One update of π_θ on both roles' samples together.

In the arithmetic world (``small``) a document is a fact sheet, the task form is free-form with an integer answer,
and the Challenger's question over the sheet's variables reaches the Reasoner with their values written in
(:func:`coevolve.tasks.arith.self_contained`), so the Reasoner never sees the sheet either.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, Protocol

from pydantic import Field

from coevolve.config import ConfigError, RunConfig
from coevolve.documents import DocumentPool, check_document_source, load_documents, tokenizer_counter
from coevolve.formats import Generation, GeneratorFormat, one_line
from coevolve.grading.extract import braces_balanced, extract_answer, tag_blocks
from coevolve.grading.guard import parses_model_text
from coevolve.recipes.base import (
    PhaseTimer,
    StepOutput,
    mean,
    register,
    role_metrics,
    step_seed,
    tool_use,
    train_samples,
)
from coevolve.recipes.generator import GeneratorParams, GeneratorRecipe
from coevolve.records import SampleRow, generator_row, solver_row
from coevolve.rewards.spice import challenger_reward, reasoner_reward
from coevolve.rl.advantages import compute_advantages
from coevolve.rollout import Completion
from coevolve.tasks import arith
from coevolve.tasks.registry import get_task

Form = Literal["mcq", "free_form"]
CHOICES = "ABCD"
MCQ_INSTRUCTION = "\nAnswer with the letter (A, B, C or D) of the correct option."

# The Challenger's prompt (the paper's structure: the document, the task form asked for, the rules of a valid task,
# then the output format; our wording).
CHALLENGER_PROMPT = """You are the Challenger in a self-play game. Read the document below and write ONE challenging \
reasoning question grounded in it, with its correct answer.

[BEGINNING OF THE DOCUMENT]
{document}
[END OF THE DOCUMENT]

The question goes to a solver who will NOT see the document: make it fully self-contained (state every fact and \
definition it needs; never write "according to the document"), answerable with certainty from the document, and \
hard enough to need several reasoning steps.
{form}
Write the question inside <question>...</question>, then the answer inside <answer>...</answer>."""
FORM_RULES = {
    "mcq": "Task form: multiple choice. Give exactly four options, each on its own line as A) ..., B) ..., C) ..., "
           "D) ..., inside the question; exactly one is correct. The answer is its letter.",
    "free_form": "Task form: free-form. The answer is one short verifiable value (an integer, a number, a "
                 "mathematical expression or a short phrase), with no units and no explanation.",
}
_OPTION = re.compile(r"(?m)^[ \t]*\(?([A-D])[).:]")
MAX_ANSWER_CHARS = 200


@parses_model_text(invalid=(None, None))
def parse_task(text: str) -> tuple[str | None, str | None]:
    """(question, answer) of a Challenger output: the last <question> block outside <think> blocks and the first
    <answer> block after it; None for what is missing or empty."""
    kept, pos = [], 0
    for start, _, _, end in tag_blocks(text, "think"):
        kept.append(text[pos:start])
        pos = end
    text = "".join(kept) + text[pos:]
    questions = list(tag_blocks(text, "question"))
    if not questions:
        return None, None
    _, q_start, q_end, after = questions[-1]
    question = text[q_start:q_end].strip() or None
    rest = text[after:]
    answer = next((rest[a_start:a_end].strip() for _, a_start, a_end, _ in tag_blocks(rest, "answer")), None)
    return question, answer or None


def read_chat_task(output: Completion, style: str, form: Form = "free_form", **_: Any) -> Generation:
    """A valid task of the asked form: multiple choice with options A-D in the question and a letter as the answer;
    free-form with a short answer whose braces balance."""
    question, answer = parse_task(output.text)
    if question is None or answer is None or len(answer) > MAX_ANSWER_CHARS:
        return Generation(None)
    if form == "mcq":
        letter = extract_answer(answer, "mcq", len(CHOICES))
        if letter is None or set(_OPTION.findall(question)) != set(CHOICES):
            return Generation(None)
        return Generation(question, letter)
    return Generation(question, answer) if braces_balanced(answer) else Generation(None)


def read_arith_task(output: Completion, style: str, document: str, **_: Any) -> Generation:
    """A valid arithmetic-world task: a question over the fact sheet, with the sheet's values written in, and the
    Challenger's integer answer."""
    parsed = arith.parse_question(output.text, style, document)
    if parsed is None or parsed.answer is None or not re.fullmatch(r"-?\d+", parsed.answer.strip()):
        return Generation(None)
    question = arith.self_contained(parsed.question, document)
    return Generation(question, parsed.answer.strip()) if question else Generation(None)


class ChallengerPromptBuilder(Protocol):
    """The Challenger's user message: ``prompt(style, document=..., form=...)`` for its document and task form."""

    def __call__(self, style: str, /, *, document: str, form: Form) -> str: ...


class ChallengerOutputParser(Protocol):
    """The reading of one Challenger output written over ``document`` in ``form``."""

    def __call__(self, output: Completion, style: str, /, *, document: str, form: Form) -> Generation: ...


class SpiceParams(GeneratorParams):
    """Algorithm 1's inputs (B, G, K, ρ, the Gaussian's centre and width), the task forms and the corpus."""

    documents_per_step: int = Field(128, gt=0, description="B, documents per iteration")
    challenger_samples: int = Field(8, gt=1, description="G, Challenger outputs per document (its Dr.GRPO group)")
    reasoner_samples: int = Field(8, gt=1, description="K, Reasoner answers per valid task (its Dr.GRPO group)")
    invalid_penalty: float = Field(-0.1, description="ρ, the Challenger's reward for an invalid task")
    variance_target: float = Field(0.25, ge=0, le=0.25, description="the centre of r_C in Var (0.25: p = 1/2)")
    variance_width: float = Field(0.01, gt=0, description="σ² of r_C's Gaussian in Var")
    mcq_share: float = Field(0.5, ge=0, le=1, description="probability that a document's task is multiple choice "
                             "(else free-form); the arithmetic world has free-form tasks only (0)")
    advantage: Literal["dr_grpo", "grpo"] = Field("dr_grpo", description="both roles' advantages: Dr.GRPO "
                                                  "(paper) or std-scaled GRPO")
    document_source: str | None = Field(None, description="arith | openstax | proofwiki | a path (text files, a "
                                        "parquet file or dataset folder, #column) | hf:<id>; default by task")
    document_min_tokens: int = Field(200, gt=0, description="shortest chunk of a document, in tokens")
    document_max_tokens: int = Field(2048, gt=0, description="longest chunk of a document, in tokens")
    document_pool_size: int | None = Field(None, gt=0, description="keep a seeded subset of this many chunks")
    challenger_max_tokens: int = Field(64, gt=0, description="the Challenger's response budget")


@dataclass
class Task:
    """One Challenger output for a document and what the iteration computed for it."""

    doc: str
    doc_key: str
    group: int
    form: Form
    output: Completion
    question: str | None = None
    key: str | None = None  # a*
    answers: list[Completion] = field(default_factory=list)
    parsed: list[str | None] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # r_R of each answer
    reasoner_advantages: list[float] = field(default_factory=list)
    reward: float = 0.0  # r_C
    advantage: float = 0.0

    @property
    def valid(self) -> bool:
        return self.question is not None

    @property
    def pass_rate(self) -> float | None:
        return mean(self.scores) if self.scores else None


@register
class Spice(GeneratorRecipe[SpiceParams, ChallengerPromptBuilder, ChallengerOutputParser]):
    name = "spice"
    summary = ("one model: a Challenger writes document-grounded tasks (multiple choice or free-form) and a Reasoner "
               "answers them without the document; Challenger rewarded by a Gaussian of the Reasoner's success "
               "variance; Dr.GRPO")
    roles = ("policy",)
    Params = SpiceParams
    formats: ClassVar[dict[str, GeneratorFormat[ChallengerPromptBuilder, ChallengerOutputParser]]] = {
        "chat": GeneratorFormat(
            lambda style, document, form="free_form", **_: CHALLENGER_PROMPT.format(document=document,
                                                                                    form=FORM_RULES[form]),
            read_chat_task,
            description="<question>{the question}</question> <answer>{the answer}</answer>",
            regex=r"<question>[^<>\n]{10,600}</question> <answer>[^<>\n]{1,60}</answer>",
            render=lambda e: f"<question>{one_line(e.question)}</question> <answer>{e.answer}</answer>",
            warmup_inputs=lambda e, examples, rng: {"document": e.solution, "form": "free_form"}),
        # the writer prompt over a fact sheet; not ``grounded``: the Reasoner gets the question with the values in
        "arith": GeneratorFormat(lambda style, document, **_: arith.question_prompt(style, doc=document),
                                 read_arith_task),
    }
    defaults = {
        "steps": 640, "eval_every": 20,
        "rollout": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 64},
        "train": {"lr": 1e-6, "kl_beta": 0.0, "grad_clip": 1.0, "loss_agg": "token_sum_norm"},
    }
    presets = {
        "small": {  # tiny-arith on fact sheets, free-form integer tasks
            "model": "tiny-arith", "task": "arith", "steps": 100, "eval_every": 25,
            "rollout": {"temperature": 1.0, "max_new_tokens": 48, "batch_size": 256},
            "train": {"lr": 3e-5, "micro_batch_size": 16},
            "params": {"documents_per_step": 8, "challenger_samples": 4, "reasoner_samples": 4, "mcq_share": 0.0,
                       "challenger_max_tokens": 48, "document_source": "arith"},
        },
        "paper": {  # §4.1 at the paper's scale; Qwen3-4B-Base is --set model=...; values and sources in the docs
            "model": "smollm2-135m", "task": "math", "steps": 640, "eval_every": 40,
            "rollout": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 8192},
            "train": {"lr": 1e-6, "kl_beta": 0.0, "grad_clip": 1.0, "loss_agg": "token_sum_norm",
                      "mini_batch_size": 0, "epochs": 1, "micro_batch_size": 2},
            "eval_sets": ["gsm8k", "math500"], "eval_limit": 100, "eval_max_new_tokens": 8192,
            "params": {"documents_per_step": 128, "challenger_samples": 8, "reasoner_samples": 8, "mcq_share": 0.5,
                       "challenger_max_tokens": 8192, "document_source": "openstax"},
        },
    }

    @classmethod
    def check_settings(cls, config: RunConfig, params: SpiceParams) -> None:
        super().check_settings(config, params)
        if config.task == "arith" and params.mcq_share > 0:
            raise ConfigError("config key 'params.mcq_share': the arithmetic world has free-form integer tasks only; "
                              "set it to 0")

    @classmethod
    def check_inputs(cls, config: RunConfig, params: SpiceParams) -> None:
        super().check_inputs(config, params)
        source = params.document_source or get_task(config.task, data_dir=config.data_dir).documents
        check_document_source(source, "params.document_source", config.data_dir)

    def __init__(self, config: RunConfig, params: SpiceParams):
        super().__init__(config, params)
        self.policy = self.load_policy(self.generator_model())
        self.trainer = self.make_trainer(self.policy, "policy")
        self.documents: DocumentPool = load_documents(
            params.document_source or self.task.documents, min_tokens=params.document_min_tokens,
            max_tokens=params.document_max_tokens, count=tokenizer_counter(self.policy.tokenizer),
            data_dir=config.data_dir, limit=params.document_pool_size, seed=config.seed)
        self.challenger_sampling = self.generator_sampling(replace(self.sampling,
                                                                   max_new_tokens=params.challenger_max_tokens))
        self.covered: set[str] = set()  # keys of the documents that have yielded a valid task so far

    def state_dict(self) -> dict[str, Any]:
        return {"covered": sorted(self.covered)}

    def load_state_dict(self, state) -> None:
        covered = state["covered"]
        if not isinstance(covered, list) or not all(isinstance(k, str) for k in covered):
            raise ValueError("spice state: 'covered' is not a list of document keys")
        self.covered = set(covered)

    def run_summary(self) -> dict[str, Any]:
        return {"documents_covered": len(self.covered), "document_pool": len(self.documents)}

    # --- Algorithm 1 --------------------------------------------------------------------------------------------
    def step(self, step: int) -> StepOutput:
        p, timer, seed = self.params, PhaseTimer(), self.config.seed
        docs = self.documents.take(seed, (step - 1) * p.documents_per_step, p.documents_per_step)  # 1
        forms = self.task_forms(len(docs), step_seed(seed, step, "forms"))
        with timer("challenge"):  # 2
            tasks = self.challenge(docs, forms, step_seed(seed, step, "challenge"))
        self.watch_format(step, sum(t.valid for t in tasks), len(tasks))
        with timer("reason"):  # 3
            self.reason([t for t in tasks if t.valid], step_seed(seed, step, "reason"))
        for t in tasks:  # 4
            t.reward = challenger_reward(t.scores if t.valid else None, target=p.variance_target,
                                         width=p.variance_width, invalid=p.invalid_penalty)
        for t, a in zip(tasks, compute_advantages(p.advantage, [t.reward for t in tasks],
                                                  [t.group for t in tasks])):  # 5
            t.advantage = float(a)
        with timer("update"):  # 6
            batch = (train_samples([t.output for t in tasks], [t.advantage for t in tasks])
                     + train_samples([c for t in tasks for c in t.answers],
                                     [a for t in tasks for a in t.reasoner_advantages]))
            stats = self.trainer.update(batch)
        self.covered.update(t.doc_key for t in tasks if t.valid)
        return StepOutput({**self.step_metrics(tasks), **role_metrics("policy", stats), **timer},
                          self.records(step, tasks))

    # --- the pieces ---------------------------------------------------------------------------------------------
    def task_forms(self, n: int, seed: int) -> list[Form]:
        """Each document's task form: multiple choice with probability ``mcq_share``, else free-form."""
        rng = random.Random(seed)
        return ["mcq" if rng.random() < self.params.mcq_share else "free_form" for _ in range(n)]

    def challenge(self, docs: list[str], forms: list[Form], seed: int) -> list[Task]:
        """G Challenger outputs per document, each read as a task of the document's form."""
        prompts = [self.generator_prompt(self.policy, self.generator_format.prompt(self.policy.prompt_style, document=d,
                                                                                    form=f))
                   for d, f in zip(docs, forms)]
        groups = self.sample_groups(self.policy, prompts, self.params.challenger_samples, seed,
                                    self.challenger_sampling)
        tasks = [Task(d, hashlib.sha1(d.encode()).hexdigest()[:16], g, f, c)
                 for g, (d, f, group) in enumerate(zip(docs, forms, groups)) for c in group]
        for t in tasks:
            generation = self.generator_format.parse(t.output, self.style, document=t.doc, form=t.form)
            if generation.valid and generation.answer is not None:
                t.question, t.key = generation.question, generation.answer
        return tasks

    def reasoner_prompt(self, question: str, form: Form) -> str:
        """The Reasoner's prompt: the question alone (with the instruction of its form), never the document."""
        question += MCQ_INSTRUCTION if form == "mcq" else ""
        return self.policy.format_prompt(self.task.solver_prompt(question, None, self.style))

    def reason(self, tasks: list[Task], seed: int) -> None:
        """K Reasoner answers per valid task, r_R = 1[a ≡ a*], Dr.GRPO (or GRPO) advantages within the K."""
        if not tasks:
            return
        groups = self.solve_groups(self.policy, [self.reasoner_prompt(t.question, t.form) for t in tasks
                                                 if t.question is not None],
                                   self.params.reasoner_samples, seed)
        for t, (answers, parsed) in zip(tasks, groups):
            if t.form == "mcq":
                parsed = [extract_answer(c.written_text, "mcq", len(CHOICES)) for c in answers]
            t.answers, t.parsed = answers, parsed
            t.scores = [reasoner_reward(self.agrees(t, a)) for a in parsed]
            t.reasoner_advantages = [float(a) for a in compute_advantages(self.params.advantage, t.scores,
                                                                          [0] * len(t.scores))]

    def agrees(self, task: Task, answer: str | None) -> bool:
        """a ≡ a*: the same letter for multiple choice, the task's answer equivalence for free-form."""
        if answer is None or task.key is None:
            return False
        return answer == task.key if task.form == "mcq" else self.task.is_correct(answer, task.key)

    # --- logging ------------------------------------------------------------------------------------------------
    def step_metrics(self, tasks: list[Task]) -> dict[str, Any]:
        valid = [t for t in tasks if t.valid]
        rates = [rate for t in valid if (rate := t.pass_rate) is not None]
        by_form = {f: [t for t in tasks if t.form == f] for f in ("mcq", "free_form")}
        return {
            "generator/reward_mean": mean([t.reward for t in tasks]),
            "generator/advantage_abs_mean": mean([abs(t.advantage) for t in tasks]),
            "solver/reward_mean": mean([s for t in valid for s in t.scores]),
            **tool_use(self.config, [c for t in valid for c in t.answers], [s > 0 for t in valid for s in t.scores]),
            "solver/advantage_abs_mean": mean([abs(a) for t in valid for a in t.reasoner_advantages]),
            "questions/valid_rate": len(valid) / len(tasks),
            "spice/valid_rate_mcq": mean([float(t.valid) for t in by_form["mcq"]]),
            "spice/valid_rate_free_form": mean([float(t.valid) for t in by_form["free_form"]]),
            "spice/mcq_share": mean([float(t.form == "mcq") for t in valid]),  # the answer-type mix of valid tasks
            "spice/pass_rate_mean": mean(rates),
            "spice/pass_rate_zero": mean([float(r == 0) for r in rates]),
            "spice/pass_rate_one": mean([float(r == 1) for r in rates]),
            "spice/pass_rate_frontier": mean([float(0 < r < 1) for r in rates]),  # tasks with a Reasoner signal
            "spice/documents_valid": float(len({t.doc_key for t in valid})),
            "spice/document_coverage": len(self.covered | {t.doc_key for t in valid}) / len(self.documents),
            "tokens/generator": sum(len(t.output.token_ids) for t in tasks),
            "tokens/solver": sum(len(c.token_ids) for t in tasks for c in t.answers),
        }

    def records(self, step: int, tasks: list[Task]) -> list[SampleRow]:
        """One generator row per Challenger output; one solver row per Reasoner answer."""
        rows = []
        for i, t in enumerate(tasks):
            qid = f"s{step}-q{i}"
            oracle = self.task.oracle(t.question, None, t.key, t.key) if t.form == "free_form" else None
            rows.append(generator_row(
                step, None, "challenge", t.output, question=t.question, question_id=qid, valid=t.valid, answer=t.key,
                label=t.key, label_source="generator", solve_rate=t.pass_rate, reward=t.reward,
                reward_terms={"invalid": not t.valid}, advantage=t.advantage, oracle=oracle,
                extra={"document": t.doc, "document_key": t.doc_key, "form": t.form}))
            rows += [solver_row(
                step, None, "reason", c, question=t.question, question_id=qid, answer=a, label=t.key,
                label_source="generator", solve_rate=t.pass_rate, reward=r, advantage=adv,
                oracle=self.task.oracle(t.question, None, a, t.key) if t.form == "free_form" else None,
                extra={"form": t.form}) for c, a, r, adv in zip(t.answers, t.parsed, t.scores, t.reasoner_advantages)]
        return rows
