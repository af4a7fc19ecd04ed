"""Batched sampling behind one narrow interface: our transformers token loop (``hf``) or in-process vLLM (``vllm``)."""

from __future__ import annotations

from typing import Callable

from coevolve.rollout.base import Completion, RolloutEngine, SamplingParams, weights_version

__all__ = ["Completion", "RolloutEngine", "SamplingParams", "make_engine", "weights_version"]


def make_engine(policy, rollout, *, version: Callable[[], object] | None = None, seed: int = 0,
                bf16: bool = False) -> RolloutEngine:
    """The sampler ``rollout.engine`` names for ``policy`` (a ``Policy``; ``rollout`` is the config's ``rollout``).

    ``version`` identifies the live weights (default: :func:`weights_version` of the model); an engine with its
    own copy of the weights reloads them when it changes. ``bf16``: the HF engine samples from a bf16 copy
    (``rollout.dtype`` resolved for the run's device).
    """
    if rollout.engine == "hf":
        import torch

        from coevolve.rollout.hf import HFRolloutEngine

        return HFRolloutEngine(policy.model, policy.tokenizer, batch_size=rollout.batch_size,
                               eos_token_ids=policy.eos_token_ids, dtype=torch.bfloat16 if bf16 else None,
                               cuda_graphs=rollout.cuda_graphs, keep_sampler=rollout.keep_sampler,
                               sync_every=rollout.sync_every, version=version)
    from coevolve.models import hf_model_source
    from coevolve.rollout.vllm_engine import VLLMRolloutEngine, VLLMSettings, require_vllm

    require_vllm()
    return VLLMRolloutEngine(policy.model, policy.tokenizer, hf_model_source(policy.name),
                             eos_token_ids=policy.eos_token_ids, settings=VLLMSettings(**rollout.vllm.model_dump()),
                             version=version, seed=seed)
