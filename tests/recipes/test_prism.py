"""The prism recipe: coverage reward by hand, persistent counts, SolverInit, pool clusters, resume, CLI."""

from __future__ import annotations

import json
import math

import helpers
import numpy as np
import pytest
import torch
from helpers import records
from test_r_zero import TINY, completion, question, stub_labels, stub_questions
from typer.testing import CliRunner

from coevolve.cli import app
from coevolve.embeddings import ClusterSpace
from coevolve.loop import run
from coevolve.recipes import resolve

E = math.exp(-1.0)


@pytest.fixture(scope="module")
def space_dir(tmp_path_factory):
    """Four hand-made clusters: the unit vectors of a 4-d space."""
    folder = tmp_path_factory.mktemp("space")
    ClusterSpace(np.eye(4, dtype=np.float32), seed=0, encoder="hand", corpus_sha256="x", n_corpus=4).save(folder)
    return folder


def fake_embed(texts):
    """Cluster = first digit mod 4 (one-hot)."""
    return np.eye(4, dtype=np.float32)[[int(t[0]) % 4 for t in texts]]


def make(model_dir, space_dir, *sets):
    recipe = helpers.make_recipe("prism", model_dir, *TINY, f"params.cluster_space={space_dir}", *sets)
    recipe.embed_texts = fake_embed
    return recipe, recipe.config


def test_rewards_and_counts_by_hand(random_model_dir, space_dir):
    recipe, _ = make(random_model_dir, space_dir, "params.gamma=0.5")
    qs = [question("0+1", 0.75), question("0+2", 0.5), question("1+1", 1.0), question("2+2", 0.25),
          question(None, None)]
    recipe.questioner_rewards(qs)
    # first batch: every n_k = 1, so d = e^-1; p = 1.0 is assigned (p >= 0.5) but gated to 0; p = 0.25 unassigned
    assert [q.cluster for q in qs] == [0, 0, 1, None, None]
    assert [q.reward for q in qs] == pytest.approx([1.0 * (1 + 5 * E), 0.375 * (1 + 5 * E), 0.0, 0.0, -1.0])
    assert recipe.coverage.counts.tolist() == pytest.approx([1.5, 1.0, 0.5, 0.5])  # 0.5 n + 0.5 m
    again = [question("0+3", 0.75), question("3+1", 0.75)]
    recipe.questioner_rewards(again)  # n_bar = 0.875: d_0 = exp(-1.5/0.875), d_3 = exp(-0.5/0.875)
    assert [q.terms["rarity"] for q in again] == pytest.approx([math.exp(-1.5 / 0.875), math.exp(-0.5 / 0.875)])
    assert again[0].reward < again[1].reward


def test_ablation_switches(random_model_dir, space_dir):
    flat, _ = make(random_model_dir, space_dir, "params.zpd_gate=false", "params.lam=0")
    qs = [question("0+1", 0.5), question("1+1", 0.95)]
    flat.questioner_rewards(qs)
    assert [q.reward for q in qs] == pytest.approx([1.0, 0.0])  # band indicator, no rarity bonus
    band_only, _ = make(random_model_dir, space_dir, "params.count_scope=in_band")
    band_only.questioner_rewards([question("0+1", 1.0), question("1+1", 0.6)])
    assert band_only.coverage.counts.tolist() == pytest.approx([0.99, 1.0, 0.99, 0.99])
    _, params, _ = resolve("prism", preset="small")
    assert params.gamma == 0.95 and params.questioner_init == "solver" and params.band == [0.5, 0.9]
    _, paper, _ = resolve("prism", preset="paper")
    assert paper.k == 128 and paper.lam == 5.0 and paper.gamma == 0.99
    assert paper.reference_corpus == "math_minus_math500"


