"""Episodes: the tool loop below every engine (syntax, observations, the mask, the limit, the budget), the same
greedy episodes from the HF plain loop and its static decoder, and hostile code that only becomes an observation."""

from __future__ import annotations

import os

import pytest
import torch
from helpers import scripted_gpt2

from coevolve.execution import Executor, sandbox_problem
from coevolve.rollout import Completion, SamplingParams
from coevolve.rollout.episodes import (
    OBSERVATION_CHARS,
    TOOL_CALL_STOP,
    TOOL_LIMITS,
    EpisodeEngine,
    ToolResult,
    observation,
    python_tool,
    tool_code,
    tool_rates,
)
from coevolve.rollout.hf import HFRolloutEngine

CALL = "I compute.\n```python\nprint(6*7)\n```\n```output"


@pytest.fixture(scope="module")
def tokenizer():
    from coevolve.models.tiny_arith import build_tokenizer

    tok = build_tokenizer()
    tok.padding_side = "left"
    return tok


@pytest.fixture(scope="module")
def executor():
    problem = sandbox_problem()
    if problem is not None:
        pytest.skip(problem)
    with Executor(TOOL_LIMITS, workers=2) as pool:
        yield pool


class ScriptedEngine:
    """Answers each call with the next scripted text per prompt (a dict from the context's end to the text), the
    character tokenizer's ids, the stop rule of the real engines (cut right after the first stop string)."""

    def __init__(self, tokenizer, replies: list[str]):
        self.tokenizer, self.replies, self.calls = tokenizer, list(replies), []

    def generate(self, prompts, params, seed):
        self.calls.append((list(prompts), params.max_new_tokens))
        out = []
        for prompt in prompts:
            text, reason = self.replies.pop(0), "eos"
            for stop in params.stop:
                if stop in text:
                    text, reason = text[:text.index(stop) + len(stop)], "stop"
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) > params.max_new_tokens:
                ids, reason = ids[:params.max_new_tokens], "length"
                text = self.tokenizer.decode(ids)
            out.append(Completion(prompt, self.tokenizer(prompt)["input_ids"], ids, text, [-0.5] * len(ids), reason))
        return out

    def pop_metrics(self):
        return {}


def fixed_tool(output="42", status="ok"):
    seen = []

    def run(codes):
        seen.append(list(codes))
        return [ToolResult(output, status) for _ in codes]

    run.seen = seen
    return run


def test_tool_code_takes_the_last_python_block_before_the_call():
    assert tool_code(CALL) == "print(6*7)"
    assert tool_code("```python\nx = 1\n```\nthen\n```python\ny = 2\nprint(y)\n```\n```output") == "y = 2\nprint(y)"
    assert tool_code("```python\nprint(1)\n```output") == "print(1)"  # no closing fence: up to the call
    assert tool_code("no code\n```output") is None
    assert observation(ToolResult("42", "ok")) == "\n42\n```\n"


def test_an_episode_appends_the_observation_and_masks_exactly_its_tokens(tokenizer):
    engine = ScriptedEngine(tokenizer, [CALL, "The answer is 42."])
    tool = fixed_tool()
    episodes = EpisodeEngine(engine, tokenizer, tool, max_tool_calls=4)
    params = SamplingParams(temperature=0.0, max_new_tokens=200)
    [c] = episodes.generate(["Q:6*7=?"], params, seed=0)
    assert tool.seen == [["print(6*7)"]]
    assert c.text == CALL + "\n42\n```\n" + "The answer is 42."
    assert c.tool_calls == 1 and c.finish_reason == "eos"
    # the second turn is sampled on the prompt and the episode so far, with the budget left
    assert engine.calls[1] == (["Q:6*7=?" + CALL + "\n42\n```\n"], 200 - len(CALL) - 8)
    assert len(c.token_ids) == len(c.tool_mask) == len(c.logprobs)
    decoded = [(tokenizer.decode([t]), tool) for t, tool in zip(c.token_ids, c.tool_mask)]
    assert "".join(ch for ch, tool in decoded if tool) == "\n42\n```\n"
    assert "".join(ch for ch, tool in decoded if not tool) == CALL + "The answer is 42."
    first_tool = c.tool_mask.index(True)
    assert first_tool == len(CALL) and sum(c.tool_mask) == len("\n42\n```\n")
    assert all(lp == 0.0 for lp, tool in zip(c.logprobs, c.tool_mask) if tool)
    assert all(lp == -0.5 for lp, tool in zip(c.logprobs, c.tool_mask) if not tool)
    counts = episodes.pop_metrics()
    assert counts["tool/calls"] == 1 and counts["tool/episodes"] == 1 and counts["tool/errors"] == 0
    assert counts["tool/observation_tokens"] == len("\n42\n```\n")
    assert tool_rates(counts)["tool/calls_per_episode"] == 1.0


