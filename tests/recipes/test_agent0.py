"""The agent0 recipe: the curriculum reward and ADPO against hand computation, a curriculum step whose executor runs
sandboxed tool calls, the small preset's two-step run, the presets' sources, and SIGKILL-and-resume."""

from __future__ import annotations

import json
import signal

import helpers
import psutil
import pytest
from helpers import CallThenAnswer, records
from run_checks import (
    SLOW_TOOL_SECONDS,
    assert_same_training,
    kill_during_tool_call,
    run_killed,
    still_running,
    train_rows,
)
from typer.testing import CliRunner

from coevolve.cli import app
from coevolve.execution import sandbox_problem
from coevolve.grading.vote import majority_vote
from coevolve.loop import run
from coevolve.recipes import resolve
from coevolve.recipes.agent0 import EXECUTOR_PROMPT, curriculum_tool_calls
from coevolve.recipes.r_zero import PoolItem, Question
from coevolve.rollout import Completion

TINY = ["eval_sets=[]", "rollout.max_new_tokens=8", "params.questioner_steps=2", "params.solver_steps=2",
        "params.questioner_prompts=2", "params.questioner_group=2", "params.score_samples=2", "params.pool_size=6",
        "params.label_samples=4", "params.solver_questions=2", "params.solver_group=4",
        "params.question_max_tokens=8"]


def make(model_dir, *sets):
    return helpers.make_recipe("agent0", model_dir, *TINY, *sets)


def completion(text: str = "") -> Completion:
    return Completion(prompt="W:\n", prompt_ids=[1], token_ids=[5, 6], text=text, logprobs=[-1.0, -1.0])


def task(text, p, tool_calls=(), answers=None, own=None, output=""):
    q = Question(completion(output), text, own)
    q.p, q.solver_tool_calls = p, list(tool_calls)
    if answers is not None:
        q.vote = majority_vote(answers, None)
    return q


def batch():
    # clusters by character BLEU (R-Zero's test batch): {0, 1, 2} 3/5, {3} 1/5, {4: bad format, empty text} 1/5
    return [task("3+4*5", 0.5, [1, 1]), task("3+4*5", 0.5, [0, 0]), task("3+4*5", 0.75, [4, 6]),
            task("(12-7)*9", 0.5, [2, 0]), task(None, None)]


def test_curriculum_reward_by_hand(random_model_dir):
    """R_C = max(0, R_unc + R_tool - R_rep) (paper form), R_tool = 0.05 min(N, 4) averaged over the executor's
    episodes: N = [1, 1] -> 0.05, [0, 0] -> 0, [4, 6] -> (0.2 + 0.2) / 2, [2, 0] -> (0.1 + 0) / 2."""
    recipe = make(random_model_dir)
    qs = batch()
    metrics = recipe.questioner_rewards(qs)
    assert [q.terms["repetition"] for q in qs] == pytest.approx([0.6, 0.6, 0.6, 0.2, 0.2])
    assert [q.terms["tool"] for q in qs] == pytest.approx([0.05, 0.0, 0.2, 0.05, 0.0])
    # R_unc [1, 1, 0.5, 1, 0]: max(0, 1 + 0.05 - 0.6), max(0, 1 - 0.6), max(0, 0.5 + 0.2 - 0.6), 1 + 0.05 - 0.2; bad 0
    assert [q.reward for q in qs] == pytest.approx([0.45, 0.4, 0.1, 0.85, 0.0])
    assert metrics["agent0/tool_reward_mean"] == pytest.approx(0.3 / 5)
    assert metrics["agent0/executor_tool_calls_mean"] == pytest.approx(14 / 8)
    # the code's form (curriculum_reward.py:150): min(p, 1-p) - R_rep + R_tool; a bad format -1 - R_rep + R_tool
    code = make(random_model_dir, "params.reward_form=code")
    qs = batch()
    code.questioner_rewards(qs)
    assert [q.reward for q in qs] == pytest.approx([0.5 - 0.6 + 0.05, 0.5 - 0.6, 0.25 - 0.6 + 0.2, 0.5 - 0.2 + 0.05,
                                                    -1 - 0.2])


