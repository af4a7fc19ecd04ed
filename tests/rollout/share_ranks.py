"""Each rank's share of a sampling call, without a model or vLLM (tests/rollout/test_wrappers.py).

``torchrun --nproc-per-node 2 share_ranks.py OUT_JSON``: every rank builds a run's sampler as a recipe does
(``RoleRuntime.engine``) around a stand-in engine that records how many prompts it is asked to sample and answers each
prompt with the seed it was sampled under. For each case: the prompts each rank's engine sampled per call, and the
completions every rank got back. Rank 0 writes the results as JSON.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import torch

from coevolve import distributed, rollout
from coevolve.recipes import resolve
from coevolve.roles import RoleRuntime
from coevolve.rollout import Completion, SamplingParams
from coevolve.rollout.base import PROMPT_SEED_STRIDE

CASES = {  # name: (config settings, number of prompts per call)
    "vllm": (["rollout.engine=vllm"], [7, 1, 0]),
    "vllm_tensor_parallel": (["rollout.engine=vllm", "rollout.vllm.tensor_parallel_size=2"], [7]),
    "hf_batches_of_2": (["rollout.engine=hf", "rollout.batch_size=2"], [5]),
}


class RecordingEngine:
    """Answers prompt j of a call with seed s by "prompt@s + j * stride" and records each call's number of prompts."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def generate(self, prompts, params, seed):
        self.calls.append(len(prompts))
        return [Completion(p, [], [], f"{p}@{seed + j * PROMPT_SEED_STRIDE}") for j, p in enumerate(prompts)]

    def pop_metrics(self) -> dict[str, float]:
        return {}


def case(sets: list[str], sizes: list[int]) -> dict:
    config, _, _ = resolve("grpo", sets=sets)
    engine = RecordingEngine()
    rollout._engine = lambda policy, settings, **kwargs: engine  # what make_engine would build for rollout.engine
    sampler = RoleRuntime(config).engine(SimpleNamespace(), None)
    got = [[c.text for c in sampler.generate([f"q{j}" for j in range(n)], SamplingParams(), seed=5)] for n in sizes]
    return {"calls": distributed.all_gather_objects(engine.calls), "completions": distributed.all_gather_objects(got)}


def main(out: str) -> None:
    torch.set_num_threads(1)
    distributed.init_from_env(torch.device("cpu"))
    results = {name: case(sets, sizes) for name, (sets, sizes) in CASES.items()}
    if distributed.is_main():
        with open(out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
