"""What a recipe with a generator adds to :class:`Recipe`: its output format per task world and the format help.

A generator writes questions in the format its recipe declares for the run's task world (``formats["arith"]`` for the
arithmetic task, ``formats["chat"]`` for the others). The help switches (:mod:`coevolve.formats`) are worked examples
in the prompt, constrained decoding and a format warm-up's model as the starting point; a ``FormatWatch`` warns when
none of a generator's outputs parse for several steps.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import Field

from coevolve.config import ConfigError, RunConfig
from coevolve.formats import (
    FormatWatch,
    GeneratorFormat,
    ParserT,
    PromptT,
    examples_block,
    load_worked_examples,
    solver_answer_regex,
)
from coevolve.models import Policy
from coevolve.recipes.base import Recipe, RecipeParams
from coevolve.rollout import SamplingParams


class GeneratorParams(RecipeParams):
    """``params`` of a recipe with a generator: the format help switches (:mod:`coevolve.formats`), all off in
    the papers' presets."""

    format_examples: int = Field(0, ge=0, le=16, description="worked examples of the output format (GSM8K-train "
                                 "problems) appended to the generator prompt")
    format_constraint: bool = Field(False, description="constrained decoding of the generator's output format "
                                    "(xgrammar / vLLM structured outputs); turns on train.tis_cap")
    generator_init: str | None = Field(None, description="start the generator (one-policy recipes: the policy) from "
                                       "this `coevolve sft` output folder (its model/) or model folder")
    solver_format_constraint: bool = Field(False, description="constrained decoding of the solver's training "
                                           "rollouts to end in \\boxed{answer} (evaluation is never constrained)")
    format_warn_after: int = Field(3, gt=0, description="K: warn once after K consecutive generator steps with no "
                                   "valid output")


GeneratorParamsT = TypeVar("GeneratorParamsT", bound=GeneratorParams)


class GeneratorRecipe(Recipe[GeneratorParamsT], Generic[GeneratorParamsT, PromptT, ParserT]):
    """A recipe whose generator writes questions: a subclass of ``GeneratorRecipe[ItsParams, ItsPromptBuilder,
    ItsOutputParser]`` declares its output format by task world in ``formats`` (annotated with the same two types, so
    a builder that wants other keywords than the recipe passes is a type error), and ``self.generator_format`` is the
    run's."""

    formats: ClassVar[dict[str, GeneratorFormat[Any, Any]]] = {}  # the generator's output format per world

    def __init__(self, config: RunConfig, params: GeneratorParamsT):
        super().__init__(config, params)
        self.world = world_of(config.task)
        self.generator_format: GeneratorFormat[PromptT, ParserT] = self.formats[self.world]
        self.format_watch = FormatWatch(self.name, params.format_warn_after,
                                        self.generator_format.description if self.world == "chat" else None)
        if params.solver_format_constraint:  # the solver's rollouts: sample_groups without explicit params
            self.solver_sampling = replace(self.sampling, regex=solver_answer_regex(self.sampling.max_new_tokens))
        self.format_examples = (load_worked_examples(params.format_examples, self.config.seed, self.config.data_dir)
                                if params.format_examples else [])

    @classmethod
    def check_settings(cls, config: RunConfig, params: GeneratorParamsT) -> None:
        super().check_settings(config, params)
        helped = (params.format_examples or params.format_constraint or params.generator_init
                  or params.solver_format_constraint)
        if helped and config.task == "arith":
            raise ConfigError("config key 'params.format_examples/format_constraint/generator_init': format help is "
                              "for chat tasks (math and its document variants); tiny-arith has its own formats")
        if world_of(config.task) not in cls.formats:
            raise ConfigError(f"config key 'task': the {cls.name} generator has no output format for the "
                              f"{config.task} task (it has: {', '.join(cls.formats)})")

    @classmethod
    def constrains_rollouts(cls, params: GeneratorParamsT) -> bool:
        return params.format_constraint or params.solver_format_constraint

    def solver_budget(self, sampling: SamplingParams, max_new_tokens: int) -> SamplingParams:
        """``sampling`` with another token budget (and, with ``params.solver_format_constraint``, the answer format's
        constraint for that budget)."""
        regex = solver_answer_regex(max_new_tokens) if self.params.solver_format_constraint else sampling.regex
        return replace(sampling, max_new_tokens=max_new_tokens, regex=regex)

    def generator_prompt(self, policy: Policy, message: str) -> str:
        """The generator's prompt: its format's ``message`` (``self.generator_format.prompt(policy.prompt_style,
        **inputs)``) with ``params.format_examples`` worked examples of the format appended, in ``policy``'s chat
        template."""
        return policy.format_prompt(message + examples_block(self.generator_format, self.format_examples))

    def generator_sampling(self, sampling: SamplingParams) -> SamplingParams:
        """The generator's sampling: its format's stop strings, and constrained decoding of the format when
        ``params.format_constraint`` is on."""
        if self.generator_format.stop:
            sampling = replace(sampling, stop=self.generator_format.stop)
        if not self.params.format_constraint:
            return sampling
        return replace(sampling, regex=self.generator_format.regex)

    def generator_model(self) -> str:
        """What the generator starts from: ``params.generator_init`` (a ``coevolve sft`` folder's model) or the
        run's model."""
        return self.start_model(self.config, self.params, "generator")

    @classmethod
    def start_model(cls, config: RunConfig, params: GeneratorParamsT, role: str) -> str:
        """The solver starts from the run's model; every other role (the generator, and the one policy of a
        one-policy recipe) from ``params.generator_init`` when it is set."""
        init = params.generator_init
        if role == "solver" or init is None:
            return config.model
        return str(Path(init) / "model") if (Path(init) / "model").is_dir() else init

    def load_solver_and_generator(self, generator_role: str) -> tuple[Policy, Policy]:
        """The two models of a two-model recipe, each with its trainer: the solver S_0 = M_0 (role ``solver``) and
        the generator (``generator_role``), a copy of M_0 or the ``params.generator_init`` model."""
        solver = self.load_policy()
        if self.params.generator_init is None:
            generator = Policy(solver.name, copy.deepcopy(solver.model), solver.tokenizer, solver.prompt_style)
        else:
            generator = self.load_policy(self.generator_model())
        self.make_trainer(solver, "solver")
        self.make_trainer(generator, generator_role)
        return solver, generator

    def watch_format(self, step: int, valid: int, total: int) -> None:
        """Count a generator step's valid outputs; one warning after ``params.format_warn_after`` empty steps."""
        self.format_watch.observe(step, valid, total)


def world_of(task: str) -> str:
    """The task world a generator writes for: ``arith`` for the arithmetic task, ``chat`` for the others."""
    return "arith" if task == "arith" else "chat"
