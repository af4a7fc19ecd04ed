"""azr as the authors' `paper` branch runs it: the ``reference_code`` preset value by value (sources in
docs/recipes/azr.md, "Presets"), and one step under R1-Zero's wrapper and the code's <think>/<answer> rule on canned
outputs (prompts in R1-Zero's template without the chat template, answers read only from <answer>, -1 without the
shape, a valid proposal without it still buffered)."""

from __future__ import annotations

import random

import helpers
import pytest
from helpers import records

from coevolve.execution import sandbox_problem
from coevolve.recipes import resolve
from coevolve.rollout import Completion
from coevolve.tasks.triplets import r1_zero_prompt


def test_reference_code_preset_is_the_paper_branch_row_by_row():
    cfg, params, _ = resolve("azr", preset="reference_code")
    train, rollout = cfg.train, cfg.rollout
    expected = {  # value: the paper branch's file and line are in docs/recipes/azr.md
        "task": (cfg.task, "python"),
        "lr": (train.lr, 1e-6), "lr_schedule": (train.lr_schedule, "constant"),
        "weight_decay (AdamW default 1e-2)": (train.weight_decay, 0.01),
        "symmetric clip 0.2": ((train.clip_low, train.clip_high), (0.2, 0.2)), "no dual clip": (train.dual_clip, None),
        "token-mean loss": (train.loss_agg, "token_mean"), "grad clip": (train.grad_clip, 1.0),
        "no KL": (train.kl_beta, 0.0), "entropy bonus": (train.entropy_coef, 0.001),
        "mini-batch": (train.mini_batch_size, 128), "PPO epochs": (train.epochs, 1),
        "temperature, top-p": ((rollout.temperature, rollout.top_p), (1.0, 1.0)),
        "response length": (rollout.max_new_tokens, 8096),
        "B": (params.batch_size, 64), "K (io_n)": (params.references, 6), "n": (params.learnability_samples, 8),
        "N (num_inputs)": (params.induction_inputs, 10), "S": (params.seed_batch_factor, 4),
        "max programs": (params.max_buffer, 16384), "timeout": (params.execution_timeout_s, 10.0),
        "valid task with r_propose 0": (params.trivial_task_reward, -0.5),
        "token-level whitening": (params.token_weighted_baseline, True),
        "R1-Zero wrapper and <think>/<answer> rule": (params.r1_zero_format, True),
        "reject_multiple_functions": (params.single_function, True),
        "inputs as expressions": (params.expression_inputs, True), "None and non-literal outputs": (
            params.any_output, True), "outputs cut to 400": (params.output_chars, 400),
        "seeding strips": (params.strip_seed_programs, True),
        "prompt filter (data.max_prompt_length 6144 < content_max_length 8096)": (params.max_prompt_tokens, 6144),
        "all three task types": (params.task_types, ["deduction", "abduction", "induction"]),
    }
    assert {name: got for name, (got, _) in expected.items()} == {name: want for name, (_, want) in expected.items()}
    small = resolve("azr", preset="small")[1]  # the small world keeps coevolve's rules and the chat-free format
    assert not (small.r1_zero_format or small.single_function or small.expression_inputs or small.any_output)
    assert small.strip_seed_programs and small.output_chars is None and small.max_prompt_tokens is None


PROGRAMS = {  # program, input, output; "plain" is written without the <think>/<answer> shape
    "tagged": ("def f(a):\n    return a + 1", "2", "3"),
    "plain": ("def f(a):\n    return a * 2", "5", "10"),
    "seed": ("def f(a):\n    return a", '"Hello world"', "'Hello world'"),
}


def completion(text: str) -> Completion:
    return Completion(prompt="", prompt_ids=[1], token_ids=[5, 6], text=text, logprobs=[-1.0, -1.0])


