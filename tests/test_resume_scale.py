"""Resume on another number of processes: a run checkpointed on 1 process continues on 2 (data parallel or FSDP),
and one checkpointed on 2 continues on 1, training as the uninterrupted one-process run did: the same global batch
and data order (the same samples), each step's loss and grad norm, the final weights and AdamW moments (the optimizer
state restored into the new layout: whole on 1 process, sharded on 2), every step logged once. A change that cannot
be honoured is one line before any model loads.

The sharded case (Dynamic RL 1 -> 2 with FSDP -> 1) shares its 2-process launch with the two-node test
(tests/test_multinode.py). Each test takes one 2-process launch (the slow part on 2 cores); the uninterrupted runs
and the 1-process resumes run in this process."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from run_checks import assert_same_training, launch, samples, train_rows
from test_faults_cli import model_loaders
from typer.testing import CliRunner

from coevolve.cli import app

R_ZERO_RUN = ["run", "r_zero", "--quiet", "--set", "steps=4", "--set", "eval_sets=[]",
              "--set", "params.questioner_steps=2", "--set", "params.solver_steps=2",
              "--set", "params.questioner_prompts=4", "--set", "params.questioner_group=4",
              "--set", "params.score_samples=4", "--set", "params.pool_size=8", "--set", "params.label_samples=4",
              "--set", "params.band=[0,1]", "--set", "params.solver_questions=4", "--set", "params.solver_group=8",
              "--set", "rollout.batch_size=8", "--set", "train.micro_batch_size=4", "--set", "train.lr=1e-3"]
EVERY_STEP = ["--set", "checkpoint_every=1", "--set", "keep_checkpoints=10"]


def run_here(*args: str) -> None:
    """``coevolve ARGS`` in this process (one process, no launcher)."""
    done = CliRunner().invoke(app, [str(a) for a in args])
    assert done.exit_code == 0, done.output


def rewound(run_dir: Path, to: Path, step: int) -> Path:
    """A copy of ``run_dir`` as it was when checkpoint ``step`` had just been written (later checkpoints and the
    summary removed; the resume itself forgets the later rows and samples)."""
    shutil.copytree(run_dir, to)
    for later in (to / "checkpoints").glob("step_*"):
        if int(later.name.removeprefix("step_")) > step:
            shutil.rmtree(later)
    (to / "summary.json").unlink()
    return to


def assert_continues(straight: Path, resumed: Path, model_dir: Path, series: tuple[str, ...]) -> dict[str, float]:
    """``resumed`` trained as ``straight``: the same samples (the same data, in the same order, batched the same),
    every step logged once, the same per-step ``series``, weights and AdamW moments (run_checks.UPDATE_GAP)."""
    assert samples(resumed) == samples(straight)
    assert [r["step"] for r in train_rows(resumed)] == [r["step"] for r in train_rows(straight)]
    return assert_same_training(straight, resumed, model_dir, series)


@pytest.mark.slow
def test_two_role_recipe_one_process_to_two_and_back_to_one(small_tiny_arith, tmp_path, capsys):
    """R-Zero checkpointed on 1 process after step 1 (the questioner's phase), steps 2-4 data parallel on 2
    processes (the questioner's second step, then the solver's phase on the pool it builds), then steps 3-4 again on
    1 process from the 2-process checkpoint of step 2: both roles' weights and AdamW state as the straight run."""
    model = small_tiny_arith[1]
    norms = ("questioner/grad_norm", "solver/grad_norm")
    straight = tmp_path / "straight"
    run_here(*R_ZERO_RUN, "--set", f"model={model}", *EVERY_STEP, "--out", straight)
    two = rewound(straight, tmp_path / "two", 1)
    done = launch(["run", "--resume", str(two), "--quiet", "--processes", "2"])
    assert done.returncode == 0, done.stderr[-2000:]
    gaps = assert_continues(straight, two, model, norms)
    back = rewound(two, tmp_path / "back", 2)
    run_here("run", "--resume", back, "--quiet")
    back_gaps = assert_continues(straight, back, model, norms)
    with capsys.disabled():
        print(f"\nr_zero 1 -> 2 -> 1 processes vs 1 throughout: |difference| / |update| = {gaps['weights']:.2e} / "
              f"{back_gaps['weights']:.2e} (weights), {gaps['adam']:.2e} / {back_gaps['adam']:.2e} (AdamW moments)")


def test_a_change_of_processes_that_cannot_be_honoured_is_one_line_before_a_model_loads(tmp_path, random_model_dir,
                                                                                          monkeypatch):
    """A sharded run resumed on one process without turning sharding off, and a vLLM engine over 2 ranks resumed on
    3 processes: one line naming the key, exit 2, no model loaded, the run folder untouched."""
    out = tmp_path / "run"
    run_here("run", "grpo", "--out", out, "--quiet", "--set", f"model={random_model_dir}", "--set", "steps=1",
             "--set", "eval_sets=[]", "--set", "rollout.max_new_tokens=4", "--set", "params.questions_per_step=2",
             "--set", "params.group_size=2")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded or built before the error")

    for module, name in model_loaders():
        monkeypatch.setattr(module, name, no_model)
    for extra, key in ((["--set", "steps=2", "--set", "train.fsdp=true"], "train.fsdp=false"),
                       (["--set", "steps=2", "--set", "rollout.engine=vllm",
                         "--set", "rollout.vllm.tensor_parallel_size=2", "--processes", "3"],
                        "rollout.vllm.tensor_parallel_size")):
        done = CliRunner().invoke(app, ["run", "--resume", str(out), "--quiet", *extra])
        errors = [line for line in done.output.splitlines() if "error:" in line]
        assert done.exit_code == 2 and len(errors) == 1 and key in errors[0], done.output
        assert "Traceback" not in done.output
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
