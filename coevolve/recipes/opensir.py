r"""OpenSIR: one policy plays teacher and student, seeded by a growing pool of its own problems.

Paper: OpenSIR: Open-Ended Self-Improving Reasoner (anonymous submission, no arXiv id; §2, Algorithm 1); released
code: ``EdinburghNLP/OpenSIR``. Per step t:

Problem generation (lines 2-6)
    1. draw k reference problems p_1..p_k from the pool P_{t-1}, uniformly with replacement;
    2. the policy, prompted as teacher with p_i, writes G problems q_{i,1..G} (one teacher group);
    3. Q_valid = the format-valid problems.
Solution sampling (lines 7-13)
    4. the policy, prompted as student, solves each q in Q_valid G times;
    5. majority vote a*_q and solve rate s_q = count(a*_q) / G (Eq. 1); mean solution length.
Scoring and selection (lines 14-17)
    6. score_novel(q) = alpha sol + lambda len + gamma div + delta fmt (Eqs. 2-5); 0 for invalid outputs;
    7. teacher: the B/(2G) groups with the largest Var_j score_novel(q_{i,j});
       student: the B/(2G) problems with the largest score_novel;
    8. R^T = score_novel (Eq. 9); R^S = 1[a_j = a*] + delta fmt^S (Eq. 6).
Model update (lines 18-21)
    9. group-relative advantages per role (Eq. 8) and one GRPO step on D_T ∪ D_S (Eq. 7);
   10. P_t = P_{t-1} ∪ Q_valid.

The generation count follows the paper: k = B/G groups (``teacher_upscale`` = 2 generated groups per trained
one), so B/2 teacher and B/2 student sequences enter each update.

Tasks, paper vs released code, step structure, presets and ablations: ``docs/recipes/opensir.md``.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
from pydantic import Field, model_validator

from coevolve.config import ConfigError
from coevolve.embeddings import embed
from coevolve.formats import LINE, Generation, GeneratorFormat, concepts_of, one_line
from coevolve.grading.equivalence import verify_equivalent
from coevolve.grading.vote import VoteResult, majority_vote
from coevolve.models import Policy
from coevolve.pool import ProblemPool
from coevolve.recipes.base import (
    PhaseTimer,
    StepOutput,
    mean,
    register,
    role_metrics,
    step_seed,
    train_samples,
)
from coevolve.recipes.generator import GeneratorParams, GeneratorRecipe
from coevolve.records import SampleRow, generator_row, solver_row
from coevolve.rewards.difficulty import triangular_solvability
from coevolve.rewards.format import (
    StudentFormat,
    TeacherRules,
    length_score,
    parse_teacher_output,
    student_format_score,
)
from coevolve.rewards.novelty import (
    DiversityMode,
    PoolEmbeddings,
    concept_novelty,
    expression_concepts,
    group_variance,
    min_distance_diversity,
    novelty_score,
    top_indices,
    top_k_mean_diversity,
)
from coevolve.rl.advantages import compute_advantages
from coevolve.rl.trainer import TrainSample
from coevolve.rollout import Completion
from coevolve.tasks import arith
from coevolve.tasks.registry import Task

TERMS = ("sol", "len", "div", "fmt")  # the four components of score_novel (Eq. 5)

# p_T (Fig. 21; the system line "You are a helpful AI Assistant" is folded into the user turn).
TEACHER_PROMPT = """You are a helpful AI Assistant.

You are given a math problem: {problem}

Your task is to create a math problem that is conceptually different from the provided problem. \
The new problem must be answerable with a numerical value or mathematical expression.

First, explain how your new problem differs conceptually from the original problem inside the <think>...</think> \
tags. Then, present your new problem inside the <problem>...</problem> tags. Finally, identify at most three math \
concepts required to solve your problem. Provide these concepts in a comma separated list inside the \
<concepts>...</concepts> tags."""

# p_S (Fig. 22; system text, then the problem).
STUDENT_PROMPT = """You are a helpful AI Assistant, designed to provide well-reasoned and detailed responses. \
You FIRST think about the reasoning process step by step and then provide the user with the answer. The last line \
of your response should be 'Therefore, the final answer is: $\\boxed{ANSWER}$' (without quotes) where ANSWER is \
just the final number or expression that solves the problem.

