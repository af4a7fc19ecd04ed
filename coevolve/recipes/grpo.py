"""GRPO with ground-truth labels on a fixed problem set (RLVR): the upper bound for self-evolving recipes.

Per step (DeepSeekMath's GRPO):
    1. draw B labelled problems from the training set;
    2. sample G solutions for each;
    3. reward r = 1 if the extracted answer equals the ground truth, else 0;
    4. advantage = group z-score of r (or another estimator from ``coevolve.rl.advantages``);
    5. one clipped policy-gradient update.

``paper`` takes DeepSeekMath's step structure (its §4.2: one policy update per exploration stage): a single AdamW
step on the whole batch, 1 epoch. ``solver/optimizer_steps`` logs the steps taken and ``solver/advantage_abs_mean``
the advantage scale.
"""

from __future__ import annotations

import random

from pydantic import Field

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
from coevolve.records import solver_row
from coevolve.rl.advantages import AdvantageName, compute_advantages, nonzero_variance_mask


class GRPOParams(RecipeParams):
    questions_per_step: int = Field(16, gt=0, description="B, problems per step")
    group_size: int = Field(8, gt=1, description="G, solutions per problem")
    advantage: AdvantageName = Field("grpo", description="the advantage estimator (coevolve.rl.advantages)")
    drop_zero_variance: bool = Field(False, description="leave out groups whose rewards are all equal")
    levels: ArithLevels = Field([1, 2, 3, 4], description="arith: difficulty levels of the training problems")
    train_split: str = Field("train", description="math: training file (gsm8k train)")


@register
class GRPO(Recipe[GRPOParams]):
    name = "grpo"
    summary = "baseline: solver-only RLVR with ground-truth labels (upper bound for self-evolving recipes)"
    Params = GRPOParams
    defaults = {"steps": 200, "train": {"lr": 5e-5}, "rollout": {"max_new_tokens": 64}, "eval_every": 25}
    presets = {
        "small": {"model": "tiny-arith", "task": "arith", "steps": 200},  # ~2 s a step on one core
        "paper": {  # DeepSeekMath GRPO / the specs' common solver settings for real models
            "model": "smollm2-135m", "task": "math", "steps": 200,
            "rollout": {"temperature": 1.0, "max_new_tokens": 512},
            "train": {"lr": 1e-6, "kl_beta": 0.0, "micro_batch_size": 4, "mini_batch_size": 0, "epochs": 1},
            "params": {"questions_per_step": 32, "group_size": 8},
            "eval_sets": ["gsm8k", "math500"], "eval_limit": 100, "eval_max_new_tokens": 512,
        },
    }

    def __init__(self, config, params: GRPOParams):
        super().__init__(config, params)
        self.policy = self.load_policy()
        self.trainer = self.make_trainer(self.policy, "solver")

    @classmethod
    def data_sets(cls, config, params: GRPOParams):
        if config.task != "math":
            return super().data_sets(config, params)
        split = "gsm8k_train" if params.train_split == "train" else params.train_split  # MathTask.training_problems
        return super().data_sets(config, params) + [split]

    def step(self, step: int) -> StepOutput:
        p, timer = self.params, PhaseTimer()
        problems = self.task.training_problems(random.Random(step_seed(self.config.seed, step, "problems")),
                                               p.questions_per_step, levels=p.levels, split=p.train_split)
        prompts = [self.policy.format_prompt(self.task.solver_prompt(q.question, q.doc, self.policy.prompt_style))
                   for q in problems]
        with timer("solve"):
            solved = self.solve_groups(self.policy, prompts, p.group_size, step_seed(self.config.seed, step, "solve"))
        with timer("reward"):
            completions = [c for group, _ in solved for c in group]
            group_ids = [g for g, (group, _) in enumerate(solved) for _ in group]
            answers = [a for _, group_answers in solved for a in group_answers]
            rewards = [float(self.task.is_correct(a, problems[g].answer)) for a, g in zip(answers, group_ids)]
            advantages = compute_advantages(p.advantage, rewards, group_ids)
            keep = (nonzero_variance_mask(rewards, group_ids) if p.drop_zero_variance
                    else [True] * len(rewards))
        with timer("update_solver"):
            stats = self.trainer.update(train_samples([c for c, k in zip(completions, keep) if k],
                                                      [a for a, k in zip(advantages, keep) if k]))
        records = [solver_row(
            step, None, "solve", c, question=problems[g].question, question_id=f"s{step}-q{g}", answer=a,
            label=problems[g].answer, label_source="ground_truth", solve_rate=None, reward=r,
            reward_terms={"correct": r}, advantage=float(adv),
            oracle=self.task.oracle(problems[g].question, problems[g].doc, a, problems[g].answer),
        ) for c, g, a, r, adv in zip(completions, group_ids, answers, rewards, advantages)]
        return StepOutput(
            metrics={"solver/reward_mean": mean(rewards), "reward/correct": mean(rewards),
                     "solver/advantage_abs_mean": mean([abs(float(a)) for a, k in zip(advantages, keep) if k]),
                     "tokens/solver": sum(len(c.token_ids) for c in completions),
                     **tool_use(self.config, completions, [r > 0 for r in rewards]),
                     **role_metrics("solver", stats), **timer},
            samples=records,
        )
