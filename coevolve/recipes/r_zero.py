r"""R-Zero: a Questioner (R-Zero's "Challenger") and a Solver co-evolve in alternating GRPO phases from one base model.

Paper: R-Zero (Huang et al. 2025, arXiv:2508.05004), as Prism re-implements it (Preventing Curriculum Collapse in
Self-Evolving Reasoning Systems, arXiv:2603.13309, §3 and §5.2). Q_0 = S_0 = M_0; for each iteration t:

Questioner phase (``questioner_steps`` = 6 GRPO steps), the Solver frozen at S_{t-1}:
    1. Q_t <- Q_{t-1} (``questioner_init: solver`` is the SolverInit ablation, Q_t <- S_{t-1});
    2. B_Q copies of the questioner prompt, G_Q = 4 outputs each; q = the question of each output;
    3. p(q) = share of m_s = 10 solver samples that agree with their majority answer (an unanswered sample never
       votes; ``missing_answer_votes: code`` lets it vote "None", as both codes do);
    4. r = max(0, r_unc(p) - r_rep) with r_unc = 1 - 2|p - 1/2| and r_rep the BLEU-cluster share of the batch
       (0 for a bad format; the code's form: min(p, 1-p) - r_rep, -1 - r_rep for a bad format);
    5. group-relative advantages over the G_Q outputs of a prompt copy; one GRPO update of Q_t.
Pool (at the start of the Solver phase):
    6. N_pool questions from Q_t, labelled by the majority answer of m_l = 8 samples of S_{t-1};
    7. keep those with p in the pool band (``band`` unless ``pool_band`` is set: [0.25, 0.75] paper, [0.3, 0.8]
       code) and no pool-filter reason.
Solver phase (``solver_steps`` = 20 GRPO steps): S_t <- S_{t-1}; each step draws questions from the pool (in a
    shuffled order per iteration), G_S = 8 rollouts each, reward 1 if the answer agrees with the majority label
    (plus ``solver_format_weight`` times the ``<think>..</think>..\boxed{}`` format, the code's 0.1), one update.

One loop step is one GRPO update of one role: step s lies in iteration (s-1) // (S_Q + S_S) + 1, its first S_Q steps
train the Questioner, the rest the Solver; ``steps`` = T * (S_Q + S_S) (T = 4: 104 steps). The pool and the
iteration's state are in ``state_dict``, so a run resumes at any step. Each step logs the trained role's
``<role>/optimizer_steps`` (the loop logs 0 for the idle one) and ``generator/`` or ``solver/advantage_abs_mean``,
and warns once when every questioner group has zero reward variance or the solver's pool is empty.

Tasks, paper vs released code, step structure, presets and ablations: ``docs/recipes/r_zero.md``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import Field, model_validator

from coevolve.formats import ANSWER, LINE, Generation, GeneratorFormat, arith_format, one_line
from coevolve.grading.extract import extract_boxed, tag_blocks
from coevolve.grading.guard import parses_model_text
from coevolve.grading.vote import VoteResult, majority_vote
from coevolve.phases import Schedule, phase_for
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
from coevolve.rewards.questioner import (
    QuestionReward,
    ScoredQuestion,
    repetition_penalties,
    rzero_rewards,
)
from coevolve.rewards.uncertainty import BleuTokens, RZeroForm, in_band, pool_filter_reasons
from coevolve.rl.advantages import compute_advantages, nonzero_variance_mask
from coevolve.rollout import Completion, SamplingParams

log = logging.getLogger(__name__)

# R-Zero's questioner prompt (its released code; system text folded into the user turn).
QUESTIONER_PROMPT = (
    "You are an expert competition-math problem setter.\n"
    "FIRST, in your private scratch-pad, think step-by-step to design a brand-new, non-trivial problem. The problem "
    "could come from any field of mathematics, including but not limited to algebra, geometry, number theory, "
    "combinatorics, prealgebra, probability, statistics, and calculus. Aim for a difficulty such that fewer than 30% "
    "of advanced high-school students could solve it. Avoid re-using textbook cliches or famous contest problems.\n"
    "THEN, without revealing any of your private thoughts, output exactly the following two blocks:\n\n"
    "<question>\n{The full problem statement on one or more lines}\n</question>\n\n\\boxed{final_answer}\n\n"
    "Do NOT output anything else.\n\n"
    "Generate one new, challenging reasoning question now. Remember to format the output exactly as instructed."
)
CHAT_FORMAT = GeneratorFormat(
    lambda style, **_: QUESTIONER_PROMPT, lambda output, style, **_: Generation(*parse_questioner_output(output.text)),
    description="<question>\\n{the problem}\\n</question>\\n\\n\\boxed{final answer}",
    regex=r"<question>\n" + LINE + r"\n</question>\n\n\\boxed\{" + ANSWER + r"\}",
    render=lambda e: f"<question>\n{one_line(e.question)}\n</question>\n\n\\boxed{{{e.answer}}}")
MISSING_ANSWER = "None"  # what mathruler's extract_boxed_content returns for a sample without a box (both codes)
BLEU_TOKENS = {"chat": "none", "arith": "char"}  # the repetition penalty's BLEU tokens per world: words, characters

# The optimizer of both codes (R-Zero's EasyR1 and Prism's verl actor configs), which the papers leave open: clip
# 0.2/0.3 with dual clip c = 3, AdamW with weight decay 0.01; each phase is a new training job, so its AdamW starts
# afresh and its KL reference is the job's starting weights.
CODE_OPTIMIZER = {"clip_low": 0.2, "clip_high": 0.3, "dual_clip": 3.0, "weight_decay": 0.01,
                  "optimizer_reset": "phase", "kl_reference": "phase_start"}
# ``small``: the same optimizer at tiny-arith scale (one full-batch AdamW step per update, so the ratio is 1 and the
# clip ranges are inert; no KL term, so no reference) with a constant lr (docs/recipes/r_zero.md).
SMALL_TRAIN = dict(CODE_OPTIMIZER)
# Prism's scripts (its examples/config.yaml, loaded by every questioner and solver job): verl's cosine schedule over
# each job's steps, a linear warm-up over the first 10% of them (5 of 50 solver steps; none of 6 questioner steps),
# then a half cosine towards 10% of the peak. R-Zero's own config keeps the lr constant (no warm-up).
PRISM_LR = {"lr_warmup_ratio": 0.1, "lr_min_ratio": 0.1}
# The paper's scale on the one offline chat model (GPU-scale: hours per step on a CPU). Sampling as in both codes:
# training rollouts of either role at top_p 0.99 and up to 4,096 tokens, the solver's scoring and labelling votes at
# top_k 40 (rollout.scoring), the questioner's pool at top_p 0.95 (params.pool_top_p).
# Prism's scripts (verl; issue 11): per questioner step 512 prompts x 4 outputs in mini-batches of 16
# prompts, per solver step 512 questions x 8 rollouts in mini-batches of 128 questions, 2 PPO epochs each; both roles
# on the cosine schedule (PRISM_LR).
PRISM_ROLES = {"questioner": {"mini_batch_size": 16 * 4, "epochs": 2, "lr_schedule": "cosine"},
               "solver": {"mini_batch_size": 128 * 8, "epochs": 2, "lr_schedule": "cosine"}}
PAPER_SCALE = {
    "model": "smollm2-135m", "task": "math", "steps": 104, "eval_every": 26, "roles": PRISM_ROLES,
    "rollout": {"temperature": 1.0, "top_p": 0.99, "top_k": 0, "max_new_tokens": 4096,
                "scoring": {"top_p": 1.0, "top_k": 40}},
    "train": {"lr": 5e-6, "kl_beta": 1e-4, "grad_clip": 1.0, "micro_batch_size": 4, **CODE_OPTIMIZER, **PRISM_LR},
    "eval_sets": ["gsm8k", "math500"], "eval_limit": 100, "eval_max_new_tokens": 1024,
}
PAPER_PARAMS = {"questioner_prompts": 512, "questioner_group": 4, "score_samples": 10, "pool_size": 8000,
                "label_samples": 8, "solver_questions": 512, "solver_group": 8, "question_max_tokens": 4096,
                "pool_top_p": 0.95, "label_max_tokens": 2048}
# Prism's released code where it differs from its paper (both recipes); an unboxed solver sample votes as
# mathruler's "None" (params.missing_answer_votes: code).
PRISM_CODE = {
    **PAPER_SCALE, "steps": 4 * (6 + 50), "eval_every": 56,
    "train": {**PAPER_SCALE["train"], "lr": 1e-6},
}
PRISM_CODE_PARAMS = {**PAPER_PARAMS, "solver_steps": 50, "pool_p_denominator": "all",
                     "solver_format_weight": 0.1, "filter_prove": False, "missing_answer_votes": "code"}
# R-Zero's own repository (EasyR1 config and scripts): 5 iterations, questioner 512 prompts x 4 in mini-batches of
# 16 prompts, solver 512 questions x 5 in mini-batches of 128 questions, 1 PPO epoch, KL (low_var_kl) 1e-2 to each
# job's starting weights, a constant lr.
RZERO_CODE = {
    **PAPER_SCALE, "steps": 5 * (5 + 15), "eval_every": 20,
    "train": {**{k: v for k, v in PAPER_SCALE["train"].items() if k not in PRISM_LR}, "lr": 1e-6, "kl_beta": 1e-2},
    "params": {"questioner_steps": 5, "solver_steps": 15, "questioner_prompts": 512, "questioner_group": 4,
               "score_samples": 10, "pool_size": 8000, "label_samples": 9, "band": [0.3, 0.8],
               "pool_p_denominator": "all", "solver_questions": 512, "solver_group": 5, "reward_form": "code",
               "solver_format_weight": 0.1, "advantage": "grpo", "filter_prove": False, "question_max_tokens": 4096,
               "pool_top_p": 0.95, "missing_answer_votes": "code"},
    "roles": {"questioner": {"mini_batch_size": 16 * 4, "epochs": 1}, "solver": {"mini_batch_size": 128 * 5,
                                                                                 "epochs": 1}},
}


class RZeroParams(GeneratorParams):
    """The schedule, batch sizes and reward switches shared by ``r_zero`` and ``prism``."""

    questioner_steps: int = Field(6, ge=0, description="S_Q, questioner GRPO steps per iteration")
    solver_steps: int = Field(20, ge=0, description="S_S, solver GRPO steps per iteration")
    questioner_prompts: int = Field(16, gt=0, description="B_Q, copies of the questioner prompt per step")
    questioner_group: int = Field(4, gt=1, description="G_Q, outputs per prompt copy (the GRPO group)")
    score_samples: int = Field(10, gt=0, description="m_s, solver samples that score p(q) for the questioner")
    pool_size: int = Field(256, gt=0, description="N_pool, candidate questions generated for the solver")
    label_samples: int = Field(8, gt=0, description="m_l, solver samples for each pool question's label")
    band: list[float] = Field([0.25, 0.75], min_length=2, max_length=2,
                              description="keep pool questions with band[0] <= p <= band[1]")
    pool_band: list[float] | None = Field(None, min_length=2, max_length=2,
                                          description="the pool's band where it differs from band (unset: band)")
    pool_p_denominator: Literal["all", "answered"] = Field("all", description="pool p over m_l or over answers")
    missing_answer_votes: Literal["drop", "code"] = Field(
        "drop", description="a solver sample without an answer: drop, it never votes (counted in p's denominator); "
        "code, it votes as the answer \"None\" (mathruler's string in both codes), which can win, and a chat "
        "questioner output needs only its <question> block")
    solver_questions: int = Field(16, gt=0, description="pool questions per solver step")
    solver_group: int = Field(8, gt=1, description="G_S, rollouts per question")
    solver_format_weight: float = Field(0.0, ge=0, le=1, description="r = (1-w) agree + w format (code: 0.1)")
    questioner_init: Literal["previous_questioner", "solver"] = Field(
        "previous_questioner", description="Q_t from Q_{t-1} (R-Zero) or from S_{t-1} (Prism's SolverInit)")
    reward_form: RZeroForm = Field("paper", description="R-Zero's composite: paper max(0, .) or code form")
    repetition_threshold: float = Field(0.5, gt=0, le=1, description="BLEU-distance threshold of the clustering")
    repetition_weight: float = Field(1.0, ge=0, description="lambda_rep (0: no repetition penalty)")
    bleu_tokens: BleuTokens | None = Field(None, description="BLEU tokens: none (words) or char; default char "
                                                             "for the arithmetic task, words otherwise")
    filter_prove: bool = Field(True, description="the pool also drops 'prove' / 'show that' questions "
                                                "(R-Zero's paper)")
    advantage: Literal["grpo", "dr_grpo"] = Field("grpo", description="(r-mean)/(std+eps) or r-mean")
    question_max_tokens: int = Field(48, gt=0, description="budget of a questioner output")
    pool_top_p: float | None = Field(None, gt=0, le=1, description="top_p of the questioner's pool generation "
                                     "(codes: 0.95; unset: rollout.top_p, as its training rollouts)")
    label_max_tokens: int | None = Field(None, gt=0, description="budget of the solver's pool-label votes (Prism's "
                                         "code: 2048; unset: rollout.scoring's, as its scoring votes)")

    @model_validator(mode="after")
    def _check(self) -> RZeroParams:
        for name, band in (("band", self.band), ("pool_band", self.pool_band)):
            if band is not None and not 0.0 <= band[0] <= band[1] <= 1.0:
                raise ValueError(f"{name} {band} must satisfy 0 <= low <= high <= 1")
        if self.questioner_steps + self.solver_steps == 0:
            raise ValueError("an iteration needs at least one step")
        return self


@dataclass
class Question:
    """One questioner output, what the frozen solver made of it, and its reward."""

    output: Completion
    text: str | None  # q; None: the output failed the format check
    own_answer: str | None  # the questioner's own answer: logged, never a label
    answers: list[str | None] = field(default_factory=list)
    vote: VoteResult | None = None
    p: float | None = None  # solver agreement with the majority answer
    solver_tokens: int = 0  # tokens the solver sampled to score it
    solver_tool_calls: list[int] = field(default_factory=list)  # tool calls of each of those samples (episodes)
    cluster: int | None = None  # Prism's c(q)
    terms: dict[str, float] = field(default_factory=dict)
    reward: float = 0.0
    advantage: float = 0.0

    @property
    def label(self) -> str | None:
        return self.vote.label if self.vote else None


def scored_questions(questions: Sequence[Question]) -> list[ScoredQuestion]:
    """What the reward stages read of each question: its text and p."""
    return [ScoredQuestion(q.text, q.p) for q in questions]


def give_rewards(questions: Sequence[Question], rewards: Sequence[QuestionReward]) -> None:
    """Each question's reward and terms from the reward stages' output."""
    for q, r in zip(questions, rewards, strict=True):
        q.reward, q.terms = r.reward, dict(r.terms)


@dataclass
class PoolItem:
    """A labelled question of the solver's pool."""

    question: str
    label: str
    p: float
    question_id: str