def test_solver_init_at_each_iteration_and_counts_carry_over(random_model_dir, space_dir):
    recipe, _ = make(random_model_dir, space_dir, "train.lr=1e-2", "params.pool_size=4")
    stub_questions(recipe, ["0+1", "0+2", "1+1", "0+3"])  # per step: 3 questions in cluster 0, 1 in cluster 1
    stub_labels(recipe, [["1", "1", "1", "2"]] * 100)  # p = 0.75 everywhere (questioner scoring and pool)
    for step in range(1, 5):  # iteration 1: 2 questioner steps, then the pool and 2 solver steps
        recipe.step(step)
    n0, n1 = 0.99 * (0.99 + 0.03) + 0.03, 1.0
    assert recipe.coverage.counts.tolist() == pytest.approx([n0, n1, 0.99 ** 2, 0.99 ** 2])
    assert recipe.questioner_trainer.optimizer.state
    solver_weights = [t.clone() for t in recipe.solver_policy.model.parameters()]
    assert not all(torch.equal(a, b) for a, b in zip(recipe.questioner.model.parameters(), solver_weights))
    recipe.questioner_trainer.update = lambda samples: {}  # keep step 5's questioner at its initial weights
    recipe.step(5)  # iteration 2, questioner step 0: Q_2 <- S_1, counts carried over (not reset to alpha)
    assert all(torch.equal(a, b) for a, b in zip(recipe.questioner.model.parameters(), solver_weights))
    assert not recipe.questioner_trainer.optimizer.state
    assert recipe.coverage.counts[0] == pytest.approx(0.99 * n0 + 0.03) and recipe.coverage.updates == 3


def test_pool_rows_carry_clusters(random_model_dir, space_dir):
    recipe, _ = make(random_model_dir, space_dir, "params.pool_size=4")
    stub_questions(recipe, ["0+1", "1+2", "2+3", "3+1"])
    stub_labels(recipe, [["1", "1"], ["1", "2"], ["1", "1"], ["1", "2"]])
    out = recipe.step(3)
    rows = [r for r in records(out) if r["phase"] == "pool"]
    assert [r["cluster"] for r in rows] == [0, 1, 2, 3] and [r["in_pool"] for r in rows] == [False, True, False, True]
    assert out.metrics["coverage/generated_active"] == 4 and out.metrics["coverage/pool_active"] == 2
    assert recipe.coverage.updates == 0  # the pool never touches the counts


def test_the_pool_band_of_its_own_decides_the_pool(random_model_dir, space_dir):
    """``params.pool_band`` [0.25, 0.5] with the reward band [0.5, 0.9]: of p = 1, 0.75, 0.5, 0.25 (4 labels each)
    the pool keeps 0.5 and 0.25; the reward band would keep 0.75 and 0.5."""
    for sets, kept in (((), [False, True, True, False]),
                       (("params.pool_band=[0.25,0.5]",), [False, False, True, True])):
        recipe, _ = make(random_model_dir, space_dir, "params.pool_size=4", *sets)
        stub_questions(recipe, ["0+1", "1+2", "2+3", "3+1"])
        stub_labels(recipe, [["1"] * 4, ["1", "1", "1", "2"], ["1", "1", "2", "3"], ["1", "2", "3", "4"]])
        out = recipe.step(3)  # the first solver step builds the pool
        rows = [r for r in records(out) if r["phase"] == "pool"]
        assert [r["in_pool"] for r in rows] == kept, sets
        texts = ["0+1", "1+2", "2+3", "3+1"]
        assert sorted(i.question for i in recipe.pool) == [t for t, k in zip(texts, kept) if k]
        assert sorted(i.p for i in recipe.pool) == sorted(p for p, k in zip([1.0, 0.75, 0.5, 0.25], kept) if k)
        assert out.metrics["coverage/pool_active"] == 2 and out.metrics["pool/size"] == 2


def test_resume_restores_counts(tmp_path, random_model_dir, space_dir):
    def recipe_for(steps):
        recipe, config = make(random_model_dir, space_dir, f"steps={steps}", "train.lr=1e-2")
        stub_questions(recipe, ["0+1", "1+2", "2+3"])
        return recipe, config

    straight, config = recipe_for(6)
    run(straight, config, tmp_path / "straight", progress=False)
    first, config = recipe_for(5)
    run(first, config, tmp_path / "resumed", progress=False)
    second, config = recipe_for(6)
    run(second, config, tmp_path / "resumed", resume=True, progress=False)
    assert second.coverage.counts.tolist() == straight.coverage.counts.tolist()
    assert second.coverage.updates == straight.coverage.updates
    a, b = ([json.loads(line) for line in (root / "samples" / "step_000006.jsonl").read_text().splitlines()]
            for root in (tmp_path / "straight", tmp_path / "resumed"))
    assert [(r["completion"], r["reward"]) for r in a] == [(r["completion"], r["reward"]) for r in b]


