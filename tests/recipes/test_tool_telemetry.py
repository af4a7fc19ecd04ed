"""Every recipe whose solver can run tool-using episodes reports ``tool/correct_used_tool`` (the share of the answers
its reward counts as right whose episode ran a tool call) when ``rollout.tools`` is on, and nothing of it without."""

from __future__ import annotations

import math

import pytest
from helpers import CallThenAnswer, make_recipe, read_generations
from test_resume_stream import SETTINGS

from coevolve.execution import sandbox_problem
from coevolve.formats import Generation

pytestmark = pytest.mark.skipif(sandbox_problem() is not None, reason=f"no sandbox: {sandbox_problem()}")
TOOLS = ["rollout.tools=[python]", "rollout.max_tool_calls=1", "rollout.max_new_tokens=64"]


def test_ttrl_counts_the_right_answers_that_called_the_tool(random_model_dir):
    """Every episode prints the question and answers with the observation: every right answer used the tool."""
    recipe = make_recipe("ttrl", random_model_dir, *SETTINGS["ttrl"], *TOOLS, "params.pool_source=train",
                         preset="small")
    recipe._runtime.engine = lambda policy, trainer: CallThenAnswer(recipe.policy.tokenizer)
    metrics = recipe.step(1).metrics
    assert metrics["reward/correct"] == 1.0 and metrics["tool/correct_used_tool"] == 1.0


@pytest.mark.parametrize("name", ["dynamic_rl", "pasodoble", "infuser", "spice"])
def test_the_generator_recipes_report_it_with_tools_and_not_without(name, random_model_dir):
    steps = {}
    for tools in (True, False):
        recipe = make_recipe(name, random_model_dir, *SETTINGS[name], *(TOOLS if tools else []), preset="small")
        if name in ("pasodoble", "infuser"):  # the random model writes no question: each output reads as one
            read_generations(recipe, lambda output, style, **_: Generation("What is 2 + 3?", "5"))
        steps[tools] = recipe.step(1).metrics
    value = steps[True]["tool/correct_used_tool"]
    assert math.isnan(value) or 0.0 <= value <= 1.0
    assert "tool/correct_used_tool" not in steps[False]
