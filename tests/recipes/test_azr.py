"""The azr recipe (coevolve/recipes/azr.py): its config, the sandbox set up before the model loads (and refused in one
line without the explicit opt-in), a run in the tiny program world with every task type's telemetry, and a run killed
with SIGKILL that resumes with its task buffers and trains as the uninterrupted one."""

from __future__ import annotations

import json
import math
import signal
from types import SimpleNamespace

import pytest
from run_checks import assert_same_training, last_checkpoint, launch, run_killed, train_rows
from typer.testing import CliRunner

from coevolve.cli import app
from coevolve.config import ConfigError
from coevolve.recipes import resolve
from coevolve.recipes.azr import AZR, AZRParams, Proposed, Solved
from coevolve.rollout import Completion
from coevolve.tasks.triplets import INVALID_REASONS, KINDS

# Three steps of B=4 tasks per type in the tiny program world: seeding fills each buffer to B*S = 8.
AZR_RUN = ["run", "azr", "--preset", "small", "--quiet", "--set", "steps=3", "--set", "params.batch_size=4",
           "--set", "params.seed_batch_factor=2", "--set", "params.learnability_samples=2",
           "--set", "params.references=2", "--set", "rollout.max_new_tokens=40", "--set", "eval_sets=[prog_deduction]",
           "--set", "eval_limit=8", "--set", "eval_every=0"]


def test_presets_follow_the_paper_and_the_small_world():
    cfg, params, _ = resolve("azr", preset="paper")
    assert (cfg.task, cfg.train.lr, cfg.train.kl_beta, cfg.train.mini_batch_size, cfg.train.entropy_coef) == (
        "python", 1e-6, 0.0, 128, 0.001)  # Table 3
    assert (params.batch_size, params.references, params.learnability_samples, params.induction_inputs,
            params.seed_batch_factor, params.max_buffer) == (64, 6, 8, 10, 4, 16384)
    cfg, params, _ = resolve("azr", preset="small")
    assert (cfg.model, cfg.task, params.induction_inputs) == ("tiny-program", "program", 6)
    assert cfg.eval_sets == ["prog_deduction", "prog_abduction", "prog_induction"]
    with pytest.raises(ConfigError, match="task types repeat"):
        resolve("azr", sets=["params.task_types=[deduction,deduction]"])


def test_without_a_sandbox_azr_refuses_in_one_line_unless_told_to_run_unconfined(tmp_path, monkeypatch,
                                                                                   random_model_dir):
    import coevolve.execution.executor as executor

    monkeypatch.setattr(executor, "sandbox_problem", lambda: "bubblewrap (bwrap) is not installed")
    out = tmp_path / "run"
    args = ["run", "azr", "--quiet", "--out", str(out), "--set", "task=python", "--set", f"model={random_model_dir}",
            "--set", "steps=1", "--set", "eval_sets=[]"]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2
    line, = refused.output.strip().splitlines()
    assert "bubblewrap (bwrap) is not installed" in line and "params.unconfined_execution=true" in line
    assert not out.exists() or not any(out.iterdir())  # nothing written, no model loaded
    from coevolve.recipes.azr import make_world

    cfg, params, _ = resolve("azr", sets=["task=python", "params.unconfined_execution=true"])
    world = make_world(cfg, params)  # the explicit opt-in: unconfined processes under the same limits
    try:
        assert world.executor.confinement == "none"
    finally:
        world.close()
    cfg, params, _ = resolve("azr", sets=["task=arith"])
    with pytest.raises(ConfigError, match="task=program"):
        make_world(cfg, params)