def test_the_codes_tool_count_and_own_answer_gate(random_model_dir):
    """reference_code's R_tool counts "```output" in the curriculum's own text (capped at 4); its p_hat is 0 unless
    the executor's majority agrees with the curriculum's own boxed answer and p_hat > 0.1."""
    recipe = make(random_model_dir, "params.reward_form=code", "params.tool_calls_of=curriculum",
                  "params.own_answer_gate=true", "params.repetition_weight=0")
    call = "```python\nprint(1)\n```\n```output"
    qs = [task("1+2", 0.5, [3, 3], ["3", "3", "4", "5"], own="3", output=call * 2),  # agrees: p 0.5, N 2
          task("2+2", 0.5, [], ["4", "4", "5", "6"], own="7", output=call * 6),  # disagrees: p 0; N capped at 4
          task("3+3", 0.1, [], ["6", "1", "2", "3", "4", "5", "7", "8", "9", "0"], own="6"),  # p = 0.1, not > 0.1
          task("4+4", 0.5, [], ["8", "8", "1", "2"], own=None)]  # no own answer: p 0
    recipe.questioner_rewards(qs)
    assert [q.terms["tool"] for q in qs] == pytest.approx([0.1, 0.2, 0.0, 0.0])
    assert [q.terms["uncertainty"] for q in qs] == pytest.approx([1.0, 0.0, 0.0, 0.0])
    assert [q.reward for q in qs] == pytest.approx([0.5 + 0.1, 0.0 + 0.2, 0.0, 0.0])
    assert curriculum_tool_calls(call * 3) == 3 and curriculum_tool_calls("no call") == 0


def test_adpo_executor_step_by_hand(random_model_dir):
    """Two pool tasks: p 0.55 (scale 0.6 + 0.4 * 0.5 = 0.8, clip_high 0.2 + 0.1 * 0.5 = 0.25) and p 0.3 (scale 0.6,
    clip_high 0.3). Rewards +1 / -1 against the majority label; GRPO advantages (sample std) times the scale."""
    recipe = make(random_model_dir, "rollout.tools=[]")
    recipe.pool = [PoolItem("1+2", "3", 0.55, "i1-pool0"), PoolItem("2+2", "4", 0.3, "i1-pool1")]
    recipe.pool_iteration = 1
    replies = {"1+2": ["A:3", "A:3", "A:9", "A:9"], "2+2": ["A:4", "A:1", "A:2", None]}

    def sample_groups(policy, prompts, n, seed, sampling=None):
        assert policy is recipe.solver_policy
        return [[completion(r or "no answer") for r in replies[p.removeprefix("Q:").removesuffix("=?\n")]]
                for p in prompts]

    seen = []
    update = recipe.solver_trainer.update
    recipe.sample_groups = sample_groups
    recipe.solver_trainer.update = lambda samples: seen.extend(samples) or update(samples)
    rows = [r for r in records(recipe.step(3)) if r["role"] == "solver"]  # step 3: the executor phase's first
    by_task = {q: [r for r in rows if r["question"] == q] for q in ("1+2", "2+2")}
    assert [r["reward"] for r in by_task["1+2"]] == [1, 1, -1, -1]
    assert [r["reward"] for r in by_task["2+2"]] == [1, -1, -1, -1]
    # [1, 1, -1, -1]: +-1 / sqrt(4/3) = +-0.8660, x 0.8;  [1, -1, -1, -1]: (r + 0.5) / 1 = [1.5, -0.5 x 3], x 0.6
    assert [r["advantage"] for r in by_task["1+2"]] == pytest.approx([0.69282, 0.69282, -0.69282, -0.69282],
                                                                     abs=1e-5)
    assert [r["advantage"] for r in by_task["2+2"]] == pytest.approx([0.9, -0.3, -0.3, -0.3], abs=1e-5)
    highs = {round(s.advantage, 4): s.clip_high for s in seen}
    assert highs[0.6928] == pytest.approx(0.25) and highs[0.9] == pytest.approx(0.3)
    assert sorted({s.clip_high for s in seen}) == pytest.approx([0.25, 0.3])


