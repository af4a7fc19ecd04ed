"""Optimizer state as plain tensors and JSON, and back.

torchao's 8-bit AdamW (``train.optimizer: adamw_8bit``) keeps each large moment as a tensor subclass
(``OptimState8bit``: uint8 codes, one float32 scale per block of 256 values and the 256-entry quantisation map) and
its learning rate as a 0-d tensor. safetensors writes plain tensors only, JSON has no tensors, and ``copy.deepcopy``
of the subclass fails (it has no ``clone``), so a checkpoint and a copy take each state apart into its plain tensors
with a JSON-able description (the subclass's own ``__tensor_flatten__``) and rebuild it (``__tensor_unflatten__``).
Only the classes named in ``STATE_SUBCLASSES`` are ever rebuilt, so a checkpoint's text cannot make the loader
construct anything else (nothing is unpickled).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import torch

STATE_SUBCLASSES = ("torchao.optim.subclass_8bit.OptimState8bit",)


def _class_name(value: torch.Tensor) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


def is_subclass_state(value: Any) -> bool:
    """Whether ``value`` is a tensor subclass (not a plain tensor) that :func:`split_state` takes apart."""
    return isinstance(value, torch.Tensor) and type(value) is not torch.Tensor and hasattr(value,
                                                                                          "__tensor_flatten__")


def split_state(value: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A subclass state's plain tensors by attribute name, and the JSON-able description :func:`join_state` reads."""
    name = _class_name(value)
    if name not in STATE_SUBCLASSES:
        raise TypeError(f"optimizer state of type {name} cannot be checkpointed (known: {', '.join(STATE_SUBCLASSES)})")
    attrs, context = value.__tensor_flatten__()
    return {attr: getattr(value, attr) for attr in attrs}, {"type": name, "context": [_encode(c) for c in context]}


def join_state(parts: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> torch.Tensor:
    """The subclass state :func:`split_state` took apart; a ValueError for a type not in ``STATE_SUBCLASSES``."""
    name = meta["type"]
    if name not in STATE_SUBCLASSES:
        raise ValueError(f"optimizer state of unknown type {name!r}")
    module, _, cls_name = name.rpartition(".")
    cls = getattr(importlib.import_module(module), cls_name)
    return cls.__tensor_unflatten__(dict(parts), [_decode(c) for c in meta["context"]], None, None)


def _encode(item: Any) -> Any:
    if isinstance(item, torch.dtype):
        return {"dtype": str(item).removeprefix("torch.")}
    if item is None or isinstance(item, (bool, int, float, str)):
        return item
    raise TypeError(f"optimizer state description {item!r} is not JSON")


def _decode(item: Any) -> Any:
    if isinstance(item, dict):
        dtype = getattr(torch, str(item["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {item['dtype']!r}")
        return dtype
    return item


def plain_groups(groups: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Param groups with their 0-d tensor values (torchao's lr) as numbers, and each group's tensor keys with their
    dtypes, for :func:`tensor_groups`."""
    plain, kinds = [], []
    for group in groups:
        tensors = {k: v for k, v in group.items() if isinstance(v, torch.Tensor)}
        plain.append({**group, **{k: v.item() for k, v in tensors.items()}})
        kinds.append({k: str(v.dtype).removeprefix("torch.") for k, v in tensors.items()})
    return plain, kinds


def tensor_groups(groups: list[dict[str, Any]], kinds: list[Mapping[str, str]]) -> list[dict[str, Any]]:
    """The param groups :func:`plain_groups` made plain, their tensor values tensors again."""
    return [{**group, **{k: torch.tensor(group[k], dtype=_decode({"dtype": dtype})) for k, dtype in kind.items()}}
            for group, kind in zip(groups, kinds, strict=True)]


def copy_state_dict(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of an optimizer's ``state_dict()`` whose subclass states are rebuilt from copies of their parts."""
    def copied(value: Any) -> Any:
        if is_subclass_state(value):
            parts, meta = split_state(value)
            return join_state({k: v.clone() for k, v in parts.items()}, meta)
        return value.clone() if isinstance(value, torch.Tensor) else value

    state = {index: {name: copied(value) for name, value in slots.items()}
             for index, slots in state_dict["state"].items()}
    groups = [{k: copied(v) if k != "params" else list(v) for k, v in group.items()}
              for group in state_dict["param_groups"]]
    return {"state": state, "param_groups": groups}
