"""Dynamic RL ("All by Large Language Model Itself"): one policy writes its own questions and learns to answer them.

Algorithm 1 of the paper (anonymous submission, no arXiv id; §2), one step:
    3. sample n questions q_i ~ pi(.|z_0) from the fixed prompt z_0 (one group: all share z_0);
    4. sample m solutions s_ij ~ pi(.|q_i, z_q) for each question;
    5. majority vote: golden answer l(q), support r(q), p(q) = r(q)/m (Eq. 4, 5, 7);
    6. solution reward R_s = S_a(l(q), e(s)) (Eq. 6);
    7. question reward R_q = tent(p(q); tau) (Eq. 8);
    8. question diversity R_dq = 1 / sum_k S_q(q, q_k), positional token overlap (Eq. 10, 11);
    9. answer diversity R_da = 1 / sum_k S_a(l(q), l(q_k)) (Eq. 12);
   10. filtering: proofs, multi-part questions and leaked solutions get R_q = 0 and R_s = 0 (diversity stays);
   11. one update of pi on Eq. 14: A_q = sum of lambda-weighted z-scores of R_q, R_dq, R_da over the n questions, on
       the question tokens; A_s = lambda_s z-score of R_s over the m solutions of a question, on the solution tokens.

Malformed outputs (no question) are filtered, kept in the n-question statistics and not solved (the paper is silent on
them).
Our reading where the paper is silent: a malformed output's R_dq and R_da are the batch minimum over the well-formed
questions (:func:`coevolve.rewards.similarity.malformed_floor`); by Eq. 10 its empty text would otherwise have the
batch's highest R_dq and so the highest question advantage.

Step structure: the paper names no PPO mini-batches or epochs; ``paper`` takes one whole-batch AdamW step per step,
1 epoch (§3.1 gives none; inferred from the BNPO recipe), which also keeps Eq. 14's two means exact (``loss_terms``).
``policy/optimizer_steps`` logs the steps taken, ``<role>/advantage_abs_mean`` the advantage scale per role.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

from pydantic import Field

from coevolve.formats import Generation, GeneratorFormat, OutputParser, PromptBuilder, arith_format, one_line
from coevolve.grading.guard import parses_model_text
from coevolve.grading.vote import VoteResult, majority_vote
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
from coevolve.rewards.difficulty import tent_reward
from coevolve.rewards.filters import FILTER_RULES, filter_reasons
from coevolve.rewards.similarity import answer_diversity, malformed_floor, question_diversity
from coevolve.rl.advantages import decomposed_advantages
from coevolve.rl.trainer import TrainSample
from coevolve.rollout import Completion

# z_0, verbatim from the paper (§2 "Prompt"); the output's "Solution:" part is discarded.
Z0 = ("Generate exactly one math question and its step-by-step solution. The answer to the question should exist and "
      "be unique.\nFormat the output as follows:\nQuestion: <math question here>\nSolution: <step-by-step solution "
      "here>")
QUESTION_MARK, SOLUTION_MARK = "Question:", "Solution:"
QUESTION_TERMS = ("R_q", "R_dq", "R_da")


class DynamicRLParams(GeneratorParams):
    """Algorithm 1's inputs (n, m, tau, the lambdas) and the paper's ablations (Table 2) as switches."""

    n: int = Field(32, gt=1, description="questions per step (one group for the question rewards)")
    m: int = Field(16, gt=1, description="solutions per question (majority vote and GRPO group)")
    tau: float = Field(0.75, ge=0, le=1, description="peak of the tent question reward R_q (Eq. 8)")
    lambda_q: float = Field(1e-3, ge=0, description="weight of R_q in A_q")
    lambda_dq: float = Field(0.1, ge=0, description="weight of R_dq in A_q")
    lambda_da: float = Field(1.0, ge=0, description="weight of R_da in A_q")
    lambda_s: float = Field(1.0, ge=0, description="weight of R_s in A_s")
    question_reward: bool = Field(True, description="false: the 'w/o R_q' ablation (lambda_q taken as 0)")
    question_diversity: bool = Field(True, description="false: the 'w/o R_dq' ablation")
    answer_diversity: bool = Field(True, description="false: the 'w/o R_da' ablation")
    filtering: bool = Field(True, description="false: the 'w/o filtering' ablation (malformed outputs stay filtered)")
    broad_multi_part: bool = Field(False, description="filter any 'find ... and ...' sentence (paper's literal rule)")
    question_max_tokens: int = Field(48, gt=0, description="budget of a z_0 generation (paper: 1024)")
    unbiased_std: bool = Field(True, description="z-scores with the n-1 std (verl); false: population std")
    loss_terms: Literal["separate", "pooled"] = Field(
        "separate", description="separate: Eq. 14's two means (question and solution) summed; "
                                "pooled: one mean over all sequences of the step (verl batch)")


@dataclass
class GeneratedQuestion:
    """One o_i ~ pi(.|z_0) and everything a step computes for its question q_i."""

    output: Completion
    parsed: Generation  # no question: malformed
    solutions: list[Completion] = field(default_factory=list)
    answers: list[str | None] = field(default_factory=list)  # a_ij = e(s_ij)
    vote: VoteResult | None = None
    filtered: list[str] = field(default_factory=list)  # rules that fired ("malformed" included)
    rewards: dict[str, float] = field(default_factory=dict)  # R_q, R_dq, R_da
    solution_rewards: list[float] = field(default_factory=list)  # R_s(q, s_ij)
    advantage: float = 0.0  # A_q
    solution_advantages: list[float] = field(default_factory=list)  # A_s

    @property
    def text(self) -> str | None:
        return self.parsed.question

    @property
    def label(self) -> str | None:
        return self.vote.label if self.vote else None

    @property
    def solve_rate(self) -> float:
        """p(q) = r(q) / m (Eq. 7); 0 for a question that was not solved."""
        return self.vote.p if self.vote else 0.0


def parse_paper_question(completion: Completion, style: str = "chat", **_: Any) -> Generation:
    """q from the z_0 output: the text after the first "Question:" up to "Solution:" (paper §2 "Prompt").

    Malformed (no question): no "Question:", an empty question, or cut off by the length limit before "Solution:".
    """
    return Generation(_paper_question(completion.text, completion.finish_reason == "length"))


@parses_model_text()
def _paper_question(text: str, cut_off: bool) -> str | None:
    start = text.find(QUESTION_MARK)
    if start < 0:
        return None
    body = text[start + len(QUESTION_MARK):]
    end = body.find(SOLUTION_MARK)
    if end < 0 and cut_off:
        return None
    question = (body if end < 0 else body[:end]).strip()
    return question or None


@register
class DynamicRL(GeneratorRecipe[DynamicRLParams, PromptBuilder, OutputParser]):
    name = "dynamic_rl"
    summary = ("one policy writes questions from a fixed prompt and answers them; majority-vote labels, tent "
               "difficulty + token/answer diversity rewards, per-term z-scored advantages")
    roles = ("policy",)
    Params = DynamicRLParams
    formats: ClassVar[dict[str, GeneratorFormat[PromptBuilder, OutputParser]]] = {
        "chat": GeneratorFormat(  # z_0, the paper's prompt for free-form math; generation stops at "Solution:"
            lambda style, **_: Z0, parse_paper_question, stop=(SOLUTION_MARK,),
            description="Question: {the question}\\nSolution: {step-by-step solution} (generation stops at "
            "'Solution:')",
            regex=r"Question: [^\n]{10,300}\nSolution:",
            render=lambda e: f"Question: {one_line(e.question)}\nSolution: {e.solution}\nThe answer is {e.answer}."),
        "arith": arith_format(),  # the writer prompt
    }
    defaults = {
        "steps": 80, "eval_every": 20,
        "rollout": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 64},
        # Eq. 14: sequence log-likelihood (token sum, C = 1) averaged over samples; clip range of verl's BNPO recipe
        "train": {"lr": 5e-5, "loss_agg": "token_sum_norm", "norm_constant": 1, "clip_low": 0.2, "clip_high": 0.28},
    }
    presets = {
        "small": {  # tiny-arith: "W:" -> "Q:<expression>", solved as "Q:<expression>=?"; ~3 s a step on one core
            "model": "tiny-arith", "task": "arith", "steps": 120, "eval_every": 20,
            "params": {"n": 32, "m": 8, "question_max_tokens": 48},
        },
        "paper": {  # §3.1; the paper's models are Qwen2.5-Math-1.5B/7B (--set model=...)
            "model": "smollm2-135m", "task": "math", "steps": 1260,
            "rollout": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 3072},
            "train": {"lr": 1e-6, "kl_beta": 0.0, "grad_clip": 1.0, "micro_batch_size": 4, "mini_batch_size": 0,
                      "epochs": 1},
            "params": {"n": 32, "m": 16, "tau": 0.75, "lambda_q": 1e-3, "lambda_dq": 0.1, "lambda_da": 1.0,
                       "lambda_s": 1.0, "question_max_tokens": 1024},
            "eval_sets": ["math500", "gsm8k"], "eval_limit": 100, "eval_max_new_tokens": 3072, "eval_every": 50,
        },
    }

    def __init__(self, config, params: DynamicRLParams):
        super().__init__(config, params)
        self.policy = self.load_policy(self.generator_model())  # the model, or a format warm-up's
        self.trainer = self.make_trainer(self.policy, "policy")
        # z_0 in the run's task world (``formats``)
        self.z0 = self.generator_prompt(self.policy, self.generator_format.prompt(self.policy.prompt_style))
        self.question_sampling = self.generator_sampling(replace(self.sampling,
                                                                 max_new_tokens=params.question_max_tokens))
        self.equivalent = self.task.vote_equivalence  # S_a: exact for the toy world's integers, math-verify for math
        self.weights = {"R_q": params.lambda_q if params.question_reward else 0.0,
                        "R_dq": params.lambda_dq if params.question_diversity else 0.0,
                        "R_da": params.lambda_da if params.answer_diversity else 0.0}

    def step(self, step: int) -> StepOutput:
        p, timer, seed = self.params, PhaseTimer(), self.config.seed
        with timer("generate"):  # line 3: n questions from pi(.|z_0)
            outputs = self.sample_groups(self.policy, [self.z0], p.n, step_seed(seed, step, "questions"),
                                         self.question_sampling)[0]
            questions = [GeneratedQuestion(o, self.generator_format.parse(o, self.style)) for o in outputs]
            posed = [q for q in questions if q.text is not None]
        self.watch_format(step, len(posed), len(questions))
        with timer("solve"):  # line 4: m solutions from pi(.|q, z_q) per question
            prompts = [self.policy.format_prompt(self.task.solver_prompt(q.text, None, self.style)) for q in posed
                       if q.text is not None]
            for q, (solutions, answers) in zip(posed, self.solve_groups(self.policy, prompts, p.m,
                                                                        step_seed(seed, step, "solve"))):
                q.solutions, q.answers = solutions, answers
        with timer("reward"):
            for q in posed:
                q.vote = majority_vote(q.answers, self.equivalent)  # line 5: l(q), r(q) (Eq. 4, 5)
                q.solution_rewards = [float(agree) for agree in q.vote.agree]  # line 6: R_s (Eq. 6)
            r_q = [tent_reward(q.solve_rate, p.tau) for q in questions]  # line 7: R_q (Eq. 7, 8)
            malformed = [q.text is None for q in questions]
            r_dq = malformed_floor(question_diversity([self.question_tokens(q.text) for q in questions]),
                                   malformed)  # line 8: R_dq (Eq. 10, 11)
            raw_da = answer_diversity([q.label for q in questions], self.equivalent)
            r_da = malformed_floor(raw_da, malformed)  # line 9: R_da (Eq. 12)
            for q, *terms in zip(questions, r_q, r_dq, r_da):
                q.rewards = dict(zip(QUESTION_TERMS, terms))
                q.filtered = self.filter_rules(q.text)  # line 10: R_q <- 0, R_s <- 0 for filtered questions
                if q.filtered:
                    q.rewards["R_q"], q.solution_rewards = 0.0, [0.0] * len(q.solutions)
            self.advantages(questions)  # line 11: advantage decomposition (Eq. 14)
        with timer("update"):  # line 11: one update of the policy on both roles
            stats = self.trainer.update(self.train_batch(questions))
        metrics = {**self.step_metrics(questions),
                   "questions/unique_label_ratio": sum(raw_da) / p.n}  # Fig. 6: classes / n
        return StepOutput(metrics={**metrics, **role_metrics("policy", stats), **timer},
                          samples=self.records(step, questions))

    # --- the pieces of a step ---------------------------------------------------------------------------------
    def question_tokens(self, question: str | None) -> list[int]:
        """t(q) for S_q: the policy's tokens of the question text, no special tokens (Eq. 10 does not name a
        tokenizer)."""
        return self.policy.tokenizer(question, add_special_tokens=False)["input_ids"] if question else []

    def filter_rules(self, question: str | None) -> list[str]:
        """Why a question is filtered: "malformed" for no question, else the rules that fire (if filtering is on)."""
        if question is None:
            return ["malformed"]
        return filter_reasons(question, self.params.broad_multi_part) if self.params.filtering else []

    def advantages(self, questions: list[GeneratedQuestion]) -> None:
        """Eq. 14: A_q = sum_k lambda_k Z_n(R_k) over the n questions; A_s = lambda_s Z_m(R_s) within each question."""
        unbiased = self.params.unbiased_std
        a_q = decomposed_advantages({t: [q.rewards[t] for q in questions] for t in QUESTION_TERMS}, self.weights,
                                    [0] * len(questions), unbiased=unbiased)
        for q, a in zip(questions, a_q):
            q.advantage = float(a)
        solved = [(i, q) for i, q in enumerate(questions) if q.solutions]
        if not solved:
            return
        a_s = iter(decomposed_advantages({"R_s": [r for _, q in solved for r in q.solution_rewards]},
                                         {"R_s": self.params.lambda_s},
                                         [i for i, q in solved for _ in q.solutions], unbiased=unbiased))
        for _, q in solved:
            q.solution_advantages = [float(next(a_s)) for _ in q.solutions]

    def train_batch(self, questions: list[GeneratedQuestion]) -> list[TrainSample]:
        """A_q on each o_i's tokens (the question, plus "Solution:" where generation stops there), A_s on each s_ij's.

        The trainer averages over the pooled batch; with ``loss_terms="separate"`` each role's advantages are scaled
        by (batch size / role size) so the loss is Eq. 14's sum of a mean over questions and a mean over solutions
        (exact when one optimizer step takes the whole batch, as in the paper). A frozen generator is not trained.
        """
        generator = [] if self.config.frozen_generator else train_samples(
            [q.output for q in questions], [q.advantage for q in questions])
        solver = train_samples([s for q in questions for s in q.solutions],
                               [a for q in questions for a in q.solution_advantages])
        if self.params.loss_terms == "separate":
            total = len(generator) + len(solver)
            for part in (generator, solver):
                for sample in part:
                    sample.advantage *= total / len(part)
        return generator + solver

    def question_reward(self, q: GeneratedQuestion) -> float:
        """The generator's reward, Eq. 13's L_q integrand: lambda_q R_q + lambda_dq R_dq + lambda_da R_da."""
        return sum(self.weights[t] * q.rewards[t] for t in QUESTION_TERMS)

    def step_metrics(self, questions: list[GeneratedQuestion]) -> dict[str, Any]:
        """Mean rewards (Fig. 4), validity and filter rates, difficulty, advantage scale, tokens."""
        n = len(questions)
        posed = [q for q in questions if q.text is not None]
        r_s = [r for q in questions for r in q.solution_rewards]
        answers = [a for q in questions for a in q.answers]
        texts = [q.text for q in posed]
        return {
            "generator/reward_mean": mean([self.question_reward(q) for q in questions]),
            "solver/reward_mean": mean(r_s),
            **{f"reward/{t}": mean([q.rewards[t] for q in questions]) for t in QUESTION_TERMS},
            "reward/R_s": mean(r_s),
            **tool_use(self.config, [c for q in questions for c in q.solutions], [r > 0 for r in r_s]),
            "questions/valid_rate": len(posed) / n,
            "questions/filtered_rate": sum(bool(q.filtered) for q in questions) / n,
            **{f"questions/filter_{rule}": sum(rule in q.filtered for q in questions) / n for rule in FILTER_RULES},
            "questions/solve_rate_mean": mean([q.solve_rate for q in posed]),
            "questions/all_agree_rate": mean([float(q.vote.support == len(q.answers)) for q in posed if q.vote]),
            "questions/duplicate_rate": (len(texts) - len(set(texts))) / len(texts) if texts else float("nan"),
            "solver/none_rate": mean([float(a is None) for a in answers]),
            "generator/advantage_abs_mean": mean([abs(q.advantage) for q in questions]),
            "solver/advantage_abs_mean": mean([abs(a) for q in questions for a in q.solution_advantages]),
            "tokens/generator": sum(len(q.output.token_ids) for q in questions),
            "tokens/solver": sum(len(s.token_ids) for q in questions for s in q.solutions),
        }

    def records(self, step: int, questions: list[GeneratedQuestion]) -> list[SampleRow]:
        """One generator row per o_i and one solver row per s_ij (the run-dir sample schema)."""
        rows: list[SampleRow] = []
        for i, q in enumerate(questions):
            qid, answer = f"s{step}-q{i}", q.parsed.answer
            rows.append(generator_row(
                step, None, "generate", q.output, question=q.text, question_id=qid, valid=q.text is not None,
                answer=answer, label=q.label, label_source="majority", solve_rate=q.solve_rate if q.vote else None,
                reward=self.question_reward(q), reward_terms=q.rewards, advantage=q.advantage,
                oracle=self.task.oracle(q.text, None, answer, q.label),
                extra={"filtered": q.filtered, "support": q.vote.support if q.vote else 0}))
            rows += [solver_row(
                step, None, "solve", s, question=q.text, question_id=qid, answer=a, label=q.label,
                label_source="majority", solve_rate=q.solve_rate, reward=r, reward_terms={"R_s": r}, advantage=adv,
                oracle=self.task.oracle(q.text, None, a, q.label),
            ) for s, a, r, adv in zip(q.solutions, q.answers, q.solution_rewards, q.solution_advantages)]
        return rows