def test_r1_zero_wrapper_and_format_rule_in_one_step(random_model_dir):
    recipe = helpers.make_recipe(
        "azr", random_model_dir, "task=python", "params.r1_zero_format=true", "params.task_types=[deduction]",
        "params.batch_size=2", "params.seed_batch_factor=1", "params.learnability_samples=2", "params.references=1",
        "params.execution_workers=1", "params.execution_timeout_s=3", "rollout.max_new_tokens=8",
        f"params.unconfined_execution={str(sandbox_problem() is not None).lower()}")
    prompts_seen = []

    def sample_groups(policy, prompts, n, seed, sampling=None):
        prompts_seen.extend(prompts)
        out = []
        for i, prompt in enumerate(prompts):
            if "write a new Python program" in prompt:  # proposer: one shaped output, one not
                name = ("tagged", "plain")[i % 2]
                program, argument, _ = PROGRAMS[name]
                blocks = f"```python\n{program}\n```\n```input\n{argument}\n```"
                out.append([completion(f" ok </think> <answer>{blocks}</answer>" if name == "tagged"
                                       else f"<answer>{blocks}</answer>")])
                continue
            name = next(k for k, (program, _, _) in PROGRAMS.items() if f"```python\n{program}\n```" in prompt)
            answer = f"```output\n{PROGRAMS[name][2]}\n```"
            shaped, unshaped, untagged = (f"r </think><answer>{answer}</answer>", f"<answer>{answer}</answer>",
                                          f"r </think>{answer}")
            if n == 2:  # learnability rollouts: the answer counts when it is inside <answer>
                out.append([completion(shaped), completion(untagged)])
            else:  # the solve phase: the whole shape is needed
                out.append([completion(shaped if name == "tagged" else unshaped)])
        return out

    recipe.sample_groups = sample_groups
    try:
        rows = records(recipe.step(1))
        assert prompts_seen and all(p.startswith("A conversation between User and Assistant.")
                                    and p.endswith("\nAssistant: <think>") for p in prompts_seen)
        message = recipe.world.solver_prompt("deduction", recipe.buffers.triplets("deduction")[0], recipe.style)
        assert recipe.format(message) == r1_zero_prompt(message) != recipe.policy.format_prompt(message)
        assert {t.program for t in recipe.buffers.triplets("deduction")} >= {
            PROGRAMS["tagged"][0], PROGRAMS["plain"][0]}  # the unshaped proposal's task is buffered too
        proposer = {r["question"].split(" | ")[0]: r["reward"] for r in rows if r["phase"] == "propose"}
        assert proposer == {"def f(a): return a + 1": 0.5, "def f(a): return a * 2": -1.0}  # 1 - 1/2; unshaped
        solver = {r["question"].split(" | ")[0]: (r["answer"], r["reward"]) for r in rows if r["phase"] == "solve"}
        assert solver == {"def f(a): return a + 1": ("3", 1.0), "def f(a): return a * 2": ("10", -1.0)}
    finally:
        recipe.world.close()


def test_without_the_setting_prompts_keep_the_chat_template(random_model_dir):
    recipe = helpers.make_recipe("azr", random_model_dir, "task=python", "params.execution_workers=1",
                                 f"params.unconfined_execution={str(sandbox_problem() is not None).lower()}")
    try:
        assert recipe.format("Q") == recipe.policy.format_prompt("Q")
        assert recipe.answer_text(completion("text without tags")) == "text without tags"
    finally:
        recipe.world.close()


def test_the_program_world_refuses_the_r1_zero_format():
    from coevolve.config import ConfigError
    from coevolve.recipes.azr import make_world

    cfg, params, _ = resolve("azr", preset="small", sets=["params.r1_zero_format=true"])
    with pytest.raises(ConfigError, match="params.r1_zero_format"):
        make_world(cfg, params)  # before any model loads


def test_prompts_over_the_token_limit_are_left_out(random_model_dir):
    """max_prompt_tokens (the code's prompt-length filters): a solver task whose prompt is too long leaves the batch,
    a proposer draws other references."""
    from coevolve.rollout.hf import encode_prompt
    from coevolve.tasks.triplets import Triplet

    short = Triplet("def f(a):\n    return a", ("1",), ("1",))
    long = Triplet("def f(a):\n    return a" + " + 0" * 200, ("1",), ("1",))
    recipe = helpers.make_recipe("azr", random_model_dir, "task=python", "params.execution_workers=1",
                                 "params.task_types=[deduction]", "params.references=1", "params.batch_size=2",
                                 f"params.unconfined_execution={str(sandbox_problem() is not None).lower()}")
    try:
        def tokens(task, solver=True):
            message = (recipe.world.solver_prompt("deduction", task, "chat") if solver
                       else recipe.world.proposer_prompt("deduction", [task], "chat"))
            return len(encode_prompt(recipe.policy.tokenizer, recipe.format(message)))

        assert recipe.solve_batch("deduction", [long, short], [long, short]) == [(long, True), (short, True)]
        recipe.params.max_prompt_tokens = tokens(short)
        assert tokens(long) > tokens(short)
        assert recipe.solve_batch("deduction", [long, short], [long, short]) == [(short, True), (short, False)]
        recipe.params.max_prompt_tokens = tokens(short, solver=False)
        recipe.buffers.add("deduction", [long, short], 0)
        rng = random.Random(0)
        assert all(recipe.references("deduction", rng) == [short] for _ in range(10))
    finally:
        recipe.world.close()


def test_the_r1_zero_format_refuses_the_constrained_formats():
    from coevolve.config import ConfigError

    with pytest.raises(ConfigError, match="r1_zero_format needs the <think>/<answer> tags"):
        resolve("azr", preset="reference_code", sets=["params.solver_format_constraint=true"])
