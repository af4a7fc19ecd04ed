"""Phases: a recipe whose roles take turns declares its schedule once, and the shared code runs it.

A :class:`Schedule` is one iteration's phases, repeated: each :class:`Phase` names the role that trains, for how many
loop steps, and what happens at its start (the role's weights re-initialised from another role's, recipe state reset,
and, as the role's ``train`` settings say, a fresh AdamW and the KL reference moved to the current weights). Every
step of a phase sets the role's lr on its schedule over the phase (:meth:`PolicyTrainer.phase_step`). What a step
does depends only on its position (iteration, phase, index), so a resumed run gets what a straight run had.

R-Zero and Prism alternate a questioner and a solver phase; TTRL is one phase over the whole run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coevolve.rl.trainer import PolicyTrainer


@dataclass(frozen=True)
class Phase:
    """One phase of an iteration: ``role`` trains for ``steps`` loop steps.

    At its start: from the second iteration on, the role's weights are re-initialised from ``reinit_from``'s (with a
    fresh AdamW) and the recipe state named in ``reset`` goes back to its initial value (``Recipe.reset_state``);
    ``fresh_optimizer`` and ``move_kl_reference`` (every iteration) come from the role's ``train.optimizer_reset`` and
    ``train.kl_reference``.
    """

    role: str
    steps: int
    reinit_from: str | None = None
    reset: tuple[str, ...] = ()
    fresh_optimizer: bool = False
    move_kl_reference: bool = False

    def at_start(self) -> list[str]:
        """What happens at the phase's start, in words (for the run summary)."""
        return ([f"weights from {self.reinit_from} (from iteration 2)"] if self.reinit_from else []) + \
            [f"reset {name} (from iteration 2)" for name in self.reset] + \
            (["fresh optimizer"] if self.fresh_optimizer else []) + \
            (["KL reference moves to the current weights"] if self.move_kl_reference else [])


@dataclass(frozen=True)
class PhasePosition:
    """Where a loop step lies: its iteration (1-based), its phase and its index within the phase (0-based)."""

    iteration: int
    phase: Phase
    index: int

    @property
    def role(self) -> str:
        return self.phase.role

    @property
    def first(self) -> bool:
        """The phase's first step: what :class:`Phase` says happens at its start happens before it."""
        return self.index == 0


class Schedule:
    """An iteration's phases in order, repeated over the run."""

    def __init__(self, phases: Sequence[Phase]):
        self.phases = tuple(phases)
        self.period = sum(phase.steps for phase in self.phases)
        if self.period <= 0:
            raise ValueError("a schedule needs at least one step per iteration")

    def at(self, step: int) -> PhasePosition:
        """The position of loop step ``step`` (1-based)."""
        iteration, offset = divmod(step - 1, self.period)
        for phase in self.phases:
            if offset < phase.steps:
                return PhasePosition(iteration + 1, phase, offset)
            offset -= phase.steps
        raise AssertionError("unreachable: offset < period")

    def describe(self) -> list[dict[str, Any]]:
        """The phases as the run summary records them."""
        return [{"role": phase.role, "steps": phase.steps, "at_start": phase.at_start()} for phase in self.phases]


def phase_for(role: str, steps: int, trainer: PolicyTrainer, **starts: Any) -> Phase:
    """A phase of ``role`` whose start also does what its trainer's settings ask: a fresh AdamW
    (``optimizer_reset: phase``) and the KL reference moved (``kl_reference: phase_start``, a reference kept)."""
    return Phase(role, steps, fresh_optimizer=trainer.settings.optimizer_reset == "phase",
                 move_kl_reference=trainer.settings.kl_reference == "phase_start" and trainer.reference is not None,
                 **starts)


def start_step(position: PhasePosition, trainers: Mapping[str, PolicyTrainer],
               reset_state: Callable[[str], None]) -> None:
    """What comes before the step at ``position``: at a phase's start its re-initialisation and resets, then (every
    step) the trained role's fresh AdamW, moved KL reference and lr (:meth:`PolicyTrainer.phase_step`)."""
    phase, trainer = position.phase, trainers[position.role]
    if position.first and position.iteration > 1:
        if phase.reinit_from is not None:  # the weights are published to the role's samplers
            trainer.load_weights(trainers[phase.reinit_from].model.state_dict())
            trainer.optimizer.state.clear()
        for name in phase.reset:
            reset_state(name)
    trainer.phase_step(position.index, phase.steps)
