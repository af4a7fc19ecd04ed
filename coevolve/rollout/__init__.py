"""Batched sampling behind one narrow interface: our transformers token loop (``hf``) or in-process vLLM (``vllm``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from coevolve.memory import CPU_BATCH_SIZE
from coevolve.rollout.base import Completion, RolloutEngine, SamplingParams, fixed_weights
from coevolve.rollout.wrappers import DataParallelEngine, FullWeightsEngine, ResidentEngine

__all__ = ["Completion", "RolloutEngine", "SamplingParams", "fixed_weights", "make_engine"]


def make_engine(policy, rollout, *, version: Callable[[], object] | None = None, seed: int = 0,
                bf16: bool = False, make_resident: Callable[[], None] | None = None, data_parallel: bool = False,
                sharded: torch.nn.Module | None = None) -> RolloutEngine:
    """The sampling stack for ``policy`` (a ``Policy``; ``rollout`` is the config's ``rollout``): the engine
    ``rollout.engine`` names, then the wrappers of :mod:`coevolve.rollout.wrappers` the run needs.

    ``version`` returns the weights version the policy's trainer publishes (default :func:`fixed_weights`: nothing
    trains the policy); an engine with its own copy of the weights reloads them when it changes. ``bf16``: the HF
    engine samples from a bf16 copy (``rollout.dtype`` resolved for the run's device). ``make_resident``: called
    before each call (roles take turns on the GPU); ``data_parallel``: each rank (vLLM: each engine, over
    ``rollout.vllm.tensor_parallel_size`` ranks) samples its share and every rank sees the whole batch; ``sharded``:
    the FSDP model whose whole weights every rank gathers to sample with the HF engine.
    """
    engine = _engine(policy, rollout, version=version, seed=seed, bf16=bf16)
    vllm = rollout.engine == "vllm"
    if make_resident is not None:
        engine = ResidentEngine(engine, make_resident)
    if data_parallel:  # vLLM seeds each request; a tensor-parallel engine spans several ranks
        engine = (DataParallelEngine(engine, unit=1, ranks_per_engine=rollout.vllm.tensor_parallel_size) if vllm
                  else DataParallelEngine(engine, unit=_fixed_batch(rollout) or CPU_BATCH_SIZE))
    if sharded is not None and not vllm:  # vLLM loads a sharded model's weights itself, gathered a tensor at a time
        engine = FullWeightsEngine(engine, sharded)
    return engine


def _fixed_batch(rollout) -> int | None:
    """``rollout.batch_size`` as the HF engine takes it: a number, or None to plan each call."""
    return None if rollout.batch_size == "auto" else rollout.batch_size


def _engine(policy, rollout, *, version: Callable[[], object] | None, seed: int, bf16: bool) -> RolloutEngine:
    if rollout.engine == "hf":
        from coevolve.rollout.hf import HFRolloutEngine

        return HFRolloutEngine(policy.model, policy.tokenizer, batch_size=_fixed_batch(rollout),
                               eos_token_ids=policy.eos_token_ids, dtype=torch.bfloat16 if bf16 else None,
                               cuda_graphs=rollout.cuda_graphs, keep_sampler=rollout.keep_sampler,
                               sync_every=rollout.sync_every, version=version)
    from coevolve.rollout.vllm_engine import VLLMRolloutEngine, VLLMSettings, require_vllm

    require_vllm()
    return VLLMRolloutEngine(policy.model, policy.tokenizer, policy.weights_source,
                             eos_token_ids=policy.eos_token_ids, settings=VLLMSettings(**rollout.vllm.model_dump()),
                             version=version, seed=seed)