{problem}"""


# The paper's scale on the one offline chat model (GPU-scale: hours per step on a CPU).
_PAPER_SCALE: dict[str, Any] = {
    "model": "smollm2-135m", "task": "math", "steps": 200,
    "rollout": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 2048},
    "train": {"lr": 3e-7, "kl_beta": 1e-4, "grad_clip": 0.5, "micro_batch_size": 4, "mini_batch_size": 0, "epochs": 1},
    "eval_sets": ["gsm8k", "math500"], "eval_limit": 100, "eval_max_new_tokens": 512, "eval_every": 50,
}


class TeacherPromptBuilder(Protocol):
    """The teacher's user message: ``prompt(style, reference=...)`` for the pool problem it starts from."""

    def __call__(self, style: str, /, *, reference: str) -> str: ...


class TeacherOutputParser(Protocol):
    """The reading of one teacher output under ``params.teacher_rules``."""

    def __call__(self, output: Completion, style: str, /, *, rules: TeacherRules) -> Generation: ...


def read_teacher_output(output: Completion, style: str, rules: TeacherRules, **_: Any) -> Generation:
    """The problem, concepts, validity and format score of one teacher output (Fig. 21's tags)."""
    read = parse_teacher_output(output.text, rules)
    return Generation(read.problem, concepts=read.concepts, format_score=read.format_score, rejected=not read.valid)


def read_arith_problem(output: Completion, style: str, **_: Any) -> Generation:
    """The arithmetic world's writer output: the question, the operations it uses as its concepts, format 1."""
    parsed = arith.parse_question(output.text, style)
    if parsed is None:
        return Generation(None)
    return Generation(parsed.question, concepts=expression_concepts(parsed.question), format_score=1.0)


@dataclass(frozen=True)
class StudentWorld:
    """OpenSIR's other pieces of a task world: P_0, the concepts of a problem its writer listed none for (the seed),
    the student's prompt, and its format score score_fom^S (Eq. 6)."""

    seed: str
    concepts: Callable[[str], tuple[str, ...]]
    prompt: Callable[[Task, str, str], str]  # (task, problem, style) -> the student's user message
    format_score: Callable[[str, str | None, StudentFormat], float]  # (solution, its parsed answer, the rule)


STUDENT_WORLDS = {
    "chat": StudentWorld("What is 1+1?", lambda problem: (),
                         lambda task, problem, style: STUDENT_PROMPT.replace("{problem}", problem),  # Fig. 22
                         lambda text, answer, rule: student_format_score(text, rule)),
    "arith": StudentWorld("1+1", expression_concepts,
                          lambda task, problem, style: task.solver_prompt(problem, None, style),
                          lambda text, answer, rule: float(answer is not None)),  # the world's answer format
}