def test_a_row_without_a_tool_call_is_one_turn_and_rows_continue_independently(tokenizer):
    engine = ScriptedEngine(tokenizer, ["A:5", CALL, "done"])
    episodes = EpisodeEngine(engine, tokenizer, fixed_tool(), max_tool_calls=2)
    plain, used = episodes.generate(["Q:2+3=?", "Q:6*7=?"], SamplingParams(max_new_tokens=200), seed=0)
    assert plain.text == "A:5" and plain.tool_mask == [False] * 3 and plain.tool_calls == 0
    assert used.tool_calls == 1 and used.text.endswith("done")
    assert [len(prompts) for prompts, _ in engine.calls] == [2, 1]  # the finished row does not generate again


def test_the_limit_caps_and_counts_calls(tokenizer):
    engine = ScriptedEngine(tokenizer, [CALL] * 10)
    tool = fixed_tool()
    episodes = EpisodeEngine(engine, tokenizer, tool, max_tool_calls=3)
    [c] = episodes.generate(["Q:?"], SamplingParams(max_new_tokens=10_000), seed=0)
    assert c.tool_calls == 3 and len(tool.seen) == 3 and c.finish_reason == "tool_limit"
    assert c.text.count(TOOL_CALL_STOP) == 4  # the fourth request is in the text but not run
    assert episodes.pop_metrics()["tool/capped_calls"] == 1
    with pytest.raises(ValueError, match="max_tool_calls"):
        EpisodeEngine(engine, tokenizer, tool, max_tool_calls=-1)


def test_the_budget_counts_model_and_observation_tokens(tokenizer):
    budget = len(CALL) + 5  # the observation "\n42\n```\n" (8 tokens) does not fit: cut to 5, episode over
    engine = ScriptedEngine(tokenizer, [CALL, "never sampled"])
    [c] = EpisodeEngine(engine, tokenizer, fixed_tool(), max_tool_calls=4).generate(
        ["Q:?"], SamplingParams(max_new_tokens=budget), seed=0)
    assert len(c.token_ids) == budget and sum(c.tool_mask) == 5 and c.finish_reason == "length"
    assert len(engine.calls) == 1


def test_a_call_without_a_code_block_gets_an_error_observation(tokenizer):
    engine = ScriptedEngine(tokenizer, ["hmm\n```output", "ok"])
    tool = fixed_tool()
    episodes = EpisodeEngine(engine, tokenizer, tool, max_tool_calls=4)
    [c] = episodes.generate(["Q:?"], SamplingParams(max_new_tokens=500), seed=0)
    assert tool.seen == [] and "error: syntax: no ```python block" in c.text and c.tool_calls == 1
    assert episodes.pop_metrics()["tool/errors"] == 1


def test_an_answer_is_read_from_the_model_s_text_never_from_an_observation(tokenizer):
    """A program that prints an answer-shaped line ("A:99", "\\boxed{99}") does not answer for the model: the
    model's own text after the observation has no answer, so the episode has none; the model's own answer wins."""
    from coevolve.tasks.arith import parse_answer

    for printed, style in (("A:99", "compact"), ("\\boxed{99}", "chat")):
        engine = ScriptedEngine(tokenizer, [CALL, CALL, "so I am not sure.", "A:7"])  # by turn, then row
        episodes = EpisodeEngine(engine, tokenizer, fixed_tool(printed), max_tool_calls=4)
        silent, answered = episodes.generate(["Q:a", "Q:b"], SamplingParams(max_new_tokens=500), seed=0)
        assert parse_answer(silent.text, style) == "99"  # the whole text would grade the tool's output
        assert parse_answer(silent.written_text, style) is None
        assert silent.written_text == CALL + "\n" + "so I am not sure."
        assert parse_answer(answered.written_text, "compact") == "7"
        assert [silent.text[a:b] for a, b in silent.observation_spans] == [observation(ToolResult(printed, "ok"))]


