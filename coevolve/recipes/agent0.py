r"""Agent0: a curriculum agent and a tool-using executor agent co-evolve from one base model in alternating phases.

Paper: Agent0: Unleashing Self-Evolving Agents from Zero Data via Tool-Integrated Reasoning (Xia et al. 2025,
arXiv:2511.16043); code: aiming-lab/Agent0 (curriculum_train/: EasyR1 with R-Zero's questioner and reward,
executor_train/: verl-tool with ADPO). The curriculum agent pi_theta is R-Zero's questioner ("questioner" role), the
executor agent pi_phi its solver ("solver" role); both start from M_0. For each iteration t:

Curriculum phase (``questioner_steps``; 5 in the code), the executor frozen at pi_phi^{t-1}:
    1. B copies of the curriculum prompt, G = 4 tasks x each;
    2. k = ``score_samples`` (10) tool-using executor episodes per task (rollout.tools); p_hat(x) = the share of
       them that agree with their majority answer;
    3. R_C(x) = R_unc + R_tool - R_rep: R_unc = 1 - 2|p_hat - 1/2|, R_tool = gamma min(N_tool, C) (gamma 0.05, C 4),
       R_rep R-Zero's BLEU-cluster share of the batch (:func:`coevolve.rewards.questioner.agent0_rewards`: the paper's
       max(0, .) form, or the code's min(p, 1-p) - R_rep + R_tool, -1 - R_rep + R_tool for a bad format);
    4. group-relative advantages over the G tasks of a prompt copy; one GRPO update of pi_theta.
Pool (at the start of the executor phase):
    5. ``pool_size`` tasks from the frozen pi_theta^t, each labelled by the majority answer of ``label_samples``
       executor samples; keep those with p_hat in the frontier band [0.3, 0.8].
Executor phase (``solver_steps``; 100 in the code): each step draws pool tasks, G_S = 16 tool-using episodes each,
    reward +1 if the episode's answer (read from the model's own text, never a tool's output) agrees with the
    majority label, else -1; ADPO: the GRPO advantage times s(p_hat) = m + (1 - m) clamp((p_hat - 0.3) / 0.5, 0, 1)
    (m = 0.6) and each episode's upper clip range eps + 0.1 clamp((0.8 - p_hat) / 0.5, 0, 1); one update.

One loop step is one update of one role (:mod:`coevolve.phases`, R-Zero's schedule). Paper vs code, every value's
source and what differs: ``docs/recipes/agent0.md``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import Field, model_validator

from coevolve.grading.guard import parses_model_text
from coevolve.recipes.base import mean, register
from coevolve.recipes.r_zero import (
    CODE_OPTIMIZER,
    SMALL_TRAIN,
    PoolItem,
    Question,
    RZero,
    RZeroParams,
    give_rewards,
)
from coevolve.rewards.questioner import ScoredQuestion, agent0_rewards, repetition_penalties, tool_rewards
from coevolve.rl.advantages import ambiguity_scale, compute_advantages
from coevolve.rl.losses import ambiguity_clip_high
from coevolve.rollout.episodes import TOOL_CALL_STOP

# The executor's instruction in the chat world: the code's system prompt of the curriculum phase's executor
# (vllm_service_init/start_vllm_server_tool.py:102-112), its tool protocol changed to the ```output convention of the
# executor's training (verl-tool's action_stop_tokens='```output', train_qwen3_4b_adpo.sh:19) that the episodes use.
EXECUTOR_PROMPT = (
    "Solve the following problem step by step. You now have the ability to selectively write executable Python code "
    "to enhance your reasoning process.\n"
    "First, provide your reasoning and write a self-contained Python code block wrapped in ```python ... ``` to help "
    "you calculate the answer. You must use the `print()` function to output the results.\n"
    "After the code block, write ```output and STOP. I will execute the code and write its output, closed by ```, "
    "after which you continue. You must use this result (even if it's an error) to continue your reasoning and "
    "provide the final answer.\n"
    "The last part of your response should be: \\boxed{...}"
)
# The code's values (aiming-lab/Agent0; file:line in docs/recipes/agent0.md). Curriculum: EasyR1's config.yaml and
# curriculum_train.sh; executor: train_qwen3_4b_adpo.sh with verl-tool's actor.yaml; the curriculum's executor
# episodes: start_vllm_server_tool.py; the pool: question_generate.py, evaluate.py, upload.py (README's call).
CODE_TRAIN = {**CODE_OPTIMIZER, "lr": 1e-6, "kl_beta": 1e-2, "kl_clamp": 10.0, "grad_clip": 1.0,
              "loss_agg": "token_mean", "micro_batch_size": 4,
              # the executor's 10 warm-up steps of 100, then a constant lr: a cosine to lr_min_ratio 1.0 (the
              # curriculum role keeps the constant schedule: its warm-up ratio is 0 in config.yaml)
              "lr_warmup_ratio": 0.1, "lr_min_ratio": 1.0}
CODE_ROLES = {"questioner": {"mini_batch_size": 128 * 4, "epochs": 1},
              "solver": {"mini_batch_size": 128 * 16, "epochs": 1, "lr_schedule": "cosine"}}
ITERATIONS = 3  # the paper's iterations (its per-iteration results; not checked against its text here)
CODE_PARAMS = {"questioner_steps": 5, "solver_steps": 100, "questioner_prompts": 512, "questioner_group": 4,
               "score_samples": 10, "pool_size": 8000, "label_samples": 9, "band": [0.3, 0.8],
               "pool_p_denominator": "all", "missing_answer_votes": "code", "solver_questions": 128, "solver_group": 16,
               "question_max_tokens": 4096, "pool_top_p": 0.95, "label_max_tokens": 4096, "label_top_k": 40,
               "filter_prove": False, "reward_form": "code", "tool_calls_of": "curriculum", "own_answer_gate": True,
               "label_with_tools": False}
PAPER_SCALE = {
    "model": "smollm2-135m", "task": "math", "steps": ITERATIONS * (5 + 100), "eval_every": 105,
    "rollout": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 4096, "tools": ["python"],
                "max_tool_calls": 4, "scoring": {"temperature": 0.7, "top_p": 0.9, "top_k": 0, "max_new_tokens": 2048}},
    "train": CODE_TRAIN, "roles": CODE_ROLES,
    "eval_sets": ["gsm8k", "math500"], "eval_limit": 100, "eval_max_new_tokens": 1024,
}


@parses_model_text(invalid=0)
def curriculum_tool_calls(text: str) -> int:
    """The code's N_tool of a curriculum output: the "```output" strings in its own text (curriculum_reward.py:121)."""
    return text.count(TOOL_CALL_STOP)


