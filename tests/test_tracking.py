"""Reporting (``report_to``): TensorBoard by default; Weights & Biases offline holds the resolved config, every
metrics row under its metrics.jsonl name, the evaluation tables and the HTML report; without the package, one line
names the extra. (A killed and resumed run continuing one W&B run: tests/test_resume.py.)"""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
from typer.testing import CliRunner
from wandb_offline import offline_runs

from coevolve.cli import app
from coevolve.rundir import check_run_dir


def offline_wandb(monkeypatch, tmp_path):
    """W&B offline, every folder it writes inside ``tmp_path`` (never the home folder); returns WANDB_DIR."""
    for name in ("DIR", "CACHE_DIR", "CONFIG_DIR", "DATA_DIR", "ARTIFACT_DIR"):
        folder = tmp_path / f"wandb-{name.lower()}"
        folder.mkdir()
        monkeypatch.setenv(f"WANDB_{name}", str(folder))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    return tmp_path / "wandb-dir"


def tiny_grpo(model, out, *sets: str):
    return CliRunner().invoke(app, [
        "run", "grpo", "--out", str(out), "--quiet", "--set", f"model={model}", "--set", "steps=3",
        "--set", "params.questions_per_step=2", "--set", "params.group_size=2", "--set", "rollout.max_new_tokens=6",
        "--set", "eval_sets=[arith_l1]", "--set", "eval_limit=4", "--set", "eval_max_new_tokens=8", *sets])


def assert_rows_logged(run_dir, history: list[dict]) -> None:
    """Every metrics.jsonl row is a W&B history row with the same names and (finite) values."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        want = {k: v for k, v in row.items() if isinstance(v, (int, float)) and v == v}
        assert any(all(h.get(k) == pytest.approx(v) for k, v in want.items()) for h in history), row


@pytest.mark.slow
def test_wandb_offline_run_holds_the_config_rows_tables_and_report(random_model_dir, tmp_path, monkeypatch):
    wandb_dir = offline_wandb(monkeypatch, tmp_path)
    out = tmp_path / "run"
    done = tiny_grpo(random_model_dir, out, "--set", "report_to=[tensorboard,wandb]")
    assert done.exit_code == 0, done.output
    [run] = offline_runs(wandb_dir)
    assert run.id == json.loads((out / "wandb_run.json").read_text())["id"]
    assert run.config["recipe"] == "grpo" and run.config["steps"] == 3 and run.config["train"]["lr"] > 0
    assert run.config["report_to"] == ["tensorboard", "wandb"]
    assert_rows_logged(out, run.history)
    assert sorted(h["step"] for h in run.history if "solver/loss" in h) == [1, 2, 3]
    tables = [h for h in run.history if "eval/table/_type" in h]
    assert [t["step"] for t in tables] == [0, 3] and all(t["eval/table/nrows"] == 1 for t in tables)
    assert f"report-{run.id}" in run.artifacts and (out / "report" / "report.html").exists()
    assert list((out / "tb").iterdir())  # TensorBoard as well
    check_run_dir(out, overwrite=True)  # --overwrite may remove all a W&B run added (wandb_run.json, report, ...)


def test_default_reports_to_tensorboard_only(random_model_dir, tmp_path, monkeypatch):
    wandb_dir = offline_wandb(monkeypatch, tmp_path)
    out = tmp_path / "run"
    done = tiny_grpo(random_model_dir, out, "--set", "steps=1", "--set", "eval_sets=[]")
    assert done.exit_code == 0, done.output
    assert list((out / "tb").iterdir()) and not (out / "wandb_run.json").exists()
    assert not list(wandb_dir.iterdir())


def test_without_wandb_one_line_names_the_extra(random_model_dir, tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    out = tmp_path / "run"
    done = tiny_grpo(random_model_dir, out, "--set", "report_to=[wandb]")
    errors = [line for line in done.output.splitlines() if line.startswith("error:")]
    assert done.exit_code == 2 and len(errors) == 1, done.output
    assert "pip install 'coevolve[wandb]'" in errors[0] and not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("trouble", ["no API key", "server out of reach"])
def test_wandb_online_that_cannot_start_logs_offline_and_says_so(random_model_dir, tmp_path, monkeypatch, caplog,
                                                                   trouble):
    """W&B online without an API key (wandb: UsageError at once) or without its server (wandb: a CommError after
    init_timeout, 90 s by default): one warning, and the run logs to W&B offline in the run directory. The server is
    a closed port on this machine: the test never reaches the network."""
    offline_wandb(monkeypatch, tmp_path)
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    if trouble == "server out of reach":
        monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
        monkeypatch.setenv("WANDB_INIT_TIMEOUT", "2")
    out = tmp_path / "run"
    done = tiny_grpo(random_model_dir, out, "--set", "steps=1", "--set", "eval_sets=[]", "--set",
                     "report_to=[wandb]")
    assert done.exit_code == 0 and "Traceback" not in done.output, done.output
    warnings = [r.getMessage() for r in caplog.records if "W&B" in r.getMessage()]
    assert len(warnings) == 1 and "offline" in warnings[0] and "wandb sync" in warnings[0], warnings
    [run] = offline_runs(tmp_path / "wandb-dir")
    assert run.id == json.loads((out / "wandb_run.json").read_text())["id"]
    assert_rows_logged(out, run.history)


def test_overwrite_keeps_the_users_files_inside_wandb_folders(tmp_path):
    """W&B's folders in a run directory are removed by W&B's own file layout (the files of an offline run, its logs,
    media and links): a file of the user's among them refuses --overwrite like anywhere else."""
    from coevolve.rundir import RunDirError, removal_plan

    out = tmp_path / "run"
    run = out / "wandb" / "offline-run-20260101_120000-abc123"
    (out / "config.yaml").parent.mkdir(parents=True)
    (out / "config.yaml").write_text("recipe: grpo\n")
    for name in ("run-abc123.wandb", "files/requirements.txt", "files/wandb-summary.json",
                 "files/media/table/eval/table_1_f374adaa48585f6f5534.table.json", "logs/debug.log",
                 "logs/debug-internal.log", "logs/debug-core.log"):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("x")
    (run / "tmp" / "code").mkdir(parents=True)
    (out / "wandb" / "latest-run").symlink_to(run.name)
    remove, foreign = removal_plan(out)
    assert foreign == [] and run in remove and out / "wandb" / "latest-run" in remove
    for mine, named in (("notes.txt", "notes.txt"), ("files/notes.txt", "files/notes.txt"),
                        ("files/media/table/notes.md", "files/media/table/notes.md"),
                        ("logs/mine/debug.log", "logs/mine/")):
        (run / mine).parent.mkdir(parents=True, exist_ok=True)
        (run / mine).write_text("mine\n")
        with pytest.raises(RunDirError, match=f"offline-run-20260101_120000-abc123/{named}"):
            check_run_dir(out, overwrite=True)
        (run / mine).unlink()
    shutil.rmtree(run / "logs" / "mine")
    check_run_dir(out, overwrite=True)
