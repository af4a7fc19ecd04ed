r"""INFUSER: a document-grounded generator rewarded by its questions' influence on the solver's dev-set progress.

Paper: INFUSER: Influence-Guided Self-Evolution Improves Reasoning (Chen et al.; Algorithm 1, §2.3 and App. C.1);
released code: ``FFishy-git/INFUSER``. Generator π_φ and solver π_θ start from the same weights, each with its own
AdamW. One step is one iteration t:

Phase 1  dev reference: n solver rollouts on every dev question (q̃, ã*), r̃ = 1[ã ≡ ã*], Â = r̃ - mean (Dr.GRPO);
         zero-variance dev groups dropped; ĝ_dev = ∇_θ of the clipped objective (2.10) on the rest (no step).
         (``dev_rollouts`` may differ from n; the paper uses n for both.)
Phase 2  generation: B documents (walked without replacement, reshuffled each epoch); n generator outputs each,
         parsed into (q, a_φ) or marked invalid.
Phase 3  solving: n solver rollouts per valid question, r = 1[a ≡ a_φ], Â = r - mean; zero-variance questions score 0
         and are left out of Phases 4 and 6.
Phase 4  influence: ŝ(q, a_φ) = cos(ĝ_dev, Γ̂), Γ̂ the question's gradient preconditioned by the solver's live AdamW
         second moment (:mod:`coevolve.rl.influence`, streamed one question at a time); invalid outputs get ρ_inv.
Phase 5  generator update: DuGRPO over each document's n outputs (2.14), zero-variance documents dropped, M documents
         per optimizer step, clipped objective with token-level TIS.
Phase 6  solver update: Dr.GRPO advantages of Phase 3 on the retained questions, M questions per optimizer step.

The generator is updated before the solver on the same rollouts; every influence score uses the solver of the start
of the iteration. ``frozen_generator: true`` is Fix-gen (Phases 1, 4 and 5 skipped, §3.3.1).

Tasks, paper vs released code, step structure, presets and ablations: ``docs/recipes/infuser.md``.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field
from scipy.stats import spearmanr

from coevolve.config import RoleSettings
from coevolve.documents import DocumentPool, check_document_source, dev_set, load_documents, tokenizer_counter
from coevolve.formats import (
    DocumentOutputParser,
    DocumentPromptBuilder,
    Generation,
    GeneratorFormat,
    grounded_arith_format,
    one_line,
)
from coevolve.grading.extract import braces_balanced, tag_blocks
from coevolve.grading.guard import parses_model_text
from coevolve.recipes.base import (
    ArithLevels,
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
from coevolve.rl.advantages import compute_advantages, nonzero_variance_mask
from coevolve.rl.influence import DevGradient, dev_gradient, influence_scores, one_step_dev_gains
from coevolve.rl.trainer import TrainSample
from coevolve.rollout import Completion
from coevolve.tasks import arith
from coevolve.tasks.registry import Problem, get_task

# Generator, free-form math variant (paper App. F.4, the JSON core kept).
GENERATOR_PROMPT = """You are an expert educator who writes challenging exam questions and always outputs valid JSON.

Your task is to write ONE challenging question based on the document below.

[BEGINNING OF THE DOCUMENT]
{text}
[END OF THE DOCUMENT]

