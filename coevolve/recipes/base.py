"""What every recipe is: typed parameters, presets, models to checkpoint, and one training step.

Recipes subclass ``Recipe`` and register with ``@register``. Mechanics shared by recipes (group
sampling, step seeds, sample records) live here so a recipe file reads like its paper's algorithm.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from coevolve.config import ConfigError, RoleSettings, RunConfig, to_yaml
from coevolve.models import Policy
from coevolve.phases import PhasePosition, Schedule, start_step
from coevolve.records import SampleRow
from coevolve.rl.trainer import PolicyTrainer, TrainSample
from coevolve.roles import RoleRuntime
from coevolve.rollout import Completion, RolloutEngine, SamplingParams
from coevolve.tasks.registry import Task, get_task

RECIPES: dict[str, type[Recipe]] = {}


class RecipeParams(BaseModel):
    """Base of each recipe's ``params`` section (unknown keys and non-finite numbers are errors; a key in ``renamed``
    is refused with one line saying where it went)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    renamed: ClassVar[dict[str, str]] = {}


ParamsT = TypeVar("ParamsT", bound=RecipeParams)  # a recipe's ``Params``
ArithLevels = Annotated[list[Literal[1, 2, 3, 4, 5, 6]], Field(min_length=1)]  # levels of the arith world


@dataclass
class StepOutput:
    """What one training step produced: a metrics row (without step/time) and sample records."""

    metrics: dict[str, Any] = field(default_factory=dict)
    samples: list[SampleRow] = field(default_factory=list)


RecipeT = TypeVar("RecipeT", bound="type[Recipe]")


def register(cls: RecipeT) -> RecipeT:
    """Add a recipe class to ``RECIPES`` under its ``name``: ``@register`` on a built-in, or the ``coevolve.recipes``
    entry point of a user's package (:mod:`coevolve.recipes`). A name taken by another class is one ConfigError."""
    taken = RECIPES.get(cls.name)
    if taken is not None and taken is not cls:
        raise ConfigError(f"recipe name {cls.name!r} is taken twice: by {taken.__module__}.{taken.__qualname__} and "
                          f"by {cls.__module__}.{cls.__qualname__}; give the second recipe another name")
    RECIPES[cls.name] = cls
    return cls


def recipes_where(flag: str) -> str:
    """The registered recipes whose class attribute ``flag`` is true, named for an error message."""
    return ", ".join(sorted(name for name, recipe in RECIPES.items() if getattr(recipe, flag)))