def test_cli_run_and_resume(tmp_path, random_model_dir, space_dir):
    out = tmp_path / "run"
    sets = [x for s in [f"model={random_model_dir}", "steps=2", *TINY, f"params.cluster_space={space_dir}"]
            for x in ("--set", s)]
    result = CliRunner().invoke(app, ["run", "prism", *sets, "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["run", "--resume", str(out), "--set", "steps=3", "--quiet"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["phase"]) for r in rows] == [(1, "questioner"), (2, "questioner"), (3, "solver")]
    assert rows[0]["generator/reward_mean"] == -1.0  # the random model never writes a valid question
    state = json.loads(next((out / "checkpoints").glob("step_000003")).joinpath("state.json").read_text())
    assert state["recipe"]["loop_recipe"]["coverage"]["counts"] == [1.0] * 4


def test_the_released_loop_keeps_the_questioner_and_restarts_the_counts(random_model_dir, space_dir):
    """``reference_code``: Q_2 <- Q_1 (the released loop passes the previous questioner's checkpoint) and n <- alpha
    at iteration 2 (each questioner job builds its counts afresh); the paper's reading is the test above."""
    recipe, _ = make(random_model_dir, space_dir, "train.lr=1e-2", "params.pool_size=4",
                     "params.questioner_init=previous_questioner", "params.count_reset=iteration")
    stub_questions(recipe, ["0+1", "0+2", "1+1", "0+3"])  # per step: 3 questions in cluster 0, 1 in cluster 1
    stub_labels(recipe, [["1", "1", "1", "2"]] * 100)  # p = 0.75 everywhere
    for step in range(1, 5):
        recipe.step(step)
    assert recipe.coverage.updates == 2
    questioner = [t.clone() for t in recipe.questioner.model.parameters()]
    recipe.questioner_trainer.update = lambda samples: {}  # keep step 5's questioner at its starting weights
    recipe.step(5)
    assert all(torch.equal(a, b) for a, b in zip(recipe.questioner.model.parameters(), questioner))
    # one update from alpha = 1: n_0 = 0.99 + 3 x 0.01, n_1 = 0.99 + 0.01, the others decayed once
    assert recipe.coverage.counts.tolist() == pytest.approx([1.02, 1.0, 0.99, 0.99]) and recipe.coverage.updates == 1
    _, code, _ = resolve("prism", preset="reference_code")
    assert (code.questioner_init, code.count_reset) == ("previous_questioner", "iteration")
    for preset in ("paper", "small"):
        _, params, _ = resolve("prism", preset=preset)
        assert (params.questioner_init, params.count_reset) == ("solver", "never")


def test_unboxed_votes_make_the_example_question_rewarded_only_with_the_code_switch(random_model_dir, space_dir):
    """Issue 35's example (6 unboxed, 2 x "5", 2 x "7" of 10): code, p = 0.6 sits in the ZPD band, zpd = 0.625 and
    the first batch's rarity e^-1 give 0.625 (1 + 5/e); drop, p = 0.2: reward 0 and no count."""
    unboxed = ["5", None, "7", None, None, "5", None, "7", None, None]
    for votes, reward, counted in (("code", 0.625 * (1 + 5 * E), 1), ("drop", 0.0, 0)):
        recipe, _ = make(random_model_dir, space_dir, f"params.missing_answer_votes={votes}")
        recipe.solve_groups = lambda policy, prompts, n, seed, params=None, tools=True: [
            ([completion()] * n, list(unboxed)) for _ in prompts]
        q = question("0+1", None)
        recipe.label([q], 10, 0, "all")
        recipe.questioner_rewards([q])
        assert q.reward == pytest.approx(reward) and recipe.coverage.updates == counted, votes