The question must be fully self-contained (no "according to the document"; define every term it uses) and have one \
machine-verifiable answer. Combine several ideas from the document; avoid single facts and definitions.
Output exactly one JSON object, placed last in your response, with the keys "question_text" (the question) and \
"ground_truth" (a single concise mathematical answer: no units, no prose, no \\boxed{{}}). If the document is not \
complex enough, return empty strings for both keys."""
_FENCE = re.compile(r"```(?:json)?")
# A backslash that JSON would misread: LaTeX commands (\frac is not a form feed) and invalid escapes; escaped
# backslashes are matched first so they stay as they are.
_LATEX_ESCAPE = re.compile(r'\\\\|\\(?!["/]|u[0-9a-fA-F]{4}|[bfnrt](?![a-zA-Z]))')
_INTEGER = re.compile(r"-?\d+")

_PAPER_SCALE: dict[str, Any] = {
    "model": "smollm2-135m", "task": "math", "steps": 100, "eval_every": 5,
    "rollout": {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8192},
    "train": {"lr": 2e-6, "weight_decay": 0.01, "grad_clip": 1.0, "clip_low": 0.2, "clip_high": 0.2, "tis_cap": 2.0,
              "kl_beta": 0.0, "epochs": 1, "micro_batch_size": 4, "loss_agg": "token_sum_norm"},
    "eval_sets": ["gsm8k", "math500"], "eval_limit": 100, "eval_max_new_tokens": 8192,
    "roles": {"generator": {"lr": 4e-6}},  # η_gen (the solver's is train.lr)
    "params": {"documents_per_step": 128, "group_size": 8, "dev_size": 800, "minibatch_prompts": 32,
               "generator_max_tokens": 8192, "document_source": "openstax"},
}


@parses_model_text()
def parse_generator_json(text: str) -> tuple[str, str] | None:
    """(question_text, ground_truth) of the last JSON object in ``text`` that has both, non-empty (as the released code
    reads it), outside
    ``<think>`` blocks and code fences."""
    kept, pos = [], 0
    for start, _, _, end in tag_blocks(text, "think"):
        kept.append(text[pos:start])
        pos = end
    text = _FENCE.sub("", "".join(kept) + text[pos:])
    found = None
    depth, start = 0, -1
    for i, ch in enumerate(text):
        if ch == "{":
            depth, start = depth + 1, i if depth == 0 else start
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                span = text[start:i + 1]
                for candidate in (_LATEX_ESCAPE.sub(lambda m: "\\\\", span), span):
                    try:
                        obj = json.loads(candidate)
                    except json.JSONDecodeError:
                        continue
                    if isinstance(obj, dict):
                        question, truth = obj.get("question_text"), obj.get("ground_truth")
                        if isinstance(question, str) and isinstance(truth, (str, int, float)) and question.strip() \
                                and str(truth).strip():
                            found = (question.strip(), str(truth).strip())
                    break
    return found


def read_json_question(output: Completion, style: str, **_: Any) -> Generation:
    """q and a_φ of a valid JSON generation (App. F.4); neither for an invalid one."""
    found = parse_generator_json(output.text)
    if found is None or not braces_balanced(found[1]):
        return Generation(None)
    return Generation(*found)


def read_arith_question(output: Completion, style: str, document: str | None, **_: Any) -> Generation:
    """q and a_φ of a valid arithmetic-world writer output: a question over the fact sheet and an integer answer."""
    parsed = arith.parse_question(output.text, style, document)
    if parsed is None or parsed.answer is None or not _INTEGER.fullmatch(parsed.answer.strip()):
        return Generation(None)
    return Generation(parsed.question, parsed.answer.strip())


class InfuserParams(GeneratorParams):
    """Algorithm 1's inputs (B, n, M, dev set, ρ_inv, learning rates) and the ablation switches."""

    documents_per_step: int = Field(128, gt=0, description="B, documents per iteration")
    group_size: int = Field(8, gt=1, description="n, generator outputs per document and solver answers per question")
    minibatch_prompts: int = Field(32, gt=0, description="M, documents (generator) or questions (solver) per step")
    dev_size: int = Field(800, gt=0, description="|𝒟_dev|, all used every iteration")
    dev_source: str | None = Field(None, description="math: 'math' (default) or 'gsm8k'; mcq: 'supergpqa'")
    dev_levels: ArithLevels = Field([1, 2, 3, 4], description="arith: levels of the held-out dev slices")
    dev_rollouts: int | None = Field(None, gt=1, description="solver rollouts per dev question (default n, as the "
                                                              "paper)")
    validity_every: int = Field(0, ge=0, description="every K steps, rank-correlate ŝ with the dev-reward change of "
                                                     "one update on each question alone (0: never)")
    document_source: str | None = Field(None, description="arith | openstax | proofwiki | a path; default by task")
    document_min_tokens: int = Field(200, gt=0, description="T_min of a chunk")
    document_max_tokens: int = Field(2048, gt=0, description="T_max of a chunk")
    document_pool_size: int | None = Field(None, gt=0, description="keep a seeded subset of this many chunks")
    generator_max_tokens: int = Field(64, gt=0, description="generator response budget (paper: 8192)")
    rho_inv: float = Field(0.0, description="reward of an invalid generation")
    influence: Literal["preconditioned_cosine", "sgd_cosine"] = Field(
        "preconditioned_cosine", description="Phase 4's score: cosine of the dev gradient with the question's "
        "gradient preconditioned by the solver's AdamW second moment (paper, App. D.4); sgd_cosine, with the plain "
        "gradient (Table 10 ablation)")
    generator_advantage: Literal["dugrpo", "grpo", "batch_norm"] = Field(
        "dugrpo", description="the generator's advantage: dugrpo, DuGRPO over each document's outputs (Eq. 2.14, "
        "paper); grpo, group std; batch_norm, batch std (Table 10 ablations)")