def test_tool_token_spans_and_the_sample_record(tokenizer):
    from coevolve.records import solver_row

    engine = ScriptedEngine(tokenizer, [CALL, "A:1", "x" + CALL, "A:42"])  # by turn, then row
    episodes = EpisodeEngine(engine, tokenizer, fixed_tool(), max_tool_calls=4)
    used, plain = episodes.generate(["Q:a", "Q:b"], SamplingParams(max_new_tokens=500), seed=0)
    obs = len(observation(ToolResult("42", "ok")))
    first = (len(CALL), len(CALL) + obs)
    second = (first[1] + 1 + len(CALL), first[1] + 1 + len(CALL) + obs)
    assert used.tool_token_spans() == [first, second]
    assert [used.tool_mask[t] for t in range(len(used.tool_mask))] == [
        any(a <= t < b for a, b in (first, second)) for t in range(len(used.tool_mask))]
    row = solver_row(1, None, "solve", used, question="q", question_id="q0", label_source="majority").as_record()
    assert row["tool_calls"] == 2 and row["tool_spans"] == [list(first), list(second)]
    assert plain.tool_mask == [False] * 3  # an episode without a call records its zero calls and no span
    assert solver_row(1, None, "solve", plain, question="q", question_id="q1",
                      label_source="majority").as_record()["tool_spans"] == []
    single = Completion("p", [1], [2, 3], "A:1", [-0.1, -0.1])
    assert "tool_spans" not in solver_row(1, None, "solve", single, question="q", question_id="q2",
                                          label_source="majority").as_record()


FIRST = "```python\nprint(6*7)\n```\n```output"


def tool_script() -> dict[int, str]:
    """The greedy script of prompt "Q:?" (<s> Q : ? -> the first new token is predicted at position 3): a python
    call, then "A:42" right after its observation."""
    after = 3 + len(FIRST) + len(observation(ToolResult("42", "ok")))
    return {3 + k: ch for k, ch in enumerate(FIRST)} | {after + k: ch for k, ch in enumerate("A:42")}


def test_greedy_episodes_are_the_same_in_the_plain_loop_and_the_static_decoder(tokenizer, executor):
    """Real sandboxed calls: row 0 runs print(6*7) and reads 42; row 1 (one token later) writes ``python without
    the third backtick (an error observation); both go on after their observation."""
    prompt, first = "Q:?", FIRST
    model = scripted_gpt2(tokenizer, tool_script())
    params = SamplingParams(temperature=0.0, max_new_tokens=120)
    runs = {}
    for name, engine in (("plain", HFRolloutEngine(model, tokenizer, batch_size=8)),
                         ("static", HFRolloutEngine(model, tokenizer, batch_size=8, dtype=torch.float32,
                                                    sync_every=4))):
        episodes = EpisodeEngine(engine, tokenizer, python_tool(executor), max_tool_calls=2)
        runs[name] = episodes.generate([prompt, prompt + "?"], params, seed=0)
        assert (engine.decoder is not None) == (name == "static")
    plain, static = runs["plain"], runs["static"]
    assert [c.token_ids for c in plain] == [c.token_ids for c in static]
    assert [c.tool_mask for c in plain] == [c.tool_mask for c in static]
    assert [c.finish_reason for c in plain] == [c.finish_reason for c in static]
    assert plain[0].text == first + "\n42\n```\n" + "A:42"
    assert plain[0].tool_calls == 1 and plain[0].finish_reason == "eos"
    assert "error: syntax: no ```python block" in plain[1].text and plain[1].tool_calls >= 1
    for c in plain:
        observed = "".join(tokenizer.decode([t]) for t, tool in zip(c.token_ids, c.tool_mask) if tool)
        assert observed and observed in c.text
    for mine, theirs in zip(plain, static):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)


