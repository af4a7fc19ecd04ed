"""The typed config: layering, validation errors (one line, exit code 2, nothing written), the CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from coevolve.config import ConfigError, parse_set
from coevolve.recipes import resolve


def test_layers_override_in_order(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("steps: 7\ntrain:\n  lr: 0.001\n")
    config, params, _ = resolve("grpo", preset="small", config_file=str(cfg_file),
                                sets=["train.lr=2e-4", "params.group_size=4"])
    assert config.steps == 7  # file beats preset (60)
    assert config.train.lr == 2e-4  # --set beats file
    assert params.group_size == 4 and config.params["group_size"] == 4
    assert config.eval_sets == [f"arith_l{i}" for i in range(1, 7)]  # the task's default sets


def test_an_eval_preset_that_names_a_protocol_brings_its_budget(tmp_path):
    """r_zero's paper preset evaluates in 1,024 tokens; eval_preset r_zero (R-Zero's evaluation/generate.py) brings
    4,096 and prism 4,096, unless eval_max_new_tokens is set beside or after the preset's name; the project's greedy
    default keeps the run's budget; a saved config reads back as it was written."""
    from coevolve.config import to_yaml
    from coevolve.evaluation.harness import EVAL_PRESETS
    from coevolve.recipes import resolve_saved

    def budget(*sets: str, config_file: str | None = None) -> int:
        return resolve("r_zero", preset="paper", sets=list(sets), config_file=config_file)[0].eval_max_new_tokens

    assert budget() == 1024
    assert budget("eval_preset=r_zero") == EVAL_PRESETS["r_zero"].max_new_tokens == 4096
    assert budget("eval_preset=prism") == EVAL_PRESETS["prism"].max_new_tokens == 4096
    assert budget("eval_preset=ttrl") == 3072
    assert budget("eval_preset=greedy") == 1024  # not a protocol: the run's budget
    assert budget("eval_preset=r_zero", "eval_max_new_tokens=2048") == 2048
    in_file = tmp_path / "c.yaml"
    in_file.write_text("eval_preset: r_zero\neval_max_new_tokens: 512\n")
    assert budget(config_file=str(in_file)) == 512  # set beside the preset's name
    assert budget("eval_max_new_tokens=512", "eval_preset=r_zero") == 512  # one layer: order inside it is moot
    in_file.write_text("eval_max_new_tokens: 512\n")
    assert budget("eval_preset=r_zero", config_file=str(in_file)) == 4096  # the preset is named later
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(resolve("r_zero", preset="paper", sets=["eval_preset=ttrl",
                                                                      "eval_max_new_tokens=100"])[0]))
    assert resolve_saved(str(saved))[0].eval_max_new_tokens == 100
    assert resolve_saved(str(saved), sets=["eval_preset=r_zero"])[0].eval_max_new_tokens == 4096


@pytest.mark.parametrize("sets, key", [
    (["train.lrr=1"], "train.lrr"),
    (["stepz=3"], "stepz"),
    (["params.group_sise=3"], "params.group_sise"),
    (["steps=many"], "steps"),
    (["train.lr=-1"], "train.lr"),
    (["train.loss_agg=mean"], "train.loss_agg"),
])
def test_bad_keys_name_the_key(sets, key):
    with pytest.raises(ConfigError) as info:
        resolve("grpo", sets=sets)
    message = str(info.value)
    assert f"'{key}'" in message and "\n" not in message


def test_parse_set_types():
    assert parse_set(["a.b=3", "c=[x, y]", "d=true", "e=1e-4", "f=hello"]) == {
        "a": {"b": 3}, "c": ["x", "y"], "d": True, "e": 1e-4, "f": "hello"}
    with pytest.raises(ConfigError):
        parse_set(["novalue"])


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "coevolve.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_cli_rejects_bad_config_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    result = _cli("run", "grpo", "--set", "train.lrr=1", "--out", str(out), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: unknown config key 'train.lrr'"]
    assert not out.exists()
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("steps: [1, 2\n")
    result = _cli("run", "grpo", "--config", str(bad_yaml), "--out", str(out), cwd=tmp_path)
    assert result.returncode == 2 and "not valid YAML" in result.stderr and not out.exists()
    result = _cli("run", "nosuch", cwd=tmp_path)
    assert result.returncode == 2 and "unknown recipe 'nosuch'" in result.stderr


def test_cli_lists_recipes(tmp_path):
    result = _cli("recipes", cwd=tmp_path)
    assert result.returncode == 0
    assert any(line.startswith("grpo ") for line in result.stdout.splitlines())


