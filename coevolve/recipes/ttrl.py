"""TTRL: test-time reinforcement learning with majority-vote rewards on unlabeled questions (the label-free baseline).

Paper: TTRL: Test-Time Reinforcement Learning (Zuo et al. 2025, arXiv:2504.16084, NeurIPS 2025), §3. Given a fixed
set D of unlabeled questions (a benchmark's questions with their answers hidden, or a task's training problems) and
the policy pi_theta, repeat for ``steps`` steps:

    1. draw a batch of B questions x from D (one shuffled pass over D after another);
    2. sample N answers {y_i} ~ pi_theta(.|x) for the vote (paper: N = 64);
    3. estimate the label y* = the majority answer among the parseable {y_i} (an unparseable answer never wins; a tie
       between the largest classes is broken by a seeded draw);
    4. keep a subset of M of the N samples for the update (paper: 32; the code keeps the first M);
    5. reward r(y_i, y*) = 1 if y_i agrees with y*, else 0;
    6. GRPO advantages over each question's M rewards; one policy-gradient update on the B x M samples.

``label_free_reward`` swaps lines 5-6 for a reward that does not collapse (equations: ``coevolve.rewards.label_free``):

- ``evol_rl`` (EVOL-RL, arXiv:2509.15194): over all N samples, r = 0.5 + 0.5 * novelty in the majority, -1 + 0.5 *
  novelty outside it, -1 when unparseable, the novelty measured by the sentence encoder over the group's responses;
  then GRPO on the M trained ones (with asymmetric clipping and an entropy bonus in its presets);
- ``restrain`` (RESTRAIN, arXiv:2510.02172): before step 1, u_x = g(c_ref / N) per question from the frozen base
  model's vote, computed once and kept in the run's state; then every distinct answer a_j is a pseudo-label of
  weight w_j = g(c_j / N) / sum_l g(c_l / N), low-consistency questions (max_j c_j < kappa) get zero reward and
  advantage - delta, and A_i = u_x * sum_j w_j * Ã_ij.

The ground truth of D is never a reward (``label_source: ground_truth`` swaps it in: GRPO on the same questions, the
paper's "RL (leakage)" upper bound); where the task has it, it only measures the label: per step
``ttrl/label_accuracy`` (majority label = ground truth; ``ttrl/label_error_rate`` = 1 - it), ``reward/correct`` (the
ground-truth reward of the trained samples) and ``ttrl/reward_accuracy`` (share of trained samples whose majority
reward equals their ground-truth reward), with ``ttrl/majority_ratio`` (support / N), ``ttrl/vote_margin`` ((winner -
runner-up) / N) and ``ttrl/majority_changed_rate`` (questions seen before whose majority answer changed since they were
last voted on). The collapse step (URLVR, arXiv:2603.08660) is read off the metrics by
:mod:`coevolve.analytics.collapse`.

Paper vs released code, presets and what the small preset changes: ``docs/recipes/ttrl.md``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from coevolve.config import RunConfig
from coevolve.data.benchmarks import load_benchmark
from coevolve.embeddings import EncoderUnavailable, default_encoder_path, embed
from coevolve.grading.equivalence import normalize_answer
from coevolve.grading.vote import VoteResult
from coevolve.phases import Schedule, phase_for
from coevolve.recipes.base import (
    ArithLevels,
    PhaseTimer,
    Recipe,
    RecipeParams,
    StepOutput,
    mean,
    register,
    role_metrics,
    step_seed,
    tool_use,
    train_samples,
)
from coevolve.records import LabelSource, SampleRow, solver_row
from coevolve.rewards.label_free import after_think, evol_rl_rewards, gaussian, restrain_advantages, weight_entropy
from coevolve.rewards.majority import agreement_rewards, seeded_vote, vote_margin
from coevolve.rl.advantages import compute_advantages
from coevolve.rollout import Completion
from coevolve.tasks.registry import Problem, Task, TaskDataError, get_task

# The paper's MATH-500 run (its §4 settings): 10 episodes of the 500 test questions, 32 questions a step, 64 votes and
# 32 trained samples, AdamW at lr 5e-7 on a cosine schedule, 3072 new tokens; on the one offline chat model. What the
# stored paper text did not give comes from the released scripts (verl/examples/ttrl/*, every one alike): the actor's
# KL loss on (verl's kl_loss_coef 0.001, low_var_kl: k3 clamped to [-10, 10]), training top_p 1 (verl's default; 0.95
# is the validation setting), and verl's actor defaults: dual clip c = 3, AdamW weight decay 0.01. The scripts sample
# Qwen2.5-Math at temperature 1.0 and Qwen2.5 / LLaMA-3.1-Instruct at 0.6; SmolLM2, a general chat model, takes 0.6
# (for a Qwen2.5-Math model set rollout.temperature=1.0). docs/recipes/ttrl.md: each value's source.
_CODE_ACTOR = {"kl_beta": 1e-3, "kl_clamp": 10.0, "dual_clip": 3.0, "weight_decay": 0.01}
_PAPER: dict[str, Any] = {
    "model": "smollm2-135m", "task": "math", "steps": 10 * 16, "eval_every": 16,
    "rollout": {"temperature": 0.6, "top_p": 1.0, "max_new_tokens": 3072},
    "train": {"lr": 5e-7, "lr_schedule": "cosine", "micro_batch_size": 2, "mini_batch_size": 32, "epochs": 1,
              **_CODE_ACTOR},
    "params": {"pool_source": "math500", "pool_size": 500, "questions_per_step": 32, "vote_samples": 64,
               "train_samples": 32, "subset": "first"},
    "eval_sets": ["math500"], "eval_limit": None, "eval_max_new_tokens": 3072,
}
# The released code where it differs: a 3% lr warm-up, and verl's token-mean loss (every token of a mini-batch weighs
# alike, where GRPO's objective averages each sequence first); one AdamW step per prompt (ppo_mini_batch_size 1 =
# 32 sequences), as in the paper preset.
_REFERENCE_CODE = {
    **_PAPER,
    "train": {**_PAPER["train"], "lr_warmup_ratio": 0.03, "loss_agg": "token_mean"},
}
# EVOL-RL's script (verl/examples/labelfree/evol_rl.sh): 8 questions a step, 64 votes and 32 trained samples, lr 5e-7
# with a 3% warm-up, KL loss 0.001, asymmetric clipping (clip_ratio_high 0.28, the paper's setting), an entropy bonus
# (--ent, 0.001 here; the script's default is 0), temperature 1.0, 12k new tokens, 3 episodes, one prompt (32
# sequences) per optimizer step. RESTRAIN's: the paper names no code and we found no text with its batch settings or
# k, sigma, kappa, delta: TTRL's paper settings with the method's defaults below (docs/recipes/ttrl.md: open choices).
_EVOL_RL = {
    **_PAPER, "steps": 3 * 500 // 8, "eval_every": 20,
    "rollout": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 12 * 1024},
    "train": {**_PAPER["train"], "lr_warmup_ratio": 0.03, "clip_high": 0.28, "entropy_coef": 0.001},
    "params": {**_PAPER["params"], "questions_per_step": 8, "label_free_reward": "evol_rl"},
}
_RESTRAIN = {**_PAPER, "params": {**_PAPER["params"], "label_free_reward": "restrain"}}
_SMALL = {"model": "tiny-arith", "task": "arith", "steps": 200, "eval_every": 25}


class TTRLParams(RecipeParams):
    pool_source: str = Field("train", description="D: 'train' (the task's training problems) or a benchmark "
                                                   "name whose questions are used with their answers hidden")
    pool_size: int = Field(256, gt=0, description="|D|, questions in the fixed pool (a benchmark: at most all)")
    levels: ArithLevels = Field([2], description="arith, pool_source train: difficulty levels of D")
    train_split: str = Field("train", description="math, pool_source train: the training file (gsm8k train)")
    questions_per_step: int = Field(8, gt=0, description="B, questions per step")
    vote_samples: int = Field(16, gt=1, description="N, samples per question for the majority vote (paper: 64)")
    train_samples: int = Field(8, gt=1, description="M <= N, samples per question in the update (paper: 32)")
    subset: Literal["first", "random"] = Field(
        "first", description="which M of the N samples train: the first M (the code) or M drawn with the step's seed")
    label_source: Literal["majority", "ground_truth"] = Field(
        "majority", description="reward against the majority answer (TTRL) or the hidden ground truth (GRPO on D)")
    advantage: Literal["grpo", "dr_grpo"] = Field("grpo", description="(r-mean)/(std+eps) or r-mean")
    label_free_reward: Literal["majority", "evol_rl", "restrain"] = Field(
        "majority", description="majority (TTRL), evol_rl (majority-anchored novelty, arXiv:2509.15194) or restrain "
                                "(vote-share pseudo-labels with self-penalization, arXiv:2510.02172)")
    encoder: str | None = Field(None, description="evol_rl: sentence-transformers folder for the novelty (None: "
                                                  "the packaged all-MiniLM-L6-v2)")
    restrain_k: float = Field(1.0, ge=0, le=1, description="restrain: centre k of the Gaussian g (not found in the "
                                                           "paper's accessible text: coevolve's choice)")
    restrain_sigma: float = Field(0.5, gt=0, description="restrain: bandwidth sigma of g (coevolve's choice)")
    restrain_kappa: int = Field(3, ge=0, description="restrain: a question whose largest vote count M(x) is below "
                                                     "kappa is penalised (coevolve's choice)")
    restrain_delta: float = Field(0.5, ge=0, description="restrain: advantage offset of a penalised question "
                                                         "(coevolve's choice)")

    @model_validator(mode="after")
    def _check(self) -> TTRLParams:
        if self.train_samples > self.vote_samples:
            raise ValueError(f"train_samples {self.train_samples} must not exceed vote_samples {self.vote_samples}")
        if self.label_free_reward != "majority" and self.label_source != "majority":
            raise ValueError(f"label_free_reward {self.label_free_reward} replaces the majority reward: it needs "
                             f"label_source majority")
        return self


@dataclass
class Voted:
    """One question of the step: its pool index, the N samples, their answers and the vote."""

    index: int
    problem: Problem
    group: list[Completion]  # the N completions
    answers: list[str | None]
    vote: VoteResult
    trained: list[int]  # indices of the M samples in the update
    rewards: list[float]  # of the trained samples
    label_correct: bool  # majority label = ground truth
    terms: list[dict[str, Any]]  # per vote sample: the reward's terms (majority: agreement only; a novelty may be None)
    advantages: list[float] | None = None  # restrain: the trained samples' advantages (others: GRPO on the rewards)
    restrain: dict[str, float] | None = None  # restrain: the question's penalty, weight entropy and candidates


def build_pool(config: RunConfig, params: TTRLParams, task: Task) -> list[Problem]:
    """D, fixed by the run's seed: ``pool_size`` training problems, or a benchmark's questions (answers kept only for
    the label telemetry)."""
    if params.pool_source == "train":
        return task.training_problems(random.Random(step_seed(config.seed, 0, "pool")), params.pool_size,
                                      levels=params.levels, split=params.train_split)
    items = load_benchmark(params.pool_source, data_dir=config.data_dir, limit=params.pool_size, seed=config.seed)
    return [Problem(item.question, item.answer, item.meta.get("doc")) for item in items]


def training_subset(n: int, m: int, how: str, seed: int) -> list[int]:
    """Indices of the M of N samples that enter the update: the first M (TTRL's code) or M drawn with ``seed``."""
    if how == "first":
        return list(range(m))
    return sorted(random.Random(seed).sample(range(n), m))


@register
class TTRL(Recipe[TTRLParams]):
    name = "ttrl"
    summary = ("baseline: test-time RL on unlabeled questions; reward 1 for agreeing with the majority answer of N "
               "samples, GRPO on a subset")
    Params = TTRLParams
    phased = True  # one phase, the whole run: the paper's cosine lr schedule runs over its steps
    defaults = {"steps": 200, "eval_every": 25, "train": {"lr": 5e-5}, "rollout": {"max_new_tokens": 64}}
    presets = {
        "small": _SMALL,
        "paper": _PAPER,
        "reference_code": _REFERENCE_CODE,
        "evol_rl": _EVOL_RL,
        "restrain": _RESTRAIN,
        "small_evol_rl": {**_SMALL, "train": {"clip_high": 0.28, "entropy_coef": 0.001},
                          "params": {"label_free_reward": "evol_rl"}},
        "small_restrain": {**_SMALL, "params": {"label_free_reward": "restrain"}},
    }

    def __init__(self, config, params: TTRLParams):
        super().__init__(config, params)
        self.policy = self.load_policy()
        self.trainer = self.make_trainer(self.policy, "solver")
        self.schedule = Schedule([phase_for("solver", config.steps, self.trainer)])  # one phase, the whole run
        self.pool = build_pool(config, params, self.task)
        self.vote_equivalence = self.task.vote_equivalence  # exact for integers, math-verify for math
        self.last_label: dict[str, str | None] = {}  # question id -> its majority answer when last voted on
        self.prompt_weights: dict[str, float] | None = None  # restrain: question id -> u_x, set once before step 1

    @classmethod
    def check_inputs(cls, config, params: TTRLParams) -> None:
        super().check_inputs(config, params)
        if not build_pool(config, params, get_task(config.task, data_dir=config.data_dir)):
            raise TaskDataError(f"the question pool D is empty: params.pool_source {params.pool_source!r} holds no "
                                f"questions")
        if params.label_free_reward == "evol_rl":  # the novelty's encoder, before any model loads
            try:
                folder = default_encoder_path() if params.encoder is None else Path(params.encoder)
            except EncoderUnavailable as exc:
                raise TaskDataError(str(exc)) from None
            if not folder.is_dir():
                raise TaskDataError(f"params.encoder: folder not found: {folder}")

    @classmethod
    def data_sets(cls, config, params: TTRLParams):
        if params.pool_source == "train":
            extra = ["gsm8k_train" if params.train_split == "train" else params.train_split] \
                if config.task == "math" else []
        else:
            extra = [params.pool_source]
        return super().data_sets(config, params) + extra

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"last_label": dict(self.last_label)}
        if self.prompt_weights is not None:
            state["prompt_weights"] = dict(self.prompt_weights)
        return state

    def load_state_dict(self, state) -> None:
        last_label = dict(state["last_label"])
        if not all(isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in last_label.items()):
            raise TypeError("last_label maps question ids to answers (strings or null)")
        weights = state.get("prompt_weights")
        if weights is not None:
            weights = dict(weights)
            if not all(isinstance(k, str) and isinstance(v, float) for k, v in weights.items()):
                raise TypeError("prompt_weights maps question ids to numbers")
        self.last_label, self.prompt_weights = last_label, weights

    def batch(self, step: int) -> list[int]:
        """Pool indices of step ``step``'s B questions: shuffled passes over D (epoch e in its own seeded order)."""
        size, n = len(self.pool), self.params.questions_per_step
        out = []
        for i in range((step - 1) * n, step * n):
            epoch, position = divmod(i, size)
            order = list(range(size))
            random.Random(step_seed(self.config.seed, epoch, "pool_order")).shuffle(order)
            out.append(order[position])
        return out

    def step(self, step: int) -> StepOutput:
        self.enter_phase(step)  # the lr schedule over the whole run
        p, timer, seed = self.params, PhaseTimer(), self.config.seed
        if p.label_free_reward == "restrain" and self.prompt_weights is None:
            if step > 1:
                raise ValueError("restrain: the prompt weights of the frozen base model are missing from the resumed "
                                 "state; they are computed once, before step 1")
            with timer("prompt_weights"):  # RESTRAIN: u_x from the frozen base model, once
                self.prompt_weights = self.reference_prompt_weights()
        indices = self.batch(step)
        problems = [self.pool[i] for i in indices]
        prompts = [self.prompt(q) for q in problems]
        with timer("solve"):  # line 2: N samples per question
            solved = self.solve_groups(self.policy, prompts, p.vote_samples, step_seed(seed, step, "solve"))
        with timer("reward"):  # lines 3-5
            embedded = self.embed_groups([group for group, _ in solved])
            voted = [self.vote(step, index, problem, group, answers, embeddings)
                     for index, problem, (group, answers), embeddings in zip(indices, problems, solved, embedded)]
            rewards = [r for v in voted for r in v.rewards]
            group_ids = [g for g, v in enumerate(voted) for _ in v.trained]
            advantages: Sequence[float] | np.ndarray
            if p.label_free_reward == "restrain":  # line 6: RESTRAIN's weighted, penalised advantages
                advantages = [a for v in voted if v.advantages is not None for a in v.advantages]
            else:
                advantages = compute_advantages(p.advantage, rewards, group_ids)  # line 6
        with timer("update_solver"):
            completions = [v.group[i] for v in voted for i in v.trained]
            stats = self.trainer.update(train_samples(completions, advantages))
        metrics = self.vote_metrics(voted)  # before ``last_label`` moves on
        for v in voted:
            self.last_label[f"pool{v.index}"] = v.vote.label
        return StepOutput(
            metrics={"solver/reward_mean": mean(rewards), **metrics, **self.label_free_metrics(voted),
                     "solver/advantage_abs_mean": mean([abs(float(a)) for a in advantages]),
                     "tokens/solver": sum(len(c.token_ids) for v in voted for c in v.group),
                     **role_metrics("solver", stats), **timer},
            samples=self.records(step, voted, advantages))

    def prompt(self, problem: Problem) -> str:
        return self.policy.format_prompt(self.task.solver_prompt(problem.question, problem.doc,
                                                                 self.policy.prompt_style))

    def reference_prompt_weights(self) -> dict[str, float]:
        """RESTRAIN's prompt weights u_x = g(c_ref / N) of every question of D: N samples of the policy before its
        first update (the frozen base model), c_ref the support of their majority answer."""
        p, seed = self.params, self.config.seed
        solved = self.solve_groups(self.policy, [self.prompt(q) for q in self.pool], p.vote_samples,
                                   step_seed(seed, 0, "restrain_reference"))
        support = [seeded_vote(answers, step_seed(seed, 0, f"tie:{i}"), self.vote_equivalence).support
                   for i, (_, answers) in enumerate(solved)]
        return {f"pool{i}": float(gaussian(c / p.vote_samples, p.restrain_k, p.restrain_sigma))
                for i, c in enumerate(support)}

    def embed_groups(self, groups: list[list[Completion]]) -> list[np.ndarray | None]:
        """EVOL-RL: each group's responses (after ``</think>``) through the sentence encoder, in one batch."""
        if self.params.label_free_reward != "evol_rl":
            return [None] * len(groups)
        vectors = embed([after_think(c.text) for group in groups for c in group], path=self.params.encoder)
        bounds = np.cumsum([0] + [len(group) for group in groups])
        return [vectors[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def vote(self, step: int, index: int, problem: Problem, group: list[Completion], answers: list[str | None],
             embeddings: np.ndarray | None = None) -> Voted:
        """The majority label of one question's N answers, the M trained samples and their rewards."""
        p, seed = self.params, self.config.seed
        vote = seeded_vote(answers, step_seed(seed, step, f"tie:{index}"), self.vote_equivalence)
        trained = training_subset(p.vote_samples, p.train_samples, p.subset, step_seed(seed, step, f"subset:{index}"))
        terms: list[dict[str, Any]] = [{"agree": float(agree)} for agree in vote.agree]
        advantages, restrain = None, None
        if p.label_source == "ground_truth":
            rewards = [float(self.task.is_correct(answers[i], problem.answer)) for i in trained]
        elif p.label_free_reward == "majority":
            rewards = agreement_rewards(vote, trained)
        elif p.label_free_reward == "evol_rl":  # over all N vote samples, then the trained ones take theirs
            assert embeddings is not None, "embed_groups embeds every group under evol_rl"
            valid = [c >= 0 for c in vote.classes]
            all_rewards, novelty = evol_rl_rewards(embeddings, valid, vote.agree)
            rewards = [float(all_rewards[i]) for i in trained]
            for t, ok, r, u in zip(terms, valid, all_rewards, novelty):
                t.update({"valid": float(ok), "novelty": None if np.isnan(u) else float(u), "evol_rl": float(r)})
        else:  # restrain: every distinct answer a pseudo-label
            counts = [vote.classes.count(j) for j in range(max(vote.classes, default=-1) + 1)]
            assert self.prompt_weights is not None, "set before step 1 under restrain"
            u_x = self.prompt_weights[f"pool{index}"]
            adv, weights, penalised = restrain_advantages(
                [vote.classes[i] for i in trained], counts, p.vote_samples, k=p.restrain_k, sigma=p.restrain_sigma,
                kappa=p.restrain_kappa, delta=p.restrain_delta, prompt_weight=u_x,
                group_advantages=lambda r: compute_advantages(p.advantage, r, [0] * len(r)))
            advantages = [float(a) for a in adv]
            own = [float(weights[c]) if c >= 0 else 0.0 for c in vote.classes]
            rewards = [0.0 if penalised else own[i] for i in trained]  # sum_j w_j * r~_ij
            for t, w in zip(terms, own):
                t.update({"label_weight": w, "prompt_weight": u_x, "penalised": float(penalised)})
            restrain = {"penalised": float(penalised), "weight_entropy": weight_entropy(weights),
                        "candidates": float(len(counts)), "prompt_weight": u_x}
        label_correct = vote.label is not None and self.task.is_correct(vote.label, problem.answer)
        return Voted(index, problem, group, answers, vote, trained, rewards, label_correct, terms, advantages,
                     restrain)

    def label_free_metrics(self, voted: list[Voted]) -> dict[str, float]:
        """EVOL-RL: mean novelty of the valid samples; RESTRAIN: share of penalised questions, mean weight entropy,
        candidate labels and prompt weight. Nothing for the majority reward."""
        if self.params.label_free_reward == "evol_rl":
            novelty = [t["novelty"] for v in voted for t in v.terms if t["novelty"] is not None]
            return {"evol_rl/novelty_mean": mean(novelty),
                    "evol_rl/valid_rate": mean([t["valid"] for v in voted for t in v.terms])}
        if self.params.label_free_reward == "restrain":
            return {f"restrain/{name}_mean" if name != "penalised" else "restrain/penalised_rate":
                    mean([v.restrain[name] for v in voted if v.restrain is not None])
                    for name in ("penalised", "weight_entropy", "candidates", "prompt_weight")}
        return {}

    def vote_metrics(self, voted: list[Voted]) -> dict[str, float]:
        """The vote's telemetry: label accuracy against the hidden ground truth, margin, changes since last seen."""
        trained_answers = [(v.answers[i], v.vote.agree[i], v.problem.answer) for v in voted for i in v.trained]
        truth = [float(self.task.is_correct(a, gold)) for a, _, gold in trained_answers]
        seen = [v for v in voted if f"pool{v.index}" in self.last_label]
        label_accuracy = mean([float(v.label_correct) for v in voted])
        return {
            "reward/agree": mean([float(agree) for _, agree, _ in trained_answers]),
            "reward/correct": mean(truth),
            **tool_use(self.config, [v.group[i] for v in voted for i in v.trained], [t > 0 for t in truth]),
            "ttrl/label_accuracy": label_accuracy,
            "ttrl/label_error_rate": 1.0 - label_accuracy,
            "ttrl/reward_accuracy": mean([float(float(agree) == t)
                                          for (_, agree, _), t in zip(trained_answers, truth)]),
            "ttrl/majority_ratio": mean([v.vote.p for v in voted]),
            "ttrl/vote_margin": mean([vote_margin(v.vote) for v in voted]),
            "ttrl/no_label_rate": mean([float(v.vote.label is None) for v in voted]),
            "ttrl/majority_changed_rate": mean([float(_changed(self.last_label[f"pool{v.index}"], v.vote.label))
                                                for v in seen]),
            "ttrl/seen_before_rate": len(seen) / len(voted),
            "solver/none_rate": mean([float(a is None) for v in voted for a in v.answers]),
        }

    def records(self, step: int, voted: list[Voted], advantages: Sequence[float] | np.ndarray) -> list[SampleRow]:
        """One solver row per vote sample; ``trained`` marks the M that entered the update."""
        rows, k = [], 0
        label_source: LabelSource = "majority" if self.params.label_source == "majority" else "ground_truth"
        for v in voted:
            trained = {i: j for j, i in enumerate(v.trained)}
            for i, (c, a) in enumerate(zip(v.group, v.answers)):
                in_update = i in trained
                label = v.vote.label if label_source == "majority" else v.problem.answer
                rows.append(solver_row(
                    step, None, "solve", c, question=v.problem.question, question_id=f"pool{v.index}", answer=a,
                    label=label, label_source=label_source, solve_rate=v.vote.p,
                    reward=v.rewards[trained[i]] if in_update else None,
                    reward_terms=v.terms[i],
                    advantage=float(advantages[k + trained[i]]) if in_update else None,
                    oracle=self.task.oracle(v.problem.question, v.problem.doc, a, label),
                    extra={"trained": in_update, "vote_margin": vote_margin(v.vote)}))
            k += len(v.trained)
        return rows


def _changed(before: str | None, now: str | None) -> bool:
    """Whether a question's majority answer differs from the one it had when last voted on."""
    return (normalize_answer(before) if before is not None else None) != (
        normalize_answer(now) if now is not None else None)
