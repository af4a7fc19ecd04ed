"""Data-parallel sampling shares (coevolve/rollout/wrappers.py) on 2 real gloo processes, with a stand-in engine in
place of vLLM or the HF engine (tests/rollout/share_ranks.py): how many prompts each rank's engine sampled, and that
every rank got every completion, once, seeded as one process seeds it. The results alone cannot tell a rank that
sampled its share from one that sampled the whole call (the same completions, at N times the cost)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.rollout.base import PROMPT_SEED_STRIDE


@pytest.fixture(scope="module")
def shares(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("shares") / "shares.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               str(Path(__file__).with_name("share_ranks.py")), str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def one_process(n: int, seed: int = 5) -> list[str]:
    """What one process's engine answers for prompts q0..q{n-1} (the stand-in's text: prompt@its seed)."""
    return [f"q{j}@{seed + j * PROMPT_SEED_STRIDE}" for j in range(n)]


def test_each_vllm_engine_samples_its_share_and_every_rank_gets_the_whole_call(shares):
    got = shares["vllm"]  # calls of 7, 1 and 0 prompts; one engine per rank (tensor_parallel_size 1)
    assert got["calls"] == [[4, 1, 0], [3, 0, 0]]  # rank 0 q0-q3, rank 1 q4-q6; a rank with no share still calls
    for rank_got in got["completions"]:
        assert rank_got == [one_process(7), one_process(1), []]


def test_a_tensor_parallel_engine_over_both_ranks_samples_the_call_once(shares):
    got = shares["vllm_tensor_parallel"]  # one engine over the 2 ranks: both drive it with the whole call
    assert got["calls"] == [[7], [7]]
    assert got["completions"] == [[one_process(7)], [one_process(7)]]  # contributed once, not twice


def test_the_hf_engine_shares_in_whole_batches(shares):
    got = shares["hf_batches_of_2"]  # rollout.batch_size 2: 5 prompts are 3 batches, 2 for rank 0 and 1 for rank 1
    assert got["calls"] == [[4], [1]]
    assert got["completions"] == [[one_process(5)], [one_process(5)]]
