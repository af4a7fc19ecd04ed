"""``coevolve sft``'s tool warm-up: episodes in the syntax of docs/tools.md whose observations are what the sandbox
prints, and whose observation tokens are context but never targets, token for token as the RL trainer masks them."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from coevolve.cli import app
from coevolve.config import ConfigError
from coevolve.models import load_policy
from coevolve.recipes.agent0 import EXECUTOR_PROMPT
from coevolve.rollout.base import Completion
from coevolve.rollout.episodes import TOOL_CALL_STOP, ToolResult, observation, observation_spans, tool_code
from coevolve.sft import _batch, episode_target, resolve_sft, tool_warmup_pairs, warmup_data
from coevolve.tasks import arith
from coevolve.tasks import math as math_task


def test_tool_warmup_examples_are_episodes_in_the_documented_syntax():
    pairs = tool_warmup_pairs("agent0", 40, seed=3)
    assert len(pairs) == 40 and len({target for _, target in pairs}) > 30
    for message, target in pairs:
        assert message.startswith(EXECUTOR_PROMPT + "\n\n") and message.endswith(math_task.INSTRUCTION)
        question = message.split("What is ", 1)[1].split("?", 1)[0]
        value = arith.evaluate(question)
        assert value is not None and arith.level_of(question) >= 2
        turn = target[:target.index(TOOL_CALL_STOP) + len(TOOL_CALL_STOP)]
        assert tool_code(turn) == f"print({question})"
        [(start, end)] = observation_spans(target)
        assert start == len(turn) and target[start:end] == observation(ToolResult(str(value), "ok"))
        episode = Completion("", [], [], target, [], "eos", observation_spans=[(start, end)])
        assert math_task.parse_answer(episode.written_text) == str(value)  # the model's own box, after the output
    # a recipe without a tool instruction asks the bare question
    assert tool_warmup_pairs("grpo", 1)[0][0].startswith("What is ")


def test_the_sandbox_prints_what_the_observations_show():
    from coevolve.execution import Executor, sandbox_problem
    from coevolve.rollout.episodes import TOOL_LIMITS, python_tool

    if sandbox_problem() is not None:
        pytest.skip(sandbox_problem())
    pairs = tool_warmup_pairs("agent0", 8, seed=1)
    with Executor(TOOL_LIMITS, workers=2) as executor:
        results = python_tool(executor)([tool_code(t[:t.index(TOOL_CALL_STOP) + 9]) for _, t in pairs])
    for (_, target), result in zip(pairs, results):
        [(start, end)] = observation_spans(target)
        assert result.ok and target[start:end] == observation(result)


def test_observation_tokens_are_context_but_not_targets(random_model_dir):
    """The trained tokens are exactly the model's text (and EOS), the untrained ones exactly the observation, encoded
    on its own as the episode loop encodes it; the batch's labels are -100 there and on the prompt."""
    policy = load_policy(str(random_model_dir))
    tokenizer = policy.tokenizer
    config = resolve_sft("agent0", {"model": str(random_model_dir), "warmup": "tools", "examples": 6,
                                    "max_tokens": 4096})
    data = warmup_data(config, policy)
    pairs = tool_warmup_pairs("agent0", 6, config.seed)
    for (_, target, trained), (_, text) in zip(data, pairs):
        [(start, end)] = observation_spans(text)
        shown = [t for t, learn in zip(target, trained) if not learn]
        assert shown == tokenizer(text[start:end], add_special_tokens=False)["input_ids"]
        first = trained.index(False)
        assert all(trained[:first]) and all(trained[first + len(shown):])  # one masked run, where the output is
        written = [t for t, learn in zip(target, trained) if learn]
        assert tokenizer.decode(written[:-1]) == text[:start] + text[end:] and written[-1] in policy.eos_token_ids
    ids, mask, labels = _batch(data, tokenizer.pad_token_id)
    for row, (prompt, target, trained) in enumerate(data):
        assert labels[row, :len(prompt)].eq(-100).all() and ids[row, :len(prompt)].tolist() == prompt
        scored = labels[row, len(prompt):len(prompt) + len(target)].tolist()
        assert scored == [t if learn else -100 for t, learn in zip(target, trained)]
        assert labels[row, len(prompt) + len(target):].eq(-100).all()
    # the format warm-up has no observations: every target token is trained
    assert episode_target(tokenizer, "A:12", observations=False)[1] == [True] * 4


def test_a_tool_warmup_trains_and_says_how_to_start_a_run(random_model_dir, tmp_path):
    out = tmp_path / "sft"
    result = CliRunner().invoke(app, ["sft", "agent0", "--quiet", "--out", str(out), "--set", "warmup=tools",
                                      "--set", f"model={random_model_dir}", "--set", "steps=2",
                                      "--set", "batch_size=2", "--set", "examples=4"])
    assert result.exit_code == 0, result.output
    assert f"use --set model={out / 'model'}" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["warmup"] == "tools" and summary["examples"] == 4 and (out / "model" / "config.json").exists()


def test_bad_warmup_settings_are_one_line_errors():
    with pytest.raises(ConfigError, match="warmup"):
        resolve_sft("agent0", {"warmup": "chat"})
    with pytest.raises(KeyError, match="unknown recipe"):
        resolve_sft("no_such_recipe", {"warmup": "tools"})
    with pytest.raises(KeyError, match="no generator output format"):
        resolve_sft("grpo", {})  # the format warm-up needs a generator format; the tool warm-up does not
    assert resolve_sft("grpo", {"warmup": "tools"}).warmup == "tools"
