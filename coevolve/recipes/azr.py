"""Absolute Zero (AZR): one policy proposes code-reasoning tasks of three types and solves them; a program executor
validates every proposed task and grades every answer.

Paper: Absolute Zero: Reinforced Self-play Reasoning with Zero Data (arXiv 2505.03335, Algorithm 1); code:
``LeapLabTHU/Absolute-Zero-Reasoner``. A task is a (program, input, output) triplet; deduction asks for the output,
abduction for an input that gives the output, induction for a program that maps held-out pairs. Per step t:

Seeding (first step only, §3.3.1; no update)
    0. the model proposes deduction and abduction tasks from the identity triplet until D_seed holds B*S valid ones;
       D_ded = D_abd = D_seed; induction tasks on D_seed's programs fill D_ind to B*S.
Propose phase
    1. for deduction and abduction: B proposals (p, i), each shown K references drawn from its buffer;
       for induction: B programs drawn from D_ded ∪ D_abd, for each of which the proposer writes N inputs and m;
    2. validate by executing: the program parses, uses no forbidden module, runs and returns, and two runs agree
       (§3.3.3); valid tasks join their buffer;
    3. learnability: n solver rollouts on each valid task; r_propose = 1 - solve rate, 0 at 0 or 1 (Eq. 4).
Solve phase
    4. per type, B tasks: this step's valid ones, then earlier ones drawn from the buffer; one rollout each;
       r_solve = 1 if the answer checks by execution (Eq. 5, §3.3.4).
Update
    5. format-aware rewards: r_role if passable, -0.5 if wrong but well formatted, -1 if malformed (Eq. 6; with
       params.r1_zero_format, malformed includes an output without the code's <think>/<answer> shape);
    6. Task-Relative REINFORCE++: one baseline per (task type, role), six in all (Eq. 8);
    7. one policy update on all proposer and solver sequences.

Worlds: ``task=program`` (the tiny-program model's integer functions, evaluated exactly in this process) and
``task=python`` (Python functions, run by the sandboxed executor: :mod:`coevolve.tasks.python_programs`).
Paper vs code, presets and what is not reproduced: ``docs/recipes/azr.md``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from coevolve.config import ConfigError, RunConfig
from coevolve.models import BUILTIN_MODELS, TINY_BUILDS
from coevolve.recipes.base import (
    PhaseTimer,
    Recipe,
    RecipeParams,
    StepOutput,
    mean,
    register,
    role_metrics,
    step_seed,
    train_samples,
)
from coevolve.records import SampleRow, generator_row, solver_row
from coevolve.rewards.azr import learnability, proposer_reward, solver_reward, tagged_answer, think_answer_format
from coevolve.rl.advantages import compute_advantages
from coevolve.rl.trainer import TrainSample
from coevolve.rollout import Completion, SamplingParams
from coevolve.rollout.hf import encode_prompt
from coevolve.tasks.registry import Task
from coevolve.tasks.triplets import (
    INVALID_REASONS,
    KINDS,
    ExecutionStats,
    Kind,
    ProgramWorld,
    Proposal,
    TaskBuffers,
    Triplet,
    buffer_stats,
    r1_zero_prompt,
)

if TYPE_CHECKING:
    from coevolve.tasks.python_programs import Rules


class AZRParams(RecipeParams):
    """Algorithm 1's inputs (B, K, n, N, S) and the switches for where the paper and its code differ."""

    batch_size: int = Field(64, gt=0, description="B: proposals per task type, and solver tasks per task type")
    references: int = Field(6, ge=0, description="K: reference triplets shown to a deduction or abduction proposer")
    learnability_samples: int = Field(8, gt=1, description="n: solver rollouts estimating a task's solve rate (Eq. 4)")
    induction_inputs: int = Field(10, ge=2, description="N: inputs an induction proposer writes (the solver sees "
                                  "N // 2 pairs, its program is checked on the rest)")
    task_types: list[Kind] = Field(list(KINDS), min_length=1, description="the task types trained (ablations)")
    seed_batch_factor: int = Field(4, gt=0, description="S: seeding fills each buffer to B * S triplets")
    seed_max_rounds: int = Field(50, gt=0, description="seeding stops after this many proposal batches per buffer, "
                                 "full or not (not in the paper: a model that rarely writes a valid task)")
    max_buffer: int = Field(16384, gt=0, description="most triplets a buffer keeps (paper: max programs)")
    trivial_task_reward: float = Field(-0.5, le=0, description="proposer reward of a valid task that every rollout "
                                       "or none solved (code: -0.5; a literal reading of Eq. 6: 0)")
    token_weighted_baseline: bool = Field(False, description="TRR++ mean and std over tokens (code, verl's "
                                          "REINFORCE++ whitening) instead of over sequences (Eq. 8)")
    proposer_max_tokens: int | None = Field(None, gt=0, description="proposer budget (unset: rollout.max_new_tokens)")
    execution_timeout_s: float = Field(10.0, gt=0, description="python world: CPU and wall seconds per program run")
    execution_workers: int | None = Field(None, gt=0, description="python world: sandbox workers (unset: one per "
                                          "core)")
    unconfined_execution: bool = Field(False, description="python world: run model-written programs without the "
                                       "bubblewrap sandbox (separate processes under resource limits, but with "
                                       "your files, network and processes in reach); only where no sandbox can run")
    format_constraint: bool = Field(False, description="python world: constrained decoding of the proposer formats "
                                    "(format help for small chat models; turns on train.tis_cap)")
    solver_format_constraint: bool = Field(False, description="python world: constrained decoding of the solver's "
                                           "answer formats")
    r1_zero_format: bool = Field(False, description="the code's answer format: every prompt wrapped in R1-Zero's "
                                 "<think>/<answer> template with the chat template off; answers read only from "
                                 "<answer>; an output not shaped <think>...</think><answer>...</answer> scores -1 (a "
                                 "valid proposal still joins its buffer)")
    single_function: bool = Field(False, description="python world: a program with more than one def (nested "
                                  "functions and methods included) is invalid (code: reject_multiple_functions)")
    expression_inputs: bool = Field(False, description="python world: inputs are any call arguments (dict(a=1, b=2), "
                                    "keyword arguments), evaluated in the sandbox; unset: positional literals")
    any_output: bool = Field(False, description="python world: None and values that are not plain literals are "
                             "valid outputs (their repr); unset: plain literals other than None")
    output_chars: int | None = Field(None, gt=2, description="python world: gold outputs longer than this are cut to "
                                     "their first and last halves around '...' (code: 400); unset: an output over "
                                     "2,000 characters is invalid")
    strip_seed_programs: bool = Field(True, description="python world: seeding strips each proposed program of "
                                      "comments, docstrings and top-level code other than imports and definitions "
                                      "(code's seeding scripts: remove_comments, remove_after_return)")
    max_prompt_tokens: int | None = Field(None, gt=0, description="drop a prompt longer than this many tokens, as "
                                          "formatted for the model: a proposer draws other references, a solver task "
                                          "is left out of the batch (code: content_max_length 8096, then "
                                          "data.max_prompt_length 6144, which binds)")

    @field_validator("task_types")
    @classmethod
    def _distinct(cls, kinds: list[Kind]) -> list[Kind]:
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"task types repeat: {kinds}")
        return [kind for kind in KINDS if kind in kinds]  # the paper's order

    @model_validator(mode="after")
    def _one_format(self) -> AZRParams:
        if self.r1_zero_format and (self.format_constraint or self.solver_format_constraint):
            raise ValueError("params.r1_zero_format needs the <think>/<answer> tags, which the constrained formats "
                             "(format_constraint, solver_format_constraint) do not write; turn one of them off")
        return self

    def rules(self) -> Rules:
        """The python world's validity rules these params choose."""
        from coevolve.tasks.python_programs import Rules

        return Rules(self.single_function, self.expression_inputs, self.any_output, self.output_chars)


