"""Fault probes of the command line (issue 21): the run directory, checks before anything loads, non-finite values,
resume and concurrency, trust. The CLI runs in-process (typer's CliRunner) on a random 2-layer model."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from typer.testing import CliRunner

from coevolve.cli import app

NO_MODEL = "model=/no/such/model"  # loading it fails: an error about anything else came before the model loaded


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def tiny_run(model_dir, out, *extra: str, steps: int = 1):
    """A 1-step grpo run on the random model (about a second)."""
    return invoke("run", "grpo", "--out", out, "--quiet", "--set", f"model={model_dir}", "--set", f"steps={steps}",
                  "--set", "eval_sets=[]", "--set", "params.questions_per_step=2", "--set", "params.group_size=2",
                  "--set", "rollout.max_new_tokens=4", *extra)


def one_error(result, code: int) -> str:
    """The single ``error:`` line of a command that exited with ``code`` and no traceback."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def train_steps(out: Path) -> list[int]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "solver/reward_mean" in r]


# --- 1. --out into a folder that is not a run ---------------------------------------------------------------------

def test_new_run_refuses_a_folder_with_the_users_files(tmp_path, random_model_dir):
    user = tmp_path / "mine"
    (user / "samples").mkdir(parents=True)
    (user / "checkpoints" / "step_000001").mkdir(parents=True)
    (user / "metrics.jsonl").write_text('{"step": 1, "mine": true}\n')
    (user / "summary.json").write_text("{}\n")
    (user / "samples" / "notes.jsonl").write_text("{}\n")
    (user / "checkpoints" / "step_000001" / "state.json").write_text("{}\n")
    before = tree(user)
    for extra in ([], ["--overwrite"]):
        line = one_error(tiny_run(random_model_dir, user, *extra), 2)
        assert str(user) in line and "not empty" in line
        assert tree(user) == before and sorted(p.name for p in user.iterdir()) == sorted(
            ["samples", "checkpoints", "metrics.jsonl", "summary.json"])
    line = one_error(invoke("sft", "r_zero", "--out", user, "--set", NO_MODEL), 2)  # the format warm-up's --out too
    assert str(user) in line and tree(user) == before


def test_out_empty_string_is_refused(tmp_path, monkeypatch, random_model_dir):
    monkeypatch.chdir(tmp_path)
    line = one_error(tiny_run(random_model_dir, ""), 2)
    assert "--out" in line
    assert list(tmp_path.iterdir()) == []


def test_overwrite_replaces_only_what_a_run_wrote(tmp_path, random_model_dir):
    out = tmp_path / "run"
    assert tiny_run(random_model_dir, out).exit_code == 0
    line = one_error(tiny_run(random_model_dir, out), 2)
    assert "--resume" in line and "--overwrite" in line
    (out / "notes.txt").write_text("mine\n")
    before = tree(out)
    line = one_error(tiny_run(random_model_dir, out, "--overwrite"), 2)
    assert "notes.txt" in line and tree(out) == before
    (out / "notes.txt").unlink()
    result = tiny_run(random_model_dir, out, "--overwrite", "--set", "seed=3")
    assert result.exit_code == 0, result.output
    assert train_steps(out) == [1]  # a fresh run, not appended to the old one
    assert yaml.safe_load((out / "config.yaml").read_text())["seed"] == 3
    line = one_error(invoke("run", "--resume", out, "--overwrite"), 2)
    assert "--overwrite" in line


