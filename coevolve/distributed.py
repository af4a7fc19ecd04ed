"""Data parallel below the recipes: every rank runs the recipe on the whole batch; sampling and gradients are split.

A run launched on several processes (``coevolve run --processes N``, ``torchrun`` or ``accelerate launch``) keeps
one global view without the recipes knowing: each rank samples its share of a call's prompts and all ranks
gather the completions (``DataParallelEngine``), so votes, pools, coverage counts, diversity terms and every
group statistic are computed on the same global batch everywhere; the trainer splits each mini-batch across ranks
and sums the gradients (``all_reduce_gradients``), so every rank takes the same optimizer step and the weights
stay equal. Rank 0 alone writes the run directory. With one process every function here is a no-op.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Sequence

import torch
import torch.distributed as dist

from coevolve.rollout.base import PROMPT_SEED_STRIDE, Completion, RolloutEngine, SamplingParams


class DistributedSetupError(RuntimeError):
    """The process group could not be set up; the message is one line."""


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    """Whether this process writes the run directory (rank 0, or the only process)."""
    return rank() == 0


def launched_distributed() -> bool:
    """Whether a launcher (torchrun, accelerate launch) started this process as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def device_for(setting: str) -> torch.device:
    """The device ``device: auto | cpu | cuda`` means for this process (``cuda:<local rank>`` under a launcher)."""
    use_cuda = setting == "cuda" or (setting == "auto" and torch.cuda.is_available())
    if not use_cuda:
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def init_from_env(device: torch.device, timeout_s: float = 1800.0) -> None:
    """Join the process group a launcher described in the environment (gloo on CPU, NCCL on CUDA)."""
    if not launched_distributed():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        try:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                    timeout=datetime.timedelta(seconds=timeout_s))
        except (RuntimeError, ValueError) as exc:
            raise DistributedSetupError(f"could not join the process group: {str(exc).splitlines()[0]}") from exc


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def all_gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (``[obj]`` with one process)."""
    if world_size() == 1:
        return [obj]
    gathered: list[Any] = [None] * world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def all_reduce_gradients(parameters: Sequence[torch.nn.Parameter]) -> None:
    """Sum the gradients of ``parameters`` over ranks (a rank with no share of the batch contributes zeros)."""
    if world_size() == 1:
        return
    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)


def shard_bounds(n: int, *, unit: int = 1) -> tuple[int, int]:
    """[start, end) of this rank's contiguous share of ``n`` items, in whole units of ``unit`` items."""
    units = -(-n // unit)
    per_rank, extra = divmod(units, world_size())
    r = rank()
    first = r * per_rank + min(r, extra)
    last = first + per_rank + (1 if r < extra else 0)
    return min(first * unit, n), min(last * unit, n)


class DataParallelEngine:
    """Each rank samples its contiguous share of the prompts (whole engine batches); all ranks get every completion.

    Prompt ``j`` of a call with seed ``s`` is sampled as if it were the first prompt of a call with seed
    ``s + j * PROMPT_SEED_STRIDE``, so a rank sampling prompts ``[a, b)`` reproduces exactly what one process
    sampling all of them would have (shares are whole batches of ``batch_size``, the unit of the HF engine's RNG).
    """

    def __init__(self, inner: RolloutEngine, batch_size: int):
        self.inner = inner
        self.batch_size = batch_size

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> list[Completion]:
        start, end = shard_bounds(len(prompts), unit=self.batch_size)
        local = (self.inner.generate(prompts[start:end], params, seed + start * PROMPT_SEED_STRIDE)
                 if end > start else [])
        return [c for part in all_gather_objects(local) for c in part]

    def pop_metrics(self) -> dict[str, float]:
        return self.inner.pop_metrics()