@dataclass
class Proposed:
    """One proposer output and everything the step computes for it."""

    kind: Kind
    completion: Completion
    references: list[Triplet]  # K references, or the one program an induction proposer was given
    task: Triplet | None = None  # the validated task
    reason: str | None = None  # why it is not a valid task
    estimates: list[Completion] = field(default_factory=list)  # the n learnability rollouts
    estimate_answers: list[str | None] = field(default_factory=list)
    estimate_correct: list[bool] = field(default_factory=list)
    proposal: Proposal | None = None  # what the world read from the completion
    formatted: bool = True  # r1_zero_format: the completion has the <think>/<answer> shape
    r_propose: float = 0.0
    reward: float = -1.0
    advantage: float = 0.0


@dataclass
class Solved:
    """One solver task of the solve phase (new this step, or drawn from the buffer) and its one rollout."""

    kind: Kind
    task: Triplet
    new: bool
    completion: Completion
    answer: str | None = None
    formatted: bool = False  # an answer was read (r1_zero_format: from a well-formatted output)
    correct: bool = False
    reward: float = -1.0
    advantage: float = 0.0


def make_world(config: RunConfig, params: AZRParams) -> ProgramWorld:
    """The program world of ``config.task``; the python world sets up its sandbox here, before any model loads."""
    if config.task == "program":
        from coevolve.tasks.program import TinyProgramWorld

        if params.r1_zero_format:
            raise ConfigError("config key 'params.r1_zero_format': the <think>/<answer> format is for chat models in "
                              "the python world (task=python); the program world's model writes its compact format")

        return TinyProgramWorld(params.induction_inputs)
    if config.task == "python":
        from coevolve.execution import SandboxUnavailable
        from coevolve.tasks.python_programs import python_world

        try:
            return python_world(params.execution_timeout_s, params.execution_workers, params.unconfined_execution,
                                params.induction_inputs, params.rules())
        except SandboxUnavailable as exc:
            raise ConfigError(f"config key 'params.unconfined_execution': azr runs model-written programs in a "
                              f"bubblewrap sandbox, which cannot run here ({exc}); install bubblewrap, or pass "
                              f"--set params.unconfined_execution=true to run them unconfined (separate processes "
                              f"under resource limits that can read your files and reach the network)") from None
    raise ConfigError(f"config key 'task': azr runs in the program world (task=program, the tiny-program model) or "
                      f"the python world (task=python), not {config.task!r}")


