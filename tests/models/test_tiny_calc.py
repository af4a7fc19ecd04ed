"""The tiny-calc model (issue 45's world where the tool matters): its corpus's tool traces are episodes in the syntax of
docs/tools.md, their observations stay out of the pretraining loss, and its cached build reports tool use."""

from __future__ import annotations

import json
import random

import pytest

from coevolve.models import tiny_arith
from coevolve.models.tiny_arith import TinyArithBuild
from coevolve.models.tiny_calc import TinyCalcBuild
from coevolve.models.tiny_program import TinyProgramBuild
from coevolve.rollout.base import Completion
from coevolve.rollout.episodes import TOOL_CALL_STOP, ToolResult, observation, observation_spans, tool_code
from coevolve.tasks import arith


def test_builds_keep_their_cache_folders():
    # the cache folders every experiment ran on: a tiny-calc build must not change the others' names
    assert TinyCalcBuild.default().fingerprint() == "3381482155be"
    assert TinyCalcBuild.for_tests().fingerprint() == "e612ca4063a5"  # calls the tool (issue 45's kill test)
    assert TinyProgramBuild.default().fingerprint() == "8e92c025b2e2"  # FORMAT_VERSION 2 (issue 43): rebuilt
    assert TinyProgramBuild.for_tests().fingerprint() == "e22045adc072"
    assert TinyArithBuild.default().fingerprint() == "9e7ee49240d8"


def _tool_samples(n: int = 3000) -> list[tuple[str, str]]:
    build, rng = TinyCalcBuild.default(), random.Random(0)
    return [pair for pair in (build.sample(rng) for _ in range(n)) if TOOL_CALL_STOP in pair[1]]


def test_tool_traces_are_episodes_in_the_documented_syntax():
    samples = _tool_samples()
    levels = [arith.level_of(*_question(prompt)) for prompt, _ in samples]
    assert set(levels) == {1, 2, 3, 4, 5, 6} and levels.count(6) > 2 * levels.count(1)  # more often on hard levels
    for prompt, completion in samples:
        question, doc = _question(prompt)
        turn = completion[:completion.index(TOOL_CALL_STOP) + len(TOOL_CALL_STOP)]  # where an episode's turn stops
        code = tool_code(turn)
        assert code.splitlines()[-1] == f"print({question})"
        assert code.splitlines()[:-1] == (doc.split(",") if doc else [])
        [(start, end)] = observation_spans(completion)
        answer = str(arith.evaluate(question, doc))
        assert start == len(turn) and completion[start:end] == observation(ToolResult(answer, "ok"))
        episode = Completion(prompt, [], [], completion, [], "eos", observation_spans=[(start, end)])
        assert arith.parse_answer(episode.written_text) == answer  # the model's own line, after the observation


def test_the_sandbox_prints_what_the_traces_show():
    from coevolve.execution import Executor, sandbox_problem
    from coevolve.rollout.episodes import TOOL_LIMITS, python_tool

    if sandbox_problem() is not None:
        pytest.skip(sandbox_problem())
    samples = _tool_samples(600)[:12]
    with Executor(TOOL_LIMITS, workers=2) as executor:
        results = python_tool(executor)([tool_code(c[:c.index(TOOL_CALL_STOP) + 9]) for _, c in samples])
    for (_, completion), result in zip(samples, results):
        [(start, end)] = observation_spans(completion)
        assert completion[start:end] == observation(result)


def test_observations_stay_out_of_the_pretraining_loss():
    build = TinyCalcBuild.for_tests()
    tokenizer = tiny_arith.build_tokenizer()
    ids, _, labels = next(tiny_arith._batches(build, tokenizer))
    texts = [tokenizer.decode(row, skip_special_tokens=True) for row in ids]
    traced = [i for i, text in enumerate(texts) if TOOL_CALL_STOP in text]
    assert traced, texts
    for i in traced:
        prompt_len = texts[i].index("=?\n") + 3
        completion = texts[i][prompt_len:]
        first = 1 + prompt_len  # BOS, then the prompt
        scored = {t - first for t in range(len(labels[i])) if labels[i][t] != -100}
        unscored = {t for start, end in observation_spans(completion) for t in range(start, end)}
        assert unscored and not scored & unscored
        assert scored | unscored == set(range(len(completion) + 1))  # every other completion token and EOS


def test_the_build_reports_tool_use_per_level(small_tiny_calc):
    folder = small_tiny_calc[1]
    assert folder.name == f"tiny-calc-{TinyCalcBuild.for_tests().fingerprint()}"
    info = json.loads((folder / "build_info.json").read_text())
    for key in ("accuracy", "accuracy_with_tool", "tool_call_rate", "tool_call_rate_sampled"):
        if info.get(key) is None:
            assert key != "accuracy" and info["tool_unavailable"]
            continue
        assert set(info[key]) == {"1", "2", "3", "4", "5", "6"} and all(0 <= v <= 1 for v in info[key].values())
    if info.get("tool_call_rate_sampled") is not None:  # the test build is for tests of episodes that call the tool
        assert sum(info["tool_call_rate_sampled"].values()) / 6 > 0.5, info["tool_call_rate_sampled"]


def _question(prompt: str) -> tuple[str, str | None]:
    lines = prompt.splitlines()
    doc = lines[0][2:] if lines[0].startswith("D:") else None
    return lines[-1][2:].removesuffix("=?"), doc
