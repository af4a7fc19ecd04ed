"""Where a run's roles live: each role's model on the run's device, its trainer with what the device decides (bf16,
passes fitted to the free memory, activation checkpointing on a GPU), and one sampler per policy (``rollout.engine``,
each rank sampling its share, whole weights gathered from FSDP shards, roles taking turns on the GPU with
``train.offload_idle_role``). The recipes' base asks this module, so no recipe learns about ranks, devices or which
sampler it has.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from coevolve import distributed
from coevolve.config import (
    DEFAULT_TIS_CAP,
    GPU_MICRO_BATCH_TOKENS,
    LoraSettings,
    RoleSettings,
    RunConfig,
    SamplingConfig,
)
from coevolve.memory import ModelShape, StatePlan, free_device_memory, plan_training_state, training_workspace_bytes
from coevolve.models import Policy, load_policy
from coevolve.rl import logprob_head
from coevolve.rl.residency import Residency
from coevolve.rl.trainer import PolicyTrainer, UpdateSettings, update_settings
from coevolve.rollout import RolloutEngine, make_engine

if TYPE_CHECKING:
    from coevolve.execution import Executor

log = logging.getLogger(__name__)
# Bytes per logit of one chunk of the log-prob head at a time: the float32 logits, their gradient and the softmax.
HEAD_BYTES_PER_LOGIT = 12


def tis_cap(config: RunConfig, *, bf16_sampler: bool, constrained: bool) -> float | None:
    """The cap of truncated importance sampling: ``train.tis_cap``, else ``DEFAULT_TIS_CAP`` where rollouts are not
    sampled from the trainer's pi (vLLM's log-probs are not the trainer's, a bf16 sampler copy rounds the weights,
    constrained decoding samples from a masked distribution q: the weights min(pi_old / q, cap) correct for all
    three), else None (off)."""
    if config.train.tis_cap is not None:
        return config.train.tis_cap
    other = config.rollout.engine == "vllm" or bf16_sampler or constrained
    return DEFAULT_TIS_CAP if other else None


def bf16_on(setting: str, device: torch.device) -> bool:
    """Whether a ``train.dtype`` / ``rollout.dtype`` setting means bf16 on ``device`` (``auto``: a GPU with bf16)."""
    on_cuda = device.type == "cuda"
    return setting == "bf16" or (setting == "auto" and on_cuda and torch.cuda.is_bf16_supported())


def evaluation_sampler(policy: Policy, rollout: SamplingConfig, *, seed: int) -> RolloutEngine:
    """The sampler ``coevolve eval`` measures a model with: the engine a run gives a policy (``rollout.engine``,
    ``rollout.dtype`` resolved for the policy's device), on weights nothing trains."""
    device = next(policy.model.parameters()).device
    return make_engine(policy, rollout, seed=seed, bf16=bf16_on(rollout.dtype, device))


@contextmanager
def evaluation_episodes(engine: RolloutEngine, policy: Policy, rollout: SamplingConfig) -> Iterator[RolloutEngine]:
    """``engine`` as a run's solver samples, for ``coevolve eval`` (which has no run's roles): with
    ``rollout.tools``, tool-using episodes (up to ``rollout.max_tool_calls`` calls, in a sandbox pool of the
    evaluation's own, closed after it); without tools, ``engine`` itself. A run's own evaluation samples with its
    solver's engine (``Recipe.solving_engine``)."""
    if not rollout.tools:
        yield engine
        return
    from coevolve.execution import Executor
    from coevolve.rollout.episodes import TOOL_LIMITS, EpisodeEngine, python_tool

    with Executor(TOOL_LIMITS) as executor:
        yield EpisodeEngine(engine, policy.tokenizer, python_tool(executor), rollout.max_tool_calls)


class RoleRuntime:
    """The device side of a run's roles: their models, trainers' settings and samplers."""

    def __init__(self, config: RunConfig, models: int = 1):
        self.config = config
        self.models = models  # the models the recipe trains (one per role)
        self.device = distributed.device_for(config.device)
        self.residency = Residency(self.device) if config.train.offload_idle_role else None  # which role is on the GPU
        self.state_plan: StatePlan | None = None  # CUDA: decided at the first role's settings (:meth:`plan_state`)
        self._engines: dict[int, RolloutEngine] = {}  # by id of the Policy it samples
        self._episodes: dict[int, RolloutEngine] = {}  # by id of the Policy: its engine with the tool loop around it
        self._executor: Executor | None = None  # the sandbox pool of the tool calls, from the first episode sampler

    def load_policy(self, name: str) -> Policy:
        """The model ``name`` (built-in name, folder or hub id) on the run's device."""
        return load_policy(name, trust_remote_code=self.config.trust_remote_code, device=str(self.device))

    def bf16(self, setting: str) -> bool:
        """Whether a ``train.dtype`` / ``rollout.dtype`` setting means bf16 on this run's device."""
        return bf16_on(setting, self.device)

    def update_settings(self, policy: Policy, role: RoleSettings | None, constrained: bool) -> UpdateSettings:
        """A role's update settings: the run's ``train`` section, the role's own over it, and what the device and the
        sampler decide (``constrained``: the recipe samples under a format constraint)."""
        train = self.config.train
        on_cuda = self.device.type == "cuda"
        plan = self.plan_state(policy)
        planned: dict[str, Any] = {} if plan is None else {"optimizer": plan.optimizer}
        if plan is not None and plan.lora and train.lora is None:
            planned["lora"] = LoraSettings().model_dump()
        return update_settings(
            train, role, **planned, micro_batch_tokens=self._micro_batch_tokens(policy, on_cuda),
            fit_memory=train.micro_batch_tokens is None,
            tis_cap=tis_cap(self.config, bf16_sampler=self.bf16(self.config.rollout.dtype), constrained=constrained),
            norm_constant=train.norm_constant or self.config.rollout.max_new_tokens,
            temperature=self.config.rollout.temperature, dtype="bf16" if self.bf16(train.dtype) else "fp32",
            gradient_checkpointing=on_cuda if train.gradient_checkpointing is None else train.gradient_checkpointing,
            selective_checkpointing=on_cuda and train.gradient_checkpointing is None)

    def plan_state(self, policy: Policy) -> StatePlan | None:
        """On CUDA with one process, the plan of what the roles' training state needs in the usable memory (the free
        memory and what this process holds now: :func:`coevolve.memory.plan_training_state`), made once, at the first
        role, and logged: the settings left unset among ``train.offload_idle_role``, ``train.optimizer`` (adamw_8bit
        only where torchao is installed) and, with ``train.lora_if_needed``, ``train.lora`` take its values. None
        elsewhere (nothing changes)."""
        train = self.config.train
        if self.state_plan is not None or self.device.type != "cuda" or train.fsdp or distributed.world_size() > 1:
            return self.state_plan
        model = policy.model
        shape = ModelShape.of(model.config)
        parameters = sum(p.numel() for p in model.parameters())
        bf16 = self.bf16(train.dtype)
        usable = (free_device_memory(self.device) or 0) + torch.cuda.memory_allocated(self.device)
        self.state_plan = plan_training_state(
            usable, shape, parameters, self.models,
            workspace_bytes=training_workspace_bytes(shape, dtype_bytes=2 if bf16 else 4,
                                                     head_bytes=HEAD_BYTES_PER_LOGIT * logprob_head.HEAD_CHUNK_LOGITS),
            bf16=bf16, sampler_copy=self.config.rollout.engine == "hf" and self.bf16(self.config.rollout.dtype),
            reference=train.kl_beta > 0, offload=train.offload_idle_role,
            optimizer=train.optimizer or (None if importlib.util.find_spec("torchao") else "adamw"),
            lora=True if train.lora is not None else None if train.lora_if_needed else False)
        if self.state_plan.offload_idle_role and self.residency is None:
            self.residency = Residency(self.device)
        log.info("memory plan for %d model(s) of %.2fB parameters in %.1f GiB: %s", self.models,
                 parameters / 1e9, usable / 2**30, self.state_plan.describe())
        return self.state_plan

    def make_trainer(self, policy: Policy, settings: UpdateSettings) -> PolicyTrainer:
        """A trainer of ``policy`` (it takes turns on the GPU with the other roles' under ``offload_idle_role``)."""
        trainer = PolicyTrainer(policy.model, policy.tokenizer, settings, seed=self.config.seed)
        if self.residency is not None:
            self.residency.register(trainer)
        return trainer

    def engine(self, policy: Policy, trainer: PolicyTrainer | None) -> RolloutEngine:
        """The sampler of ``policy`` (``rollout.engine``), one per policy for the whole run; ``trainer``: the one that
        updates it, if any.

        An engine with its own weights (vLLM, a bf16 copy) reloads them before sampling whenever the trainer has
        published a new weights version (:meth:`PolicyTrainer.publish_weights`) since the last load; a policy no
        trainer changes keeps the weights it was loaded with.
        """
        key = id(policy)
        if key not in self._engines:
            version = None if trainer is None else (lambda: trainer.weights_version)
            turns = self.residency if trainer is not None else None  # roles take turns on the GPU
            make_resident = trainer.make_resident if trainer is not None and turns is not None else None
            engine = make_engine(policy, self.config.rollout, version=version, seed=self.config.seed,
                                 bf16=self.bf16(self.config.rollout.dtype), make_resident=make_resident,
                                 data_parallel=distributed.world_size() > 1,
                                 sharded=trainer.model if trainer is not None and trainer.settings.fsdp else None)
            if turns is not None and trainer is not None:
                turns.attach_sampler(trainer, engine)
            self._engines[key] = engine
        return self._engines[key]

    def episode_engine(self, policy: Policy, trainer: PolicyTrainer | None) -> RolloutEngine:
        """The episode sampler of ``policy`` (``rollout.tools``): :meth:`engine` with the tool loop of
        :mod:`coevolve.rollout.episodes` around it, its calls run in one sandboxed worker pool for the run."""
        from coevolve.execution import Executor
        from coevolve.rollout.episodes import TOOL_LIMITS, EpisodeEngine, python_tool


        key = id(policy)
        if key not in self._episodes:
            if self._executor is None:
                self._executor = Executor(TOOL_LIMITS)
            self._episodes[key] = EpisodeEngine(self.engine(policy, trainer), policy.tokenizer,
                                                python_tool(self._executor), self.config.rollout.max_tool_calls)
        return self._episodes[key]

    def engine_metrics(self) -> dict[str, float]:
        """What the samplers cost since the last call, summed over engines (``time/weight_sync_s``), and the tool
        telemetry of episodes (:func:`coevolve.rollout.episodes.tool_rates`)."""
        totals: dict[str, float] = {}
        for engine in [*self._engines.values(), *self._episodes.values()]:
            for key, value in engine.pop_metrics().items():
                totals[key] = totals.get(key, 0.0) + value
        if self._episodes:
            from coevolve.rollout.episodes import tool_rates

            totals.update(tool_rates(totals))
        return totals

    def _micro_batch_tokens(self, policy: Policy, on_cuda: bool) -> int | None:
        """``train.micro_batch_tokens``; unset, ``GPU_MICRO_BATCH_TOKENS`` on a GPU for a model whose log-prob head
        runs in chunks (whole logits of that many tokens would not fit; lowered at each update to what the free
        memory holds), else passes of ``micro_batch_size``."""
        if self.config.train.micro_batch_tokens is not None or not on_cuda:
            return self.config.train.micro_batch_tokens
        return GPU_MICRO_BATCH_TOKENS if logprob_head.cut_at_head(policy.model) is not None else None
