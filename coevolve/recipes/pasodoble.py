r"""PasoDoble: a knowledge-grounded Proposer writes questions with its own answers; a Solver learns to agree.

Paper: Better LLM Reasoning via Dual-Play (Zhang et al., arXiv:2511.11881; Algorithms 1 and 2, App. F-G); released
code: ``HCY123902/PasoDoble``. Two models from the same start, each with its own AdamW.

PROPOSE_AND_SCORE (§3.3-3.4), for each of ``passages_per_step`` passages k ~ Uniform(𝒦):
    1. the Proposer writes I completions for k, each one question q_i with its answer a_i* (one GRPO group);
    2. the Solver answers each question J times; r^s_ij = 1[a_ij ≡ a_i*];
    3. pass rate p_i = mean_j r^s_ij, set to 0 by the leak check (released code only);
    4. r^div_i = share of the history H not Jaccard-similar to q_i (§3.3); H takes the new questions;
    5. r^p_i = (1.1 - p_i) + w r^div_i if p_i > tau_low and r^div_i >= tau_div, else 0 (§3.3);
    6. retained_i = tau_low < p_i < 1 (§3.4).
Online (Algorithm 1): one PROPOSE_AND_SCORE per step; skip the step when no question is retained (and, with
``skip_zero_advantages``, the released code's rule, when every Proposer advantage is 0); else GRPO-update the Proposer
on all I proposals per passage, then the Solver on the J solutions of each retained question.
Offline (Algorithm 2): T_P Proposer steps (Solver frozen) push their retained questions into the question buffer 𝓑;
then T_S Solver steps (Proposer frozen) replay the next ``replay_batch`` buffered questions circularly, re-solve them,
keep those whose current p is in (tau_low, 1) and update the Solver. Only updates count towards T_P and T_S (code);
``max_skips`` consecutive skipped Solver steps end a Solver phase early (our guard against an endless loop);
optional eviction (App. D) drops a question at p = 1 or after ``eviction_patience`` replays without a new peak.

Each loop step is one iteration, skipped ones included, so ``steps`` caps the iterations; the paper counts successful
updates (600 online, App. B): ``max_updates`` (600 in ``paper``) is the number of updates after which the run stops
(online: joint updates; offline: Proposer and Solver updates); ``summary.json`` states the schedule the run had.
``skipped`` marks skipped iterations, ``updates`` counts the updates so far, and ``<role>/optimizer_steps`` gives
each role's AdamW steps.

Tasks, paper vs released code, step structure, presets and ablations: ``docs/recipes/pasodoble.md``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

from pydantic import Field

from coevolve.documents import DocumentPool, check_document_source, load_documents, tokenizer_counter
from coevolve.formats import (
    ANSWER,
    LINE,
    MAX_SOLUTION_CHARS,
    DocumentOutputParser,
    DocumentPromptBuilder,
    Generation,
    GeneratorFormat,
    grounded_arith_format,
    one_line,
)
from coevolve.grading.extract import extract_boxed, tag_blocks
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
from coevolve.rewards.pasodoble import DiversityGate, JaccardHistory, LeakMode, leaks_answer, proposer_reward
from coevolve.rl.advantages import compute_advantages
from coevolve.rollout import Completion
from coevolve.tasks.registry import get_task

# Proposer prompt (paper Fig. 11, App. I, with the released code's output format); the system text is folded into
# the user turn, since the chat template takes one user message here.
PROPOSER_PROMPT = (
    "You are the proposer in a proposer-solver game. Create a challenging, well-structured, diverse and unambiguous "
    "math problem with a verifiable answer, using the provided external knowledge and your own knowledge as context."
    "\nPut the problem statement inside <problem>...</problem>. Then put a detailed step-by-step solution with a brief "
    "check inside <answer>...</answer>, with the final answer in \\boxed{{}} inside the answer section.\n\n"
    "{knowledge}Now write one problem and its answer.")
KNOWLEDGE = "External knowledge: {passage}\n\n"
_THINK_END = "</think>"
TOKEN_PAIR_BASE = 1_000_003  # a prime above any vocabulary size: a pair of token ids (a, b) is a * base + b


# The paper's scale on the one offline chat model (GPU-scale: hours per step on a CPU).
_PAPER_SCALE: dict[str, Any] = {
    "model": "smollm2-135m", "task": "math", "steps": 600, "eval_every": 40,
    "rollout": {"temperature": 0.6, "top_p": 1.0, "max_new_tokens": 6144},
    "train": {"lr": 1e-6, "kl_beta": 0.0, "grad_clip": 1.0, "micro_batch_size": 2},
    "eval_sets": ["gsm8k", "math500"], "eval_limit": 100, "eval_max_new_tokens": 6144,
    "roles": {"proposer": {"mini_batch_size": 0, "epochs": 1}, "solver": {"mini_batch_size": 0, "epochs": 1}},
    "params": {"proposer_max_tokens": 6144, "knowledge_source": "openstax"},
}


class PasoDobleParams(GeneratorParams):
    """Algorithm 1/2's inputs, the released code's options and the ablation switches."""

    renamed: ClassVar[dict[str, str]] = {"scale_std": "params.advantage (grpo for true, dr_grpo for false)"}

    mode: Literal["online", "offline"] = Field("online", description="Algorithm 1 (joint) or 2 (alternating)")
    passages_per_step: int = Field(1, gt=0, description="B_k passages per Proposer step (code: 1)")
    proposals: int = Field(6, gt=1, description="I, proposals per passage (the Proposer's GRPO group)")
    solutions: int = Field(6, gt=1, description="J, Solver samples per question (its GRPO group)")
    tau_low: float = Field(0.2, ge=0, le=1, description="validity threshold: p > tau_low")
    tau_sim: float = Field(0.3, ge=0, le=1, description="Jaccard threshold of a near-duplicate (code: 0.8)")
    tau_div: float = Field(0.3, ge=0, le=1, description="diversity gate on r_div")
    w_div: float = Field(0.2, ge=0, description="w, weight of r_div")
    difficulty_offset: float = Field(1.1, description="r_diff = offset - p")
    history_size: int = Field(100, gt=0, description="|H|")
    history_update: Literal["sequential", "snapshot"] = Field(
        "sequential", description="how H grows: sequential, each q_i appended after it is scored, an empty one too "
        "(paper, Algorithm 1); snapshot, all I scored against one snapshot, then appended only when some p > tau_low "
        "(released code, docs item 4)")
    diversity_gate: DiversityGate = Field("ge", description="r_div passes the gate when r_div >= tau_div (ge, "
                                          "paper) or > tau_div (gt, released code, docs item 3)")
    question_tokens: Literal["ids", "id_bigrams"] = Field(
        "ids", description="Tok(q): token ids (paper/code) or pairs of consecutive ids (for character tokenizers)")
    leak_filter: LeakMode = Field(
        "word", description="pre-check that marks (q, a*) invalid (p = 0) when the question gives the answer away: "
        "off (paper: none); raw, the released code's substring test; word, the answer as a whole word (default)")
    advantage: Literal["grpo", "dr_grpo"] = Field("grpo", description="both roles' advantages: GRPO's "
                                                  "std-scaled (paper, code) or mean-centred only")
    adv_eps: float = Field(1e-4, gt=0, description="epsilon of the group std (TRL's, the code's: 1e-4)")
    solver_reward: Literal["agree", "random_full", "random_partial"] = Field(
        "agree", description="r^s: agree, 1 when the answer matches the Proposer's a* (§3.4); random_full / "
        "random_partial, Bernoulli(0.5) (partial: 0 without an answer), the no-answers ablations of §5.3")
    knowledge: bool = Field(True, description="false: the w/o-𝒦 ablation")
    knowledge_source: str | None = Field(None, description="arith | openstax | proofwiki | a path; default by task")
    knowledge_max_tokens: int = Field(1024, gt=0, description="passages longer than this are split (paper: filtered)")
    knowledge_min_tokens: int = Field(1, gt=0, description="passage fragments under this many tokens (words) are "
                                      "dropped when passages are split (1: none)")
    knowledge_pool_size: int | None = Field(None, gt=0, description="keep a seeded subset of this many passages")
    proposer_max_tokens: int = Field(64, gt=0, description="Proposer completion budget (paper: 6144)")
    proposer_steps: int = Field(10, gt=0, description="offline: T_P Proposer updates per iteration")
    solver_steps: int = Field(5, gt=0, description="offline: T_S Solver updates per iteration")
    replay_batch: int = Field(6, gt=0, description="offline: buffered questions per Solver step (code: I)")
    eviction: bool = Field(False, description="offline: App. D buffer eviction (off in the paper's results)")
    eviction_patience: int = Field(3, gt=0, description="c: replays without a new peak before eviction")
    max_skips: int = Field(10, gt=0, description="offline: consecutive skipped Solver steps that end the phase")
    max_updates: int | None = Field(None, gt=0, description="updates after which the run stops (paper: 600); "
                                                            "unset: none")
    skip_zero_advantages: bool = Field(False, description="also skip a step whose Proposer advantages are all 0 "
                                       "(released code); Algorithms 1-2 skip only when no question is retained")


@dataclass
class Proposal:
    """One Proposer completion c_i for passage k and what scoring found."""

    passage: str | None
    group: int
    output: Completion | None  # None: a question replayed from the offline buffer
    question: str | None = None
    answer: str | None = None  # a_i*
    oracle: dict[str, Any] | None = None  # the arithmetic checker's facts about (q, a*): analytics only
    solutions: list[Completion] = field(default_factory=list)
    solver_answers: list[str | None] = field(default_factory=list)
    solver_rewards: list[float] = field(default_factory=list)
    p_raw: float = 0.0
    leak: bool = False
    r_div: float = 0.0
    reward: float = 0.0
    advantage: float = 0.0
    solver_advantages: list[float] = field(default_factory=list)

    @property
    def completion(self) -> Completion:
        """c_i (a ValueError for a question replayed from the offline buffer, which has none)."""
        if self.output is None:
            raise ValueError("a question replayed from the offline buffer has no Proposer completion")
        return self.output

    @property
    def p(self) -> float:
        """The leak-checked pass rate, used for rewards, retention and the buffer (the paper does not say which p)."""
        return 0.0 if self.leak else self.p_raw


@dataclass
class Buffered:
    """An entry of the offline question buffer 𝓑: (q, a*, used, prev_acc) plus the eviction counter."""

    question: str
    answer: str
    doc: str | None
    used: int = 0
    prev_acc: float = 0.0
    stale: int = 0


@parses_model_text(invalid=(None, None))
def parse_proposal(text: str) -> tuple[str | None, str | None]:
    """(q, a*) of a chat Proposer completion after its last ``</think>``: the first ``<problem>`` block and the last
    ``\\boxed{}`` (as the released code reads them); None where missing."""
    after = text[text.rfind(_THINK_END) + len(_THINK_END):] if _THINK_END in text else text
    block = next(tag_blocks(after, "problem"), None)
    question = after[block[1]:block[2]].strip() if block else ""
    return question or None, extract_boxed(after)


CHAT_FORMAT: GeneratorFormat[DocumentPromptBuilder, DocumentOutputParser] = GeneratorFormat(
    lambda style, document, **_: PROPOSER_PROMPT.format(knowledge=KNOWLEDGE.format(passage=document) if document
                                                        else ""),
    lambda output, style, **_: Generation(*parse_proposal(output.text)),
    description="<problem>{the problem}</problem> <answer>{worked solution} \\boxed{final answer}</answer>",
    regex=r"<problem>" + LINE + rf"</problem> <answer>[^<>{{}}\n]{{0,{MAX_SOLUTION_CHARS}}}\\boxed\{{" + ANSWER
    + r"\}</answer>",
    render=lambda e: (f"<problem>{one_line(e.question)}</problem> <answer>{one_line(e.solution)} "
                      f"\\boxed{{{e.answer}}}</answer>"),
    warmup_inputs=lambda e, examples, rng: {"document": e.solution})  # the passage: the example's worked solution
ARITH_FORMAT = grounded_arith_format()  # questions over the fact sheet's variables; the Solver is shown it too


@register
class PasoDoble(GeneratorRecipe[PasoDobleParams, DocumentPromptBuilder, DocumentOutputParser]):
    name = "pasodoble"
    summary = ("knowledge-grounded proposer writes questions with its own answers, rewarded by difficulty (1.1 - "
               "pass rate) + Jaccard diversity, gated; the solver learns to agree; online or offline")
    roles = ("proposer", "solver")
    Params = PasoDobleParams
    formats: ClassVar[dict[str, GeneratorFormat[DocumentPromptBuilder, DocumentOutputParser]]] = {
        "chat": CHAT_FORMAT, "arith": ARITH_FORMAT}
    defaults = {
        "steps": 200, "eval_every": 50,
        "rollout": {"temperature": 0.6, "top_p": 1.0, "max_new_tokens": 64},
        "train": {"lr": 1e-6, "kl_beta": 0.0, "grad_clip": 1.0, "loss_agg": "seq_mean", "clip_low": 0.2,
                  "clip_high": 0.2},
    }
    presets = {
        "small": {  # tiny-arith on fact sheets; about 1.8 s a step on a quiet core (300 steps + evaluations ~ 10 min)
            "model": "tiny-arith", "task": "arith", "steps": 300, "eval_every": 50,
            "rollout": {"temperature": 1.0, "max_new_tokens": 64},
            "train": {"lr": 3e-5},
            "params": {"passages_per_step": 4, "proposer_max_tokens": 96, "question_tokens": "id_bigrams",
                       "tau_sim": 0.6, "knowledge_source": "arith"},
        },
        "small_offline": {
            "model": "tiny-arith", "task": "arith", "steps": 400, "eval_every": 100,
            "rollout": {"temperature": 1.0, "max_new_tokens": 64},
            "train": {"lr": 3e-5},
            "params": {"mode": "offline", "passages_per_step": 4, "proposer_max_tokens": 96,
                       "question_tokens": "id_bigrams", "tau_sim": 0.6, "knowledge_source": "arith",
                       "replay_batch": 24},
        },
        "paper": {**_PAPER_SCALE, "steps": 2000,
                  "params": {**_PAPER_SCALE["params"], "leak_filter": "off", "max_updates": 600,
                             "skip_zero_advantages": False}},
        "reference_code": {
            **_PAPER_SCALE, "steps": 2000,
            "train": {**_PAPER_SCALE["train"], "loss_agg": "token_sum_norm", "norm_constant": 6144},
            "params": {**_PAPER_SCALE["params"], "tau_sim": 0.8, "diversity_gate": "gt", "history_update": "snapshot",
                       "leak_filter": "raw", "skip_zero_advantages": True},
            "roles": {**_PAPER_SCALE["roles"], "solver": {"mini_batch_size": 2, "epochs": 1}},
        },
    }

    @classmethod
    def check_inputs(cls, config, params: PasoDobleParams) -> None:
        super().check_inputs(config, params)
        if params.knowledge:
            source = params.knowledge_source or get_task(config.task, data_dir=config.data_dir).documents
            check_document_source(source, "params.knowledge_source", config.data_dir)

    def __init__(self, config, params: PasoDobleParams):
        super().__init__(config, params)
        self.solver_policy, self.proposer = self.load_solver_and_generator("proposer")
        self.solver_trainer, self.proposer_trainer = self.trainers()["solver"], self.trainers()["proposer"]
        self.knowledge: DocumentPool | None = None
        if params.knowledge:
            source = params.knowledge_source or self.task.documents
            self.knowledge = load_documents(source, max_tokens=params.knowledge_max_tokens,
                                            min_tokens=params.knowledge_min_tokens,
                                            count=tokenizer_counter(self.proposer.tokenizer),
                                            data_dir=config.data_dir, limit=params.knowledge_pool_size,
                                            seed=config.seed)
        self.proposer_sampling = self.generator_sampling(replace(self.sampling,
                                                                 max_new_tokens=params.proposer_max_tokens))
        self.history = JaccardHistory(params.history_size)
        self.buffer: list[Buffered] = []
        self.pointer = 0
        self.phase, self.phase_updates, self.skips = "proposer", 0, 0
        self.updates = 0  # successful updates so far (``max_updates``)

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history.state_dict(), "buffer": [vars(b) for b in self.buffer],
                "pointer": self.pointer, "phase": self.phase, "phase_updates": self.phase_updates,
                "skips": self.skips, "updates": self.updates}

    def load_state_dict(self, state) -> None:
        self.history.load_state_dict(state["history"])
        self.buffer = [Buffered(**b) for b in state["buffer"]]
        self.pointer, self.phase = state["pointer"], state["phase"]
        self.phase_updates, self.skips, self.updates = state["phase_updates"], state["skips"], state["updates"]

    # --- Algorithms 1 and 2 -----------------------------------------------------------------------------------
    def step(self, step: int) -> StepOutput:
        if self.finished():
            return StepOutput({"skipped": 1.0, "updates": float(self.updates), "done": 1.0})
        if self.params.mode == "online":
            out = self.online_step(step)
        else:
            out = self.proposer_step(step) if self.phase == "proposer" else self.solver_step(step)
        self.updates += int(not out.metrics["skipped"])
        out.metrics["updates"] = float(self.updates)
        return out

    def finished(self) -> bool:
        return self.params.max_updates is not None and self.updates >= self.params.max_updates

    def run_summary(self) -> dict[str, Any]:
        """The schedule the run had: updates per role and, offline, the iterations they make up."""
        p = self.params
        proposer, solver = self.proposer_trainer.updates_done, self.solver_trainer.updates_done
        if p.mode == "online":
            schedule = f"online: {self.updates} joint updates (proposer {proposer}, solver {solver})"
        else:
            schedule = (f"offline: {proposer} Proposer and {solver} Solver updates, "
                        f"{proposer / p.proposer_steps:.1f} iterations of T_P = {p.proposer_steps} + "
                        f"T_S = {p.solver_steps}")
        if self.finished():
            schedule += f"; stopped at max_updates = {p.max_updates}"
        return {"updates": self.updates, "updates_by_role": {"proposer": proposer, "solver": solver},
                "schedule": schedule}

    def propose_and_retain(self, step: int, timer: PhaseTimer) -> tuple[list[Proposal], list[Proposal], bool]:
        """Proposals with their pass rates and advantages, those kept for the Solver, and whether to skip the step
        (nothing retained; with ``skip_zero_advantages``, also all Proposer advantages zero)."""
        proposals = self.propose_and_score(step, timer)
        retained = [x for x in proposals if self.retained(x.p)]
        flat = self.params.skip_zero_advantages and not any(x.advantage for x in proposals)
        return proposals, retained, not retained or flat

    def online_step(self, step: int) -> StepOutput:
        timer = PhaseTimer()
        proposals, retained, skipped = self.propose_and_retain(step, timer)
        stats: dict[str, float] = {}
        if not skipped:
            with timer("update_proposer"):
                stats.update(self.update_proposer(proposals))
            with timer("update_solver"):
                stats.update(self.update_solver(retained))
        metrics = {**self.proposal_metrics(proposals), **stats, "skipped": float(skipped), **timer}
        return StepOutput(metrics, self.records(step, proposals, trained=not skipped))

    def proposer_step(self, step: int) -> StepOutput:
        """Offline Phase A: one Proposer step with the Solver frozen; retained questions go to 𝓑."""
        timer = PhaseTimer()
        proposals, retained, skipped = self.propose_and_retain(step, timer)
        stats: dict[str, float] = {}
        if not skipped:
            self.buffer += [Buffered(x.question, x.answer, self.solver_doc(x.passage), prev_acc=x.p)
                            for x in retained if x.question is not None and x.answer is not None]
            with timer("update_proposer"):
                stats = self.update_proposer(proposals)
            self.advance_phase(updated=True, target=self.params.proposer_steps, next_phase="solver")
        metrics = {**self.proposal_metrics(proposals), **stats, "skipped": float(skipped), "phase_proposer": 1.0,
                   "buffer/size": float(len(self.buffer)), **timer}
        return StepOutput(metrics, self.records(step, proposals, trained=False))

    def solver_step(self, step: int) -> StepOutput:
        """Offline Phase B: replay the next questions of 𝓑, keep those with tau_low < p < 1, update the Solver."""
        p, timer = self.params, PhaseTimer()
        if not self.buffer:
            self.phase, self.phase_updates, self.skips = "proposer", 0, 0
            return StepOutput({"skipped": 1.0, "phase_proposer": 0.0, "buffer/size": 0.0})
        count = min(p.replay_batch, len(self.buffer))
        entries = [self.buffer[(self.pointer + i) % len(self.buffer)] for i in range(count)]
        self.pointer = (self.pointer + count) % len(self.buffer)
        replayed = [Proposal(e.doc, i, None, e.question, e.answer) for i, e in enumerate(entries)]
        with timer("solve"):
            self.solve(replayed, step_seed(self.config.seed, step, "replay"))
        for entry in entries:
            entry.used += 1
        kept = [x for x in replayed if self.retained(x.p_raw)]
        kept_ids = {id(x) for x in kept}
        stats = {}
        if kept:
            with timer("update_solver"):
                stats = self.update_solver(kept)
        if p.eviction:
            self.evict(entries, [x.p_raw for x in replayed])
        self.advance_phase(updated=bool(kept), target=p.solver_steps, next_phase="proposer")
        metrics = {"solver/reward_mean": mean([r for x in replayed for r in x.solver_rewards]),
                   **tool_use(self.config, [c for x in replayed for c in x.solutions],
                              [r > 0 for x in replayed for r in x.solver_rewards]),
                   "replay/kept_rate": len(kept) / count, "replay/pass_rate_mean": mean([x.p_raw for x in replayed]),
                   **stats, "skipped": float(not kept), "phase_proposer": 0.0, "buffer/size": float(len(self.buffer)),
                   **timer}
        return StepOutput(metrics, [row for x in replayed
                                    for row in self.solver_records(step, "replay", x, id(x) in kept_ids, x.question)])

    # --- the pieces -------------------------------------------------------------------------------------------
    def propose_and_score(self, step: int, timer: PhaseTimer) -> list[Proposal]:
        """PROPOSE_AND_SCORE (§3.3-3.4) for ``passages_per_step`` passages."""
        p, seed = self.params, self.config.seed
        passages = (self.knowledge.sample(step_seed(seed, step, "passages"), p.passages_per_step)
                    if self.knowledge else [None] * p.passages_per_step)
        with timer("propose"):  # line 2: I completions per passage
            prompts = [self.generator_prompt(self.proposer, self.generator_format.prompt(self.proposer.prompt_style,
                                                                                       document=k))
                       for k in passages]
            groups = self.sample_groups(self.proposer, prompts, p.proposals, step_seed(seed, step, "propose"),
                                        self.proposer_sampling)
        proposals = [Proposal(k, g, c) for g, (k, group) in enumerate(zip(passages, groups)) for c in group]
        for x in proposals:  # line 3: q_i, a_i*
            generation = self.generator_format.parse(x.completion, self.style, document=x.passage)
            x.question, x.answer = generation.question, generation.answer
            x.oracle = self.task.oracle(x.question, self.solver_doc(x.passage), x.answer, x.answer)
        self.watch_format(step, sum(bool(x.question and x.answer) for x in proposals), len(proposals))
        with timer("solve"):  # lines 4-5: J answers per question, pass rate
            self.solve([x for x in proposals if x.question], step_seed(seed, step, "solve"))
        with timer("reward"):
            for x in proposals:
                x.leak = p.leak_filter != "off" and leaks_answer(x.question, x.answer, p.leak_filter)  # line 6
            self.diversity(proposals)  # line 8 and the history update (line 10)
            for x in proposals:  # lines 7, 9
                x.reward = proposer_reward(x.p, x.r_div, tau_low=p.tau_low, w=p.w_div, tau_div=p.tau_div,
                                           offset=p.difficulty_offset, gate=p.diversity_gate)
            groups_of = [x.group for x in proposals]
            rewards = [x.reward for x in proposals]
            advantages = compute_advantages(p.advantage, rewards, groups_of, eps=p.adv_eps)
            for x, a in zip(proposals, advantages):
                x.advantage = float(a)
        return proposals

    def solver_doc(self, passage: str | None) -> str | None:
        """What the Solver sees besides the question: the fact sheet in the arithmetic world, nothing otherwise."""
        return passage if self.generator_format.grounded else None

    def solve(self, proposals: list[Proposal], seed: int) -> None:
        """J Solver answers per question and r^s_ij against the Proposer's answer (or the random ablations)."""
        if not proposals:
            return
        prompts = [self.solver_policy.format_prompt(self.task.solver_prompt(x.question, self.solver_doc(x.passage),
                                                                              self.style))
                   for x in proposals if x.question is not None]
        rng = random.Random(seed)
        for x, (group, answers) in zip(proposals, self.solve_groups(self.solver_policy, prompts, self.params.solutions,
                                                                    seed)):
            x.solutions, x.solver_answers = group, answers
            x.solver_rewards = [self.solver_reward(a, x.answer, rng) for a in x.solver_answers]
            x.p_raw = mean(x.solver_rewards)
            x.solver_advantages = [float(a) for a in compute_advantages(
                self.params.advantage, x.solver_rewards, [0] * len(group), eps=self.params.adv_eps)]

    def solver_reward(self, answer: str | None, key: str | None, rng: random.Random) -> float:
        """r^s = 1[a ≡ a*] (§3.4); the no-answers ablations draw Bernoulli(0.5) (partial: 0 without an answer)."""
        mode = self.params.solver_reward
        if mode == "random_full" or (mode == "random_partial" and answer is not None):
            return float(rng.random() < 0.5)
        if mode == "random_partial" or answer is None or key is None:
            return 0.0
        return float(self.task.is_correct(answer, key))

    def diversity(self, proposals: list[Proposal]) -> None:
        """r^div against H (§3.3) and the history update, in Algorithm 1's order or the released code's."""
        p = self.params
        tokens = [self.question_tokens(x.question) for x in proposals]
        if p.history_update == "sequential":  # every proposal, one without a question as the empty token set
            for x, t in zip(proposals, tokens):
                x.r_div = self.history.diversity(t, p.tau_sim)
                self.history.push([t])
            return
        if not any(x.p > p.tau_low for x in proposals):
            return  # the code computes no diversity (r_p is 0 anyway) and appends nothing
        for x, t in zip(proposals, tokens):
            x.r_div = self.history.diversity(t, p.tau_sim)
        self.history.push(tokens)

    def question_tokens(self, question: str | None) -> frozenset[int]:
        """Tok(q): the Proposer tokenizer's ids of the question text, or pairs of consecutive ids."""
        ids = self.proposer.tokenizer(question, add_special_tokens=False)["input_ids"] if question else []
        if self.params.question_tokens == "ids":
            return frozenset(ids)
        return frozenset(a * TOKEN_PAIR_BASE + b for a, b in zip(ids, ids[1:]))

    def retained(self, p: float) -> bool:
        """ret = 1[tau_low < p < 1] (§3.4)."""
        return self.params.tau_low < p < 1.0

    def update_proposer(self, proposals: list[Proposal]) -> dict[str, float]:
        """GRPO on all I proposals per passage (skipped for the frozen-Proposer ablation)."""
        if self.config.frozen_generator:
            return {}
        samples = train_samples([x.completion for x in proposals], [x.advantage for x in proposals])
        return {**role_metrics("proposer", self.proposer_trainer.update(samples)),
                "generator/advantage_abs_mean": mean([abs(x.advantage) for x in proposals])}

    def update_solver(self, questions: list[Proposal]) -> dict[str, float]:
        """GRPO on the J solutions of each retained question."""
        advantages = [a for x in questions for a in x.solver_advantages]
        samples = train_samples([s for x in questions for s in x.solutions], advantages)
        return {**role_metrics("solver", self.solver_trainer.update(samples)),
                "solver/advantage_abs_mean": mean([abs(a) for a in advantages])}

    def advance_phase(self, updated: bool, target: int, next_phase: str) -> None:
        """Offline schedule: count updates (and consecutive skips) and switch phase after ``target`` updates."""
        self.phase_updates += int(updated)
        self.skips = 0 if updated else self.skips + 1
        if self.phase_updates >= target or (next_phase == "proposer" and self.skips >= self.params.max_skips):
            self.phase, self.phase_updates, self.skips = next_phase, 0, 0

    def evict(self, entries: list[Buffered], pass_rates: list[float]) -> None:
        """App. D (the code's batch variant): drop at p = 1, or after c replays without a 0.01 improvement."""
        for entry, p_new in zip(entries, pass_rates):
            if p_new - entry.prev_acc > 0.01:
                entry.prev_acc, entry.stale = p_new, 0
            else:
                entry.stale += 1
        gone = {id(e) for e, p_new in zip(entries, pass_rates)
                if p_new >= 1.0 or e.stale >= self.params.eviction_patience}
        if gone:
            before = self.buffer[:self.pointer]
            self.pointer -= sum(id(e) in gone for e in before)
            self.buffer = [e for e in self.buffer if id(e) not in gone]
            self.pointer = self.pointer % len(self.buffer) if self.buffer else 0

    # --- logging ----------------------------------------------------------------------------------------------
    def proposal_metrics(self, proposals: list[Proposal]) -> dict[str, Any]:
        p = self.params
        posed = [x for x in proposals if x.question]
        retained = [x for x in proposals if self.retained(x.p)]
        audited = [x.oracle["label_correct"] for x in retained
                   if x.oracle and x.oracle.get("label_correct") is not None]
        return {
            "generator/reward_mean": mean([x.reward for x in proposals]),
            "solver/reward_mean": mean([r for x in proposals for r in x.solver_rewards]),
            **tool_use(self.config, [c for x in proposals for c in x.solutions],
                       [r > 0 for x in proposals for r in x.solver_rewards]),
            "reward/r_div": mean([x.r_div for x in posed]),
            "reward/r_diff": mean([p.difficulty_offset - x.p for x in posed]),
            "questions/valid_rate": mean([float(bool(x.question and x.answer)) for x in proposals]),
            "questions/leak_rate": mean([float(x.leak) for x in posed]),
            "questions/pass_rate_mean": mean([x.p for x in posed]),
            "questions/gated_by_diversity": mean([float(x.p > p.tau_low and x.reward == 0.0) for x in posed]),
            "questions/sampling_efficiency": len(retained) / len(proposals),  # undefined in the paper
            "questions/retained": float(len(retained)),
            "questions/retained_label_correct": mean([float(c) for c in audited]),
            "history/size": float(len(self.history)),
            "tokens/generator": sum(len(x.completion.token_ids) for x in proposals),
            "tokens/solver": sum(len(s.token_ids) for x in proposals for s in x.solutions),
        }

    def records(self, step: int, proposals: list[Proposal], trained: bool) -> list[SampleRow]:
        """One generator row per proposal, one solver row per Solver answer (``trained``: it entered an update)."""
        rows = []
        for i, x in enumerate(proposals):
            rows.append(generator_row(
                step, None, "propose", x.completion, question=x.question, question_id=f"s{step}-q{i}",
                valid=bool(x.question and x.answer), answer=x.answer, label=x.answer, label_source="generator",
                solve_rate=x.p if x.question else None, reward=x.reward,
                reward_terms={"p_raw": x.p_raw, "leak": x.leak, "r_div": x.r_div}, advantage=x.advantage,
                oracle=x.oracle, extra={"passage": x.passage, "retained": self.retained(x.p)}))
            rows += self.solver_records(step, "solve", x, trained and self.retained(x.p), f"s{step}-q{i}")
        return rows

    def solver_records(self, step: int, phase: str, x: Proposal, trained: bool, qid: str | None) -> list[SampleRow]:
        """One solver row per Solver answer to ``x`` (phase ``solve`` online and in Phase A, ``replay`` in Phase B)."""
        doc = self.solver_doc(x.passage)
        return [solver_row(
            step, None, phase, s, question=x.question, question_id=qid,
            answer=a, label=x.answer, label_source="generator", solve_rate=x.p, reward=r, reward_terms={"agree": r},
            advantage=adv, oracle=self.task.oracle(x.question, doc, a, x.answer), extra={"trained": trained},
        ) for s, a, r, adv in zip(x.solutions, x.solver_answers, x.solver_rewards, x.solver_advantages)]