@parses_model_text(invalid=(None, None))
def parse_questioner_output(text: str, require_answer: bool = True) -> tuple[str | None, str | None]:
    """(q, the questioner's answer) from the last ``<question>`` block and the last ``\\boxed{}``; q is None unless both
    are there (as the prompt asks), or, with ``require_answer`` false, unless the block is (as both codes read it:
    mathruler's "None" for a missing box passes their check)."""
    blocks = list(tag_blocks(text, "question"))
    question = text[blocks[-1][1]:blocks[-1][2]].strip() if blocks else None
    answer = extract_boxed(text)
    return (question if question and (answer or not require_answer) else None), answer


ARITH_FORMAT = arith_format()


@parses_model_text(invalid=False)
def has_think_format(text: str) -> bool:
    """The code's solver format ``<think>..</think>..\\boxed{..}..`` (the whole stripped text), checked in linear time
    (as a regex with three ``.*`` it is cubic)."""
    text = text.strip()
    think_end = text.find("</think>", len("<think>")) if text.startswith("<think>") else -1
    box = text.find("\\boxed{", think_end + len("</think>")) if think_end >= 0 else -1
    return box >= 0 and text.find("}", box + len("\\boxed{")) >= 0


@register
class RZero(GeneratorRecipe):
    name = "r_zero"
    summary = ("questioner and solver in alternating GRPO phases; uncertainty reward minus BLEU-cluster repetition "
               "penalty; majority-vote labels, pool band filter")
    roles = ("questioner", "solver")
    Params = RZeroParams
    phased = True
    scores_questions = True
    formats = {"chat": CHAT_FORMAT, "arith": ARITH_FORMAT}
    label_with_tools = True  # the pool's labels are voted by episodes when ``rollout.tools`` is on
    defaults = {"steps": 104, "eval_every": 26, "rollout": {"temperature": 1.0, "max_new_tokens": 64},
                "train": {"lr": 3e-5, "grad_clip": 1.0}}
    presets = {
        "small": {"model": "tiny-arith", "task": "arith", "steps": 104, "eval_every": 26, "train": SMALL_TRAIN},
        "paper": {**PAPER_SCALE, "params": {**PAPER_PARAMS, "advantage": "dr_grpo"}},
        "reference_code": RZERO_CODE,
        "prism_code": {**PRISM_CODE, "params": {**PRISM_CODE_PARAMS, "reward_form": "code", "band": [0.3, 0.8]}},
    }

    def __init__(self, config, params: RZeroParams):
        super().__init__(config, params)
        # S_0 = M_0 and Q_0 (a copy of M_0, or a format warm-up's model)
        self.solver_policy, self.questioner = self.load_solver_and_generator("questioner")
        self.solver_trainer, self.questioner_trainer = self.trainers()["solver"], self.trainers()["questioner"]
        self.question_prompt = self.generator_prompt(self.questioner)
        self.question_sampling = self.generator_sampling(replace(self.sampling,
                                                                 max_new_tokens=params.question_max_tokens))
        self.pool_sampling = replace(self.question_sampling, top_p=params.pool_top_p or self.sampling.top_p)
        scoring = replace(self.sampling, **config.rollout.scoring.model_dump(exclude_none=True))
        self.scoring_sampling = self.solver_budget(scoring, scoring.max_new_tokens)  # votes for p(q), not training
        self.label_sampling = self.solver_budget(scoring, params.label_max_tokens or scoring.max_new_tokens)
        self.vote_equivalence = self.task.vote_equivalence  # integers: the vote's exact fast path
        self.bleu_tokens = params.bleu_tokens or BLEU_TOKENS[self.world]
        self.pool_band = params.pool_band or params.band
        reinit = "solver" if params.questioner_init == "solver" and not config.frozen_generator else None
        self.schedule = Schedule([  # line 1 at the questioner phase's start: Q_t <- Q_{t-1}, or S_{t-1} (SolverInit)
            phase_for("questioner", params.questioner_steps, self.questioner_trainer, reinit_from=reinit,
                      reset=self.questioner_resets()),
            phase_for("solver", params.solver_steps, self.solver_trainer)])
        self.pool: list[PoolItem] = []
        self.pool_iteration = 0  # the iteration whose pool ``self.pool`` is

    def state_dict(self) -> dict[str, Any]:
        return {"pool_iteration": self.pool_iteration, "pool": [vars(item) for item in self.pool]}

    def load_state_dict(self, state) -> None:
        self.pool_iteration = int(state["pool_iteration"])
        self.pool = [PoolItem(**item) for item in state["pool"]]

    def questioner_resets(self) -> tuple[str, ...]:
        """Recipe state reset at each questioner phase's start after the first (none for R-Zero)."""
        return ()

    def step(self, step: int) -> StepOutput:
        at = self.enter_phase(step)  # a fresh AdamW per phase, the lr schedule, SolverInit's Q_t <- S_{t-1}
        if at.role == "questioner":
            return self.questioner_step(step, at.iteration)
        return self.solver_step(step, at.iteration, at.index)

    # --- questioner phase -------------------------------------------------------------------------
    def questioner_step(self, step: int, t: int) -> StepOutput:
        p, timer, seed = self.params, PhaseTimer(), self.config.seed
        with timer("generate"):  # B_Q prompt copies x G_Q outputs
            groups = self.sample_groups(self.questioner, [self.question_prompt] * p.questioner_prompts,
                                        p.questioner_group, step_seed(seed, step, "questions"), self.question_sampling)
            questions = [self.read_question(o) for group in groups for o in group]
        self.watch_format(step, sum(q.text is not None for q in questions), len(questions))
        with timer("score"):  # p(q) from m_s samples of the frozen solver S_{t-1}
            self.label(questions, p.score_samples, step_seed(seed, step, "score"), "all")
        with timer("reward"):
            extra = self.questioner_rewards(questions)
            group_ids = [g for g, group in enumerate(groups) for _ in group]
            rewards = [q.reward for q in questions]
            for q, a in zip(questions, compute_advantages(p.advantage, rewards, group_ids)):
                q.advantage = float(a)
            varies = nonzero_variance_mask(rewards, group_ids)
        if not any(varies):
            log.warning("step %d: every questioner group has zero reward variance (all advantages 0)", step)
        stats: dict[str, float] = {}
        if not self.config.frozen_generator:
            with timer("update_questioner"):
                stats = self.questioner_trainer.update(
                    train_samples([q.output for q in questions], [q.advantage for q in questions]))
        return StepOutput(
            metrics={"iteration": t, "phase": "questioner", **self.question_metrics(questions), **extra,
                     "questioner/zero_variance_rate": mean([float(not v) for v in varies]),
                     "generator/advantage_abs_mean": mean([abs(q.advantage) for q in questions]),
                     **role_metrics("questioner", stats), **timer},
            samples=self.question_records(step, t, "question", questions))

    def questioner_rewards(self, questions: list[Question]) -> dict[str, float]:
        """R-Zero's reward (:mod:`coevolve.rewards.questioner`): uncertainty minus the BLEU-cluster repetition penalty
        over the whole batch, written on each question; returns its metrics."""
        p, scored = self.params, scored_questions(questions)
        penalties = repetition_penalties(scored, p.repetition_threshold, self.bleu_tokens, p.repetition_weight)
        give_rewards(questions, rzero_rewards(scored, penalties, p.reward_form))
        return {"rzero/repetition_mean": mean(penalties)}

    # --- solver phase -----------------------------------------------------------------------------
    def solver_step(self, step: int, t: int, index: int) -> StepOutput:
        p, timer, seed = self.params, PhaseTimer(), self.config.seed
        samples: list[SampleRow] = []
        metrics: dict[str, Any] = {"iteration": t, "phase": "solver"}
        if self.pool_iteration != t:  # lines 6-7 at the phase boundary: pool from Q_t, labels from S_{t-1}
            with timer("pool"):
                candidates = self.build_pool(step, t)
            metrics.update(self.pool_metrics(candidates))
            samples += self.question_records(step, t, "pool", candidates)
        batch = self.solver_batch(t, index)
        if not batch:
            log.warning("step %d: the solver pool of iteration %d is empty; no solver update", step, t)
        stats: dict[str, float] = {}
        if batch:
            prompts = [self.solver_prompt(item.question) for item in batch]
            with timer("solve"):
                solved = self.solve_groups(self.solver_policy, prompts, p.solver_group, step_seed(seed, step, "solve"))
            with timer("reward"):
                groups, answers = [group for group, _ in solved], [group_answers for _, group_answers in solved]
                terms = [[self.solver_terms(c, a, item.label) for c, a in zip(group, group_answers)]
                         for item, group, group_answers in zip(batch, groups, answers)]
                group_ids = [g for g, group in enumerate(groups) for _ in group]
                rewards, advantages, clip_highs = self.solver_advantages(batch, terms, group_ids)
            with timer("update_solver"):
                completions = [c for group in groups for c in group]
                stats = self.solver_trainer.update(train_samples(completions, advantages, clip_highs))
            samples += self.solver_records(step, t, batch, groups, answers, terms, rewards, advantages)
            metrics.update({"solver/reward_mean": mean(rewards), "reward/agree": mean(
                [x["agree"] for g in terms for x in g]), "tokens/solver": sum(len(c.token_ids) for c in completions),
                "solver/none_rate": mean([float(a is None) for g in answers for a in g]),
                "solver/advantage_abs_mean": mean([abs(float(a)) for a in advantages]),
                **tool_use(self.config, completions, [x["agree"] > 0 for g in terms for x in g])})
        metrics.update({"pool/size": len(self.pool), **role_metrics("solver", stats), **timer})
        return StepOutput(metrics=metrics, samples=samples)

    def solver_advantages(self, batch: list[PoolItem], terms: list[list[dict[str, float]]], group_ids: list[int],
                          ) -> tuple[list[float], list[float], list[float] | None]:
        """Each rollout's reward r = (1 - w) agree + w format, its advantage, and its own upper clip range (None: the
        trainer's ``clip_high``)."""
        p = self.params
        rewards = [(1 - p.solver_format_weight) * x["agree"] + p.solver_format_weight * x["format"]
                   for group_terms in terms for x in group_terms]
        return rewards, [float(a) for a in compute_advantages(p.advantage, rewards, group_ids)], None

    def build_pool(self, step: int, t: int) -> list[Question]:
        """N_pool questions from Q_t labelled by S_{t-1}; the pool keeps those in the band with no filter reason."""
        p, seed = self.params, self.config.seed
        outputs = self.sample_groups(self.questioner, [self.question_prompt], p.pool_size,
                                     step_seed(seed, step, "pool"), self.pool_sampling)[0]
        candidates = [self.read_question(o) for o in outputs]
        self.watch_format(step, sum(q.text is not None for q in candidates), len(candidates))
        self.label(candidates, p.label_samples, step_seed(seed, step, "pool_labels"), p.pool_p_denominator,
                   self.label_sampling, tools=self.label_with_tools)
        self.describe_pool(candidates)
        self.pool = [PoolItem(q.text, q.label, q.p, f"i{t}-pool{i}") for i, q in enumerate(candidates)
                     if self.keep(q)]
        self.pool_iteration = t
        return candidates

    def keep(self, q: Question) -> bool:
        """Pool filter: a valid question with a label, p inside the pool band and no R-Zero filter reason."""
        return (q.text is not None and q.p is not None and in_band(q.p, *self.pool_band)
                and not pool_filter_reasons(q.text, q.label, english_proofs=self.params.filter_prove))

    def describe_pool(self, candidates: list[Question]) -> None:
        """Annotate pool candidates before filtering (Prism assigns clusters); nothing for R-Zero."""

    def solver_batch(self, t: int, index: int) -> list[PoolItem]:
        """The ``index``-th slice of the pool in a shuffled order fixed per iteration, cycling through the pool."""
        if not self.pool:
            return []
        order = list(range(len(self.pool)))
        random.Random(step_seed(self.config.seed, t, "pool_order")).shuffle(order)
        n = self.params.solver_questions
        return [self.pool[order[(index * n + i) % len(order)]] for i in range(n)]

    def solver_terms(self, completion: Completion, answer: str | None, label: str) -> dict[str, float]:
        """Agreement with the majority label, and the code's <think>..</think>..\\boxed{} format."""
        agree = self.task.answers_agree(answer, label)
        return {"agree": float(agree), "format": float(has_think_format(completion.written_text))}

    # --- shared pieces ----------------------------------------------------------------------------
    def read_question(self, output: Completion) -> Question:
        """q and the questioner's own answer, read in the world's format (``formats``); with ``missing_answer_votes:
        code`` a chat output without a box is valid too (both codes take mathruler's "None" for its answer)."""
        if self.params.missing_answer_votes == "code" and self.world == "chat":
            generation = Generation(*parse_questioner_output(output.text, require_answer=False))
        else:
            generation = self.read_generation(output)
        return Question(output, generation.question, generation.answer)

    def solver_prompt(self, question: str) -> str:
        return self.solver_policy.format_prompt(self.task.solver_prompt(question, None, self.style))

    def label(self, questions: list[Question], samples: int, seed: int, denominator: str,
              sampling: SamplingParams | None = None, tools: bool = True) -> None:
        """Majority answer and p(q) (share of samples agreeing with it) of every valid question, from ``samples``
        solver votes sampled with ``sampling`` (unset: ``rollout.scoring``); ``tools`` false: single turns even with
        ``rollout.tools``."""
        valid = [q for q in questions if q.text is not None]
        solved = self.solve_groups(self.solver_policy, [self.solver_prompt(q.text) for q in valid], samples, seed,
                                   sampling or self.scoring_sampling, tools=tools)
        for q, (group, answers) in zip(valid, solved):
            q.answers = answers
            q.solver_tokens = sum(len(c.token_ids) for c in group)
            q.solver_tool_calls = [c.tool_calls for c in group]
            votes = answers if self.params.missing_answer_votes == "drop" else [
                MISSING_ANSWER if a is None else a for a in answers]
            q.vote = majority_vote(votes, self.vote_equivalence)
            q.p = q.vote.p if denominator == "all" else (q.vote.support / q.vote.n_valid if q.vote.n_valid else 0.0)

    # --- records and metrics ----------------------------------------------------------------------
    def question_records(self, step: int, t: int, phase: str, questions: list[Question]) -> list[SampleRow]:
        """One generator row per questioner output (phase ``question`` in training, ``pool`` for the pool)."""
        pooled = {item.question_id for item in self.pool} if phase == "pool" else set()
        rows = []
        for i, q in enumerate(questions):
            qid = f"i{t}-pool{i}" if phase == "pool" else f"s{step}-q{i}"
            rows.append(generator_row(
                step, t, phase, q.output, question=q.text, question_id=qid, valid=q.text is not None,
                answer=q.own_answer, label=q.label, label_source="majority", solve_rate=q.p,
                reward=q.reward if phase == "question" else None, reward_terms=q.terms,
                advantage=q.advantage if phase == "question" else None,
                oracle=self.task.oracle(q.text, None, q.own_answer, q.label) if q.text else None,
                extra={"cluster": q.cluster, "in_pool": qid in pooled}))
        return rows

    def solver_records(self, step: int, t: int, batch: list[PoolItem], groups, answers, terms, rewards,
                       advantages) -> list[SampleRow]:
        """One solver row per rollout, labelled with its pool question's majority answer."""
        rows, k = [], 0
        for item, group, group_answers, group_terms in zip(batch, groups, answers, terms):
            for c, a, x in zip(group, group_answers, group_terms):
                rows.append(solver_row(
                    step, t, "solve", c, question=item.question, question_id=item.question_id, answer=a,
                    label=item.label, label_source="majority", solve_rate=item.p, reward=rewards[k], reward_terms=x,
                    advantage=float(advantages[k]), oracle=self.task.oracle(item.question, None, a, item.label)))
                k += 1
        return rows

    def question_metrics(self, questions: list[Question]) -> dict[str, float]:
        scored = [q.p for q in questions if q.p is not None]
        return {
            "generator/reward_mean": mean([q.reward for q in questions]),
            "questions/valid_rate": len(scored) / len(questions),
            "questions/solve_rate_mean": mean(scored),
            "questions/in_band_rate": sum(in_band(x, *self.params.band) for x in scored) / len(questions),
            "questions/distinct_rate": len({q.text for q in questions if q.text}) / len(questions),
            "tokens/generator": sum(len(q.output.token_ids) for q in questions),
            "tokens/solver": sum(q.solver_tokens for q in questions),
        }

    def pool_metrics(self, candidates: list[Question]) -> dict[str, float]:
        scored = [q for q in candidates if q.p is not None]
        return {
            "pool/candidates": len(candidates), "pool/valid_rate": len(scored) / len(candidates),
            "pool/solve_rate_mean": mean([q.p for q in scored]),
            "pool/kept_rate": len(self.pool) / len(candidates),
            "pool/distinct_rate": len({q.text for q in scored}) / len(candidates),
        }