class OpenSIRParams(GeneratorParams):
    batch_size: int = Field(256, gt=0, description="B, rollouts per update: B/(2G) teacher groups + B/(2G) problems")
    group_size: int = Field(8, gt=1, description="G, problems per reference and solutions per problem")
    teacher_upscale: int = Field(2, ge=1, description="teacher groups generated per group trained (k = this*B/(2G))")
    seed_problem: str | None = Field(None, description="P_0; default 'What is 1+1?' (chat) or '1+1' (tiny-arith)")
    s_min: float = Field(0.5, ge=0, le=1, description="solve-rate range [s_min, s_max] of Eq. 2")
    s_max: float = Field(0.9, ge=0, le=1, description="upper end of Eq. 2's solve-rate range (share of the G "
                         "solutions that agree with the vote; paper and code: 0.9)")
    sol_edge: Literal["inv_group", "inv_levels"] = Field("inv_group", description="triangle end: 1/G or 1/#levels")
    solve_rate_denominator: Literal["group", "parsed"] = Field("group", description="G or #parsed answers")
    w_sol: float = Field(1.0, ge=0, description="alpha, solvability weight (Eq. 5)")
    w_len: float = Field(1.0, ge=0, description="lambda, solution-length weight (0: no-length ablation)")
    w_div: float = Field(1.0, ge=0, description="gamma, diversity weight (0: no-diversity ablation)")
    w_fmt: float = Field(0.1, ge=0, description="delta, teacher format weight")
    student_fmt_weight: float = Field(0.1, ge=0, description="delta of Eq. 6, student format weight")
    l_base: float = Field(1000.0, gt=0, description="Eq. 3 normaliser, tokens")
    l_cap: float | None = Field(1000.0, gt=0, description="Eq. 3 cap, tokens (not in the paper; code: 1000)")
    diversity: DiversityMode = Field(
        "min_pool", description="div of Eq. 5: min_pool, the least cosine distance of the problem's embedding to the "
        "pool P_{t-1} (paper); top5_batch_and_pool, (1 - mean cosine similarity to its top-k neighbours in the batch "
        "and pool) / 2 (released code, docs item 5); concepts, concept novelty (Eq. 10 ablation)")
    top_k_neighbours: int = Field(5, gt=0, description="k of the top5_batch_and_pool variant")
    encoder: str | None = Field(None, description="sentence-transformers folder; default: packaged all-MiniLM-L6-v2")
    selection_score: Literal["novelty", "sol_div"] = Field(
        "novelty", description="the score that ranks teacher groups and student problems (Algorithm lines 15-16): "
        "novelty, score_novel of Eq. 5 (paper); sol_div, w_sol * sol + w_div * div (released code, docs item 8)")
    teacher_variance: Literal["all", "valid_only"] = Field(
        "all", description="Var_j of a teacher group's selection scores: all, over its G outputs with invalid ones "
        "at 0 (paper); valid_only, over the valid ones, -1 when none (released code, docs item 11)")
    selection_scope: Literal["global", "chunked"] = Field(
        "global", description="global: the B/(2G) teacher groups and problems with the highest scores over the "
        "batch (paper); chunked: one group and one problem per chunk of teacher_upscale groups (released code, "
        "docs item 9)")
    train_roles: Literal["both", "student", "teacher"] = Field(
        "both", description="roles that update: both; student (teacher frozen at its initial weights, the §4.4 "
        "ablation, as frozen_generator does); teacher")
    teacher_rules: TeacherRules = Field(
        "paper", description="how a teacher output is read and its format scored: paper, <problem> (or <question>) "
        "and at most 3 concepts (§2.3.1); code, the released parse_xml rules, whose format score needs <think> "
        "(docs item 10)")
    student_format: StudentFormat = Field(
        "boxed", description="the student's format score (Eq. 6): boxed, the answer in \\boxed{} (paper); phrase, "
        "'Therefore, the final answer is: ...' (released code, docs item 16); tiny-arith: its own answer format")
    vote: Literal["fast", "verify"] = Field("fast", description="answer equivalence of the majority vote")
    adv_eps: float = Field(1e-4, gt=0, description="epsilon of the group std (code: 1e-4)")

    @model_validator(mode="after")
    def _check(self) -> OpenSIRParams:
        if self.batch_size % (2 * self.group_size):
            raise ValueError(f"batch_size {self.batch_size} must be a multiple of 2 * group_size")
        if not self.s_min < self.s_max:
            raise ValueError(f"s_min {self.s_min} must be below s_max {self.s_max}")
        return self


@dataclass
class Candidate:
    """One teacher output q_{i,j} of group i, what the student made of it, and both roles' rewards."""

    group: int
    index: int  # j within the group
    completion: Completion
    parsed: Generation
    solutions: list[Completion] = field(default_factory=list)
    answers: list[str | None] = field(default_factory=list)
    vote: VoteResult | None = None
    solve_rate: float | None = None
    terms: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TERMS, 0.0))  # 0 when invalid
    novelty: float = 0.0  # score_novel = R^T; 0 for an invalid output
    selection: float = 0.0  # what selection ranks by (score_novel, or sol + div in the code)
    advantage: float | None = None  # A^T, when its group is trained
    student_terms: list[dict[str, float]] = field(default_factory=list)  # correct, format per solution
    student_rewards: list[float] = field(default_factory=list)  # R^S per solution, when selected for the student
    student_advantages: list[float] = field(default_factory=list)

    @property
    def question(self) -> str:
        """q_{i,j} of a valid output (a ValueError for an invalid one, which has none)."""
        if self.parsed.question is None:
            raise ValueError("an invalid teacher output has no question")
        return self.parsed.question

    @property
    def label(self) -> str | None:
        """The student's majority answer, once voted."""
        return self.vote.label if self.vote else None