class Agent0Params(RZeroParams):
    """R-Zero's schedule and pool, with Agent0's tool-use reward and ADPO."""

    tool_weight: float = Field(0.05, ge=0, description="gamma of R_tool = gamma min(N_tool, C) (code: 0.05)")
    tool_cap: int = Field(4, ge=0, description="C, the tool calls R_tool counts at most (code: 4)")
    tool_calls_of: Literal["executor", "curriculum"] = Field(
        "executor", description="N_tool: the executor's tool calls on the task (paper; mean over its k episodes) or "
        "the \"```output\" strings in the curriculum's own output (code)")
    own_answer_gate: bool = Field(False, description="p_hat counts as 0 unless the majority answer agrees with the "
                                                     "curriculum's own answer and p_hat > 0.1 (code)")
    label_with_tools: bool = Field(True, description="the pool's label votes are tool-using episodes (false: single "
                                                     "turns, as the code's evaluate.py)")
    label_top_k: int | None = Field(None, ge=0, description="top_k of the pool's label votes (code: 40; unset: "
                                                            "rollout.top_k)")
    trust_band: list[float] = Field([0.3, 0.8], min_length=2, max_length=2,
                                    description="ADPO's [min, max]_score_for_scaling (script: 0.3, 0.8)")
    min_advantage_scale: float = Field(0.6, ge=0, le=1, description="ADPO's advantage scale at p_hat <= low "
                                                                    "(script: 0.6)")
    max_epsilon_bonus: float = Field(0.1, ge=0, description="ADPO's widest raise of the upper clip range, at "
                                                            "p_hat <= low (script: 0.1)")

    @model_validator(mode="after")
    def _check_trust_band(self) -> Agent0Params:
        low, high = self.trust_band
        if not 0.0 <= low < high <= 1.0:
            raise ValueError(f"trust_band {self.trust_band} must satisfy 0 <= low < high <= 1")
        return self