def _run_files(out: Path) -> None:
    """What `coevolve eval RUN`, `report`, a damaged checkpoint set aside, a checkpoint and an atomic write that never
    finished leave in a run directory beside what the 1-step run wrote."""
    for name in ("eval/step_000001/summary.json", "eval/step_000001/arith_l1/results.jsonl",
                 "eval/model/arith_l1/summary.json", "report/report.html", "report/accuracy.png",
                 "checkpoints/damaged_step_000002/state.json", "checkpoints/.step_000003.k2j4/solver.safetensors",
                 "samples/.step_000002.jsonl.x1y2", ".metrics.jsonl.ab12"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("x")


@pytest.mark.parametrize("mine, named", [
    ("checkpoints/best_step3/solver.safetensors", "checkpoints/best_step3/"), ("samples/my_notes.txt", None),
    ("eval/my.csv", None), ("report/notes.md", None), ("tb/custom", None), ("eval/step_000001/my.csv", None),
    ("checkpoints/step_000001/notes.txt", None), ("eval/step_000001/arith_l1/results.jsonl/x",
                                                  "eval/step_000001/arith_l1/results.jsonl/")])
def test_overwrite_keeps_the_users_files_inside_run_folders(tmp_path, random_model_dir, mine, named):
    """A file of the user's anywhere in the run's folders: --overwrite refuses with one line naming it and removes
    nothing; without it, everything a run wrote (eval, report, set-aside and unfinished checkpoints, temporary
    files) goes."""
    out = tmp_path / "run"
    assert tiny_run(random_model_dir, out).exit_code == 0
    _run_files(out)
    if (out / mine).parent.is_file():
        (out / mine).parent.unlink()
    (out / mine).parent.mkdir(parents=True, exist_ok=True)
    (out / mine).write_text("mine\n")
    before = tree(out)
    line = one_error(tiny_run(random_model_dir, out, "--overwrite"), 2)
    assert (named or mine) in line and "nothing was removed" in line, line
    assert tree(out) == before
    (out / mine).unlink()
    if named:
        (out / named).rmdir()
    result = tiny_run(random_model_dir, out, "--overwrite")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [".lock", "checkpoints", "config.yaml", "metrics.jsonl",
                                                     "samples", "summary.json", "tb"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001"]


def test_overwrite_never_follows_a_symlink(tmp_path, random_model_dir):
    """A run whose checkpoints folder is a symlink (to the user's folder): refused before anything is removed, the
    run still resumes, and the link's target is untouched."""
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    assert tiny_run(random_model_dir, out).exit_code == 0
    (out / "checkpoints").rename(elsewhere)
    (out / "checkpoints").symlink_to(elsewhere, target_is_directory=True)
    (out / "samples" / "step_000009.jsonl").symlink_to(tmp_path / "precious.jsonl")
    (tmp_path / "precious.jsonl").write_text("{}\n")
    before, target = tree(out), tree(elsewhere)
    line = one_error(tiny_run(random_model_dir, out, "--overwrite"), 2)
    assert "checkpoints (a symlink)" in line and "step_000009.jsonl (a symlink)" in line
    assert tree(out) == before and tree(elsewhere) == target and (tmp_path / "precious.jsonl").exists()
    (out / "samples" / "step_000009.jsonl").unlink()
    resumed = invoke("run", "--resume", out, "--quiet", "--set", "steps=2")
    assert resumed.exit_code == 0, resumed.output
    assert train_steps(out) == [1, 2]


# --- 5. everything that can be checked, before anything is written or loaded ----------------------------------------

def config_errors(tmp_path: Path) -> list[tuple[list[str], str, int]]:
    """Every bad command the suite knows that must stop before a model is loaded or built: (arguments, a word of
    its error line, exit code). The model is the built-in tiny-arith, so a check that came after the model would
    first build it."""
    (tmp_path / "a_file").write_text("")
    (tmp_path / "folder.yaml").mkdir()
    (tmp_path / "latin1.yaml").write_bytes("steps: 3  # déjà\n".encode("latin-1"))
    (tmp_path / "huge.yaml").write_text("data_dir: &long " + "x" * 2000 + "\ntrain:\n  lora:\n    target_modules: ["
                                        + ", ".join(["*long"] * 600) + "]\n")  # 17 KB here, 1.2 MB as config.yaml
    empty = tmp_path / "empty_data"
    (empty / "gsm8k").mkdir(parents=True)
    for name in ("train.jsonl", "test.jsonl"):
        (empty / "gsm8k" / name).write_text("")
    (tmp_path / "deep.cnxml").write_text('<document xmlns="http://cnx.rice.edu/cnxml"><content>'
                                         + "<section>" * 5000 + "<para>x</para>" + "</section>" * 5000
                                         + "</content></document>")
    run, math_empty = ["run", "--out", tmp_path / "run", "--quiet"], f"data_dir={empty}"
    return [
        ([*run, "grpo", "--out", tmp_path / "a_file" / "run"], "--out", 2),
        ([*run, "grpo", "--config", tmp_path / "folder.yaml"], "folder.yaml", 2),
        ([*run, "grpo", "--config", tmp_path / "latin1.yaml"], "UTF-8", 2),
        ([*run, "grpo", "--config", tmp_path / "huge.yaml"], "config.yaml", 2),
        ([*run, "grpo", "--set", "eval_sets=[arith_l1, nosuch]"], "eval_sets", 2),
        ([*run, "grpo", "--set", "params.levels=[1, 7]"], "params.levels", 2),
        ([*run, "grpo", "--set", "params.levels=[]"], "params.levels", 2),
        ([*run, "grpo", "--set", "eval_sets=[gsm8k]", "--set", f"data_dir={tmp_path / 'no_data'}"], "--data-dir", 1),
        ([*run, "grpo", "--set", "task=math", "--set", "eval_sets=[]", "--set", f"data_dir={tmp_path / 'no_data'}"],
         "gsm8k_train", 1),
        ([*run, "grpo", "--preset", "small", "--set", "train.lr_schedule=cosine"], "train.lr_schedule", 2),
        ([*run, "grpo", "--preset", "small", "--set", "train.optimizer_reset=phase"], "train.optimizer_reset", 2),
        ([*run, "grpo", "--set", "train.lora.lora_dropout=5"], "train.lora.lora_dropout", 2),
        ([*run, "pasodoble", "--preset", "small", "--set", "rollout.scoring.top_k=40"], "rollout.scoring", 2),
        ([*run, "pasodoble", "--preset", "small", "--set", f"params.knowledge_source={tmp_path / 'no_corpus'}"],
         "params.knowledge_source", 2),
        ([*run, "infuser", "--preset", "small", "--set", f"params.document_source={tmp_path / 'no_docs'}"],
         "params.document_source", 2),
        ([*run, "infuser", "--preset", "small", "--set", f"params.document_source={tmp_path / 'deep.cnxml'}"],
         "nested too deeply", 2),
        ([*run, "infuser", "--set", "params.dev_levels=[0]"], "params.dev_levels", 2),
        ([*run, "ttrl", "--set", "task=math", "--set", "eval_sets=[]", "--set", math_empty], "empty", 1),
        ([*run, "ttrl", "--set", "task=math", "--set", "eval_sets=[]", "--set", math_empty, "--set",
          "params.pool_source=gsm8k"], "pool", 1),
        ([*run, "pasodoble", "--set", "params.scale_std=false"], "is now params.advantage", 2),
        ([*run, "r_zero", "--set", "params.questioner_epochs=2"], "is now roles.questioner.epochs", 2),
        ([*run, "r_zero", "--set", "roles.proposer.epochs=2"], "roles.proposer", 2),
        ([*run, "grpo", "--set", "roles.solver.lr_schedule=cosine"], "roles.solver.lr_schedule", 2),
        ([*run, "infuser", "--set", "roles.generator.lr=-1"], "roles.generator.lr", 2),
        ([*run, "opensir", "--set", "frozen_generator=true", "--set", "params.train_roles=teacher"],
         "params.train_roles", 2),
        ([*run, "r_zero", "--set", "params.format_examples=2"], "format help", 2),
        ([*run, "r_zero", "--preset", "small", "--set", "train.optimizer_reset=nightly"], "train.optimizer_reset", 2),
        *[(["eval", "tiny-arith", f"--{option}", value], f"--{option}", 2)
          for option, value in (("temperature", "nan"), ("temperature", "inf"), ("temperature", "-1"),
                                ("top-p", "0"), ("max-new-tokens", "0"), ("top-k", "-3"))],
        (["run", "--resume", tmp_path / "no_run"], "not a run directory", 2),
        ([*run, "grpo", "--set", "steps=true"], "'steps'", 2),
        ([*run, "grpo", "--set", "rollout.batch_size=true"], "'rollout.batch_size'", 2),
        ([*run, "grpo", "--set", "train.lora.target_modules=[nope]"], "train.lora.target_modules", 2),
        ([*run, "azr", "--preset", "small", "--set", "model=smollm2-135m"], "task=python", 2),
        (["run", "--resume", _edited_recipe(tmp_path / "edited")], "config's recipe differs", 2),
    ]


def _edited_recipe(run: Path) -> Path:
    """A grpo run's folder (its config and the names of a 1-step checkpoint) whose config.yaml now says ttrl."""
    from coevolve.config import to_yaml
    from coevolve.recipes import resolve

    config = resolve("ttrl", sets=["eval_sets=[]"])[0]
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "config.yaml").write_text(to_yaml(config))
    (run / "checkpoints" / "step_000001" / "state.json").write_text(json.dumps({"recipe": {"recipe_name": "grpo"}}))
    return run


def model_loaders() -> list[tuple[ModuleType, str]]:
    """The functions that load or build a model, as (module, name): the tripwire of the early-error checks (here and
    in bench/faults.py)."""
    import coevolve.models
    import coevolve.models.tiny_arith
    import coevolve.roles
    import coevolve.run_models

    # every module that binds a loader by name: one first imported while the stand-in is set would keep it
    return [(coevolve.models.tiny_arith, "ensure_tiny_arith"), (coevolve.models, "load_policy"),
            (coevolve.roles, "load_policy"), (coevolve.run_models, "load_policy")]


def test_every_config_error_comes_before_a_model_is_built(tmp_path, monkeypatch):
    """With an empty model cache, each bad command stops with one line and its exit code before any model is
    loaded or built (a build would take minutes), and nothing is written: neither --out nor the cache."""

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded or built before the error")

    cache = tmp_path / "cache"
    monkeypatch.setenv("COEVOLVE_CACHE", str(cache))
    for module, name in model_loaders():
        monkeypatch.setattr(module, name, no_model)
    for args, needle, code in config_errors(tmp_path):
        line = one_error(invoke(*args), code)
        assert needle in line, (args, line)
        assert not (tmp_path / "run").exists() and not cache.exists(), args


def test_a_full_disk_is_one_line_and_the_run_resumes(tmp_path, random_model_dir, monkeypatch):
    """No space left while step 2's checkpoint is written: one line, no half-written checkpoint left, step 1 kept."""
    import errno

    from coevolve import store

    real = store._write_checkpoint

    def full_at_step_2(folder, step, *args):
        if step == 2:
            (folder / "solver.safetensors").write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device", str(folder / "solver.optim.safetensors"))
        return real(folder, step, *args)

    out = tmp_path / "run"
    monkeypatch.setattr(store, "_write_checkpoint", full_at_step_2)
    line = one_error(tiny_run(random_model_dir, out, steps=2), 2)
    assert "no space left" in line and "--resume" in line and "solver.optim.safetensors" in line
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001"]
    monkeypatch.setattr(store, "_write_checkpoint", real)
    assert invoke("run", "--resume", out, "--quiet").exit_code == 0
    assert train_steps(out) == [1, 2]


def test_a_full_disk_in_safetensors_is_one_line_and_keeps_the_last_checkpoint(tmp_path, random_model_dir,
                                                                              monkeypatch):
    """safetensors reports a full disk as its own error (``SafetensorError: ... No space left on device (os error
    28)``), at the step's checkpoint and again on resume while the disk is still full: one line each time, exit code
    2, step 1's checkpoint intact and no temporary folder left."""
    from safetensors import SafetensorError

    from coevolve import store

    real = store.save_file

    def full(tensors, filename, *args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    out = tmp_path / "run"
    assert tiny_run(random_model_dir, out).exit_code == 0
    step_1 = tree(out / "checkpoints")
    monkeypatch.setattr(store, "save_file", full)
    for _ in range(2):
        line = one_error(invoke("run", "--resume", out, "--quiet", "--set", "steps=2"), 2)
        assert "no space left" in line and "optim.safetensors" in line and f"--resume {out}" in line, line
        assert tree(out / "checkpoints") == step_1
    monkeypatch.setattr(store, "save_file", real)
    assert invoke("run", "--resume", out, "--quiet", "--set", "steps=2").exit_code == 0
    assert train_steps(out) == [1, 2]


def test_resume_to_fewer_steps_than_the_run_holds_is_refused(tmp_path, random_model_dir):
    out = tmp_path / "run"
    assert tiny_run(random_model_dir, out, steps=3).exit_code == 0
    before = tree(out)
    line = one_error(invoke("run", "--resume", out, "--set", "steps=2"), 2)
    assert "already holds 3 completed steps" in line and tree(out) == before


def test_quiet_silences_the_model_build(monkeypatch, tmp_path):
    """A first use of tiny-arith builds it with a progress bar, unless --quiet."""
    import coevolve.models.tiny_arith

    asked = []

    def record(*args, progress=True, **kwargs):
        asked.append(progress)
        raise KeyboardInterrupt  # stop there: the build itself is not under test

    monkeypatch.setattr(coevolve.models.tiny_arith, "ensure_tiny_arith", record)
    for quiet in (["--quiet"], []):
        invoke("run", "grpo", "--out", tmp_path / "run", *quiet)
    assert asked == [False, True]


def test_a_failed_start_leaves_the_folder_as_it_was(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for out in (tmp_path / "new", empty):
        line = one_error(invoke("run", "grpo", "--out", out, "--set", NO_MODEL), 1)
        assert "/no/such/model" in line
    assert not (tmp_path / "new").exists() and list(empty.iterdir()) == []


def test_a_late_failure_is_one_line_and_the_run_resumes(tmp_path, random_model_dir, monkeypatch):
    from coevolve.data.benchmarks import BenchmarkDataNotFound
    from coevolve.recipes.grpo import GRPO

    original = GRPO.step

    def failing(self, step):
        if step == 2:
            raise BenchmarkDataNotFound("evaluation set 'x': file not found")
        return original(self, step)

    monkeypatch.setattr(GRPO, "step", failing)
    out = tmp_path / "run"
    line = one_error(tiny_run(random_model_dir, out, steps=2), 1)
    assert "file not found" in line and f"--resume {out}" in line
    monkeypatch.setattr(GRPO, "step", original)
    assert invoke("run", "--resume", out, "--quiet").exit_code == 0
    assert train_steps(out) == [1, 2]


# --- 6. values that pass validation but make garbage ----------------------------------------------------------------

@pytest.mark.parametrize("setting, key", [("train.lr=inf", "train.lr"),
                                          ("rollout.temperature=inf", "rollout.temperature"),
                                          ("train.kl_beta=nan", "train.kl_beta"),
                                          ("params.lambda_q=inf", "params.lambda_q")])
def test_non_finite_config_values_are_refused(setting, key):
    from coevolve.config import ConfigError
    from coevolve.recipes import resolve

    with pytest.raises(ConfigError, match=key.replace(".", r"\.") + ".*finite"):
        resolve("dynamic_rl" if key.startswith("params.") else "grpo", sets=[setting])


def test_a_run_whose_every_update_was_skipped_is_an_error(tmp_path, random_model_dir):
    """train.kl_beta=1e308 makes every loss non-finite, so every optimizer step is skipped: the run ends with one
    error line saying so (exit 1), not `done`; its folder is complete (summary.json) for a look at the metrics."""
    out = tmp_path / "run"
    line = one_error(tiny_run(random_model_dir, out, "--set", "train.kl_beta=1e308", steps=2), 1)
    assert "every update of the run was skipped" in line and "train.kl_beta" in line and "--resume" not in line
    assert json.loads((out / "summary.json").read_text())["skipped_steps"] == 2
    assert tiny_run(random_model_dir, tmp_path / "fine", steps=2).exit_code == 0  # the same run, kl_beta 0: done


def test_non_finite_weights_stop_the_run_and_keep_the_last_finite_checkpoint(tmp_path, random_model_dir,
                                                                              monkeypatch):
    import torch
    from safetensors.torch import load_file

    from coevolve.recipes.grpo import GRPO

    original = GRPO.step

    def exploding(self, step):
        out = original(self, step)
        if step == 2:
            with torch.no_grad():
                next(self.policy.model.parameters()).fill_(float("nan"))
        return out

    monkeypatch.setattr(GRPO, "step", exploding)
    out = tmp_path / "run"
    line = one_error(tiny_run(random_model_dir, out, steps=3), 1)
    assert "step 2" in line and "solver" in line and "step 1" in line
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001"]
    weights = load_file(str(out / "checkpoints" / "step_000001" / "solver.safetensors"))
    assert all(torch.isfinite(t).all() for t in weights.values())


# --- 7. resume and concurrency ---------------------------------------------------------------------------------------

def test_resume_overrides_are_saved(tmp_path, random_model_dir):
    out = tmp_path / "run"
    assert tiny_run(random_model_dir, out).exit_code == 0
    assert invoke("run", "--resume", out, "--set", "steps=2", "--quiet").exit_code == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["steps"] == 2
    again = invoke("run", "--resume", out, "--quiet")
    assert again.exit_code == 0 and "done: 2 steps" in again.output
    assert train_steps(out) == [1, 2]


def test_a_second_writer_is_refused(tmp_path, random_model_dir):
    from coevolve.rundir import LOCK_NAME

    out = tmp_path / "run"
    assert tiny_run(random_model_dir, out).exit_code == 0
    before = tree(out)
    holder = subprocess.Popen([sys.executable, "-c", "import filelock, sys, time\n"
                               "lock = filelock.FileLock(sys.argv[1]); lock.acquire(); print('held', flush=True); "
                               "time.sleep(60)",
                               str(out / LOCK_NAME)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        line = one_error(invoke("run", "--resume", out, "--set", "steps=2", "--quiet"), 2)
        assert "another process" in line and str(out) in line
    finally:
        holder.kill()
        holder.wait()
    assert tree(out) == before


def test_sigterm_prints_the_resume_hint(tmp_path, random_model_dir, monkeypatch):
    import os

    from coevolve.store import RunStore

    original = RunStore.write_samples

    def terminated(self, step, records):
        original(self, step, records)
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    caught = []

    def outer(*_):  # stands in for the default action (ending pytest) in case the CLI does not handle SIGTERM
        caught.append(True)

    previous = signal.signal(signal.SIGTERM, outer)
    try:
        monkeypatch.setattr(RunStore, "write_samples", terminated)
        out = tmp_path / "run"
        result = tiny_run(random_model_dir, out, steps=3)
        assert signal.getsignal(signal.SIGTERM) is outer and not caught  # handled by the CLI, then restored
        line = one_error(result, 143)
        assert f"coevolve run --resume {out}" in line
        assert (out / "checkpoints" / "step_000001").exists() and not (out / "summary.json").exists()
    finally:
        signal.signal(signal.SIGTERM, previous)


# --- 8. trust ---------------------------------------------------------------------------------------------------------

def test_remote_code_needs_the_command_line_flag(tmp_path, random_model_dir):
    model = tmp_path / "model"
    marker = tmp_path / "remote_code_ran"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "evil", "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.Evil"}}))
    (model / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step_000001").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_000001" / "state.json").write_text("{}")
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"recipe": "grpo", "model": str(model),
                                                         "trust_remote_code": True}))
    result = invoke("eval", run_dir, "--sets", "arith_l1", "--limit", "1")
    assert result.exit_code != 0 and not marker.exists()
    line = one_error(invoke("run", "grpo", "--set", f"model={model}", "--set", "trust_remote_code=true",
                            "--out", tmp_path / "new"), 2)
    assert "--trust-remote-code" in line and not (tmp_path / "new").exists()
    out = tmp_path / "saved"
    assert tiny_run(random_model_dir, out).exit_code == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    (out / "config.yaml").write_text(yaml.safe_dump({**saved, "trust_remote_code": True}))
    line = one_error(invoke("run", "--resume", out, "--set", "steps=2"), 2)
    assert "--trust-remote-code" in line and not marker.exists()


def _alias_bomb(depth: int) -> str:
    """Nested YAML aliases: a few hundred bytes that expand to 9**depth strings."""
    anchors = ["&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    anchors += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, depth + 1)]
    return "[" + ", ".join(anchors) + "]"


def test_config_size_and_error_lines_are_capped(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(f"model: {_alias_bomb(6)}\n")  # its error line was 39 MB
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * 200_000 + "steps: 3\n")
    for extra in (["--config", bomb], ["--set", f"eval_sets={_alias_bomb(6)}"], ["--config", big]):
        line = one_error(invoke("run", "grpo", "--out", tmp_path / "run", *extra), 2)
        assert len(line) < 500, len(line)
    line = one_error(invoke("run", "grpo", "--out", tmp_path / "run", "--set", "model=[" + "x, " * 5000 + "x]"), 2)
    assert "'model'" in line and len(line) < 500
    assert not (tmp_path / "run").exists()
