"""The grpo recipe on canned solutions: reward 1 for the ground-truth answer and 0 otherwise, group z-scored."""

from __future__ import annotations

import pytest
from helpers import CallThenAnswer, records

from coevolve.recipes import resolve
from coevolve.rollout import Completion
from coevolve.rollout.hf import encode_prompt
from coevolve.tasks import arith


def test_reward_is_one_for_the_ground_truth_answer_only(random_model_dir):
    config, params, cls = resolve("grpo", sets=[f"model={random_model_dir}", "eval_sets=[]", "params.levels=[2]",
                                                "params.questions_per_step=3", "params.group_size=4"])
    recipe = cls(config, params)
    tokenizer = recipe.policy.tokenizer

    def canned(policy, prompts, group_size, seed, sampling=None):
        """Question g gets g + 1 right answers, then wrong ones (the right answer plus one) and one unparsable."""
        groups = []
        for g, prompt in enumerate(prompts):
            right = arith.evaluate(prompt.removeprefix("Q:").removesuffix("=?\n"))
            texts = [f"A:{right}"] * (g + 1) + [f"A:{right + 1}", "S:?"][:group_size - g - 1]
            texts += [f"A:{right + 1}"] * (group_size - len(texts))
            groups.append([Completion(prompt, encode_prompt(tokenizer, prompt),
                                      tokenizer(t, add_special_tokens=False)["input_ids"], t, [-1.0] * len(t), "eos")
                           for t in texts])
        return groups

    recipe.sample_groups = canned
    out = recipe.step(1)
    rows = records(out)
    assert [r["reward"] for r in rows] == [1, 0, 0, 0] + [1, 1, 0, 0] + [1, 1, 1, 0]
    assert all(r["reward_terms"]["correct"] == r["reward"] and r["label"] == str(arith.evaluate(r["question"]))
               for r in rows)
    # z-scores with the unbiased std: 1 of 4 right -> +-(3/4, 1/4) / 0.5; 2 of 4 -> +-0.5 / 0.57735
    assert [r["advantage"] for r in rows[:8]] == pytest.approx([1.5, -0.5, -0.5, -0.5] + [0.866025, 0.866025,
                                                                                          -0.866025, -0.866025],
                                                               abs=1e-5)
    assert out.metrics["solver/reward_mean"] == pytest.approx(6 / 12) and out.metrics["solver/optimizer_steps"] == 1


def test_rollout_tools_turn_the_solvers_samples_into_episodes(random_model_dir):
    """Config alone: grpo's solver samples episodes (the engine here writes a python call of the question, then
    the answer it read); the sandbox runs the calls, the update sees the tool mask, the step reports tool use."""
    from coevolve.execution import sandbox_problem

    if sandbox_problem() is not None:
        pytest.skip(sandbox_problem())
    config, params, cls = resolve("grpo", sets=[f"model={random_model_dir}", "eval_sets=[]", "params.levels=[2]",
                                                "params.questions_per_step=2", "params.group_size=2",
                                                "rollout.tools=[python]", "rollout.max_tool_calls=1",
                                                "rollout.max_new_tokens=200"])
    recipe = cls(config, params)
    tokenizer = recipe.policy.tokenizer

    recipe._runtime.engine = lambda policy, trainer: CallThenAnswer(tokenizer)
    out = recipe.step(1)
    rows = records(out)
    assert [r["reward"] for r in rows] == [1, 1, 1, 1]  # every answer the model wrote after reading the sandbox
    assert all(r["tool_calls"] == 1 and len(r["tool_spans"]) == 1 for r in rows)  # the mask, run-length coded
    assert out.metrics["tool/correct_used_tool"] == 1.0 and out.metrics["solver/optimizer_steps"] == 1
    telemetry = recipe.engine_metrics()
    assert telemetry["tool/calls"] == 4 and telemetry["tool/calls_per_episode"] == 1.0
    assert telemetry["tool/error_rate"] == 0.0 and telemetry["tool/observation_tokens_per_episode"] > 0