def test_a_curriculum_step_whose_executor_calls_the_tool(random_model_dir):
    """rollout.tools alone: the executor's k scoring votes are episodes (the engine here prints the task's
    expression, then answers with what it read), the sandbox runs every call, and R_tool = 0.05 per task."""
    from coevolve.execution import sandbox_problem

    if sandbox_problem() is not None:
        pytest.skip(sandbox_problem())
    recipe = make(random_model_dir, "rollout.max_new_tokens=200", "rollout.max_tool_calls=2",
                  "params.repetition_weight=0", "params.score_samples=3")
    tokenizer = recipe.solver_policy.tokenizer
    tasks = iter(["1+2", "7*8", "9-4", "2*3"])
    recipe.read_question = lambda output: Question(output, next(tasks), None)

    recipe._runtime.engine = lambda policy, trainer: CallThenAnswer(tokenizer)
    out = recipe.step(1)
    rows = records(out)
    assert [r["question"] for r in rows] == ["1+2", "7*8", "9-4", "2*3"]
    assert all(r["solve_rate"] == 1.0 for r in rows)  # every vote is the sandbox's result, read by the model
    assert [r["reward_terms"]["tool"] for r in rows] == pytest.approx([0.05] * 4)
    assert [r["reward"] for r in rows] == pytest.approx([0.05] * 4)  # R_unc 0 at p 1, no repetition weight
    assert out.metrics["agent0/executor_tool_calls_mean"] == 1.0
    telemetry = recipe.engine_metrics()
    assert telemetry["tool/calls"] == 4 * 3 and telemetry["tool/error_rate"] == 0.0


def test_chat_executor_prompt_carries_the_tool_instruction(random_model_dir):
    recipe = make(random_model_dir)
    assert EXECUTOR_PROMPT not in recipe.solver_prompt("1+2")  # the compact world: the task's own prompt
    assert "```output" in EXECUTOR_PROMPT and "\\boxed{...}" in EXECUTOR_PROMPT


def test_presets_cite_the_codes_values():
    config, params, _ = resolve("agent0", preset="reference_code")
    assert (params.questioner_steps, params.solver_steps, config.steps) == (5, 100, 3 * 105)
    assert (params.questioner_prompts, params.questioner_group, params.score_samples) == (512, 4, 10)
    assert (params.pool_size, params.label_samples, params.band, params.pool_p_denominator) == (
        8000, 9, [0.3, 0.8], "all")
    assert params.missing_answer_votes == "code"  # mathruler's "None" for an unboxed sample is a vote
    assert (params.solver_questions, params.solver_group, params.label_top_k) == (128, 16, 40)
    assert (params.tool_weight, params.tool_cap, params.tool_calls_of, params.own_answer_gate) == (
        0.05, 4, "curriculum", True)
    assert (params.trust_band, params.min_advantage_scale, params.max_epsilon_bonus) == ([0.3, 0.8], 0.6, 0.1)
    assert (config.rollout.tools, config.rollout.max_tool_calls, config.rollout.max_new_tokens) == (["python"], 4,
                                                                                                    4096)
    assert (config.rollout.scoring.temperature, config.rollout.scoring.top_p) == (0.7, 0.9)
    t = config.train
    assert (t.lr, t.kl_beta, t.kl_clamp, t.weight_decay, t.clip_low, t.loss_agg) == (
        1e-6, 1e-2, 10.0, 0.01, 0.2, "token_mean")
    assert config.roles["solver"].lr_schedule == "cosine" and (t.lr_warmup_ratio, t.lr_min_ratio) == (0.1, 1.0)
    paper, pparams, _ = resolve("agent0", preset="paper")
    assert (pparams.reward_form, pparams.tool_calls_of, pparams.own_answer_gate, pparams.label_with_tools) == (
        "paper", "executor", False, True)
    small, sparams, _ = resolve("agent0", preset="small")
    assert small.model == "tiny-arith" and small.steps == 2 * (sparams.questioner_steps + sparams.solver_steps)


SMALL = ["eval_sets=[]", "params.questioner_steps=1", "params.solver_steps=1", "params.questioner_prompts=2",
         "params.questioner_group=2", "params.score_samples=2", "params.pool_size=4", "params.label_samples=2",
         "params.solver_questions=2", "params.solver_group=2", "rollout.max_new_tokens=8",
         "params.question_max_tokens=8", "params.band=[0,1]"]


def test_two_steps_of_the_small_preset(tmp_path, random_model_dir):
    """The small preset, one curriculum and one executor step, through the loop (episodes on: the random model asks
    for no call)."""
    config, params, cls = resolve("agent0", preset="small", sets=[f"model={random_model_dir}", "steps=2", *SMALL])
    recipe = cls(config, params)
    recipe.read_question = lambda output: Question(output, "1+2" if len(output.text) % 2 else "3*4", None)
    label = recipe.label

    def canned(questions, samples, seed, denominator, sampling=None, tools=True):  # the real votes, then answers
        label(questions, samples, seed, denominator, sampling, tools)
        for q in questions:
            if q.text is not None:
                q.vote = majority_vote(["3", "3"] if q.text == "1+2" else ["12", "7"], None)
                q.p = q.vote.p

    recipe.label = canned
    run(recipe, config, tmp_path / "run", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "time/step_s" in r]
    assert [(r["step"], r["phase"]) for r in train] == [(1, "questioner"), (2, "solver")]
    assert "agent0/tool_reward_mean" in train[0] and train[0]["questioner/optimizer_steps"] == 1
    assert train[1]["solver/optimizer_steps"] == 1 and train[1]["pool/size"] > 0


