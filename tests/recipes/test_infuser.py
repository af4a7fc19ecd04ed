"""The infuser recipe: generator JSON parsing, rewards and DuGRPO by hand, phase order, Fix-gen, CLI + resume."""

from __future__ import annotations

import json

import helpers
import numpy as np
import pytest
from helpers import read_generations, records
from typer.testing import CliRunner

from coevolve.cli import app
from coevolve.formats import Generation
from coevolve.recipes import resolve
from coevolve.recipes.infuser import parse_generator_json
from coevolve.tasks.registry import Problem


def test_parse_generator_json():
    text = ('<think>{"question_text": "ignored", "ground_truth": "0"}</think> draft {"question_text": "", '
            '"ground_truth": ""} final ```json\n{"question_text": "What is $\\frac{1}{2}$ of 6?", "ground_truth": 3, '
            '"difficulty": "hard"}\n```')
    assert parse_generator_json(text) == ("What is $\\frac{1}{2}$ of 6?", "3")  # LaTeX escapes repaired, last wins
    assert parse_generator_json('{"question_text": "Q?", "ground_truth": "x"} {"question_text": "R?"}') == ("Q?", "x")
    assert parse_generator_json("no json here") is None
    assert parse_generator_json('{"question_text": "Q", "ground_truth": ""}') is None
    assert parse_generator_json('{"question_text": "Q", "ground_truth": [1]}') is None


def make_recipe(model_dir, *sets):
    recipe = helpers.make_recipe(
        "infuser", model_dir, "params.documents_per_step=3", "params.group_size=4", "params.dev_size=4",
        "rollout.max_new_tokens=6", "params.generator_max_tokens=6", "train.lr=1e-2", "roles.generator.lr=1e-2",
        "params.rho_inv=-0.5", *sets, preset="small")
    # The random model writes neither questions nor answers: read about two outputs in three as the question "a+b"
    # with key "1", and a solver answer as the parity of its characters' code sum, so groups have variance. (The
    # outputs run to the token budget, so their lengths barely vary: a length rule would read them all alike.)
    read_generations(recipe, lambda output, style, document: (Generation("a+b", "1") if sum(map(ord, output.text)) % 3
                                                              else Generation(None)))
    recipe.task.parse_answer = lambda text, style: str(sum(map(ord, text)) % 2)
    recipe.dev = [Problem("a+b", "1", "a=1,b=0,c=0"), Problem("a*b", "0", "a=1,b=0,c=0")]
    return recipe


def test_step_rewards_and_dugrpo(random_model_dir):
    recipe = make_recipe(random_model_dir)
    calls = []
    for role, trainer in recipe.trainers().items():
        update = trainer.update
        trainer.update = lambda samples, update=update, role=role: calls.append(role) or update(samples)
    out = recipe.step(1)
    assert calls == ["generator", "solver"]  # the generator is updated first, on the same rollouts
    gens = [r for r in records(out) if r["role"] == "generator"]
    assert len(gens) == 12 and "time/influence_s" in out.metrics and "time/dev_s" in out.metrics
    for g in gens:
        if not g["valid"]:
            assert g["reward"] == -0.5
        elif 0 < g["solve_rate"] < 1:
            assert g["reward"] == g["reward_terms"]["influence"] and -1 <= g["reward"] <= 1 and g["reward"] != 0
        else:
            assert g["reward"] == 0.0 and g["reward_terms"]["influence"] is None
    assert any(g["valid"] and 0 < g["solve_rate"] < 1 for g in gens) and not all(g["valid"] for g in gens)
    groups = [gens[i:i + 4] for i in range(0, 12, 4)]
    stds = [np.std([g["reward"] for g in grp], ddof=1) for grp in groups]
    sigma_b = np.mean([s for s in stds if s > 0])
    assert sigma_b > 0
    for grp, sd in zip(groups, stds):
        rewards = np.array([g["reward"] for g in grp])
        expected = (rewards - rewards.mean()) / (sd + sigma_b + 1e-6) if sd > 0 else np.zeros(4)
        assert [g["advantage"] for g in grp] == pytest.approx(list(expected))
        assert all(g["in_update"] == (sd > 0) for g in grp)
    sols = [r for r in records(out) if r["role"] == "solver"]
    by_q = {g["question_id"]: g for g in gens}
    assert all(s["trained"] == (0 < by_q[s["question_id"]]["solve_rate"] < 1) for s in sols)
    assert all(s["oracle"]["label_correct"] is not None for s in sols)  # analytics only


def test_sgd_cosine_and_grpo_ablations_change_the_scores(random_model_dir):
    base = make_recipe(random_model_dir).step(1)
    sgd = make_recipe(random_model_dir, "params.influence=sgd_cosine", "params.generator_advantage=grpo").step(1)
    a = [r["reward"] for r in records(base) if r["role"] == "generator"]
    b = [r["reward"] for r in records(sgd) if r["role"] == "generator"]
    assert [x == 0 for x in a] == [x == 0 for x in b] and a != b  # same questions, different influence


def test_frozen_generator_skips_phases_1_4_5(random_model_dir):
    recipe = make_recipe(random_model_dir, "frozen_generator=true")
    before = [p.detach().clone() for p in recipe.generator.model.parameters()]
    out = recipe.step(1)
    assert "time/dev_s" not in out.metrics and "time/influence_s" not in out.metrics
    assert "generator/loss" not in out.metrics and "solver/loss" in out.metrics
    assert all((a == b).all() for a, b in zip(before, recipe.generator.model.parameters()))


