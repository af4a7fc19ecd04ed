"""The training loop (coevolve/loop.py): when it evaluates. Before the first step, at every multiple of ``eval_every``
and at the last step (``steps``, or the step a recipe ends on by itself), each once; a resumed run keeps the cadence
and does not evaluate step 0 again. The recipe's steps and the evaluation are stand-ins: this is the loop's schedule."""

from __future__ import annotations

import json

import helpers
import pytest

from coevolve import loop
from coevolve.recipes.base import StepOutput


@pytest.fixture(scope="module")
def recipe(random_model_dir):
    return helpers.make_recipe("grpo", random_model_dir)


def evaluated_steps(recipe, out, monkeypatch, *, resume: bool = False, stop_at: int | None = None,
                    **settings) -> list[int]:
    """The steps the loop evaluated at in a run of ``recipe`` with config ``settings`` in ``out`` (each step a no-op;
    the recipe ends by itself after ``stop_at``); checks the metrics rows say the same."""
    seen: list[int] = []
    done: list[int] = []

    def evaluate(recipe, config, store, step):
        seen.append(step)
        return {"eval/arith_l1/accuracy": 0.0, "eval/arith_l1/accuracy_lenient": 0.0}

    def step(step: int) -> StepOutput:
        done.append(step)
        return StepOutput(metrics={"policy/loss": 0.0})

    monkeypatch.setattr(loop, "evaluate_solver", evaluate)
    monkeypatch.setattr(recipe, "step", step)
    monkeypatch.setattr(recipe, "finished", lambda: stop_at is not None and done[-1] >= stop_at)
    config = recipe.config.model_copy(update={"eval_sets": ["arith_l1"], "checkpoint_every": 1000, **settings})
    loop.run(recipe, config, out, resume=resume, progress=False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [r["step"] for r in rows if "eval/arith_l1/accuracy" in r]
    assert logged[len(logged) - len(seen):] == seen  # each evaluation logged once, at its step
    return seen


@pytest.mark.parametrize(("steps", "eval_every", "expected"), [
    (7, 3, [0, 3, 6, 7]),  # the multiples of 3, then the last step
    (6, 3, [0, 3, 6]),  # the last step is a multiple: evaluated once
    (10, 4, [0, 4, 8, 10]),
    (5, 1, [0, 1, 2, 3, 4, 5]),
    (3, 5, [0, 3]),  # eval_every beyond the run: the start and the end
    (5, 0, [0, 5]),  # 0: only at the start and the end
    (1, 2, [0, 1]),
])
def test_evaluation_cadence(recipe, tmp_path, monkeypatch, steps, eval_every, expected):
    assert evaluated_steps(recipe, tmp_path / "run", monkeypatch, steps=steps, eval_every=eval_every) == expected


def test_a_recipe_that_ends_by_itself_is_evaluated_at_its_last_step(recipe, tmp_path, monkeypatch):
    assert evaluated_steps(recipe, tmp_path / "a", monkeypatch, steps=20, eval_every=3, stop_at=7) == [0, 3, 6, 7]
    assert evaluated_steps(recipe, tmp_path / "b", monkeypatch, steps=20, eval_every=3, stop_at=6) == [0, 3, 6]


def test_a_resumed_run_keeps_the_cadence_without_evaluating_step_0_again(recipe, tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert evaluated_steps(recipe, out, monkeypatch, steps=4, eval_every=3) == [0, 3, 4]
    assert evaluated_steps(recipe, out, monkeypatch, resume=True, steps=11, eval_every=3) == [6, 9, 11]
    assert evaluated_steps(recipe, out, monkeypatch, steps=11, eval_every=3, resume=True) == []  # nothing left


def test_held_out_evaluation_runs_episodes_when_the_run_uses_tools(random_model_dir, tmp_path):
    """With rollout.tools the held-out evaluation samples tool-using episodes, as the solver trains: the sandbox runs
    the calls, the answers read its output, and the row reports the tool-call rate; without tools the same model's
    calls are never run (its single turn ends at the call) and no rate is logged."""
    from coevolve.data.benchmarks import load_benchmark
    from coevolve.execution import sandbox_problem
    from coevolve.recipes import resolve
    from coevolve.rollout import Completion
    from coevolve.rollout.hf import encode_prompt
    from coevolve.store import RunStore

    if sandbox_problem() is not None:
        pytest.skip(sandbox_problem())
    items = load_benchmark("arith_l2", limit=6, seed=0)  # the questions the evaluation asks (eval_limit=6)
    calls = {item.question for item in items[::2]}  # the model calls the tool on every other one, else answers 0

    class CallOrGuess:
        def generate(self, prompts, sampling, seed):
            out = []
            for prompt in prompts:
                question, _, episode = prompt.removeprefix("Q:").partition("=?\n")
                text = ("A:0" if question not in calls else f"A:{episode.split()[-2]}" if episode
                        else f"```python\nprint({question})\n```\n```output")
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                out.append(Completion(prompt, encode_prompt(tokenizer, prompt), ids, text, [-1.0] * len(ids),
                                      "stop" if text.endswith("```output") else "eos"))
            return out

        def pop_metrics(self):
            return {}

    expected = {True: sum(i.question in calls or i.answer == "0" for i in items) / 6,
                False: sum(i.question not in calls and i.answer == "0" for i in items) / 6}
    for tools in (True, False):
        config, params, cls = resolve("grpo", sets=[f"model={random_model_dir}", "eval_sets=[arith_l2]",
                                                    "eval_limit=6", "rollout.max_tool_calls=1",
                                                    f"rollout.tools=[{'python' if tools else ''}]"])
        recipe = cls(config, params)
        tokenizer = recipe.policy.tokenizer
        recipe._runtime.engine = lambda policy, trainer: CallOrGuess()
        row = loop.evaluate_solver(recipe, config, RunStore(tmp_path / str(tools)), 0)
        assert row["eval/arith_l2/accuracy"] == pytest.approx(expected[tools])
        assert row.get("eval/arith_l2/tool_call_rate") == (0.5 if tools else None)
        summary = json.loads((tmp_path / str(tools) / "eval" / "step_000000" / "summary.json").read_text())
        assert summary["arith_l2"]["tool_call_rate"] == (0.5 if tools else 0.0)
    assert expected[True] > expected[False]