# the test build writes valid tasks and answers at the small preset's budgets (a pool of 8 keeps some of them) and, at
# temperature 0.5, groups whose answers both agree and disagree with the label (a gradient)
KILLED = [s for s in SMALL if "max_tokens" not in s and "max_new_tokens" not in s and "pool_size" not in s]
AGENT0_RUN = ["run", "agent0", "--preset", "small", "--quiet", "--set", "steps=3", "--set", "eval_every=0",
              "--set", "train.lr=1e-3", *[arg for s in KILLED for arg in ("--set", s)],
              "--set", "params.solver_steps=2", "--set", "params.pool_size=8", "--set", "params.label_samples=4",
              "--set", "params.solver_questions=4", "--set", "params.solver_group=4",
              "--set", "rollout.temperature=0.5"]


def test_killed_mid_step_resumes_as_the_uninterrupted_run(tmp_path, small_tiny_arith):
    """SIGKILL after step 2's samples (the executor phase's first step, the pool built): the resumed run logs every
    step once and trains as the uninterrupted one (episodes on; the test build writes no Python)."""
    model = small_tiny_arith[1]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    done = CliRunner().invoke(app, [*AGENT0_RUN, "--set", f"model={model}", "--out", str(whole)])
    assert done.exit_code == 0, done.output
    proc = run_killed("after_samples", [*AGENT0_RUN, "--set", f"model={model}", "--out", str(killed)])
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    resumed = CliRunner().invoke(app, ["run", "--resume", str(killed), "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert [r["step"] for r in train_rows(killed)] == [1, 2, 3]
    assert all(r["pool/size"] > 0 for r in train_rows(whole)[1:])
    assert_same_training(whole, killed, model, ("solver/grad_norm", "solver/advantage_abs_mean"))
    assert [r["pool/size"] for r in train_rows(killed)[1:]] == [r["pool/size"] for r in train_rows(whole)[1:]]


def test_killed_during_a_tool_call_resumes_as_the_uninterrupted_run(tmp_path, small_tiny_calc):
    """SIGKILL of the run's process group while a sandboxed tool program of step 2 runs (the tiny-calc test build calls
    the tool in most episodes; the kill driver makes step 2's programs sleep so the kill lands in one): no sandbox
    process outlives the run, and the resumed run logs every step once, replays the same episodes and trains as the
    uninterrupted one."""
    if sandbox_problem() is not None:
        pytest.skip(sandbox_problem())
    model = small_tiny_calc[1]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    done = CliRunner().invoke(app, [*AGENT0_RUN, "--set", f"model={model}", "--out", str(whole)])
    assert done.exit_code == 0, done.output
    assert all(r["tool/calls"] > 0 for r in train_rows(whole)), [r["tool/calls"] for r in train_rows(whole)]
    returncode, programs, started = kill_during_tool_call([*AGENT0_RUN, "--set", f"model={model}",
                                                           "--out", str(killed)], tmp_path / "sleeping")
    assert returncode == -signal.SIGKILL and programs
    assert "bwrap" in started.values(), started
    # bwrap's --die-with-parent takes each sandbox with the run (measured: in 0.1 s), long before a sleeping program
    # would end and its worker read that the run is gone
    assert not still_running(list(started), SLOW_TOOL_SECONDS / 3)
    assert [r["step"] for r in train_rows(killed)] == [1]  # killed inside step 2

    ours = {p.pid for p in psutil.Process().children(recursive=True)}
    resumed = CliRunner().invoke(app, ["run", "--resume", str(killed), "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in ours]
    assert not still_running(new, 5)  # the resumed run closed its sandboxes
    assert [r["step"] for r in train_rows(killed)] == [1, 2, 3]
    assert [r["tool/calls"] for r in train_rows(killed)] == [r["tool/calls"] for r in train_rows(whole)]
    assert_same_training(whole, killed, model, ("solver/grad_norm", "solver/advantage_abs_mean"))
