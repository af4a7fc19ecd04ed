"""One role on the accelerator at a time (``train.offload_idle_role``).

A two-role run keeps a generator and a solver, each with fp32 weights and two AdamW moments (16 bytes per
parameter). With this setting, the trainer about to sample, update or take gradients is made resident on the
accelerator first and every other registered trainer's weights, optimizer state and frozen reference wait in host
memory, so only one role's training state occupies the GPU. Recipes never call this: the Recipe base registers the
trainers and wraps their samplers (:class:`coevolve.rollout.wrappers.ResidentEngine`), and the trainer and the
influence functions call ``make_resident`` themselves.
On a CPU-only run every model already lives in host memory and nothing moves.
"""

from __future__ import annotations

from typing import Protocol

import torch

from coevolve.rollout.base import RolloutEngine

HOST = torch.device("cpu")


class Trainer(Protocol):
    """What residency moves of a trainer (:class:`coevolve.rl.trainer.PolicyTrainer`)."""

    model: torch.nn.Module
    reference: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    residency: Residency | None


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move AdamW's moments (and, for the fused kernel, its step counters) to ``device``, in place."""
    for group in optimizer.param_groups:
        keep_step_on_host = not (group.get("fused") or group.get("capturable"))
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if torch.is_tensor(value) and not (key == "step" and keep_step_on_host):
                    state[key] = value.to(device, non_blocking=True)


class Residency:
    """Which registered trainer's training state is on ``device``; the others wait in host memory."""

    def __init__(self, device: torch.device):
        self.device = device
        self.trainers: list[Trainer] = []
        self.samplers: list[tuple[Trainer, RolloutEngine]] = []
        self.resident: Trainer | None = None

    def register(self, trainer: Trainer) -> None:
        self.trainers.append(trainer)
        trainer.residency = self

    def attach_sampler(self, trainer: Trainer, engine: RolloutEngine) -> None:
        """``engine`` samples ``trainer``'s policy: when that role goes idle, its sampler's own copy of the weights
        and its decoding buffers are freed (engines that have them expose ``release``; they rebuild on next use)."""
        self.samplers.append((trainer, engine))

    def activate(self, trainer: Trainer) -> None:
        """Make ``trainer`` resident on the device, moving every other registered trainer to host memory."""
        if self.resident is trainer or self.device.type == HOST.type:
            self.resident = trainer
            return
        for other in self.trainers:
            if other is not trainer and other.model is not trainer.model:
                self._place(other, HOST)
        for owner, engine in self.samplers:
            if owner is not trainer and owner.model is not trainer.model and hasattr(engine, "release"):
                engine.release()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self._place(trainer, self.device)
        self.resident = trainer

    @staticmethod
    def _place(trainer: Trainer, device: torch.device) -> None:
        trainer.model.to(device)
        if trainer.reference is not None:
            trainer.reference.to(device)
        move_optimizer_state(trainer.optimizer, device)
