"""Data parallel on 2 CPU processes (gloo): the same samples, per-step grad norms and losses, weights and AdamW state
as one process with the same global batch, also after every process was SIGKILLed and the run resumed; a dead rank
stops the whole run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from export_checks import assert_round_trip, assert_same_export
from run_checks import (
    COEVOLVE,
    DYNAMIC_RL_RUN,
    UPDATE_GAP,
    assert_same_training,
    kill_process_tree,
    launch,
    samples,
    train_rows,
    trained_steps,
)

POLICY = ("policy/loss", "policy/grad_norm")  # the summed gradient's norm: a share lost, halved or doubled shows


def kill_after_first_checkpoint(args: list[str], out: Path) -> None:
    """Start ``coevolve ARGS``, wait for its first checkpoint in ``out``, then SIGKILL the launcher and every rank
    before the second step ends, so the resumed run takes at least two updates."""
    runner = subprocess.Popen([*COEVOLVE, *args], env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (out / "checkpoints" / "step_000001").exists():
        assert runner.poll() is None and time.time() < deadline, "the run ended or stalled before its first checkpoint"
        time.sleep(0.05)
    kill_process_tree(runner.pid)
    runner.wait(timeout=60)
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_")) == ["step_000001"]
    assert not (out / "summary.json").exists()


@pytest.mark.slow
def test_two_processes_train_the_same_weights_as_one(dynamic_rl_run, small_tiny_arith, tmp_path, capsys):
    out = tmp_path / "two"
    done = launch([*DYNAMIC_RL_RUN, "--set", f"model={small_tiny_arith[1]}", "--out", str(out), "--processes", "2"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert trained_steps(dynamic_rl_run) == 3  # real updates, not zero gradients
    assert samples(out) == samples(dynamic_rl_run)  # each rank sampled its share; every rank saw all of it
    gaps = assert_same_training(dynamic_rl_run, out, small_tiny_arith[1], POLICY)
    with capsys.disabled():
        print(f"\n2 processes vs 1, dynamic_rl 3 steps: |difference| / |update| = {gaps['weights']:.2e} (weights), "
              f"{gaps['adam']:.2e} (AdamW moments)")
    assert [r["step"] for r in train_rows(out)] == [1, 2, 3]  # rank 0 alone wrote the metrics
    assert_same_export(dynamic_rl_run, out, tmp_path, UPDATE_GAP)  # and the same folder comes out of it


@pytest.mark.slow
def test_accelerate_launch_trains_the_same_weights_as_one_process(dynamic_rl_run, small_tiny_arith, tmp_path):
    out = tmp_path / "accelerate"
    # `--multi_gpu` is accelerate's name for its torchrun-style launcher; on a CPU machine it starts CPU ranks (gloo).
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "coevolve",
               *DYNAMIC_RL_RUN, "--set", f"model={small_tiny_arith[1]}", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("run directory:") == 1  # rank 0 alone speaks
    assert samples(out) == samples(dynamic_rl_run)
    assert_same_training(dynamic_rl_run, out, small_tiny_arith[1], POLICY)


@pytest.mark.slow
def test_fsdp_run_killed_and_resumed_trains_the_same_weights_as_one(dynamic_rl_run, small_tiny_arith, tmp_path,
                                                                    capsys):
    """Sharded over 2 processes, every process SIGKILLed after the first (gathered) checkpoint, resumed from it
    sharded again: steps 2 and 3 train after the resume."""
    out = tmp_path / "fsdp-killed"
    kill_after_first_checkpoint([*DYNAMIC_RL_RUN, "--set", f"model={small_tiny_arith[1]}", "--out", str(out),
                                 "--processes", "2", "--set", "train.fsdp=true"], out)
    done = launch(["run", "--resume", str(out), "--quiet", "--processes", "2"])  # shards loaded from whole files
    assert done.returncode == 0, done.stderr[-2000:]
    assert samples(out) == samples(dynamic_rl_run)  # sampling and evaluation ran on gathered weights
    # the gathered checkpoint has the one-process files' names; gradients summed into the shards, not averaged
    gaps = assert_same_training(dynamic_rl_run, out, small_tiny_arith[1], POLICY)
    # exported, the sharded run is the folder the one-process run exports: the same files, the same weights up to the
    # training gap above, and transformers, vLLM and `coevolve eval` read it back to what coevolve evaluates
    sharded = assert_same_export(dynamic_rl_run, out, tmp_path, UPDATE_GAP)
    gap = assert_round_trip(out, 3, sharded, tmp_path)
    with capsys.disabled():
        print(f"\nFSDP on 2 processes (killed, resumed) vs 1, dynamic_rl 3 steps: |difference| / |update| = "
              f"{gaps['weights']:.2e} (weights), {gaps['adam']:.2e} (AdamW moments); its export's transformers "
              f"log-probs within {gap:.1e} of coevolve's")


@pytest.mark.slow
def test_two_role_recipe_on_two_processes_matches_one(small_tiny_arith, tmp_path, capsys):
    """R-Zero trains the questioner (steps 1-2), then the solver (steps 3-4, on a pool that keeps every labelled
    question; at this seed one of the two solver steps has a non-zero advantage); both roles' weights, AdamW state
    and grad norms match one process, plain and sharded."""
    args = ["run", "r_zero", "--quiet", "--set", f"model={small_tiny_arith[1]}", "--set", "steps=4",
            "--set", "eval_sets=[]", "--set", "params.questioner_steps=2", "--set", "params.solver_steps=2",
            "--set", "params.questioner_prompts=4", "--set", "params.questioner_group=4",
            "--set", "params.score_samples=4", "--set", "params.pool_size=8", "--set", "params.label_samples=4",
            "--set", "params.band=[0,1]", "--set", "params.solver_questions=4", "--set", "params.solver_group=8",
            "--set", "rollout.batch_size=8", "--set", "train.micro_batch_size=4", "--set", "train.lr=1e-3"]
    norms = ("questioner/grad_norm", "solver/grad_norm")  # the losses are sums of +-advantages: rounding noise
    one, two = tmp_path / "one", tmp_path / "two"
    assert launch([*args, "--out", str(one)]).returncode == 0
    done = launch([*args, "--out", str(two), "--processes", "2"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert trained_steps(one, "questioner") == 2 and trained_steps(one, "solver") >= 1  # both roles train
    assert samples(one) == samples(two)
    gaps = assert_same_training(one, two, small_tiny_arith[1], norms)
    with capsys.disabled():
        print(f"\n2 processes vs 1, r_zero 4 steps: |difference| / |update| = {gaps['weights']:.2e} (weights), "
              f"{gaps['adam']:.2e} (AdamW moments)")
    # Both roles sharded, activations recomputed in the backward pass: still the one-process training.
    sharded = tmp_path / "fsdp"
    done = launch([*args, "--out", str(sharded), "--processes", "2", "--set", "train.fsdp=true",
                   "--set", "train.gradient_checkpointing=true"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert samples(one) == samples(sharded)
    assert_same_training(one, sharded, small_tiny_arith[1], norms)


@pytest.mark.slow
def test_killed_two_process_run_resumes(dynamic_rl_run, small_tiny_arith, tmp_path):
    out = tmp_path / "killed"
    kill_after_first_checkpoint([*DYNAMIC_RL_RUN, "--set", f"model={small_tiny_arith[1]}", "--out", str(out),
                                 "--processes", "2"], out)  # the launcher and both ranks, in step 2
    done = launch(["run", "--resume", str(out), "--quiet", "--processes", "2"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert samples(out) == samples(dynamic_rl_run)
    assert_same_training(dynamic_rl_run, out, small_tiny_arith[1], POLICY)


@pytest.mark.slow
def test_a_dead_rank_stops_the_run_with_a_message(small_tiny_arith, tmp_path):
    import psutil

    out = tmp_path / "dead"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [*DYNAMIC_RL_RUN, "--set", f"model={small_tiny_arith[1]}", "--set", "steps=50", "--out", str(out),
            "--processes", "2"]
    runner = subprocess.Popen([*COEVOLVE, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (out / "checkpoints" / "step_000001").exists():
        assert runner.poll() is None and time.time() < deadline
        time.sleep(0.2)
    ranks = [p for p in psutil.Process(runner.pid).children(recursive=True) if "coevolve" in " ".join(p.cmdline())
             and "torch.distributed.run" not in " ".join(p.cmdline())]
    assert len(ranks) == 2
    ranks[1].kill()
    _, stderr = runner.communicate(timeout=120)  # no hang: the launcher stops the other rank
    assert runner.returncode != 0
    assert "a rank failed" in stderr and f"--resume {out}" in stderr


def test_impossible_settings_are_one_line_exit_2(tmp_path, random_model_dir):
    from typer.testing import CliRunner

    from coevolve.cli import app

    cases = [(["--set", "train.lora.target_modules=[no_such_proj]"], "train.lora.target_modules"),
             (["--set", "rollout.engine=vllm", "--set", "rollout.vllm.tensor_parallel_size=2"],
              "rollout.vllm.tensor_parallel_size"),
             (["--set", "rollout.engine=vllm", "--set", "rollout.vllm.tensor_parallel_size=2", "--processes", "3"],
              "rollout.vllm.tensor_parallel_size"),
             (["--set", "train.fsdp=true"], "train.fsdp"),
             (["--set", "train.fsdp=true", "--set", "train.lora.r=4", "--processes", "2"], "train.fsdp")]
    if not torch.cuda.is_available():
        cases.append((["--set", "device=cuda"], "device"))
    for extra, key in cases:
        out = tmp_path / key
        result = CliRunner().invoke(app, ["run", "grpo", "--set", f"model={random_model_dir}", "--out", str(out),
                                          *extra])
        assert result.exit_code == 2, (extra, result.output)
        errors = [line for line in result.output.splitlines() if "error:" in line]  # beside model-loading progress
        assert len(errors) == 1 and key in errors[0] and "Traceback" not in result.output, result.output
        assert not out.exists()
