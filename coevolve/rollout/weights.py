"""The trainer's weights as a sampler sees them: checkpoint names with LoRA merged, and a sampler's own copy.

A sampler that holds its own copy of the policy (vLLM, or the HF engine's bf16 copy on a GPU) reloads it whenever the
policy's weights changed since the last load, as vLLM's weight sync does in verl and TRL.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator

import torch


def hf_state_dict(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's weights under their Hugging Face checkpoint names, LoRA adapters merged in.

    A peft model is merged for the copy and unmerged afterwards, so training continues on the adapters. A model
    sharded with FSDP2 yields each tensor gathered whole as it is read, one at a time, so a reader that loads them
    one by one never holds a second whole model; every rank must read them all, in order (each is a collective).
    """
    if hasattr(model, "merge_adapter") and hasattr(model, "peft_config"):
        model.merge_adapter()
        try:
            state = {_checkpoint_name(name): tensor.detach().clone()
                     for name, tensor in model.state_dict().items() if "lora_" not in name}
        finally:
            model.unmerge_adapter()
        yield from state.items()
        return
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach()
        yield name, tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor  # a DTensor: an FSDP2 shard


def _checkpoint_name(name: str) -> str:
    """A peft model's parameter or buffer name as the plain model names it."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a peft wrapper (the model itself when it has none)."""
    return model.get_base_model() if hasattr(model, "peft_config") else model


class SamplerCopy:
    """The policy's weights in the sampling dtype, a model of its own that ``refresh`` keeps current.

    The copy is the same architecture built on the meta device and filled from :func:`hf_state_dict`, so it needs no
    second fp32 model and no checkpoint on disk; buffers (rotary frequencies) keep the source's dtype. A refresh
    writes into the same tensors, so a CUDA graph captured on the copy stays valid across weight updates.
    """

    def __init__(self, source: torch.nn.Module, dtype: torch.dtype, version: Callable[[], object]):
        self.source = source
        self.dtype = dtype
        self.version = version
        self.model: torch.nn.Module | None = None
        self.loaded_version: object = None
        self.refreshes = 0
        self.refresh_seconds = 0.0

    def current(self) -> torch.nn.Module:
        """The copy, built on first use and reloaded when the source's weights changed since the last load."""
        started = time.perf_counter()
        if self.model is None:
            self.model = self._build()
        elif self.version() == self.loaded_version:
            return self.model
        self._load(self.model)
        self.refresh_seconds += time.perf_counter() - started
        self.refreshes += 1
        return self.model

    def release(self) -> None:
        """Free the copy (it is rebuilt from the source on the next use)."""
        self.model = None
        self.loaded_version = None

    def _build(self) -> torch.nn.Module:
        plain = base_model(self.source)
        device = next(self.source.parameters()).device
        with torch.device("meta"):
            clone = type(plain)(copy.deepcopy(plain.config))
        clone = clone.to(self.dtype).to_empty(device=device).eval().requires_grad_(False)
        buffers = {_checkpoint_name(name): buf for name, buf in plain.named_buffers()}
        for name, _ in list(clone.named_buffers()):
            owner, _, leaf = name.rpartition(".")
            module = clone.get_submodule(owner) if owner else clone
            module._buffers[leaf] = buffers[name].detach().clone()
        return clone

    @torch.no_grad()
    def _load(self, model: torch.nn.Module) -> None:
        params = dict(model.named_parameters(remove_duplicate=False))
        for name, tensor in hf_state_dict(self.source):
            if name in params:
                params[name].copy_(tensor)
        self.loaded_version = self.version()