PROGRAM_WORLD_MODEL = ("config key 'model': the program world's formats are the tiny-program model's; chat models run "
                       "azr with task=python")


@register
class AZR(Recipe[AZRParams]):
    name = "azr"
    summary = ("one policy proposes deduction/abduction/induction tasks and solves them; execution validates and "
               "grades; learnability reward, Task-Relative REINFORCE++")
    roles = ("policy",)
    Params = AZRParams
    defaults = {
        "steps": 100, "eval_every": 20,
        "rollout": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 64},
        # verl's actor settings in AZR's config: token-mean loss, clip ratios 0.2 / 0.28, grad clip 1, no KL
        "train": {"lr": 5e-5, "loss_agg": "token_mean", "clip_low": 0.2, "clip_high": 0.28, "grad_clip": 1.0,
                  "kl_beta": 0.0},
    }
    presets = {
        "small": {  # tiny-program in the program world; about 3 s a step on one core
            "model": "tiny-program", "task": "program", "steps": 100, "eval_every": 20,
            "params": {"batch_size": 16, "references": 3, "learnability_samples": 4, "induction_inputs": 6,
                       "seed_batch_factor": 4},
        },
        "paper": {  # the paper's Table 3 where it gives a value, the authors' scripts (both branches) otherwise;
            # the paper's models are Qwen2.5-7B (--set model=...). Sources per value: docs/recipes/azr.md, "Presets".
            "model": "smollm2-135m", "task": "python", "steps": 500, "eval_sets": [],
            "rollout": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 8096},
            "train": {"lr": 1e-6, "loss_agg": "token_mean", "clip_low": 0.2, "clip_high": 0.28, "grad_clip": 1.0,
                      "kl_beta": 0.0, "entropy_coef": 0.001, "mini_batch_size": 128, "epochs": 1},
            "params": {"batch_size": 64, "references": 6, "learnability_samples": 8, "induction_inputs": 10,
                       "seed_batch_factor": 4, "max_buffer": 16384, "execution_timeout_s": 10.0},
        },
        "reference_code": {  # the authors' `paper` branch (their README: the code that reproduces the paper), value
            # by value with file and line in docs/recipes/azr.md, "Presets"; --set model=... for a Qwen2.5 model
            "model": "smollm2-135m", "task": "python", "steps": 500, "eval_sets": [],
            "rollout": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 8096},
            "train": {"lr": 1e-6, "weight_decay": 0.01, "lr_schedule": "constant", "loss_agg": "token_mean",
                      "clip_low": 0.2, "clip_high": 0.2, "dual_clip": None, "grad_clip": 1.0, "kl_beta": 0.0,
                      "entropy_coef": 0.001, "mini_batch_size": 128, "epochs": 1},
            "params": {"batch_size": 64, "references": 6, "learnability_samples": 8, "induction_inputs": 10,
                       "seed_batch_factor": 4, "max_buffer": 16384, "execution_timeout_s": 10.0,
                       "trivial_task_reward": -0.5, "token_weighted_baseline": True, "r1_zero_format": True,
                       "single_function": True, "expression_inputs": True, "any_output": True, "output_chars": 400,
                       "strip_seed_programs": True, "max_prompt_tokens": 6144},
        },
    }

    def __init__(self, config: RunConfig, params: AZRParams):
        super().__init__(config, params)
        self.world = make_world(config, params)  # the sandbox first: no model loads where it cannot run
        self.policy = self.load_policy()
        if config.task == "program" and self.policy.prompt_style != "compact":
            raise ConfigError(PROGRAM_WORLD_MODEL)
        self.trainer = self.make_trainer(self.policy, "policy")
        self.buffers = TaskBuffers(params.max_buffer)
        self.proposer_sampling = replace(self.sampling, max_new_tokens=params.proposer_max_tokens
                                         or self.sampling.max_new_tokens)
        self.kinds: list[Kind] = list(params.task_types)
        self.execution = {kind: ExecutionStats() for kind in KINDS}  # since the last metrics row

    @classmethod
    def check_inputs(cls, config: RunConfig, params: AZRParams) -> None:
        """A built-in chat model in the program world stops here, before it loads (other models: in ``__init__``)."""
        super().check_inputs(config, params)
        if config.task == "program" and config.model in BUILTIN_MODELS and config.model not in TINY_BUILDS:
            raise ConfigError(PROGRAM_WORLD_MODEL)

    @classmethod
    def run_task(cls, config: RunConfig) -> Task | None:
        """The program world's registry task (its prog_* evaluation sets); the python world has none: its tasks are
        the proposer's, checked by the sandboxed executor."""
        return None if config.task == "python" else super().run_task(config)

    def state_dict(self) -> dict[str, Any]:
        return {"buffers": self.buffers.state_dict()}

    def load_state_dict(self, state) -> None:
        self.buffers.load_state_dict(state["buffers"])

    def run_summary(self) -> dict[str, Any]:
        return {"buffer_sizes": {kind: self.buffers.size(kind) for kind in KINDS}}

    # --- Algorithm 1 ----------------------------------------------------------------------------
    def step(self, step: int) -> StepOutput:
        p, timer, seed = self.params, PhaseTimer(), self.config.seed
        rng = random.Random(step_seed(seed, step, "buffers"))
        if len(self.buffers) == 0:
            with timer("seed"):  # line 1: InitSeeding
                self.seed_buffers(rng)

        # Propose phase (lines 3-15): B proposals per type, validated by execution; valid ones join the buffers.
        with timer("propose"):
            proposed = self.propose([(kind, self.references(kind, rng)) for kind in self.kinds
                                     for _ in range(p.batch_size)], step_seed(seed, step, "propose"))
        earlier = {kind: self.buffers.fill(kind, p.batch_size, rng) for kind in self.kinds}  # before this step's
        for kind in self.kinds:
            self.buffers.add(kind, [q.task for q in proposed if q.kind == kind and q.task], step)
        with timer("estimate"):  # r_propose (Eq. 4) from n solver rollouts on each valid task
            self.estimate([q for q in proposed if q.task], step_seed(seed, step, "estimate"))

        # Solve phase (lines 16-19): this step's valid tasks, the batch filled from the buffer; one rollout each.
        batch = [(kind, task, new) for kind in self.kinds
                 for task, new in self.solve_batch(kind, [q.task for q in proposed if q.kind == kind and q.task],
                                                   earlier[kind])]
        with timer("solve"):
            solved = self.solve(batch, step_seed(seed, step, "solve"))

        # Rewards (Eq. 6), Task-Relative REINFORCE++ (Eq. 8), one update on both roles.
        for q in proposed:  # a valid task joined its buffer above even when its output is badly formatted
            q.reward = proposer_reward(q.task is not None and q.formatted, q.r_propose, p.trivial_task_reward)
        for s in solved:
            s.reward = solver_reward(s.formatted, s.correct)
        self.advantages(proposed, solved)
        with timer("update"):
            stats = self.trainer.update(self.train_batch(proposed, solved))
        return StepOutput(metrics={**self.metrics(proposed, solved), **role_metrics("policy", stats), **timer},
                          samples=self.records(step, proposed, solved))

    # --- the pieces of a step ---------------------------------------------------------------------
    def seed_buffers(self, rng: random.Random) -> None:
        """InitSeeding (§3.3.1): the model proposes from D_seed (the zero triplet at first) until D_seed holds B*S
        distinct valid deduction/abduction triplets, then induction tasks on their programs until D_ind holds B*S;
        no update. Seeding gives up after ``seed_max_rounds`` batches, keeping what it has."""
        p, target = self.params, self.params.batch_size * self.params.seed_batch_factor
        seeds = TaskBuffers(target)
        seeds.add("deduction", [self.world.seed_triplet()], 0)
        io_kinds: list[Kind] = [kind for kind in ("deduction", "abduction") if kind in self.kinds] or ["deduction"]
        for round_ in range(p.seed_max_rounds):
            if seeds.size("deduction") >= target:
                break
            specs: list[tuple[Kind, list[Triplet]]] = [
                (io_kinds[i % len(io_kinds)], seeds.references("deduction", p.references, rng))
                for i in range(p.batch_size)]
            known = set(seeds.triplets("deduction"))
            new = [q.task for q in self.propose(specs, step_seed(self.config.seed, 0, f"seed-{round_}"),
                                                strip=p.strip_seed_programs)
                   if q.task and q.task not in known]
            seeds.add("deduction", list(dict.fromkeys(new)), 0)
        for kind in ("deduction", "abduction"):
            self.buffers.add(kind, seeds.triplets("deduction"), 0)
        for round_ in range(p.seed_max_rounds if "induction" in self.kinds else 0):
            if self.buffers.size("induction") >= target:
                break
            specs = [("induction", [self.buffers.induction_program(rng)]) for _ in range(p.batch_size)]
            proposed = self.propose(specs, step_seed(self.config.seed, 0, f"seed-induction-{round_}"))
            self.buffers.add("induction", [q.task for q in proposed if q.task], 0)
        self.pop_execution()  # seeding's execution is not the first step's

    def references(self, kind: Kind, rng: random.Random) -> list[Triplet]:
        """K references from the type's buffer, or (induction) one program drawn from D_ded ∪ D_abd; drawn again
        (up to 20 times) while the prompt is over ``max_prompt_tokens``."""
        for _ in range(20):
            refs = ([self.buffers.induction_program(rng)] if kind == "induction"
                    else self.buffers.references(kind, self.params.references, rng))
            if self.fits(self.world.proposer_prompt(kind, refs, self.style)):
                break
        return refs

    def fits(self, message: str) -> bool:
        """Whether a prompt, as formatted for the model, is within ``max_prompt_tokens`` (always, when unset)."""
        limit = self.params.max_prompt_tokens
        return limit is None or len(encode_prompt(self.policy.tokenizer, self.format(message))) <= limit

    def format(self, message: str) -> str:
        """A message as the model reads it: in R1-Zero's template (r1_zero_format), else in its chat template."""
        return r1_zero_prompt(message) if self.params.r1_zero_format else self.policy.format_prompt(message)

    def answer_text(self, completion: Completion) -> str:
        """The part of a completion its world reads: r1_zero_format, only what is inside <answer>."""
        return tagged_answer(completion.text) if self.params.r1_zero_format else completion.text

    def propose(self, specs: list[tuple[Kind, list[Triplet]]], seed: int, strip: bool = False) -> list[Proposed]:
        """One proposal per (type, references) spec, read and then validated by the world (one batch per type);
        ``strip``: programs stripped first (seeding)."""
        prompts = [(kind, self.world.proposer_prompt(kind, refs, self.style)) for kind, refs in specs]
        outputs = self.generate(prompts, 1, seed, self.proposer_sampling, self.params.format_constraint,
                                self.world.proposer_regex)
        proposed = [Proposed(kind, group[0], refs) for (kind, refs), group in zip(specs, outputs)]
        for q in proposed:
            read = self.world.read_proposal(q.kind, self.answer_text(q.completion),
                                            q.references[0].program if q.kind == "induction" else None, strip)
            q.reason, q.proposal = (read, None) if isinstance(read, str) else (None, read)
            q.formatted = not self.params.r1_zero_format or think_answer_format(q.completion.text)
        for kind in KINDS:
            readable = [(q, q.proposal) for q in proposed if q.kind == kind and q.proposal is not None]
            for (q, _), validation in zip(readable, self.world.validate([proposal for _, proposal in readable])):
                q.task, q.reason = validation.triplet, validation.reason
            self.execution[kind].add(self.world.pop_execution_stats())
        return proposed

    def estimate(self, proposed: list[Proposed], seed: int) -> None:
        """r_propose (Eq. 4) of each valid task from n solver rollouts (sampled and checked, not trained on)."""
        groups = self.rollouts([(q.kind, q.task) for q in proposed if q.task is not None],
                               self.params.learnability_samples, seed)
        for q, (outputs, answers, correct) in zip(proposed, groups):
            q.estimates, q.estimate_answers, q.estimate_correct = outputs, answers, correct
            q.r_propose = learnability(correct)

    def solve_batch(self, kind: Kind, new: list[Triplet], earlier: list[Triplet]) -> list[tuple[Triplet, bool]]:
        """B solver tasks of one type (§3.3.3): this step's valid tasks, then earlier ones from the buffer (a task
        whose prompt is over ``max_prompt_tokens`` left out)."""
        if self.params.max_prompt_tokens is not None:
            new, earlier = ([t for t in tasks if self.fits(self.world.solver_prompt(kind, t, self.style))]
                            for tasks in (new, earlier))
        b = self.params.batch_size
        return [(t, True) for t in new[:b]] + [(t, False) for t in earlier[:b - min(b, len(new))]]

    def solve(self, batch: list[tuple[Kind, Triplet, bool]], seed: int) -> list[Solved]:
        """One rollout per solver task (type, task, new this step), its answer checked by execution; r1_zero_format:
        an output without the <think>/<answer> shape is a formatting error and not correct (the code's pred_*
        rewards)."""
        solved = []
        for (kind, task, new), (outputs, answers, correct) in zip(
                batch, self.rollouts([(kind, task) for kind, task, _ in batch], 1, seed)):
            formatted = answers[0] is not None and (not self.params.r1_zero_format
                                                    or think_answer_format(outputs[0].text))
            solved.append(Solved(kind, task, new, outputs[0], answers[0], formatted, correct[0] and formatted))
        return solved

    def rollouts(self, tasks: list[tuple[Kind, Triplet]], n: int, seed: int
                 ) -> list[tuple[list[Completion], list[str | None], list[bool]]]:
        """``n`` solver rollouts per task with their answers and whether each checks (one check batch per type)."""
        prompts = [(kind, self.world.solver_prompt(kind, task, self.style)) for kind, task in tasks]
        groups = self.generate(prompts, n, seed, self.sampling, self.params.solver_format_constraint,
                               self.world.solver_regex)
        answers = [[self.world.read_answer(kind, self.answer_text(c)) for c in group]
                   for (kind, _), group in zip(tasks, groups)]
        correct: list[list[bool]] = [[] for _ in tasks]
        for kind in KINDS:
            index = [i for i, (k, _) in enumerate(tasks) if k == kind]
            verdicts = iter(self.world.check(kind, [tasks[i][1] for i in index for _ in range(n)],
                                             [a for i in index for a in answers[i]]))
            for i in index:
                correct[i] = [next(verdicts) for _ in range(n)]
            self.execution[kind].add(self.world.pop_execution_stats())
        return list(zip(groups, answers, correct))

    def generate(self, prompts: list[tuple[Kind, str]], n: int, seed: int, sampling: SamplingParams,
                 constrained: bool, regex_of) -> list[list[Completion]]:
        """``n`` completions per (type, message) as the model reads it (:meth:`format`), in one sampling call per
        format (one in all without constrained decoding)."""
        formats: dict[str | None, list[int]] = {}
        for i, (kind, _) in enumerate(prompts):
            formats.setdefault(regex_of(kind) if constrained else None, []).append(i)
        out: list[list[Completion]] = [[] for _ in prompts]
        for j, (regex, index) in enumerate(formats.items()):
            groups = self.sample_groups(self.policy, [self.format(prompts[i][1]) for i in index], n,
                                        seed + j, replace(sampling, regex=regex))
            for i, group in zip(index, groups):
                out[i] = group
        return out

    def advantages(self, proposed: list[Proposed], solved: list[Solved]) -> None:
        """TRR++ (Eq. 8): each reward normalised by the mean and std of its (task type, role) group."""
        items: list[Proposed | Solved] = [*proposed, *solved]
        groups = [2 * KINDS.index(x.kind) + isinstance(x, Solved) for x in items]
        weights = ([max(1, len(x.completion.token_ids)) for x in items]
                   if self.params.token_weighted_baseline else None)
        for x, a in zip(items, compute_advantages("task_relative", [x.reward for x in items], groups,
                                                  weights=weights)):
            x.advantage = float(a)

    def train_batch(self, proposed: list[Proposed], solved: list[Solved]) -> list[TrainSample]:
        """Every proposer output (unless the generator is frozen) and every solver rollout, with its advantage."""
        proposer = [] if self.config.frozen_generator else train_samples(
            [q.completion for q in proposed], [q.advantage for q in proposed])
        return proposer + train_samples([s.completion for s in solved], [s.advantage for s in solved])

    # --- telemetry and records --------------------------------------------------------------------
    def pop_execution(self) -> dict[Kind, ExecutionStats]:
        """Execution costs per type since the last call (``tasks/<type>/executor_*``), then reset them."""
        stats, self.execution = self.execution, {kind: ExecutionStats() for kind in KINDS}
        return stats

    def metrics(self, proposed: list[Proposed], solved: list[Solved]) -> dict[str, Any]:
        """Per task type: proposal validity and why proposals fail, learnability, solve rate, buffer size and
        diversity, execution cost; then the shared names (``generator/``, ``solver/``, ``questions/``)."""
        row: dict[str, Any] = {}
        execution = self.pop_execution()
        for kind in self.kinds:
            mine = [q for q in proposed if q.kind == kind]
            valid = [q for q in mine if q.task]
            batch = [s for s in solved if s.kind == kind]
            row.update({f"tasks/{kind}/{name}": value for name, value in {
                "valid_rate": len(valid) / len(mine) if mine else float("nan"),
                **{f"invalid_{reason}": sum(q.reason == reason for q in mine) / len(mine) if mine else float("nan")
                   for reason in INVALID_REASONS},
                "learnability": mean([q.r_propose for q in valid]),
                "estimated_solve_rate": mean([c for q in valid for c in q.estimate_correct]),
                "proposer_reward": mean([q.reward for q in mine]),
                "solve_rate": mean([float(s.correct) for s in batch]),
                "answer_rate": mean([float(s.answer is not None) for s in batch]),
                "solver_reward": mean([s.reward for s in batch]),
                "new_task_share": mean([float(s.new) for s in batch]),
                **buffer_stats(self.buffers, kind, self.world),
                "executor_jobs": execution[kind].jobs, "executor_s": execution[kind].seconds,
                "executor_timeouts": execution[kind].timeouts,
            }.items()})
        jobs, seconds = sum(e.jobs for e in execution.values()), sum(e.seconds for e in execution.values())
        return {
            **row,
            "generator/reward_mean": mean([q.reward for q in proposed]),
            "solver/reward_mean": mean([s.reward for s in solved]),
            "questions/valid_rate": mean([float(q.task is not None) for q in proposed]),
            "reward/learnability": mean([q.r_propose for q in proposed if q.task]),
            "reward/solve": mean([float(s.correct) for s in solved]),
            "generator/advantage_abs_mean": mean([abs(q.advantage) for q in proposed]),
            "solver/advantage_abs_mean": mean([abs(s.advantage) for s in solved]),
            "tokens/generator": sum(len(q.completion.token_ids) for q in proposed),
            "tokens/solver": sum(len(s.completion.token_ids) for s in solved),
            "executor/jobs": jobs, "executor/seconds": seconds,
            "executor/timeouts": sum(e.timeouts for e in execution.values()),
        }

    def records(self, step: int, proposed: list[Proposed], solved: list[Solved]) -> list[SampleRow]:
        """A generator row per proposal, a solver row per learnability rollout (phase "estimate", not trained) and
        per solver rollout (phase "solve")."""
        rows = []
        for i, q in enumerate(proposed):
            qid = f"s{step}-{q.kind[:3]}{i}"
            rows.append(generator_row(
                step, None, "propose", q.completion, question=describe(q.task), question_id=qid,
                valid=q.task is not None, label_source="execution",
                solve_rate=mean([float(c) for c in q.estimate_correct]) if q.task else None, reward=q.reward,
                reward_terms={"r_propose": q.r_propose}, advantage=q.advantage,
                extra={"task_type": q.kind, "invalid_reason": q.reason,
                       "references": [describe(t) for t in q.references]}))
            if q.task is not None:  # its learnability rollouts
                rows += [solver_row(
                    step, None, "estimate", c, question=describe(q.task), question_id=qid, answer=a,
                    label=gold(q.kind, q.task), label_source="execution", reward_terms={"correct": float(ok)},
                    extra={"task_type": q.kind})
                    for c, a, ok in zip(q.estimates, q.estimate_answers, q.estimate_correct)]
        for i, s in enumerate(solved):
            rows.append(solver_row(
                step, None, "solve", s.completion, question=describe(s.task), question_id=f"s{step}-solve{i}",
                answer=s.answer, label=gold(s.kind, s.task), label_source="execution", reward=s.reward,
                reward_terms={"correct": float(s.correct)}, advantage=s.advantage,
                extra={"task_type": s.kind, "new_task": s.new}))
        return rows


def describe(task: Triplet | None) -> str | None:
    """A task as one line of text for the sample records: program | inputs | outputs (| message)."""
    if task is None:
        return None
    parts = [task.program, ", ".join(task.inputs), ", ".join(task.outputs)] + ([task.message] if task.message else [])
    return " | ".join(" ".join(part.split()) for part in parts)


def gold(kind: Kind, task: Triplet) -> str:
    """What a solver's answer is checked against, as text: the output, the output an input must give, the hidden
    pairs."""
    if kind == "induction":
        return "; ".join(f"{i} -> {o}" for i, o in task.hidden)
    return task.outputs[0]