@dataclass
class Generated:
    """One generator output x_d^k for document d and what the iteration computed for it."""

    doc: str
    group: int
    output: Completion
    question: str | None = None
    key: str | None = None  # a_φ
    solutions: list[Completion] = field(default_factory=list)
    answers: list[str | None] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # solver rewards r_i
    solver_advantages: list[float] = field(default_factory=list)
    influence: float | None = None  # ŝ (None: not scored)
    grad_norm: float | None = None
    reward: float = 0.0  # the generator's reward
    advantage: float = 0.0
    in_update: bool = False  # its document group entered the generator update

    @property
    def valid(self) -> bool:
        return self.question is not None

    @property
    def informative(self) -> bool:
        """Valid with a non-zero-variance solver group: it enters Phases 4 and 6."""
        return self.valid and len(set(self.rewards)) > 1


@register
class Infuser(GeneratorRecipe[InfuserParams, DocumentPromptBuilder, DocumentOutputParser]):
    name = "infuser"
    summary = ("document-grounded generator writes questions with its own answers, rewarded by the cosine between "
               "the AdamW-preconditioned solver update they cause and a dev-set gradient; DuGRPO / Dr.GRPO")
    roles = ("generator", "solver")
    Params = InfuserParams
    fsdp_unsupported = "infuser's per-question influence gradients"
    formats: ClassVar[dict[str, GeneratorFormat[DocumentPromptBuilder, DocumentOutputParser]]] = {
        "chat": GeneratorFormat(
            lambda style, document, **_: GENERATOR_PROMPT.format(text=document), read_json_question,
            description='{"question_text": "{the question}", "ground_truth": "{final answer}"}',
            regex=r'\{"question_text": "[^"\\\n]{10,300}", "ground_truth": "[^"\\\n{}]{1,40}"\}',
            render=lambda e: json.dumps({"question_text": one_line(e.question), "ground_truth": e.answer}),
            warmup_inputs=lambda e, examples, rng: {"document": e.solution}),  # the example's worked solution
        "arith": grounded_arith_format(read_arith_question),  # questions over the fact sheet's variables
    }
    defaults = {
        "steps": 100, "eval_every": 20,
        "rollout": {"temperature": 0.7, "top_p": 1.0, "max_new_tokens": 64},
        "train": {"lr": 2e-6, "weight_decay": 0.01, "grad_clip": 1.0, "tis_cap": 2.0, "kl_beta": 0.0,
                  "loss_agg": "token_sum_norm"},
        "roles": {"generator": {"lr": 4e-6}},  # η_gen (the solver's is train.lr)
    }
    presets = {
        "small": {  # tiny-arith, fact sheets, dev 128 x 8: ~6 s a step on one core, ~5 s of it Phase 1
            "model": "tiny-arith", "task": "arith", "steps": 200, "eval_every": 50,
            "rollout": {"temperature": 1.0, "max_new_tokens": 96, "batch_size": 256},
            "train": {"lr": 3e-5, "micro_batch_size": 16}, "roles": {"generator": {"lr": 3e-5}},
            "params": {"documents_per_step": 8, "group_size": 4, "dev_size": 128, "dev_rollouts": 8,
                       "dev_levels": [1, 2, 3, 4], "minibatch_prompts": 8,
                       "generator_max_tokens": 96, "document_source": "arith", "validity_every": 20},
        },
        "paper": _PAPER_SCALE,
        "reference_code": {**_PAPER_SCALE, "train": {**_PAPER_SCALE["train"], "loss_agg": "token_mean"}},
    }

    @classmethod
    def role_settings(cls, config, params: InfuserParams, role: str) -> RoleSettings:
        """Both roles take an AdamW step every M prompts x n (the paper's mini-batch), unless ``roles.<role>`` says."""
        own = super().role_settings(config, params, role) or RoleSettings()
        if own.mini_batch_size is not None:
            return own
        return own.model_copy(update={"mini_batch_size": params.minibatch_prompts * params.group_size})

    @classmethod
    def check_inputs(cls, config, params: InfuserParams) -> None:
        super().check_inputs(config, params)
        source = params.document_source or get_task(config.task, data_dir=config.data_dir).documents
        check_document_source(source, "params.document_source", config.data_dir)

    def __init__(self, config, params: InfuserParams):
        super().__init__(config, params)
        self.solver_policy, self.generator = self.load_solver_and_generator("generator")
        self.solver_trainer, self.generator_trainer = self.trainers()["solver"], self.trainers()["generator"]
        self.shows_document = self.generator_format.grounded  # the solver sees the document beside the question
        source = params.document_source or self.task.documents
        self.documents: DocumentPool = load_documents(
            source, min_tokens=params.document_min_tokens, max_tokens=params.document_max_tokens,
            count=tokenizer_counter(self.generator.tokenizer), data_dir=config.data_dir,
            limit=params.document_pool_size, seed=config.seed)
        self.dev: list[Problem] = dev_set(config.task, params.dev_size, source=params.dev_source, seed=config.seed,
                                          data_dir=config.data_dir, levels=params.dev_levels)
        self.dev_rollouts = params.dev_rollouts or params.group_size
        self.question_sampling = self.generator_sampling(replace(self.sampling,
                                                                 max_new_tokens=params.generator_max_tokens))

    @classmethod
    def data_sets(cls, config, params: InfuserParams):
        if config.task != "math":
            return super().data_sets(config, params)
        source = params.dev_source or "math"  # dev_set() leaves MATH-500 out of the MATH dev set
        return super().data_sets(config, params) + [source] + (["math500"] if source == "math" else [])

    # --- Algorithm 1 --------------------------------------------------------------------------------------------
    def step(self, step: int) -> StepOutput:
        p, timer, seed = self.params, PhaseTimer(), self.config.seed
        learning = not self.config.frozen_generator
        dev_stats: dict[str, float] = {}
        reference: DevGradient | None = None
        dev_samples: list[TrainSample] = []
        if learning:
            with timer("dev"):  # Phase 1
                reference, dev_samples, dev_stats = self.dev_reference(step)
        docs = self.documents.take(seed, (step - 1) * p.documents_per_step, p.documents_per_step)
        with timer("generate"):  # Phase 2
            prompts = [self.generator_prompt(self.generator, self.generator_format.prompt(self.generator.prompt_style,
                                                                                        document=d))
                       for d in docs]
            groups = self.sample_groups(self.generator, prompts, p.group_size, step_seed(seed, step, "generate"),
                                        self.question_sampling)
            generated = [Generated(d, g, c) for g, (d, group) in enumerate(zip(docs, groups)) for c in group]
            for x in generated:
                generation = self.generator_format.parse(x.output, self.style, document=x.doc)
                x.question, x.key = generation.question, generation.answer
        self.watch_format(step, sum(x.valid for x in generated), len(generated))
        with timer("solve"):  # Phase 3
            self.solve([x for x in generated if x.valid], step_seed(seed, step, "solve"))
        retained = [x for x in generated if x.informative]
        if reference is not None and retained:
            with timer("influence"):  # Phase 4
                scores = influence_scores(self.solver_trainer, [self.solver_samples([x]) for x in retained],
                                          reference.grads, precondition=p.influence == "preconditioned_cosine")
            for x, s in zip(retained, scores):
                x.influence, x.grad_norm = s.score, s.grad_norm
            if p.validity_every and step % p.validity_every == 0 and len(retained) >= 3:
                with timer("validity"):
                    dev_stats.update(self.validity(step, retained, dev_samples))
        for x in generated:  # Phase 4, line 12: invalid outputs get ρ_inv; unscored valid ones 0
            x.reward = (x.influence or 0.0) if x.valid else p.rho_inv
        stats: dict[str, float] = {}
        if learning:
            with timer("update_generator"):  # Phase 5
                stats.update(self.update_generator(generated))
        with timer("update_solver"):  # Phase 6
            solver_batch = self.solver_samples(retained)
            stats.update(role_metrics("solver", self.solver_trainer.update(solver_batch)))
            stats["solver/advantage_abs_mean"] = mean([abs(x.advantage) for x in solver_batch])
        return StepOutput({**self.step_metrics(generated), **dev_stats, **stats, **timer},
                          self.records(step, generated))

    # --- the pieces ---------------------------------------------------------------------------------------------
    def dev_reference(self, step: int) -> tuple[DevGradient | None, list[TrainSample], dict[str, float]]:
        """Phase 1: ĝ_dev from the dev rollouts (None when every dev group has zero variance), the informative dev
        rollouts, and diagnostics: informative groups, and the cosine between the gradients of two random halves of
        the dev set (how far one draw of ĝ_dev is from noise)."""
        seed = self.config.seed
        second = set(random.Random(step_seed(seed, step, "dev_halves")).sample(range(len(self.dev)),
                                                                               len(self.dev) // 2))
        halves: tuple[list[TrainSample], list[TrainSample]] = ([], [])
        rewards = []
        for i, (group, r) in enumerate(self.dev_rollouts_of(step_seed(seed, step, "dev"))):
            rewards += r
            if len(set(r)) > 1:
                halves[i in second].extend(train_samples(group, compute_advantages("dr_grpo", r, [0] * len(r))))
        samples = halves[0] + halves[1]
        stats = {"dev/reward_mean": mean(rewards), "dev/groups_kept": float(len(samples) // self.dev_rollouts)}
        if not samples:
            return None, [], stats
        reference = dev_gradient(self.solver_trainer, *halves)
        stats.update({"dev/grad_norm": reference.norm, "dev/half_cosine": reference.half_cosine})
        return reference, samples, stats

    def dev_rollouts_of(self, seed: int) -> list[tuple[list[Completion], list[float]]]:
        """``dev_rollouts`` solver answers to every dev question, with their rewards r̃ = 1[ã ≡ ã*]."""
        prompts = [self.solver_prompt(d.question, d.doc) for d in self.dev]
        groups = self.sample_groups(self.solver_policy, prompts, self.dev_rollouts, seed)
        return [(group, [float(self.task.is_correct(self.task.parse_answer(c.text, self.style), problem.answer))
                         for c in group]) for problem, group in zip(self.dev, groups)]

    def validity(self, step: int, retained: list[Generated], dev_samples: list[TrainSample]) -> dict[str, float]:
        """A validity check of the influence reward: Spearman correlation between ŝ and the change in dev reward after
        one solver update on each question alone (:func:`coevolve.rl.influence.one_step_dev_gains`), estimated on
        fresh dev rollouts (``validity_spearman``: the actual change, its noise independent of ĝ_dev's) and on
        Phase 1's (``validity_spearman_same_rollouts``: how well the first-order term predicts the step)."""
        fresh = [s for group, r in self.dev_rollouts_of(step_seed(self.config.seed, step, "dev_validity"))
                 if len(set(r)) > 1 for s in train_samples(group, compute_advantages("dr_grpo", r, [0] * len(r)))]
        questions, scores = [self.solver_samples([x]) for x in retained], [x.influence for x in retained]
        total = len(self.dev) * self.dev_rollouts
        gains = one_step_dev_gains(self.solver_trainer, questions, fresh, total) if fresh else []
        same = one_step_dev_gains(self.solver_trainer, questions, dev_samples, total)
        return {"influence/validity_spearman": float(spearmanr(scores, gains).statistic) if gains else float("nan"),
                "influence/validity_spearman_same_rollouts": float(spearmanr(scores, same).statistic),
                "influence/validity_questions": float(len(retained)), "influence/validity_gain_mean": mean(gains)}

    def solver_prompt(self, question: str, doc: str | None) -> str:
        return self.solver_policy.format_prompt(self.task.solver_prompt(question, doc, self.style))

    def solve(self, questions: list[Generated], seed: int) -> None:
        """Phase 3: n solver answers per question, r = 1[a ≡ a_φ], Dr.GRPO advantages."""
        if not questions:
            return
        prompts = [self.solver_prompt(x.question, x.doc if self.shows_document else None) for x in questions
                   if x.question is not None]
        for x, (group, answers) in zip(questions, self.solve_groups(self.solver_policy, prompts, self.params.group_size,
                                                                    seed)):
            x.solutions, x.answers = group, answers
            x.rewards = [float(a is not None and x.key is not None and self.task.is_correct(a, x.key))
                         for a in x.answers]
            x.solver_advantages = [float(a) for a in compute_advantages("dr_grpo", x.rewards, [0] * len(group))]

    def solver_samples(self, questions: list[Generated]) -> list[TrainSample]:
        return train_samples([c for x in questions for c in x.solutions],
                             [a for x in questions for a in x.solver_advantages])

    def update_generator(self, generated: list[Generated]) -> dict[str, float]:
        """Phase 5: DuGRPO (or an ablation's normaliser) per document, zero-variance documents dropped."""
        rewards = [x.reward for x in generated]
        groups = [x.group for x in generated]
        advantages = compute_advantages(self.params.generator_advantage, rewards, groups)
        keep = nonzero_variance_mask(rewards, groups)
        for x, a, k in zip(generated, advantages, keep):
            x.advantage, x.in_update = float(a), bool(k)
        chosen = [x for x in generated if x.in_update]
        stats = role_metrics("generator", self.generator_trainer.update(
            train_samples([x.output for x in chosen], [x.advantage for x in chosen])))
        stds = [float(np.std([x.reward for x in generated if x.group == g], ddof=1))
                for g in sorted({x.group for x in chosen})]
        stats.update({"generator/documents_kept": float(len(stds)), "generator/sigma_B": mean(stds),
                      "generator/advantage_abs_mean": mean([abs(x.advantage) for x in chosen])})
        return stats

    # --- logging ------------------------------------------------------------------------------------------------
    def step_metrics(self, generated: list[Generated]) -> dict[str, Any]:
        valid = [x for x in generated if x.valid]
        retained = [x for x in generated if x.informative]
        scored = [x.influence for x in retained if x.influence is not None]
        oracles = [self.task.oracle(x.question, x.doc if self.shows_document else None, x.key, x.key)
                   for x in retained]
        audited = [o["label_correct"] for o in oracles if o and o.get("label_correct") is not None]
        return {
            "generator/reward_mean": mean([x.reward for x in generated]),
            "solver/reward_mean": mean([r for x in valid for r in x.rewards]),
            **tool_use(self.config, [c for x in valid for c in x.solutions], [r > 0 for x in valid for r in x.rewards]),
            "influence/mean": mean(scored),
            "influence/std": float(np.std(scored)) if scored else float("nan"),
            "influence/positive_rate": mean([float(s > 0) for s in scored]),
            "questions/valid_rate": len(valid) / len(generated),
            "questions/zero_variance_rate": mean([float(not x.informative) for x in valid]),
            "questions/retained": float(len(retained)),
            "questions/retained_label_correct": mean([float(c) for c in audited]),
            "tokens/generator": sum(len(x.output.token_ids) for x in generated),
            "tokens/solver": sum(len(c.token_ids) for x in generated for c in x.solutions),
        }

    def records(self, step: int, generated: list[Generated]) -> list[SampleRow]:
        """One generator row per output; one solver row per answer (``trained``: its question entered Phase 6)."""
        rows = []
        for i, x in enumerate(generated):
            qid, doc = f"s{step}-q{i}", x.doc if self.shows_document else None
            rows.append(generator_row(
                step, None, "generate", x.output, question=x.question, question_id=qid, valid=x.valid, answer=x.key,
                label=x.key, label_source="generator", solve_rate=mean(x.rewards) if x.rewards else None,
                reward=x.reward,
                reward_terms={"influence": x.influence, "grad_norm": x.grad_norm, "invalid": not x.valid},
                advantage=x.advantage, oracle=self.task.oracle(x.question, doc, x.key, x.key),
                extra={"document": x.doc, "in_update": x.in_update}))
            rows += [solver_row(
                step, None, "solve", c, question=x.question, question_id=qid, answer=a, label=x.key,
                label_source="generator", solve_rate=mean(x.rewards), reward=r, reward_terms={"agree": r},
                advantage=adv, oracle=self.task.oracle(x.question, doc, a, x.key), extra={"trained": x.informative},
            ) for c, a, r, adv in zip(x.solutions, x.answers, x.rewards, x.solver_advantages)]
        return rows
