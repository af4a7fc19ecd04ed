"""Engine wrappers, stacked by :func:`coevolve.rollout.make_engine`: residency, data parallel, full weights.

Each forwards ``pop_metrics`` and ``release`` (where the engine it wraps has it) to the engine it wraps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from coevolve.distributed import all_gather_objects, full_weights, rank, shard_bounds
from coevolve.rollout.base import PROMPT_SEED_STRIDE, Completion, RolloutEngine, SamplingParams


class EngineWrapper:
    """Forwards everything but ``generate`` to ``inner``."""

    def __init__(self, inner: RolloutEngine):
        self.inner = inner

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[Completion]:
        return self.inner.generate(prompts, params, seed)

    def pop_metrics(self) -> dict[str, float]:
        return self.inner.pop_metrics()

    def release(self) -> None:
        if hasattr(self.inner, "release"):
            self.inner.release()


class ResidentEngine(EngineWrapper):
    """A sampler that makes its policy's trainer resident (``train.offload_idle_role``) before each ``generate``."""

    def __init__(self, inner: RolloutEngine, make_resident: Callable[[], None]):
        super().__init__(inner)
        self.make_resident = make_resident

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[Completion]:
        self.make_resident()
        return self.inner.generate(prompts, params, seed)


class DataParallelEngine(EngineWrapper):
    """Each engine samples its contiguous share of the prompts (whole multiples of ``unit``); all ranks get every
    completion.

    Prompt ``j`` of a call with seed ``s`` is sampled as if it were the first prompt of a call with seed
    ``s + j * PROMPT_SEED_STRIDE``, so a rank sampling prompts ``[a, b)`` reproduces exactly what one process
    sampling all of them would have (``unit``: the HF engine's batch size, the unit of its RNG; 1 for vLLM, which
    seeds each request). ``ranks_per_engine`` consecutive ranks run one engine together (a vLLM tensor-parallel group):
    they sample the same share and the first of them contributes it. Every rank calls its engine, with an empty share
    too, since an engine's start and weight sync may be collective.
    """

    def __init__(self, inner: RolloutEngine, unit: int, ranks_per_engine: int = 1):
        super().__init__(inner)
        self.unit = unit
        self.ranks_per_engine = ranks_per_engine

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[Completion]:
        start, end = shard_bounds(len(prompts), unit=self.unit, ranks_per_share=self.ranks_per_engine)
        local = self.inner.generate(prompts[start:end], params, seed + start * PROMPT_SEED_STRIDE)
        first_of_engine = rank() % self.ranks_per_engine == 0
        return [c for part in all_gather_objects(local if first_of_engine else []) for c in part]


class FullWeightsEngine(EngineWrapper):
    """A sampler of a sharded policy: the whole weights are gathered on every rank for each ``generate``."""

    def __init__(self, inner: RolloutEngine, model: torch.nn.Module):
        super().__init__(inner)
        self.model = model

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[Completion]:
        with full_weights(self.model):
            return self.inner.generate(prompts, params, seed)
