"""Counts the prompts each rank's vLLM engine samples in a run started by a test (tests/rollout/test_vllm_processes.py).

The test puts this folder first on PYTHONPATH and names a folder in COEVOLVE_TEST_PROMPT_COUNTS; Python imports
``sitecustomize`` as every process of the run starts (the launcher and each rank), and this one wraps
``VLLMRolloutEngine.generate`` as its module is imported, so that each call appends its number of prompts to
``rank<RANK>.txt`` there, one line per call. Without the variable it does nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

FOLDER = os.environ.get("COEVOLVE_TEST_PROMPT_COUNTS")
MODULE = "coevolve.rollout.vllm_engine"


def count_prompts(module) -> None:
    """Wrap the engine's ``generate`` in ``module`` to record each call's number of prompts."""
    generate = module.VLLMRolloutEngine.generate

    def counted(engine, prompts, params, seed):
        with open(os.path.join(FOLDER, f"rank{os.environ.get('RANK', '0')}.txt"), "a") as f:
            f.write(f"{len(prompts)}\n")
        return generate(engine, prompts, params, seed)

    module.VLLMRolloutEngine.generate = counted


class PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds the engine's module as Python would, and patches it once it has run."""

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            count_prompts(module)

        spec.loader.exec_module = exec_module
        return spec


if FOLDER:
    sys.meta_path.insert(0, PatchOnImport())
