"""coevolve.phases: a declared schedule maps steps to positions, and a phase's start does what it declares."""

from __future__ import annotations

import pytest
import torch

from coevolve.phases import Phase, Schedule, phase_for, start_step
from coevolve.rl.trainer import PolicyTrainer, UpdateSettings


def test_steps_map_to_iterations_phases_and_indices_over_three_phases():
    schedule = Schedule([Phase("curriculum", 2), Phase("executor", 3), Phase("judge", 1)])
    got = [(at.iteration, at.role, at.index, at.first) for at in map(schedule.at, range(1, 8))]
    assert got == [(1, "curriculum", 0, True), (1, "curriculum", 1, False), (1, "executor", 0, True),
                   (1, "executor", 1, False), (1, "executor", 2, False), (1, "judge", 0, True),
                   (2, "curriculum", 0, True)]
    with pytest.raises(ValueError):
        Schedule([Phase("solver", 0)])


def test_a_phase_start_reinitialises_and_resets_from_the_second_iteration(random_policy):
    settings = UpdateSettings(lr=1e-3, optimizer_reset="phase", lr_schedule="cosine")
    questioner = PolicyTrainer(random_policy.model, random_policy.tokenizer, settings)
    solver_model = type(random_policy.model)(random_policy.model.config)
    solver = PolicyTrainer(solver_model, random_policy.tokenizer, settings)
    trainers = {"questioner": questioner, "solver": solver}
    phase = phase_for("questioner", 4, questioner, reinit_from="solver", reset=("counts",))
    assert phase.fresh_optimizer and not phase.move_kl_reference
    assert phase.at_start() == ["weights from solver (from iteration 2)", "reset counts (from iteration 2)",
                                "fresh optimizer"]
    schedule = Schedule([phase, Phase("solver", 1)])
    resets: list[str] = []
    start_step(schedule.at(1), trainers, resets.append)  # iteration 1: nothing is re-initialised or reset
    assert resets == [] and questioner.weights_version == 0
    assert not torch.equal(next(questioner.model.parameters()), next(solver.model.parameters()))
    start_step(schedule.at(3), trainers, resets.append)  # index 2 of 4 on the cosine: lr = half the peak
    assert questioner.optimizer.param_groups[0]["lr"] == pytest.approx(0.5e-3)
    start_step(schedule.at(6), trainers, resets.append)  # iteration 2's questioner phase starts
    assert resets == ["counts"] and questioner.weights_version == 1
    assert all(torch.equal(a, b) for a, b in zip(questioner.model.parameters(), solver.model.parameters()))
    assert questioner.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
