"""Recipes and advantage estimators from a user's own package: a package on ``sys.path`` with a ``coevolve.recipes``
entry point (a tiny ``.dist-info`` folder, as pip writes it) is listed by ``coevolve recipes`` and trains; its name
clashing with a built-in recipe is one error line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.store import RunStore

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = '''
from coevolve.recipes.grpo import GRPO, GRPOParams
from coevolve.rl.advantages import advantage_estimator, grpo_advantages


@advantage_estimator("halved_grpo")
def halved_grpo(rewards, groups, eps=1e-6, unbiased=True):
    return 0.5 * grpo_advantages(rewards, groups, eps=eps, unbiased=unbiased)


class PluginGRPO(GRPO):
    name = "{name}"
    summary = "a user's recipe: GRPO under another name"
    Params = GRPOParams
'''


def install(site: Path, name: str) -> None:
    """A package ``user_recipes`` with recipe ``name`` and its entry point, as ``pip install`` would leave them."""
    (site / "user_recipes").mkdir(parents=True)
    (site / "user_recipes" / "__init__.py").write_text(PLUGIN.format(name=name))
    info = site / "user_recipes-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: user-recipes\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[coevolve.recipes]\n{name} = user_recipes:PluginGRPO\n")


def coevolve(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "coevolve", *args], capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.mark.slow
def test_a_recipe_from_an_entry_point_is_listed_and_trains_two_steps(tmp_path, random_model_dir):
    install(tmp_path / "site", "user_grpo")
    listed = coevolve(tmp_path / "site", "recipes")
    assert listed.returncode == 0, listed.stderr
    assert any(line.startswith("user_grpo ") and "a user's recipe" in line for line in listed.stdout.splitlines())
    out = tmp_path / "run"
    trained = coevolve(tmp_path / "site", "run", "user_grpo", "--quiet", "--out", str(out), "--set", "steps=2",
                       "--set", f"model={random_model_dir}", "--set", "eval_sets=[]", "--set",
                       "params.advantage=halved_grpo", "--set", "rollout.max_new_tokens=4")
    assert trained.returncode == 0, trained.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipe"] == "user_grpo" and summary["steps_run"] == 2
    assert RunStore(out).samples(2)  # the second step's rollouts were written
    assert "advantage: halved_grpo" in (out / "config.yaml").read_text()  # the package's own estimator


def test_a_recipe_named_like_a_built_in_is_one_error(tmp_path):
    install(tmp_path / "site", "grpo")
    listed = coevolve(tmp_path / "site", "recipes")
    assert listed.returncode == 2
    assert listed.stderr.count("\n") == 1 and "Traceback" not in listed.stderr
    assert "recipe name 'grpo' is taken twice" in listed.stderr and "user_recipes.PluginGRPO" in listed.stderr
