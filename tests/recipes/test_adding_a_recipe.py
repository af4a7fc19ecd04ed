"""docs/adding-a-recipe.md's worked recipe, built from the guide alone: its code block is the recipe file, which
registers itself, resolves and trains for two steps on the quick tiny-arith build."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from helpers import records

from coevolve.recipes import RECIPES, resolve

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "adding-a-recipe.md"


@pytest.fixture
def self_vote(tmp_path):
    """The guide's recipe module, imported from a file holding its one Python block (unregistered afterwards)."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) == 1
    path = tmp_path / "self_vote.py"
    path.write_text(blocks[0])
    spec = importlib.util.spec_from_file_location("guide_self_vote", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would: pydantic resolves the params' annotations there
    spec.loader.exec_module(module)  # our own documentation's code, not model output
    yield module
    RECIPES.pop("self_vote", None)
    sys.modules.pop(spec.name, None)


@pytest.mark.slow
def test_the_guides_recipe_registers_and_trains(self_vote, small_tiny_arith, tmp_path):
    from coevolve.loop import run

    assert RECIPES["self_vote"] is self_vote.SelfVote
    assert len(GUIDE.read_text().split("```python\n")[1].split("```")[0].splitlines()) <= 70  # about 60 lines
    config, params, cls = resolve("self_vote", preset="small", sets=[
        f"model={small_tiny_arith[1]}", "steps=2", "eval_sets=[arith_l1]", "eval_limit=8", "params.questions=6"])
    recipe = cls(config, params)
    assert recipe.trainers().keys() == {"policy"} and recipe.solver() is recipe.policy and recipe.style == "compact"
    out = recipe.step(1)
    rows = records(out)
    assert rows and all(r["label_source"] == "majority" and r["role"] == "solver" for r in rows)
    assert {r["question_id"] for r in rows} <= {f"s1-q{i}" for i in range(6)}
    assert all(r["reward"] == float(r["answer"] is not None and r["answer"] == r["label"]) for r in rows
               if r["label"] is not None and r["answer"] is not None and re.fullmatch(r"-?\d+", r["answer"]))
    summary = run(cls(config, params), config, tmp_path / "run", progress=False)
    assert summary["steps_run"] == 2 and summary["final_eval"]["eval/arith_l1/accuracy"] >= 0.0
    assert (tmp_path / "run" / "samples" / "step_000002.jsonl").exists()
    with pytest.raises(Exception, match="arith"):  # its one world: a chat task is refused before any model loads
        resolve("self_vote", sets=["task=math"])


def test_a_recipe_that_forgets_make_trainer_gets_one_error_naming_the_fix(tmp_path, random_model_dir):
    from coevolve.loop import run
    from coevolve.recipes.base import Recipe
    from coevolve.recipes.grpo import GRPO

    class Forgetful(GRPO):  # loads its model but makes no trainer (not registered)
        def __init__(self, config, params):
            Recipe.__init__(self, config, params)
            self.policy = self.load_policy()

    config, params, _ = resolve("grpo", sets=[f"model={random_model_dir}", "eval_sets=[]", "steps=1"])
    recipe = Forgetful(config, params)
    with pytest.raises(TypeError, match=r"no trainer for role 'solver': its __init__ must call "
                                        r"self\.make_trainer\(policy, 'solver'\)"):
        run(recipe, config, tmp_path / "run", progress=False)
    with pytest.raises(TypeError, match="no solver to evaluate"):
        recipe.solver()
