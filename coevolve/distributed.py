"""Data parallel below the recipes: every rank runs the recipe on the whole batch; sampling and gradients are split.

A run launched on several processes (``coevolve run --processes N``, ``torchrun`` or ``accelerate launch``) keeps
one global view without the recipes knowing: each rank samples its share of a call's prompts and all ranks gather
the completions (``coevolve.rollout.wrappers.DataParallelEngine``; with vLLM, each rank's engine, or each
tensor-parallel group's), so votes, pools, coverage counts, diversity terms and every group statistic are computed on
the same global batch everywhere; the trainer splits each mini-batch across ranks and sums the gradients
(``all_reduce_gradients``), so every rank takes the same optimizer step and the weights stay equal. Rank 0 alone
writes the run directory. With one process every function here is a no-op.

With ``train.fsdp`` each role's weights, gradients and AdamW state are instead sharded over the ranks (torch's
FSDP2, ``shard_model``): a decoder layer's weights are gathered for its forward and backward, and the gradients are
reduce-scattered (summed) into each rank's shard. Everything that runs a rank-dependent number of forward passes
(sampling a rank's share with the HF engine, log-probs of a rank's share, evaluation) runs inside ``full_weights``,
which gathers the whole model once and keeps it until the block ends; a vLLM engine holds its own copy of the
weights and loads them gathered one tensor at a time (``coevolve.rollout.weights.hf_state_dict``); the trainer gives
every rank the same number of micro-batches; checkpoints gather the full weights and optimizer state
(``full_model_state``, ``full_optimizer_state``), so their files are the one-process files and a run resumes on any
number of processes.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist


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


def shard_bounds(n: int, *, unit: int = 1, ranks_per_share: int = 1) -> tuple[int, int]:
    """[start, end) of this rank's contiguous share of ``n`` items, in whole units of ``unit`` items; each group of
    ``ranks_per_share`` consecutive ranks (the ranks of one tensor-parallel engine) takes the same share."""
    units = -(-n // unit)
    per_share, extra = divmod(units, world_size() // ranks_per_share)
    share = rank() // ranks_per_share
    first = share * per_share + min(share, extra)
    last = first + per_share + (1 if share < extra else 0)
    return min(first * unit, n), min(last * unit, n)


# --- FSDP (train.fsdp) ---------------------------------------------------------------------------------------------
def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """Shard ``model`` over the ranks in place (FSDP2): one unit per decoder layer (the classes the model names in
    ``_no_split_modules``) and the rest (embeddings, final norm, head) in the root unit. Gradients are summed over
    ranks, not averaged: the trainer normalises each loss by the whole mini-batch."""
    from torch.distributed.fsdp import fully_shard

    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in layer_classes:
            fully_shard(module)
    fully_shard(model)
    for unit in fsdp_units(model):
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # a plain sum: gloo has no pre-multiplied sum
    return model


def fsdp_units(model: torch.nn.Module) -> list[Any]:
    """The FSDP units of ``model`` (empty when it is not sharded)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: torch.nn.Module) -> bool:
    return bool(fsdp_units(model))


@contextlib.contextmanager
def full_weights(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block every rank holds ``model``'s whole weights, so ranks may run different numbers of forward
    passes (sampling their own share); a no-op for a model that is not sharded. Every rank must enter it."""
    units = fsdp_units(model)
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)


def _canonical_names(model: torch.nn.Module) -> dict[str, str]:
    """Each state-dict name mapped to the name saved for it: tied weights (one tensor under several names) are saved
    once, under the first name in sorted order (as ``safetensors.torch.save_model`` does)."""
    by_tensor: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        by_tensor.setdefault(id(tensor), []).append(name)
    return {name: min(names) for names in by_tensor.values() for name in names}


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights of a sharded model, on the host, tied weights once (every rank must call it; rank 0
    gets the tensors, the others an empty dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    canonical = _canonical_names(model)
    return {name: tensor.contiguous() for name, tensor in state.items() if canonical.get(name, name) == name}


def load_full_model_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Write whole weights (as :func:`full_model_state` returns them) into a sharded model's shards (every rank)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    full = {name: state[saved] for name, saved in _canonical_names(model).items()}
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True))


def _trained_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The parameter name of each optimizer index (the optimizer holds ``model``'s trainable parameters in order)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A sharded model's AdamW state gathered whole, in ``optimizer.state_dict()``'s one-process layout (indices, not
    names); every rank must call it, rank 0 gets the tensors."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    local = optimizer.state_dict()
    if not optimizer.state:  # no step taken yet (torch's getter would take a zero-gradient step to create state)
        return local
    state = get_optimizer_state_dict(model, optimizer,
                                     options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    index = {name: i for i, name in enumerate(_trained_names(model, optimizer))}
    return {"state": {index[name]: slots for name, slots in state.get("state", {}).items()},
            "param_groups": local["param_groups"]}


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                              state: Mapping[str, Any]) -> None:
    """Load a one-process ``optimizer.state_dict()`` into a sharded model's optimizer (every rank)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if not state["state"]:  # saved before the first step: the new optimizer is already in that state
        return
    names = _trained_names(model, optimizer)
    groups = [{**group, "params": [names[i] for i in group["params"]]} for group in state["param_groups"]]
    full = {"state": {names[int(i)]: slots for i, slots in state["state"].items()}, "param_groups": groups}
    set_optimizer_state_dict(model, optimizer, full, options=StateDictOptions(full_state_dict=True))