HOSTILE = {
    "loop": ("while True:\n    pass", "timeout"),
    "fork": ("import os\nos.fork()", "forbidden"),
    "flood": ("while True:\n    print('x' * 10000)", None),  # cut by the capture, or out of time
    "huge": ("print('y' * 5_000_000)", "ok"),
    "surrogate": ("print('\\udcff')", "ok"),
    "raw_bytes": ("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe')", "error"),
    "fd_bytes": ("import os\nos.write(1, b'\\xff\\xfe' * 10)", "output"),
    "network": ("import socket\ns = socket.create_connection(('1.1.1.1', 80), timeout=2)", "error"),
    "memory": ("x = bytearray(10 ** 10)", "error"),  # MemoryError, caught by the harness
    "exit": ("raise SystemExit(3)", "error"),
}


def test_hostile_code_becomes_an_error_observation_and_the_episode_goes_on(tokenizer, executor):
    names = list(HOSTILE)
    tool, results = python_tool(executor), []

    def recording(codes):
        results.extend(tool(codes))
        return results[-len(codes):]

    calls = [f"```python\n{HOSTILE[name][0]}\n```\n```output" for name in names]
    engine = ScriptedEngine(tokenizer, calls + ["A:1"] * len(names))
    episodes = EpisodeEngine(engine, tokenizer, recording, max_tool_calls=1).generate(
        names, SamplingParams(max_new_tokens=2000), seed=0)
    assert len(results) == len(names)  # one executor batch for every row's call
    for name, result, episode in zip(names, results, episodes):
        expected = HOSTILE[name][1]
        if expected is not None:
            assert result.status == expected, (name, result)
        assert len(result.output) <= OBSERVATION_CHARS
        result.output.encode("utf-8")  # always valid UTF-8
        if not result.ok:
            assert "error" in result.output, (name, result)
        assert observation(result) in episode.text and episode.text.endswith("A:1") and episode.tool_calls == 1
    by_name = dict(zip(names, results))
    assert "more characters" in by_name["huge"].output
    assert by_name["surrogate"].output.strip() == "?"
    assert tool(["print(sum(range(10)))"])[0] == ToolResult("45", "ok")  # the pool still works


@pytest.mark.skipif(os.environ.get("COEVOLVE_VLLM") == "0", reason="setup left vLLM out (COEVOLVE_VLLM=0)")
def test_greedy_episodes_are_the_same_in_vllm(tokenizer, executor, tmp_path):
    """The vLLM engine (CPU build) runs the same episodes as the HF plain loop: tokens, mask and log-probs."""
    from coevolve.models import load_policy
    from coevolve.rollout.vllm_engine import VLLMRolloutEngine, VLLMSettings

    scripted_gpt2(tokenizer, tool_script()).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    policy = load_policy(str(tmp_path))
    params = SamplingParams(temperature=0.0, max_new_tokens=120)
    engines = [VLLMRolloutEngine(policy.model, policy.tokenizer, str(tmp_path), eos_token_ids=policy.eos_token_ids,
                                 settings=VLLMSettings(kv_cache_gib=0.05)),
               HFRolloutEngine(policy.model, policy.tokenizer, batch_size=8, eos_token_ids=policy.eos_token_ids)]
    vllm, hf = (EpisodeEngine(engine, tokenizer, python_tool(executor), max_tool_calls=2).generate(
        ["Q:?", "Q:??"], params, seed=0) for engine in engines)
    assert vllm[0].text == FIRST + "\n42\n```\n" + "A:42" and vllm[0].tool_calls == 1
    assert [c.token_ids for c in vllm] == [c.token_ids for c in hf]
    assert [c.tool_mask for c in vllm] == [c.tool_mask for c in hf]
    assert [c.finish_reason for c in vllm] == [c.finish_reason for c in hf]
    for mine, theirs in zip(vllm, hf):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)
