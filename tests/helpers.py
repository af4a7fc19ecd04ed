"""Small helpers the test files share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from coevolve.recipes import resolve
from coevolve.recipes.base import Recipe
from coevolve.rl.trainer import TrainSample


def records(out: Any) -> list[dict[str, Any]]:
    """A recipe step's sample rows (``StepOutput.samples``) as the JSON records the run store writes."""
    return [row.as_record() for row in out.samples]


def make_recipe(name: str, model_dir: Any, *sets: str, preset: str | None = None) -> Recipe:
    """Recipe ``name`` on ``model_dir`` without evaluation sets: its defaults (or ``preset``) under ``sets``."""
    config, params, cls = resolve(name, preset=preset, sets=[f"model={model_dir}", "eval_sets=[]", *sets])
    return cls(config, params)


def random_samples(prompts: Sequence[list[int]], lengths: Sequence[int], *, tokens: tuple[int, int] = (5, 40),
                   seed: int = 0, rollout_logprob: float | None = None,
                   advantages: Sequence[float] = (1.0,)) -> list[TrainSample]:
    """Update samples with random completions of ``lengths`` tokens (ids in ``tokens``), the k-th for prompt
    ``prompts[k % len(prompts)]`` (so samples share prompts when there are fewer prompts than lengths), with
    advantage ``advantages[k % len(advantages)]``; rollout log-probs all ``rollout_logprob`` (none when None)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k, n in enumerate(lengths):
        completion = torch.randint(*tokens, (n,), generator=gen).tolist()
        logprobs = [] if rollout_logprob is None else [rollout_logprob] * n
        out.append(TrainSample(list(prompts[k % len(prompts)]), completion, logprobs, advantages[k % len(advantages)]))
    return out