def test_a_mixed_batch_has_six_baselines_one_per_task_type_and_role():
    """TRR++ (Eq. 8) on a step's proposer and solver samples of the three types, interleaved: each sample is
    normalised within its (type, role) group only (sample std, n - 1), by hand:
    deduction proposer [0.75, -0.25]: mean 0.25, std 0.7071 -> +-0.7071;  solver [1, -0.5, -0.5]: mean 0, std 0.8660
    -> [1.1547, -0.5774, -0.5774]; abduction proposer [-1, -1]: constant -> 0;  solver [1, -1] -> +-0.7071;
    induction proposer [0.5, -0.5, 0]: mean 0, std 0.5 -> [1, -1, 0];  solver [1, 1]: constant -> 0.
    Three groups by type would pool abduction's [-1, -1, 1, -1] (the proposers' advantage -0.5) and induction's
    [0.5, -0.5, 0, 1, 1] (its solvers' 0.9204)."""
    done = Completion(prompt="", prompt_ids=[1], token_ids=[5, 6], text="", logprobs=[-1.0, -1.0])
    proposed = [Proposed(kind, done, [], reward=r) for kind, r in (
        ("deduction", 0.75), ("abduction", -1.0), ("induction", 0.5), ("deduction", -0.25), ("induction", -0.5),
        ("abduction", -1.0), ("induction", 0.0))]
    solved = [Solved(kind, None, True, done, reward=r) for kind, r in (
        ("abduction", 1.0), ("deduction", 1.0), ("induction", 1.0), ("deduction", -0.5), ("abduction", -1.0),
        ("induction", 1.0), ("deduction", -0.5))]
    AZR.advantages(SimpleNamespace(params=AZRParams()), proposed, solved)
    z, third = 1 / math.sqrt(2), 0.5 / math.sqrt(0.75)
    assert [q.advantage for q in proposed] == pytest.approx([z, 0.0, 1.0, -z, -1.0, 0.0, 0.0], abs=1e-5)
    assert [s.advantage for s in solved] == pytest.approx([z, 2 * third, 0.0, -third, -z, 0.0, -third], abs=1e-5)


@pytest.fixture(scope="module")
def azr_run(small_tiny_program, tmp_path_factory):
    """The uninterrupted run of AZR_RUN that the killed and resumed run must match."""
    out = tmp_path_factory.mktemp("azr") / "one"
    done = launch([*AZR_RUN, "--set", f"model={small_tiny_program[1]}", "--out", str(out)])
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_a_run_reports_every_task_type(azr_run):
    rows = train_rows(azr_run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    first = rows[0]
    for kind in KINDS:
        for name in ("valid_rate", "learnability", "solve_rate", "buffer_size", "buffer_distinct_ops",
                     "executor_jobs", *(f"invalid_{reason}" for reason in INVALID_REASONS)):
            assert f"tasks/{kind}/{name}" in first, (kind, name)
        assert first[f"tasks/{kind}/buffer_size"] >= 8  # seeded to B * S before the first proposals
        assert first[f"tasks/{kind}/valid_rate"] + sum(first[f"tasks/{kind}/invalid_{r}"]
                                                       for r in INVALID_REASONS) == pytest.approx(1.0)
    assert all(r["policy/optimizer_steps"] == 1 and r["policy/grad_norm"] > 0 for r in rows)
    assert first["time/seed_s"] > 0 and "time/seed_s" not in rows[1]
    samples = [json.loads(line) for line in (azr_run / "samples" / "step_000001.jsonl").read_text().splitlines()]
    phases = {(r["role"], r["phase"]) for r in samples}
    assert phases == {("generator", "propose"), ("solver", "estimate"), ("solver", "solve")}
    proposals = [r for r in samples if r["phase"] == "propose"]
    assert len(proposals) == 12 and {r["task_type"] for r in proposals} == set(KINDS)
    assert all(r["reward"] == -1.0 for r in proposals if not r["valid"])
    assert all((r["invalid_reason"] is None) == r["valid"] for r in proposals)
    assert len([r for r in samples if r["phase"] == "solve"]) == 12  # B per type: new tasks, then the buffer's
    state = json.loads((last_checkpoint(azr_run) / "state.json").read_text())["recipe"]["loop_recipe"]["buffers"]
    assert len(state["entries"]["induction"]) == rows[-1]["tasks/induction/buffer_size"]


def test_sigkill_mid_step_then_resume_restores_the_buffers(tmp_path, small_tiny_program, azr_run):
    killed = tmp_path / "killed"
    proc = run_killed("after_samples", [*AZR_RUN, "--set", f"model={small_tiny_program[1]}", "--out", str(killed)])
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert sorted(p.name for p in (killed / "checkpoints").iterdir() if p.name.startswith("step_")) == ["step_000001"]
    resumed = CliRunner().invoke(app, ["run", "--resume", str(killed), "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert [r["step"] for r in train_rows(killed)] == [1, 2, 3]
    buffers = [json.loads((last_checkpoint(run) / "state.json").read_text())["recipe"]["loop_recipe"]["buffers"]
               for run in (azr_run, killed)]
    assert buffers[0] == buffers[1]  # the resumed run's buffers are the uninterrupted run's, entry for entry
    assert_same_training(azr_run, killed, small_tiny_program[1], ("policy/loss", "policy/grad_norm"))
