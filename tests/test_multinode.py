"""Several nodes, simulated on one machine: two torchrun launchers (one per "node", one process each) meet at a c10d
rendezvous on 127.0.0.1, each with a cache and a temp folder of its own (node-local disks), the run folder shared.
The run resumes (from a one-process checkpoint, sharded), trains, writes each checkpoint, row and sample file once
(global rank 0 alone, whichever node it is on), exports the folder the one-process run exports, and resumes again on
one process. The rank-to-device mapping of a multi-node launch (local
rank, not global rank) is checked without a GPU or vLLM."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import types

import pytest
import torch
from export_checks import assert_same_export
from run_checks import DYNAMIC_RL_RUN, UPDATE_GAP
from test_resume_scale import EVERY_STEP, assert_continues, rewound, run_here

from coevolve import distributed

POLICY = ("policy/loss", "policy/grad_norm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_resume_sharded_train_checkpoint_once_and_export(small_tiny_arith, tmp_path, capsys):
    """Dynamic RL checkpointed on 1 process after step 1; steps 2-3 on the two nodes with FSDP (1 -> 2 processes:
    the whole AdamW state loaded into shards); then step 3 again on 1 process from the checkpoint the nodes gathered
    (2 -> 1). Both train as the straight one-process run (tests/test_resume_scale.py has the data-parallel case)."""
    model = small_tiny_arith[1]
    straight = tmp_path / "straight"
    run_here(*DYNAMIC_RL_RUN, "--set", f"model={model}", *EVERY_STEP, "--out", straight)
    out = rewound(straight, tmp_path / "nodes", 1)
    port = free_port()
    launchers = []
    for node in (0, 1):
        local = tmp_path / f"node{node}"
        (local / "tmp").mkdir(parents=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "COEVOLVE_CACHE": str(local / "cache"),
               "TMPDIR": str(local / "tmp")}
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                   f"--node-rank={node}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                   "--rdzv-id=t42", f"--rdzv-conf=is_host={str(node == 0).lower()}", "--max-restarts=0",
                   "-m", "coevolve", "run", "--resume", str(out), "--quiet", "--set", "train.fsdp=true"]
        launchers.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
    outputs = [launcher.communicate(timeout=600) for launcher in launchers]
    assert [launcher.returncode for launcher in launchers] == [0, 0], [err[-2000:] for _, err in outputs]
    assert sum(err.count("run directory:") for _, err in outputs) == 1  # global rank 0 alone speaks and writes
    assert sum(o.count("done:") for o, _ in outputs) == 1
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"step_00000{i}" for i in (1, 2, 3)]
    gaps = assert_continues(straight, out, model, POLICY)  # each row once, the same samples and training
    assert_same_export(straight, out, tmp_path, UPDATE_GAP)
    for node in (0, 1):  # nothing of the run went to a node's own folders (the model came from a path)
        assert not (tmp_path / f"node{node}" / "cache").exists()
    back = rewound(out, tmp_path / "back", 2)  # config.yaml now says fsdp
    run_here("run", "--resume", back, "--quiet", "--set", "train.fsdp=false")
    back_gaps = assert_continues(straight, back, model, POLICY)
    with capsys.disabled():
        print(f"\ndynamic_rl 1 -> 2 nodes (FSDP) -> 1 process vs 1 throughout: |difference| / |update| = "
              f"{gaps['weights']:.2e} / {back_gaps['weights']:.2e} (weights), {gaps['adam']:.2e} / "
              f"{back_gaps['adam']:.2e} (AdamW moments)")


@pytest.mark.parametrize("rank, local_rank", [(1, 0), (3, 1), (0, 0)])
def test_each_rank_uses_its_node_s_device_and_so_does_its_vllm_engine(rank, local_rank, monkeypatch, random_policy):
    """Rank ``rank`` of 4 on nodes of 2 GPUs: the trainer's device is cuda:<local rank>; the vLLM engine of that rank
    is built for an external launcher (it reads RANK and LOCAL_RANK itself: the same device) over the run's ranks."""
    from coevolve.rollout import vllm_engine

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    assert distributed.device_for("cuda") == torch.device("cuda", local_rank)
    assert distributed.device_for("cpu") == torch.device("cpu")
    built = {}

    class FakeLLM:  # records what vLLM would be built with, and the launcher variables it would read
        def __init__(self, **kwargs):
            built.update(kwargs, rank=os.environ["RANK"], local_rank=os.environ["LOCAL_RANK"])

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM))
    monkeypatch.setattr(vllm_engine, "require_vllm", lambda: None)
    monkeypatch.setattr(distributed, "world_size", lambda: 4)
    monkeypatch.setattr(vllm_engine, "_ENGINES_ON_THE_RUNS_GROUP", [])
    engine = vllm_engine.VLLMRolloutEngine(random_policy.model, random_policy.tokenizer, "unused-folder")
    engine._ensure_engine()
    assert built["distributed_executor_backend"] == "external_launcher" and built["tensor_parallel_size"] == 1
    assert (int(built["rank"]), torch.device("cuda", int(built["local_rank"]))) == \
        (rank, distributed.device_for("cuda"))