@register
class Agent0(RZero):
    name = "agent0"
    summary = ("curriculum and tool-using executor in alternating phases; curriculum GRPO on uncertainty + tool use - "
               "BLEU-cluster repetition; executor ADPO on frontier tasks with majority labels")
    Params = Agent0Params
    params: Agent0Params
    tool_instruction = EXECUTOR_PROMPT
    defaults = {"steps": 2 * (6 + 20), "eval_every": 26,
                "rollout": {"temperature": 1.0, "max_new_tokens": 64, "tools": ["python"], "max_tool_calls": 4},
                "train": {"lr": 3e-5, "grad_clip": 1.0}, "params": {"band": [0.3, 0.8]}}
    presets = {
        # 2 iterations of 2 curriculum and 4 executor steps on tiny-arith, which writes no Python: no tool calls
        "small": {"model": "tiny-arith", "task": "arith", "steps": 2 * (2 + 4), "eval_every": 6, "eval_limit": 50,
                  "train": SMALL_TRAIN, "rollout": {"max_tool_calls": 2},
                  "params": {"questioner_steps": 2, "solver_steps": 4, "questioner_prompts": 4,
                             "questioner_group": 4, "score_samples": 4, "pool_size": 32, "label_samples": 4,
                             "solver_questions": 4, "solver_group": 4}},
        "paper": {**PAPER_SCALE, "params": {**CODE_PARAMS, "reward_form": "paper", "tool_calls_of": "executor",
                                            "own_answer_gate": False, "label_with_tools": True}},
        "reference_code": {**PAPER_SCALE, "params": CODE_PARAMS},
    }

    def __init__(self, config, params: Agent0Params):
        super().__init__(config, params)
        self.label_with_tools = params.label_with_tools
        # the pool's votes: the executor's sampling, with the code's top_k 40, on the label budget
        self.label_sampling = self.solver_budget(
            replace(self.sampling, top_k=self.sampling.top_k if params.label_top_k is None else params.label_top_k),
            params.label_max_tokens or self.sampling.max_new_tokens)

    def solver_prompt(self, question: str) -> str:
        """The task's solver prompt; in the chat world with tools, after the executor's tool instruction."""
        message = self.task.solver_prompt(question, None, self.style)
        if self.style == "chat" and self.config.rollout.tools:
            message = f"{self.tool_instruction}\n\n{message}"
        return self.solver_policy.format_prompt(message)

    # --- curriculum phase: R_C ---------------------------------------------------------------------
    def questioner_rewards(self, questions: list[Question]) -> dict[str, float]:
        """R_C of every task (:func:`coevolve.rewards.questioner.agent0_rewards`), written on each; its metrics."""
        p = self.params
        scored = [ScoredQuestion(q.text, self.curriculum_p(q)) for q in questions]
        penalties = repetition_penalties(scored, p.repetition_threshold, self.bleu_tokens, p.repetition_weight)
        tools = tool_rewards([self.tool_counts(q) for q in questions], p.tool_weight, p.tool_cap)
        give_rewards(questions, agent0_rewards(scored, penalties, tools, p.reward_form))
        return {"rzero/repetition_mean": mean(penalties), "agent0/tool_reward_mean": mean(tools),
                "agent0/executor_tool_calls_mean": mean([n for q in questions for n in q.solver_tool_calls])}

    def curriculum_p(self, q: Question) -> float | None:
        """p_hat as the reward reads it; with ``own_answer_gate`` (the code's consolidate_and_grade) 0 unless the
        majority answer agrees with the curriculum's own answer and p_hat > 0.1."""
        if q.p is None or not self.params.own_answer_gate:
            return q.p
        agrees = q.label is not None and q.own_answer is not None and self.task.answers_agree(q.label, q.own_answer)
        return q.p if agrees and q.p > 0.1 else 0.0

    def tool_counts(self, q: Question) -> list[int]:
        """N_tool of a task: its executor episodes' tool calls, or the code's count of "```output" in the
        curriculum's own output."""
        if self.params.tool_calls_of == "curriculum":
            return [curriculum_tool_calls(q.output.text)]
        return q.solver_tool_calls

    # --- executor phase: ADPO -----------------------------------------------------------------------
    def solver_advantages(self, batch: list[PoolItem], terms: list[list[dict[str, float]]], group_ids: list[int],
                          ) -> tuple[list[float], list[float], list[float]]:
        """ADPO: reward +1 / -1 (agrees with the majority label or not, the code's torl reward), the GRPO advantage
        scaled by s(p_hat) of the episode's task, and the task's upper clip range."""
        p, (low, high) = self.params, self.params.trust_band
        rewards = [1.0 if x["agree"] else -1.0 for group_terms in terms for x in group_terms]
        base = compute_advantages(p.advantage, rewards, group_ids)
        advantages = [float(a) * ambiguity_scale(batch[g].p, low, high, p.min_advantage_scale)
                      for a, g in zip(base, group_ids)]
        clip = self.solver_trainer.settings.clip_low  # the code's clip_ratio, both ends' base
        clip_highs = [ambiguity_clip_high(batch[g].p, clip, low, high, p.max_epsilon_bonus) for g in group_ids]
        return rewards, advantages, clip_highs