def test_cli_run_and_resume(tmp_path, random_model_dir):
    out = tmp_path / "run"
    base = ["run", "infuser", "--preset", "small", "--out", str(out), "--set", f"model={random_model_dir}",
            "--set", "eval_sets=[]", "--set", "params.documents_per_step=2", "--set", "params.group_size=2",
            "--set", "params.dev_size=2", "--set", "rollout.max_new_tokens=6",
            "--set", "params.generator_max_tokens=6"]
    runner = CliRunner()
    assert runner.invoke(app, base + ["--set", "steps=2"]).exit_code == 0
    assert runner.invoke(app, ["run", "infuser", "--resume", str(out), "--set", "steps=3"]).exit_code == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and all("influence/mean" in r for r in rows)
    samples = [json.loads(line) for line in (out / "samples" / "step_000003.jsonl").read_text().splitlines()]
    assert len([s for s in samples if s["role"] == "generator"]) == 4
    assert all(s["reward"] == 0.0 and not s["valid"] for s in samples)  # a random model writes nothing valid


def test_dev_set_mixes_levels_evenly():
    from coevolve.documents import dev_set
    from coevolve.tasks import arith

    dev = dev_set("arith", 10, levels=[1, 2, 4])
    assert [p.level for p in dev] == [1, 2, 4, 1, 2, 4, 1, 2, 4, 1]
    assert all(p.doc and arith.evaluate(p.question, p.doc) == int(p.answer) for p in dev)
    assert [p.question for p in dev if p.level == 2] == [p.question for p in arith.held_out(2, 3, grounded=True)]
    _, small, _ = resolve("infuser", preset="small")
    assert (small.dev_size, small.dev_rollouts, small.dev_levels) == (128, 8, [1, 2, 3, 4])
    config, _, _ = resolve("infuser", preset="small")
    assert config.rollout.max_new_tokens >= config.eval_max_new_tokens and small.generator_max_tokens >= 96


DOC = "a=1,b=0,c=0"
# The solver's canned answers per question: for "a+b" with key 1 the rewards are [1, 0, 1, 0], with key 0 [0, 1, 0, 1];
# "a*b" with key 2 trains other tokens ([1, 0, 1, 0] on "2" and "3").
ANSWERS = {"a+b": ["A:1", "A:0", "A:1", "A:0"], "a*b": ["A:2", "A:3", "A:2", "A:3"]}


def canned(model_dir, keys, *sets):
    """An infuser step on canned text: every document is DOC, the generator's outputs read as ``keys`` (question, key)
    in turn, and the solver answers each question with ANSWERS; the dev set is "a+b" = 1 twice."""
    from coevolve.rollout import Completion
    from coevolve.rollout.hf import encode_prompt

    recipe = make_recipe(model_dir, "params.documents_per_step=1", "params.dev_rollouts=4", *sets)
    del recipe.task.parse_answer  # the real reader of "A:<n>"
    recipe.dev = [Problem("a+b", "1", DOC)] * 2
    recipe.documents.take = lambda seed, start, n: [DOC] * n
    order = iter(keys)
    read_generations(recipe, lambda output, style, document: Generation(*next(order)))
    tokenizer = recipe.solver_policy.tokenizer

    def sample_groups(policy, prompts, group_size, seed, sampling=None):
        def completion(prompt, text):
            return Completion(prompt, encode_prompt(tokenizer, prompt), tokenizer(text, add_special_tokens=False)[
                "input_ids"], text, [-1.0] * len(text), "eos")
        if policy is recipe.generator:
            return [[completion(p, "Q:a+b") for _ in range(group_size)] for p in prompts]
        return [[completion(p, t) for t in ANSWERS[p.split("Q:")[1].removesuffix("=?\n")]] for p in prompts]

    recipe.sample_groups = sample_groups
    return recipe


def test_influence_sign_and_value_on_a_known_case(random_model_dir):
    """Under sgd_cosine a question whose prompt and rollouts are the dev set's has the dev gradient (influence +1);
    with the key flipped its advantages flip (-1); the two dev halves are the same question (half cosine 1)."""
    recipe = canned(random_model_dir, [("a+b", "1"), ("a+b", "0"), ("a*b", "2"), (None, None)],
                    "params.influence=sgd_cosine")
    out = recipe.step(1)
    gens = [r for r in records(out) if r["role"] == "generator"]
    assert [g["reward"] for g in gens[:2]] == pytest.approx([1.0, -1.0], abs=1e-5)
    assert [g["reward_terms"]["influence"] for g in gens[:2]] == pytest.approx([1.0, -1.0], abs=1e-5)
    assert -1 < gens[2]["reward"] < 1 and gens[3]["reward"] == -0.5  # another question; invalid: rho_inv
    assert out.metrics["dev/half_cosine"] == pytest.approx(1.0, abs=1e-5)


def test_validity_ranks_the_one_step_gains_like_the_scores(random_model_dir):
    """With the preconditioned score and a small first AdamW step (about lr * sign(g)), the question whose gradient is
    the dev gradient gains most dev reward, its flipped twin loses most, and one on other tokens lies between: Spearman
    1 on the fresh and on the same rollouts (the canned sampler gives both the same)."""
    recipe = canned(random_model_dir, [("a+b", "1"), ("a+b", "0"), ("a*b", "2"), (None, None)],
                    "params.validity_every=1", "train.lr=1e-4")
    m = recipe.step(1).metrics
    assert m["influence/validity_questions"] == m["questions/retained"] == 3
    assert m["influence/validity_spearman"] == pytest.approx(1.0)
    assert m["influence/validity_spearman_same_rollouts"] == pytest.approx(1.0)
    assert m["generator/optimizer_steps"] >= 1 and m["solver/optimizer_steps"] >= 1