def step_seed(seed: int, step: int, purpose: str) -> int:
    """A seed derived from (run seed, step, purpose), so a resumed run samples what it would have."""
    digest = hashlib.sha256(f"{seed}:{step}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


SOLVER_ROLES = ("solver", "policy")  # the role evaluation measures: a solver, or the one policy that also answers


class Recipe(Generic[ParamsT]):
    """One method. A subclass of ``Recipe[ItsParams]`` declares ``name``, ``summary``, its ``roles``, ``Params`` and
    ``presets``, loads its
    models and makes a trainer per role in ``__init__`` (:meth:`make_trainer`), and implements ``step``; a recipe with
    a generator subclasses :class:`coevolve.recipes.generator.GeneratorRecipe`. The base sets ``config``, ``params``,
    ``task`` (the run's task world) and the sampling settings, and knows each role's policy and trainer, so
    :meth:`trainers`, :meth:`solver` and :attr:`style` need no code in a recipe."""

    name: ClassVar[str]
    summary: ClassVar[str]
    roles: ClassVar[tuple[str, ...]] = ("solver",)  # the roles it trains, in checkpoint order
    Params: ClassVar[type[RecipeParams]] = RecipeParams
    defaults: ClassVar[dict[str, Any]] = {}
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    fsdp_unsupported: ClassVar[str | None] = None  # why ``train.fsdp`` cannot shard this recipe, if it cannot
    phased: ClassVar[bool] = False  # its roles train in phases (``schedule``): lr schedules, resets
    scores_questions: ClassVar[bool] = False  # its solver votes to score or label questions (``rollout.scoring``)
    # the instruction its chat solver prompt starts with when ``rollout.tools`` is on (agent0: its executor prompt);
    # ``coevolve sft --set warmup=tools`` writes its tool warm-up's prompts the same way
    tool_instruction: ClassVar[str] = ""

    def __init__(self, config: RunConfig, params: ParamsT):
        self.config = config
        self.params = params
        self._task = self.run_task(config)
        self.sampling = SamplingParams(temperature=config.rollout.temperature, top_p=config.rollout.top_p,
                                       top_k=config.rollout.top_k, max_new_tokens=config.rollout.max_new_tokens)
        self.solver_sampling = self.sampling
        self._trainers: dict[int, PolicyTrainer] = {}  # by id of the Policy it trains
        self._role_policies: dict[str, Policy] = {}  # by role, as make_trainer recorded them
        self._runtime = RoleRuntime(config, models=len(self.roles))  # devices, ranks, samplers, memory plan
        self.schedule: Schedule | None = None  # a phased recipe's phases (coevolve.phases), set once its trainers are

    @property
    def task(self) -> Task:
        """The run's task world (:meth:`run_task`); a ValueError in a world that no registry task describes."""
        if self._task is None:
            raise ValueError(f"{self.name}: the {self.config.task} world has no registry task to parse answers")
        return self._task

    # --- what the loop needs ----------------------------------------------------------------------
    def trainers(self) -> dict[str, PolicyTrainer]:
        """Trainers by role name, in ``roles`` order; their models and optimizers are checkpointed."""
        missing = [role for role in self.roles if role not in self._role_policies]
        if missing:
            raise TypeError(f"recipe {self.name!r} has no trainer for role {missing[0]!r}: its __init__ must call "
                            f"self.make_trainer(policy, {missing[0]!r}) for each of its roles {self.roles}")
        return {role: self._trainers[id(self._role_policies[role])] for role in self.roles}

    def solver(self) -> Policy:
        """The policy that evaluation measures: the ``solver`` role's, or the one ``policy`` of a one-policy recipe."""
        role = next((role for role in SOLVER_ROLES if role in self._role_policies), None)
        if role is None:
            raise TypeError(f"recipe {self.name!r} has no solver to evaluate: its __init__ must call "
                            f"self.make_trainer(policy, role) with role 'solver' or 'policy' (its roles: {self.roles})")
        return self._role_policies[role]

    @property
    def style(self) -> str:
        """The prompt style of the run's model (``compact`` for tiny-arith, ``chat`` otherwise)."""
        return self.solver().prompt_style

    def step(self, step: int) -> StepOutput:
        raise NotImplementedError

    def enter_phase(self, step: int) -> PhasePosition:
        """A phased recipe's first call in ``step``: the step's position in :attr:`schedule`, after what comes
        before it (:func:`coevolve.phases.start_step`: a phase start's re-initialisation and resets, the lr)."""
        if self.schedule is None:
            raise ValueError(f"{self.name}: a recipe with phases sets self.schedule in __init__")
        position = self.schedule.at(step)
        self.start_phase(position)
        return position

    def start_phase(self, position: PhasePosition) -> None:
        """What comes before the step at ``position`` (:func:`coevolve.phases.start_step`)."""
        start_step(position, self.trainers(), self.reset_state)

    def reset_state(self, name: str) -> None:
        """Reset the recipe state ``name`` that a :class:`~coevolve.phases.Phase` resets at its start."""
        raise ValueError(f"{self.name} has no state {name!r} to reset at a phase start")

    def state_dict(self) -> dict[str, Any]:
        """JSON-able recipe state beyond weights and optimizers (pools, counts); saved with checkpoints."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    def finished(self) -> bool:
        """True when the method's own end came before ``steps`` (PasoDoble's ``max_updates``): the loop then
        evaluates, checkpoints and stops after this step."""
        return False

    def run_summary(self) -> dict[str, Any]:
        """What ``summary.json`` adds for this recipe (e.g. the schedule a run effectively had)."""
        return {}

    @classmethod
    def check_settings(cls, config: RunConfig, params: ParamsT) -> None:
        """Settings this recipe cannot honour: one ConfigError naming the key, raised while the config resolves
        (before any model loads or anything is written). Recipes add their own checks and call this one."""
        if config.rollout.scoring.model_dump(exclude_none=True) and not cls.scores_questions:
            raise ConfigError(f"config key 'rollout.scoring': {cls.name} has no votes that score or label questions; "
                              f"only {recipes_where('scores_questions')} sample them")
        unknown = sorted(set(config.roles) - set(cls.roles))
        if unknown:
            raise ConfigError(f"config key 'roles.{unknown[0]}': {cls.name} has no role {unknown[0]!r} (its roles: "
                              f"{', '.join(cls.roles)})")
        if config.train.kl_reference == "phase_start":
            if not cls.phased:
                raise ConfigError(f"config key 'train.kl_reference': {cls.name} has no phases; only recipes with "
                                  f"phases ({recipes_where('phased')}) move the KL reference at a phase start")
            if config.train.lora is not None:
                raise ConfigError("config key 'train.kl_reference': phase_start needs a full copy of the weights as "
                                  "the reference; with train.lora the reference is the base model, which no phase "
                                  "moves")
        if not cls.phased:
            for where, settings in (("train", config.train), *((f"roles.{r}", s) for r, s in config.roles.items())):
                for key, plain in (("lr_schedule", "constant"), ("optimizer_reset", "never")):
                    if getattr(settings, key) not in (None, plain):
                        raise ConfigError(f"config key '{where}.{key}': {cls.name} has no phases; only recipes with "
                                          f"phases ({recipes_where('phased')}) schedule the lr or reset AdamW per "
                                          f"phase")

    @classmethod
    def check_inputs(cls, config: RunConfig, params: ParamsT) -> None:
        """Read what the run will read (benchmark files, document sources, question pools) before the model loads,
        so that a missing or empty input stops the run before anything is built or written (FileNotFoundError for
        a benchmark file, ConfigError naming the key, TaskDataError for empty data). Recipes add their inputs."""
        from coevolve.data.benchmarks import load_benchmark

        for name in cls.data_sets(config, params):
            load_benchmark(name, data_dir=config.data_dir)

    @classmethod
    def run_task(cls, config: RunConfig) -> Task | None:
        """The run's task world (``self.task``): ``config.task`` as :func:`get_task` names it. None only for a recipe
        whose tasks come from a world of its own that no registry task describes (AZR's python world)."""
        return get_task(config.task, data_dir=config.data_dir)

    @classmethod
    def start_model(cls, config: RunConfig, params: ParamsT, role: str) -> str:
        """The model (name or folder) that ``role``'s weights start from, before training: the run's ``model``."""
        return config.model

    @classmethod
    def data_sets(cls, config: RunConfig, params: ParamsT) -> list[str]:
        """Benchmark files (:mod:`coevolve.data.benchmarks` names) the run reads, checked before the model
        loads: the evaluation sets, and what a recipe adds."""
        return list(config.eval_sets or [])

    # --- shared mechanics -------------------------------------------------------------------------
    def load_policy(self, name: str | None = None) -> Policy:
        """The model ``name`` (default: the run's ``model``) where the run trains."""
        return self._runtime.load_policy(name or self.config.model)

    def make_trainer(self, policy: Policy, role: str) -> PolicyTrainer:
        """A trainer for ``policy`` in ``role`` (one of ``roles``), with the run's ``train`` settings and the role's
        own (:meth:`role_settings`); the role's policy and trainer are what :meth:`trainers` and :meth:`solver`
        return."""
        if role not in self.roles or role in self._role_policies:
            raise ValueError(f"{self.name}: role {role!r} is not one of {self.roles} or has a trainer already")
        settings = self._runtime.update_settings(policy, self.role_settings(self.config, self.params, role),
                                                 constrained=self.constrains_rollouts(self.params))
        try:
            trainer = self._runtime.make_trainer(policy, settings)
        except ValueError as exc:  # peft: a target module the model does not have
            if not settings.lora:
                raise
            raise ConfigError(f"config key 'train.lora.target_modules': {str(exc).splitlines()[0]}") from None
        policy.model = trainer.model  # LoRA wraps the model; sampling uses the wrapped one
        self._trainers[id(policy)] = trainer
        self._role_policies[role] = policy
        return trainer

    @classmethod
    def constrains_rollouts(cls, params: ParamsT) -> bool:
        """Whether the recipe's rollouts are sampled under a format constraint (format help)."""
        return False

    @classmethod
    def role_settings(cls, config: RunConfig, params: ParamsT, role: str) -> RoleSettings | None:
        """``role``'s own update settings over the run's ``train`` (``roles.<role>``), or None."""
        return config.roles.get(role)

    @classmethod
    def config_yaml(cls, config: RunConfig, params: ParamsT) -> str:
        """The resolved config as ``config.yaml`` holds it, with what each role runs (:func:`to_yaml`)."""
        return to_yaml(config, {role: cls.role_settings(config, params, role) for role in cls.roles})

    def engine(self, policy: Policy) -> RolloutEngine:
        """The sampler of ``policy`` (``rollout.engine``), one per policy for the whole run, following its trainer's
        updates."""
        return self._runtime.engine(policy, self._trainers.get(id(policy)))

    def engine_metrics(self) -> dict[str, float]:
        """What the samplers cost since the last call (``time/weight_sync_s``)."""
        return self._runtime.engine_metrics()

    def sample_groups(self, policy: Policy, prompts: Sequence[str], group_size: int, seed: int,
                      params: SamplingParams | None = None) -> list[list[Completion]]:
        """``group_size`` completions for each prompt, returned as one list per prompt (``params`` unset: the
        solver's rollout sampling, ``rollout.*`` and, with ``params.solver_format_constraint``, the answer format)."""
        return _groups(self.engine(policy), prompts, group_size, seed, params or self.solver_sampling)

    def solving_engine(self, policy: Policy) -> RolloutEngine:
        """The sampler ``policy`` answers with as a solver: with ``rollout.tools``, tool-using episodes around its
        :meth:`engine` (:mod:`coevolve.rollout.episodes`, one sandbox pool for the run), else the engine itself."""
        if not self.config.rollout.tools:
            return self.engine(policy)
        return self._runtime.episode_engine(policy, self._trainers.get(id(policy)))

    def episode_groups(self, policy: Policy, prompts: Sequence[str], group_size: int, seed: int,
                       params: SamplingParams | None = None) -> list[list[Completion]]:
        """:meth:`sample_groups` as tool-using episodes (``rollout.tools``, :mod:`coevolve.rollout.episodes`)."""
        return _groups(self.solving_engine(policy), prompts, group_size, seed, params or self.solver_sampling)

    def solve_groups(self, policy: Policy, prompts: Sequence[str], n: int, seed: int,
                     params: SamplingParams | None = None, tools: bool = True,
                     ) -> list[tuple[list[Completion], list[str | None]]]:
        """``n`` solver rollouts per prompt (:meth:`sample_groups`, ``params`` unset: the solver's training sampling;
        tool-using episodes with ``rollout.tools`` unless ``tools`` is false)
        with the answer each gives, parsed by the run's task (``self.task``) in ``policy``'s prompt style from the
        text the model wrote (an episode's tool observations are never read as its answer): one (completions,
        answers) pair per prompt."""
        task = self.task
        sample = self.episode_groups if self.config.rollout.tools and tools else self.sample_groups
        groups = sample(policy, prompts, n, seed, params)
        return [(group, [task.parse_answer(c.written_text, policy.prompt_style) for c in group]) for group in groups]


def _groups(engine: RolloutEngine, prompts: Sequence[str], group_size: int, seed: int,
            params: SamplingParams) -> list[list[Completion]]:
    flat = engine.generate([p for p in prompts for _ in range(group_size)], params, seed)
    return [flat[i * group_size:(i + 1) * group_size] for i in range(len(prompts))]


def tool_use(config: RunConfig, completions: Sequence[Completion], correct: Sequence[bool]) -> dict[str, float]:
    """With ``rollout.tools``: the share of correct answers whose episode ran a tool call (``tool/correct_used_tool``,
    NaN without correct answers); nothing without tools."""
    if not config.rollout.tools:
        return {}
    return {"tool/correct_used_tool": mean([float(c.tool_calls > 0) for c, ok in zip(completions, correct) if ok])}


def train_samples(completions: Sequence[Completion], advantages: Iterable[float],
                  clip_highs: Sequence[float] | None = None) -> list[TrainSample]:
    """Pair each completion with its advantage (and, for ADPO, its own upper clip range) for the policy update."""
    highs: Sequence[float | None] = clip_highs if clip_highs is not None else [None] * len(completions)
    return [TrainSample(c.prompt_ids, c.token_ids, c.logprobs, float(a), c.tool_mask, high)
            for c, a, high in zip(completions, advantages, highs)]


def mean(values: Sequence[float]) -> float:
    """Mean of a list; NaN (logged as null) for an empty one."""
    return statistics.fmean(values) if len(values) else float("nan")


def role_metrics(role: str, stats: Mapping[str, float]) -> dict[str, float]:
    """Trainer statistics as ``<role>/<name>`` metrics (skipped steps stay a top-level count)."""
    return {("skipped_steps" if k == "skipped_steps" else f"{role}/{k}"): v for k, v in stats.items()}


class PhaseTimer(dict):
    """Seconds per phase as ``time/<phase>_s`` metrics: ``with timer("solve"): ...``."""

    @contextmanager
    def __call__(self, phase: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            key = f"time/{phase}_s"
            self[key] = self.get(key, 0.0) + time.perf_counter() - started