@register
class OpenSIR(GeneratorRecipe[OpenSIRParams, TeacherPromptBuilder, TeacherOutputParser]):
    name = "opensir"
    summary = "one policy as teacher and student; pool-seeded problems; novelty = solvability+length+diversity+format"
    roles = ("policy",)
    Params = OpenSIRParams
    formats: ClassVar[dict[str, GeneratorFormat[TeacherPromptBuilder, TeacherOutputParser]]] = {
        "chat": GeneratorFormat(
            lambda style, reference, **_: TEACHER_PROMPT.replace("{problem}", reference), read_teacher_output,
            description="<think>{how it differs}</think>\\n<problem>{the problem}</problem>\\n<concepts>{1-3 "
            "concepts, comma separated}</concepts>",
            regex=r"<think>[^<>\n]{0,120}</think>\n<problem>" + LINE
            + r"</problem>\n<concepts>[a-z ]{3,30}(, [a-z ]{3,30}){0,2}</concepts>",
            render=lambda e: (f"<think>A word problem that needs {' and '.join(concepts_of(e))}.</think>\n"
                              f"<problem>{one_line(e.question)}</problem>\n"
                              f"<concepts>{', '.join(concepts_of(e))}</concepts>"),
            warmup_inputs=lambda e, examples, rng: {"reference": rng.choice(examples).question}),  # another one's
        "arith": GeneratorFormat(lambda style, reference, **_: arith.question_prompt(style, examples=[reference]),
                                 read_arith_problem),
    }
    defaults = {"steps": 100, "rollout": {"max_new_tokens": 64, "batch_size": 256},
                "train": {"lr": 5e-5, "kl_beta": 1e-3, "grad_clip": 0.5, "loss_agg": "seq_mean"},
                "eval_every": 25, "params": {"batch_size": 64, "l_base": 64, "l_cap": 64}}
    presets = {
        "small": {"model": "tiny-arith", "task": "arith", "steps": 150},  # ~2.5 s a step on one core
        "paper": {**_PAPER_SCALE, "train": {**_PAPER_SCALE["train"], "loss_agg": "seq_mean"},
                  "params": {"batch_size": 256, "group_size": 8, "l_base": 1000, "l_cap": 1000}},
        "reference_code": {
            **_PAPER_SCALE, "train": {**_PAPER_SCALE["train"], "loss_agg": "token_mean"},
            "params": {"batch_size": 256, "group_size": 8, "l_base": 1000, "l_cap": 1000,
                       "sol_edge": "inv_levels", "solve_rate_denominator": "parsed",
                       "diversity": "top5_batch_and_pool", "selection_score": "sol_div",
                       "teacher_variance": "valid_only", "selection_scope": "chunked", "teacher_upscale": 4,
                       "teacher_rules": "code", "student_format": "phrase"},
        },
    }

    @classmethod
    def check_settings(cls, config, params: OpenSIRParams) -> None:
        super().check_settings(config, params)
        if config.frozen_generator and params.train_roles == "teacher":
            raise ConfigError("config key 'params.train_roles': 'teacher' trains only the teacher, and "
                              "frozen_generator=true freezes it; drop one of them")

    def __init__(self, config, params: OpenSIRParams):
        super().__init__(config, params)
        self.trained_roles = "student" if config.frozen_generator else params.train_roles
        self.policy = self.load_policy(self.generator_model())  # the model, or a format warm-up's
        self.student = STUDENT_WORLDS[self.world]
        # Student-only ablation (§4.4): the teacher stays the policy frozen at its initial state.
        self.teacher = (Policy(self.policy.name, copy.deepcopy(self.policy.model), self.policy.tokenizer,
                               self.policy.prompt_style) if self.trained_roles == "student" else self.policy)
        self.trainer = self.make_trainer(self.policy, "policy")
        self.teacher_sampling = self.generator_sampling(self.sampling)
        self.n_selected = params.batch_size // (2 * params.group_size)  # B/(2G) per role
        self.n_groups = self.n_selected * params.teacher_upscale  # k
        seed = params.seed_problem or self.student.seed
        self.pool = ProblemPool([seed], concepts=[self.student.concepts(seed)])
        self.embed_texts = partial(embed, path=params.encoder)
        self.pool_embeddings = PoolEmbeddings(lambda texts: self.embed_texts(texts))

    def state_dict(self):
        return {"pool": self.pool.state_dict()}

    def load_state_dict(self, state):
        self.pool.load_state_dict(state["pool"])
        self.pool_embeddings.clear()

    # --- Algorithm 1 ------------------------------------------------------------------------------
    def step(self, step: int) -> StepOutput:
        G, timer, seed = self.params.group_size, PhaseTimer(), self.config.seed

        # Problem generation: k references from P_{t-1}, G problems each; Q_valid.
        references = self.pool.sample(random.Random(step_seed(seed, step, "references")), self.n_groups)
        with timer("generate"):
            prompts = [self.generator_prompt(self.teacher, self.generator_format.prompt(self.teacher.prompt_style,
                                                                                      reference=r))
                       for r in references]
            groups = self.sample_groups(self.teacher, prompts, G, step_seed(seed, step, "generate"),
                                        self.teacher_sampling)
        candidates = [Candidate(i, j, c, self.generator_format.parse(c, self.style, rules=self.params.teacher_rules))
                      for i, group in enumerate(groups) for j, c in enumerate(group)]
        valid = [c for c in candidates if c.parsed.valid]
        self.watch_format(step, len(valid), len(candidates))

        # Solution sampling: G solutions per valid problem, majority vote, solve rate.
        with timer("solve"):
            solutions = self.sample_groups(self.policy, [self.student_prompt(c.question) for c in valid], G,
                                           step_seed(seed, step, "solve"))
            for c, sols in zip(valid, solutions):
                self.label(c, sols)

        # Scoring: novelty against P_{t-1}; selection of teacher groups and student problems.
        with timer("score"):
            diversity, embeddings = self.diversity([c.parsed for c in valid])
            for c, div in zip(valid, diversity):
                self.score(c, float(div))
            teacher_groups, student_problems = self.select(candidates)

        # Model update: R^S (Eq. 6; R^T = score_novel), advantages per role (Eq. 8), one GRPO step on D_T ∪ D_S.
        d_t = [c for c in candidates if c.group in teacher_groups] if valid else []  # no valid problem: no signal
        for c in student_problems:
            self.reward_student(c)
        self.advantages(d_t, student_problems)
        with timer("update"):
            stats = self.trainer.update(self.training_batch(d_t, student_problems))

        # P_t = P_{t-1} ∪ Q_valid.
        self.pool.add([c.question for c in valid], step, [c.parsed.concepts for c in valid])
        if embeddings is not None:
            self.pool_embeddings.append(embeddings)

        return StepOutput(metrics=self.metrics(candidates, valid, teacher_groups, student_problems, stats, timer),
                          samples=self.records(step, references, candidates, student_problems))

    # --- the student's prompt (Fig. 22; the task's own in the arithmetic world) -----------------
    def student_prompt(self, problem: str) -> str:
        return self.policy.format_prompt(self.student.prompt(self.task, problem, self.style))

    # --- labels, scores, selection, student reward ------------------------------------------------
    def label(self, c: Candidate, solutions: list[Completion]) -> None:
        """Majority answer a*_q and solve rate s_q (Eq. 1; the code divides by the parsed answers)."""
        c.solutions = solutions
        c.answers = [self.task.parse_answer(s.text, self.policy.prompt_style) for s in solutions]
        c.vote = majority_vote(c.answers, verify_equivalent if self.params.vote == "verify" else None)
        if self.params.solve_rate_denominator == "group":
            c.solve_rate = c.vote.p
        else:
            c.solve_rate = c.vote.support / c.vote.n_valid if c.vote.n_valid else None

    def diversity(self, problems: list[Generation]) -> tuple[np.ndarray, np.ndarray | None]:
        """score_div of each valid problem against P_{t-1} (Eq. 4, the code's top-5 variant or Eq. 10), and the
        problems' embeddings (cached when they join the pool)."""
        p = self.params
        if p.w_div == 0 or not problems:
            return np.zeros(len(problems)), None
        if p.diversity == "concepts":
            pool_concepts = self.pool.concepts
            return np.array([concept_novelty(q.concepts, pool_concepts) for q in problems]), None
        vectors = self.embed_texts([q.question for q in problems if q.question is not None])
        pool = self.pool_embeddings.matrix(self.pool)
        if p.diversity == "min_pool":
            return min_distance_diversity(vectors, pool), vectors
        return top_k_mean_diversity(vectors, pool, p.top_k_neighbours), vectors

    def score(self, c: Candidate, div: float) -> None:
        """score_novel (Eq. 5) from solvability (Eq. 2), length (Eq. 3), diversity and format."""
        p = self.params
        sol = (triangular_solvability(c.solve_rate, p.s_min, p.s_max, group_size=p.group_size, edge=p.sol_edge)
               if c.solve_rate is not None else 0.0)
        length = length_score(mean([len(s.token_ids) for s in c.solutions]), p.l_base, p.l_cap)
        c.terms = {"sol": sol, "len": length, "div": div, "fmt": c.parsed.format_score}
        c.novelty = novelty_score(sol, length, div, c.parsed.format_score, w_sol=p.w_sol, w_len=p.w_len,
                                  w_div=p.w_div, w_fmt=p.w_fmt)
        c.selection = c.novelty if p.selection_score == "novelty" else p.w_sol * sol + p.w_div * div

    def select(self, candidates: list[Candidate]) -> tuple[set[int], list[Candidate]]:
        """Teacher groups with the largest Var_j of the selection score and student problems with the largest
        score (lines 15-16): B/(2G) each over the batch, or one each per chunk of ``teacher_upscale`` groups."""
        p, G = self.params, self.params.group_size
        if p.selection_scope == "global":
            chunks, per_chunk = [range(self.n_groups)], self.n_selected
        else:
            chunks, per_chunk = [range(i, i + p.teacher_upscale) for i in range(0, self.n_groups, p.teacher_upscale)], 1
        teacher_groups: set[int] = set()
        student_problems: list[Candidate] = []
        for chunk in chunks:
            members = [candidates[g * G:(g + 1) * G] for g in chunk]
            variances = [group_variance([c.selection for c in m], [c.parsed.valid for c in m]
                                        if p.teacher_variance == "valid_only" else None) for m in members]
            teacher_groups.update(chunk[i] for i in top_indices(variances, per_chunk))
            eligible = [c for m in members for c in m if c.parsed.valid]
            student_problems += [eligible[i] for i in top_indices([c.selection for c in eligible], per_chunk)]
        return teacher_groups, student_problems

    def reward_student(self, c: Candidate) -> None:
        """R^S_j = 1[a_j = a*] + delta * score_fom^S(o_j) (Eq. 6) for each of the G solutions."""
        if c.vote is None:
            raise ValueError("a student problem has the student's vote")
        for solution, answer, agree in zip(c.solutions, c.answers, c.vote.agree):
            fmt = self.student.format_score(solution.text, answer, self.params.student_format)
            c.student_terms.append({"correct": float(agree), "format": fmt})
            c.student_rewards.append(float(agree) + self.params.student_fmt_weight * fmt)

    def advantages(self, d_t: list[Candidate], student_problems: list[Candidate]) -> None:
        """Group-relative advantages (Eq. 8): A^T within each selected teacher group, A^S within the G solutions of
        each selected problem (unbiased std + eps, as the code)."""
        eps, G = self.params.adv_eps, self.params.group_size
        for c, a in zip(d_t, compute_advantages("grpo", [c.novelty for c in d_t], [c.group for c in d_t], eps=eps)):
            c.advantage = float(a)
        flat = compute_advantages("grpo", [r for c in student_problems for r in c.student_rewards],
                                  [i for i, c in enumerate(student_problems) for _ in c.student_rewards], eps=eps)
        for i, c in enumerate(student_problems):
            c.student_advantages = flat[i * G:(i + 1) * G].tolist()

    def training_batch(self, d_t: list[Candidate], student_problems: list[Candidate]) -> list[TrainSample]:
        """D_T ∪ D_S, without the role an ablation leaves untrained."""
        samples = []
        if self.trained_roles in ("both", "teacher"):
            trained = [(c.completion, c.advantage) for c in d_t if c.advantage is not None]
            samples += train_samples([completion for completion, _ in trained], [a for _, a in trained])
        if self.trained_roles in ("both", "student"):
            samples += train_samples([s for c in student_problems for s in c.solutions],
                                     [a for c in student_problems for a in c.student_advantages])
        return samples

    # --- records and metrics ----------------------------------------------------------------------
    def records(self, step: int, references: list[str], candidates: list[Candidate],
                student_problems: list[Candidate]) -> list[SampleRow]:
        """Sample records: every teacher output (role generator) and the solutions of the student problems."""
        qid = {id(c): f"s{step}-g{c.group}-{c.index}" for c in candidates}
        chosen = {id(c) for c in student_problems}
        rows = []
        for c in candidates:
            label = c.label
            rows.append(generator_row(
                step, None, "generate", c.completion, question=c.parsed.question, question_id=qid[id(c)],
                valid=c.parsed.valid, answer=None, label=label, label_source="majority", solve_rate=c.solve_rate,
                reward=c.novelty, reward_terms=c.terms, advantage=c.advantage,
                oracle=self.task.oracle(c.parsed.question, None, None, label) if c.parsed.valid else None,
                extra={"reference": references[c.group], "concepts": list(c.parsed.concepts),
                       "mean_solution_tokens": mean([len(s.token_ids) for s in c.solutions]) if c.solutions else None,
                       "selected": c.advantage is not None, "student_selected": id(c) in chosen}))
        for c in student_problems:
            for s, answer, terms, reward, adv in zip(c.solutions, c.answers, c.student_terms, c.student_rewards,
                                                     c.student_advantages):
                rows.append(solver_row(
                    step, None, "solve", s, question=c.parsed.question, question_id=qid[id(c)], answer=answer,
                    label=c.label, label_source="majority", solve_rate=c.solve_rate, reward=reward,
                    reward_terms=terms, advantage=adv,
                    oracle=self.task.oracle(c.parsed.question, None, answer, c.label)))
        return rows

    def metrics(self, candidates: list[Candidate], valid: list[Candidate], teacher_groups: set[int],
                student_problems: list[Candidate], stats: dict, timer: PhaseTimer) -> dict:
        p = self.params
        rates = [c.solve_rate for c in valid if c.solve_rate is not None]
        solutions = [s for c in valid for s in c.solutions]
        student_terms = [t for c in student_problems for t in c.student_terms]
        return {
            "generator/reward_mean": mean([c.novelty for c in candidates]),
            "solver/reward_mean": mean([r for c in student_problems for r in c.student_rewards]),
            **{f"reward/{k}": mean([c.terms[k] for c in candidates]) for k in TERMS},
            "reward/correct": mean([t["correct"] for t in student_terms]),
            "reward/student_format": mean([t["format"] for t in student_terms]),
            "questions/valid_rate": len(valid) / len(candidates),
            "opensir/in_window": sum(p.s_min <= r <= p.s_max for r in rates),
            "solve_rate/all": mean(rates),
            "solve_rate/teacher_selected": mean([c.solve_rate for c in valid
                                                 if c.group in teacher_groups and c.solve_rate is not None]),
            "solve_rate/student_selected": mean([c.solve_rate for c in student_problems
                                                 if c.solve_rate is not None]),
            "pool/size": len(self.pool), "pool/concepts": len(self.pool.concepts),
            "tokens/generator": sum(len(c.completion.token_ids) for c in candidates),
            "tokens/solver": sum(len(s.token_ids) for s in solutions),
            "length/generator": mean([len(c.completion.token_ids) for c in candidates]),
            "length/solver": mean([len(s.token_ids) for s in solutions]),
            "generator/advantage_abs_mean": mean([abs(c.advantage) for c in candidates if c.advantage is not None]),
            "solver/advantage_abs_mean": mean([abs(a) for c in student_problems for a in c.student_advantages]),
            **role_metrics("policy", stats), **timer,
        }
