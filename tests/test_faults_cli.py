"""Fault probes of the command line (issue 21): the run directory, checks before anything loads, non-finite values,
resume and concurrency, trust. The CLI runs in-process (typer's CliRunner) on a random 2-layer model."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

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


# --- 6. values that pass validation but make garbage ----------------------------------------------------------------

@pytest.mark.parametrize("setting, key", [("train.lr=inf", "train.lr"), ("rollout.temperature=inf", "rollout.temperature"),
                                          ("train.kl_beta=nan", "train.kl_beta"), ("params.lambda_q=inf", "params.lambda_q")])
def test_non_finite_config_values_are_refused(setting, key):
    from coevolve.config import ConfigError
    from coevolve.recipes import resolve

    with pytest.raises(ConfigError, match=key.replace(".", r"\.") + ".*finite"):
        resolve("dynamic_rl" if key.startswith("params.") else "grpo", sets=[setting])


# --- 8. trust ---------------------------------------------------------------------------------------------------------

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
