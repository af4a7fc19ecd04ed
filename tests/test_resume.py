"""A run killed with SIGKILL mid-step resumes from its last checkpoint without losing or repeating a step, and trains
as the uninterrupted run did: the same per-step loss and grad norm, final weights and AdamW state."""

from __future__ import annotations

import json
import signal

import pytest
from run_checks import DYNAMIC_RL_RUN, assert_same_training, run_killed, train_rows
from test_tracking import assert_rows_logged, offline_wandb
from typer.testing import CliRunner
from wandb_offline import offline_runs

from coevolve.cli import app


@pytest.mark.parametrize("kill_point", ["after_samples", "mid_checkpoint"])
def test_sigkill_mid_step_then_resume(tmp_path, small_tiny_arith, dynamic_rl_run, kill_point, monkeypatch):
    """The run killed after its samples also reports to W&B (offline): the resumed run continues the same W&B run,
    and its offline files hold every metrics row; reporting changes nothing in training."""
    killed = tmp_path / "killed"
    args = [*DYNAMIC_RL_RUN, "--set", f"model={small_tiny_arith[1]}", "--out", str(killed)]
    wandb_dir = None
    if kill_point == "after_samples":
        wandb_dir = offline_wandb(monkeypatch, tmp_path)
        args += ["--set", "report_to=[tensorboard,wandb]"]
    proc = run_killed(kill_point, args)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert not (killed / "summary.json").exists()
    assert sorted(p.name for p in (killed / "checkpoints").iterdir() if p.name.startswith("step_")) == ["step_000001"]
    if kill_point == "after_samples":
        assert (killed / "samples" / "step_000002.jsonl").exists()  # logged, then lost with the step
    else:
        assert any(p.name.startswith(".step_000002.") for p in (killed / "checkpoints").iterdir())

    resumed = CliRunner().invoke(app, ["run", "--resume", str(killed), "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert [r["step"] for r in train_rows(killed)] == [1, 2, 3]  # none lost, none repeated
    assert sorted(p.name for p in (killed / "samples").iterdir()) == [f"step_00000{i}.jsonl" for i in range(1, 4)]
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["step_000002", "step_000003"]
    assert json.loads((killed / "summary.json").read_text())["steps"] == 3
    assert_same_training(dynamic_rl_run, killed, small_tiny_arith[1], ("policy/loss", "policy/grad_norm"))
    if wandb_dir is not None:
        killed_run, resumed = offline_runs(wandb_dir)
        saved = json.loads((killed / "wandb_run.json").read_text())["id"]
        assert killed_run.id == resumed.id == saved  # one W&B run, continued
        # SIGKILL took wandb-core's unwritten buffer (here all the killed process logged); the resumed process sent
        # the rows before the resume point again, so the W&B run holds every row
        assert resumed.config["recipe"] == "dynamic_rl" and resumed.config["report_to"] == ["tensorboard", "wandb"]
        assert_rows_logged(killed, killed_run.history + resumed.history)
        assert sorted(h["step"] for h in resumed.history if "policy/loss" in h) == [1, 2, 3]


def test_resume_of_a_finished_run_can_extend_it(tmp_path, random_model_dir):
    out = tmp_path / "run"
    first = CliRunner().invoke(app, ["run", "grpo", "--out", str(out), "--quiet", "--set", f"model={random_model_dir}",
                                     "--set", "steps=2", "--set", "eval_sets=[]", "--set", "rollout.max_new_tokens=6",
                                     "--set", "params.questions_per_step=2", "--set", "params.group_size=2"])
    assert first.exit_code == 0, first.output
    more = CliRunner().invoke(app, ["run", "--resume", str(out), "--set", "steps=3", "--quiet"])
    assert more.exit_code == 0, more.output
    assert [r["step"] for r in train_rows(out)] == [1, 2, 3]


def _grpo_run(model, out, steps: int):
    return CliRunner().invoke(app, ["run", "grpo", "--out", str(out), "--quiet", "--set", f"model={model}", "--set",
                                    f"steps={steps}", "--set", "eval_sets=[]", "--set", "rollout.max_new_tokens=4",
                                    "--set", "params.questions_per_step=2", "--set", "params.group_size=2"])


def _files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_resume_past_a_damaged_checkpoint_removes_only_what_the_run_wrote(tmp_path, random_model_dir):
    """Step 2's checkpoint is damaged, so the resume redoes step 2 and removes what the run wrote after step 1. A note
    of the user's inside eval/step_000002 (beside what `coevolve eval RUN` wrote) refuses it the way --overwrite
    refuses: one line naming it, nothing changed. Names a run never writes (samples/step_notes.txt, eval/step_best/)
    are kept and stop nothing (they used to stop every resume with `invalid literal for int()`)."""
    out = tmp_path / "run"
    assert _grpo_run(random_model_dir, out, 2).exit_code == 0
    (out / "checkpoints" / "step_000002" / "solver.safetensors").write_bytes(b"truncated")
    for name in ("eval/step_000002/summary.json", "eval/step_000002/arith_l1/results.jsonl",
                 "eval/step_000002/notes.txt", "samples/step_notes.txt", "eval/step_best/mine.csv"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("mine\n")
    before = _files(out)
    refused = CliRunner().invoke(app, ["run", "--resume", str(out), "--quiet"])
    errors = [line for line in refused.output.splitlines() if line.startswith("error:")]
    assert refused.exit_code == 2 and len(errors) == 1, refused.output
    assert "eval/step_000002/notes.txt" in errors[0] and "nothing was removed" in errors[0], errors[0]
    assert _files(out) == before and (out / "checkpoints" / "step_000002").is_dir()

    (out / "eval" / "step_000002" / "notes.txt").unlink()
    resumed = CliRunner().invoke(app, ["run", "--resume", str(out), "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert [r["step"] for r in train_rows(out)] == [1, 2]
    assert not (out / "eval" / "step_000002").exists()  # the run's evaluation of the lost step 2, removed
    assert (out / "samples" / "step_notes.txt").read_text() == "mine\n"
    assert (out / "eval" / "step_best" / "mine.csv").read_text() == "mine\n"
    assert (out / "checkpoints" / "damaged_step_000002" / "solver.safetensors").read_bytes() == b"truncated"
