"""Batched sampling behind one narrow interface (HF now; vLLM can be added as another engine)."""

from coevolve.rollout.base import Completion, RolloutEngine, SamplingParams

__all__ = ["Completion", "RolloutEngine", "SamplingParams"]
