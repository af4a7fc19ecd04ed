"""A run killed with SIGKILL mid-step resumes from its last checkpoint without losing or repeating a step,
and continues exactly as the uninterrupted run would have."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest


def _args(model_dir, out):
    return [sys.executable, "-m", "coevolve.cli", "run", "grpo", "--out", str(out), "--quiet",
            "--set", f"model={model_dir}", "--set", "steps=5", "--set", "eval_sets=[]",
            "--set", "params.questions_per_step=4", "--set", "params.group_size=4",
            "--set", "rollout.max_new_tokens=12", "--set", "train.lr=1e-2", "--set", "keep_checkpoints=2"]


def _train_rows(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "solver/reward_mean" in r]


# The killed run is the same CLI run with one function wrapped so that the process SIGKILLs itself at a fixed
# point of step 3: deterministic on any machine speed (polling for a checkpoint and killing raced on fast CI).
_KILL_DRIVER = """
import os, signal, sys
import coevolve.store as store
point = sys.argv.pop(1)
if point == "after_samples":
    original = store.RunStore.write_samples
    def wrapped(self, step, records):
        original(self, step, records)
        if step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
    store.RunStore.write_samples = wrapped
else:  # mid_checkpoint: weights of step 3 written, optimizer state not yet
    original = store.save_file
    def wrapped(tensors, path, *args, **kwargs):
        if "/.step_000003." in path:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(tensors, path, *args, **kwargs)
    store.save_file = wrapped
from coevolve.cli import app
sys.argv[0] = "coevolve"
app()
"""


@pytest.mark.parametrize("kill_point", ["after_samples", "mid_checkpoint"])
def test_sigkill_mid_step_then_resume(tmp_path, random_model_dir, kill_point):
    reference = tmp_path / "reference"
    subprocess.run(_args(random_model_dir, reference), check=True, capture_output=True, timeout=600)

    killed = tmp_path / "killed"
    args = _args(random_model_dir, killed)
    proc = subprocess.run([sys.executable, "-c", _KILL_DRIVER, kill_point] + args[3:], capture_output=True,
                          timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not (killed / "summary.json").exists()
    assert (killed / "checkpoints" / "step_000002").exists()
    assert not (killed / "checkpoints" / "step_000003").exists()
    if kill_point == "after_samples":
        assert (killed / "samples" / "step_000003.jsonl").exists()  # logged, then lost with the step
    else:
        assert any(p.name.startswith(".step_000003.") for p in (killed / "checkpoints").iterdir())

    resumed = subprocess.run([sys.executable, "-m", "coevolve.cli", "run", "--resume", str(killed), "--quiet"],
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    ref_rows, rows = _train_rows(reference), _train_rows(killed)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # none lost, none repeated
    for ref, got in zip(ref_rows, rows):
        assert got["solver/reward_mean"] == ref["solver/reward_mean"]
        assert abs(got["solver/loss"] - ref["solver/loss"]) < 1e-6
    assert sorted(p.name for p in (killed / "samples").iterdir()) == [f"step_00000{i}.jsonl" for i in range(1, 6)]
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["step_000004", "step_000005"]
    assert json.loads((killed / "summary.json").read_text())["steps"] == 5


def test_resume_of_a_finished_run_can_extend_it(tmp_path, random_model_dir):
    out = tmp_path / "run"
    subprocess.run(_args(random_model_dir, out)[:-2] + ["--set", "steps=2"], check=True, capture_output=True,
                   timeout=600)
    more = subprocess.run([sys.executable, "-m", "coevolve.cli", "run", "--resume", str(out), "--set", "steps=3",
                           "--quiet"], capture_output=True, text=True, timeout=600)
    assert more.returncode == 0, more.stderr
    assert [r["step"] for r in _train_rows(out)] == [1, 2, 3]