def test_missing_model_is_one_clear_line(tmp_path):
    result = _cli("run", "grpo", "--set", "model=/no/such/model", "--out", str(tmp_path / "r"), "--quiet",
                  cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("error: model path /no/such/model does not exist")
    assert "Traceback" not in result.stderr


def test_run_writes_the_run_directory(tmp_path, random_model_dir):
    out = tmp_path / "run"
    result = _cli("run", "grpo", "--set", f"model={random_model_dir}", "--set", "steps=2",
                  "--set", "params.questions_per_step=2", "--set", "params.group_size=2",
                  "--set", "eval_sets=[arith_l1]", "--set", "eval_limit=4", "--set", "rollout.max_new_tokens=8",
                  "--out", str(out), "--quiet", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["steps"] == 2 and saved["recipe"] == "grpo"
    assert "\n#   solver: lr 5e-05, mini_batch_size 0, epochs 1," in (out / "config.yaml").read_text()  # what it runs
    rows = [yaml.safe_load(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "solver/reward_mean" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    assert all("time_s" in r for r in rows)
    assert [r["step"] for r in rows if "eval/arith_l1/accuracy" in r] == [0, 2]
    assert [r["step"] for r in rows if "eval/arith_l1/accuracy_lenient" in r] == [0, 2]  # same samples, both rules
    assert len((out / "samples" / "step_000001.jsonl").read_text().splitlines()) == 4
    assert (out / "checkpoints" / "step_000002" / "solver.safetensors").exists()
    assert (out / "summary.json").exists()
    assert list((out / "tb").iterdir())
    # a second run into the same directory is refused; evaluation of the run works
    again = _cli("run", "grpo", "--set", f"model={random_model_dir}", "--out", str(out), "--quiet", cwd=tmp_path)
    assert again.returncode == 2 and "--resume" in again.stderr
    ev = _cli("eval", str(out), "--sets", "arith_l1", "--limit", "3", "--max-new-tokens", "8", cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr
    assert "arith_l1" in ev.stdout and "lenient" in ev.stdout and (out / "eval" / "step_000002").exists()


def test_eval_with_missing_data_is_one_clear_line(tmp_path, random_model_dir):
    result = _cli("eval", str(random_model_dir), "--sets", "gsm8k", "--data-dir", str(tmp_path / "empty"),
                  "--limit", "2", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "gsm8k" in last and "--data-dir" in last


def test_math_task_with_empty_training_file_is_clear(tmp_path):
    from coevolve.tasks.registry import TaskDataError, get_task

    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "train.jsonl").write_text("")
    import random

    with pytest.raises(TaskDataError, match="empty"):
        get_task("math", data_dir=str(tmp_path)).training_problems(random.Random(0), 4)


def test_every_setting_says_what_it_does():
    """Every core setting (sections walked into: train.lora.*, rollout.vllm.*, roles.<name>.*) and every recipe's
    params.* has a description."""
    from coevolve.config import RunConfig, setting_fields
    from coevolve.recipes import RECIPES

    core = setting_fields(RunConfig)
    keys = {key for key, _ in core}
    assert {"train.lora.r", "rollout.vllm.sleep", "rollout.scoring.top_k", "roles.<name>.lr",
            "train.entropy_coef"} <= keys and len(core) >= 78
    undocumented = [key for key, field in core if not field.description]
    for name, cls in sorted(RECIPES.items()):
        fields = setting_fields(cls.Params, f"{name}: params.")
        assert fields, name
        undocumented += [key for key, field in fields if not field.description]
    assert undocumented == []


def test_print_and_help_config_show_what_each_role_runs(tmp_path, monkeypatch):
    """--print-config: config.yaml as a run writes it, with each role's effective settings as comments (Prism's roles
    both run cosine while train.lr_schedule says constant); it reads back as the same config. --help-config: every
    setting with its value and description. Neither writes anything (in-process: a subprocess costs 25 s here)."""
    from typer.testing import CliRunner

    from coevolve.cli import app

    monkeypatch.chdir(tmp_path)
    printed = CliRunner().invoke(app, ["run", "prism", "--preset", "paper", "--print-config"])
    assert printed.exit_code == 0, printed.output
    config, _, _ = resolve("prism", preset="paper")
    assert yaml.safe_load(printed.stdout) == config.model_dump(mode="json")
    assert config.train.lr_schedule == "constant"
    comments = [line for line in printed.stdout.splitlines() if line.startswith("#")]
    assert comments[1:] == [
        "#   questioner: lr 5e-06, mini_batch_size 64, epochs 2, lr_schedule cosine, optimizer_reset phase",
        "#   solver: lr 5e-06, mini_batch_size 1024, epochs 2, lr_schedule cosine, optimizer_reset phase",
        "#   no role runs train.mini_batch_size (0), train.epochs (1), train.lr_schedule (constant)"]
    helped = CliRunner().invoke(app, ["run", "ttrl", "--preset", "paper", "--help-config",
                                      "--set", "train.entropy_coef=0.001"])
    assert helped.exit_code == 0, helped.output
    lines = helped.stdout.splitlines()
    at = lines.index("train.entropy_coef = 0.001")
    assert lines[at + 1].strip().startswith("entropy bonus: loss = pg_loss - entropy_coef * H")
    assert "train.kl_clamp = 10.0" in lines and "params.vote_samples = 64" in lines
    assert "(no description)" not in helped.stdout
    assert list(tmp_path.iterdir()) == []


def test_eval_answers_in_episodes_with_tools(tmp_path, random_model_dir):
    """--tools python samples tool-using episodes (a run directory's rollout.tools is the default) and reports the
    tool-call rate; an unknown tool is one line, exit 2."""
    from typer.testing import CliRunner

    from coevolve.cli import app
    from coevolve.execution import sandbox_problem

    bad = CliRunner().invoke(app, ["eval", str(random_model_dir), "--tools", "calculator", "--sets", "arith_l1"])
    assert bad.exit_code == 2 and "--tools calculator: unknown tool" in bad.output
    if sandbox_problem() is not None:
        pytest.skip(sandbox_problem())
    ran = CliRunner().invoke(app, ["eval", str(random_model_dir), "--tools", "python", "--max-tool-calls", "1",
                                   "--sets", "arith_l1", "--limit", "2", "--max-new-tokens", "8",
                                   "--out", str(tmp_path / "out")])
    assert ran.exit_code == 0, ran.output
    assert "tool calls 0.000" in ran.output  # a random model writes no call; the summary counts them
    assert (tmp_path / "out" / "arith_l1" / "summary.json").exists()
