"""The pasodoble recipe: hand-computed rewards, leak check, history semantics, buffer, offline schedule, CLI and
resume."""

from __future__ import annotations

import json

import helpers
import pytest
from helpers import read_generations, records
from typer.testing import CliRunner

from coevolve.cli import app
from coevolve.formats import Generation
from coevolve.recipes.pasodoble import Buffered
from coevolve.rewards.pasodoble import JaccardHistory, history_diversity, jaccard, leaks_answer, proposer_reward


def test_jaccard_and_history_diversity():
    assert jaccard({1, 2, 3}, {2, 3, 4}) == 0.5 and jaccard(set(), set()) == 1.0 and jaccard({1}, set()) == 0.0
    history = [frozenset({1, 2}), frozenset({1, 2, 3}), frozenset({9})]
    assert history_diversity(frozenset({1, 2}), history, 0.5) == pytest.approx(1 / 3)  # sims 1, 2/3, 0
    assert history_diversity(frozenset({1, 2}), history, 2 / 3) == pytest.approx(2 / 3)  # strict >: 2/3 is not similar
    assert history_diversity(frozenset({1}), [], 0.3) == 1.0
    h = JaccardHistory(2)
    h.push([frozenset({1}), frozenset({2}), frozenset({3})])
    assert h.state_dict() == [[2], [3]]  # FIFO of the last |H|


def test_proposer_reward_table():  # spec §4.5 with J = 6
    assert proposer_reward(2 / 6, 1.0) == pytest.approx(1.1 - 2 / 6 + 0.2)
    assert proposer_reward(5 / 6, 0.5) == pytest.approx(1.1 - 5 / 6 + 0.1)
    assert proposer_reward(1.0, 0.3) == pytest.approx(0.16)  # paper gate r_div >= tau_div
    assert proposer_reward(1.0, 0.3, gate="gt") == 0.0  # code gate r_div > tau_div
    assert proposer_reward(1 / 6, 1.0) == 0.0 and proposer_reward(0.2, 1.0) == 0.0  # p must exceed tau_low
    assert proposer_reward(0.5, 0.29) == 0.0
    assert proposer_reward(0.5, 0.0, w=0.0, tau_div=0.0) == pytest.approx(0.6)  # no-diversity ablation


def test_leak_check():
    assert leaks_answer("P_2 + x", "2", "raw") and not leaks_answer("P_2 + x", "2", "word")
    assert leaks_answer("a*12+b", "2", "raw") and not leaks_answer("a*12+b", "2", "word")
    assert leaks_answer("what is 2 + 2?", "2", "word")
    assert leaks_answer("x", "x = 5", "word")  # the question inside the answer
    assert leaks_answer("compute \\boxed{3}", "3", "word")
    assert leaks_answer(None, "3", "raw") and leaks_answer("q", None, "word") and leaks_answer("", "1", "off")
    assert not leaks_answer("a+b", "17", "raw") and not leaks_answer("2+2", "2", "off")


def make_recipe(model_dir, *sets):
    return helpers.make_recipe("pasodoble", model_dir, "params.passages_per_step=2", "params.proposals=3",
                               "params.solutions=4", "rollout.max_new_tokens=8", "params.proposer_max_tokens=8",
                               "train.lr=1e-2", *sets, preset="small")


def posing(question: str):
    """A stand-in reader: the random model never writes a question, so every completion poses ``question``."""
    return lambda output, style, document: Generation(question, "7")


def test_history_semantics(random_model_dir):
    recipe = make_recipe(random_model_dir, "params.solver_reward=random_full", "params.tau_sim=0.5")
    read_generations(recipe, posing("a+b"))
    xs = recipe.propose_and_score(1, _timer())
    assert [x.r_div for x in xs[:3]] == [1.0, 0.0, 0.0]  # paper: each q_i enters H after it is scored
    assert len(recipe.history) == 6
    snap = make_recipe(random_model_dir, "params.solver_reward=random_full", "params.tau_sim=0.5",
                       "params.history_update=snapshot", "params.tau_low=0")
    read_generations(snap, posing("a+b"))
    xs = snap.propose_and_score(1, _timer())
    assert any(x.p > 0 for x in xs) and all(x.r_div == 1.0 for x in xs) and len(snap.history) == 6


def _timer():
    from coevolve.recipes.base import PhaseTimer

    return PhaseTimer()


def test_a_question_that_states_its_answer_gets_pass_rate_zero(random_model_dir):
    """The recipe applies the leak check (word form): "7*a" states its answer 7, "17*a" does not."""
    recipe = make_recipe(random_model_dir, "params.solver_reward=random_full", "params.tau_low=0")
    for question, leaks in (("7*a", True), ("17*a", False)):
        read_generations(recipe, posing(question))
        xs = recipe.propose_and_score(1, _timer())
        assert all(x.leak == leaks for x in xs) and any(x.p_raw > 0 for x in xs)
        assert [x.p for x in xs] == [0.0 if leaks else x.p_raw for x in xs]
        assert [x.reward for x in xs] == pytest.approx(
            [1.1 - x.p + 0.2 * x.r_div if x.p > 0 and x.r_div >= 0.3 else 0.0 for x in xs])


def test_online_step_trains_only_retained_questions(random_model_dir):
    recipe = make_recipe(random_model_dir, "params.solver_reward=random_full", "params.tau_low=0")
    read_generations(recipe, posing("a+b"))
    out = recipe.step(1)
    gens = [r for r in records(out) if r["role"] == "generator"]
    sols = [r for r in records(out) if r["role"] == "solver"]
    assert len(gens) == 6 and len(sols) == 6 * 4
    for g in gens:
        assert g["label_source"] == "generator" and g["answer"] == "7" and g["oracle"]["label_correct"] is not None
        p = g["solve_rate"]
        expected = 1.1 - p + 0.2 * g["reward_terms"]["r_div"] if 0 < p and g["reward_terms"]["r_div"] >= 0.3 else 0.0
        assert g["reward"] == pytest.approx(expected)
        trained = {s["trained"] for s in sols if s["question_id"] == g["question_id"]}
        assert trained == {g["retained"] and not out.metrics["skipped"]}
        assert g["retained"] == (0 < p < 1)
    assert sum(s["trained"] for s in sols) > 0 and "solver/loss" in out.metrics and "proposer/loss" in out.metrics


def test_frozen_proposer_is_not_updated(random_model_dir):
    recipe = make_recipe(random_model_dir, "params.solver_reward=random_full", "params.tau_low=0",
                         "frozen_generator=true")
    read_generations(recipe, posing("a+b"))
    before = [p.detach().clone() for p in recipe.proposer.model.parameters()]
    out = recipe.step(1)
    assert "solver/loss" in out.metrics and "proposer/loss" not in out.metrics
    assert all((a == b).all() for a, b in zip(before, recipe.proposer.model.parameters()))


def test_offline_schedule_buffer_and_eviction(random_model_dir):
    recipe = make_recipe(random_model_dir, "params.mode=offline", "params.solver_reward=random_full",
                         "params.tau_low=0", "params.proposer_steps=1", "params.solver_steps=2",
                         "params.replay_batch=4")
    read_generations(recipe, posing("a+b"))
    for step in range(1, 4):
        out = recipe.step(step)
        if out.metrics["phase_proposer"] and not out.metrics["skipped"]:
            break
    assert recipe.phase == "solver" and len(recipe.buffer) >= 1
    assert all(0 < b.prev_acc < 1 for b in recipe.buffer)
    size = len(recipe.buffer)
    out = recipe.step(10)
    assert out.metrics["phase_proposer"] == 0.0 and all(r["phase"] == "replay" for r in records(out))
    assert len(records(out)) == min(4, size) * 4 and recipe.pointer == min(4, size) % size
    # eviction: p = 1 goes at once; no 0.01 improvement for c = 3 replays goes too; the pointer follows
    recipe.buffer = [Buffered("q0", "1", None, prev_acc=0.5), Buffered("q1", "1", None, prev_acc=0.5, stale=2),
                     Buffered("q2", "1", None, prev_acc=0.2), Buffered("q3", "1", None)]
    recipe.pointer = 3
    recipe.evict(recipe.buffer[:3], [1.0, 0.505, 0.5])
    assert [b.question for b in recipe.buffer] == ["q2", "q3"] and recipe.buffer[0].prev_acc == 0.5
    assert recipe.pointer == 1  # still at q3


def test_cli_run_and_resume(tmp_path, random_model_dir):
    out = tmp_path / "run"
    base = ["run", "pasodoble", "--preset", "small", "--out", str(out), "--set", f"model={random_model_dir}",
            "--set", "eval_sets=[]", "--set", "params.proposals=2", "--set", "params.solutions=2",
            "--set", "params.passages_per_step=1", "--set", "rollout.max_new_tokens=6",
            "--set", "params.proposer_max_tokens=6"]
    runner = CliRunner()
    assert runner.invoke(app, base + ["--set", "steps=1"]).exit_code == 0
    assert runner.invoke(app, ["run", "pasodoble", "--resume", str(out), "--set", "steps=2"]).exit_code == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all("generator/reward_mean" in r for r in rows)
    samples = [json.loads(line) for line in (out / "samples" / "step_000002.jsonl").read_text().splitlines()]
    assert {s["role"] for s in samples} == {"generator"}  # a random model poses no question: nothing to solve


def test_sequential_history_takes_every_proposal(random_model_dir):
    recipe = make_recipe(random_model_dir, "params.solver_reward=random_full", "params.tau_sim=0.5")
    texts = iter(["a+b", None, "a+b", None, "c*d", "c*d"])
    read_generations(recipe, lambda output, style, document: (lambda q: Generation(q, "7" if q else None))(next(texts)))
    xs = recipe.propose_and_score(1, _timer())
    # H after each push: {ab}, {ab, ∅}, ...: r_div = share of H not Jaccard-similar (> 0.5); two empty sets are similar
    assert [x.r_div for x in xs[:3]] == pytest.approx([1.0, 1.0, 0.5])
    assert len(recipe.history) == 6 and recipe.history.items[1] == frozenset()


def test_max_updates_counts_updates_not_iterations(random_model_dir):
    recipe = make_recipe(random_model_dir, "params.solver_reward=random_full", "params.tau_low=0",
                         "params.max_updates=1", "roles.solver.mini_batch_size=5", "roles.solver.epochs=2")
    read_generations(recipe, posing(None))  # nothing posed: the iteration is skipped and does not count
    out = recipe.step(1)
    assert out.metrics["skipped"] == 1.0 and out.metrics["updates"] == 0.0
    assert (out.metrics.get("proposer/optimizer_steps", 0), out.metrics.get("solver/optimizer_steps", 0)) == (0, 0)
    read_generations(recipe, posing("a+b"))
    for step in range(2, 12):  # random rewards: some iteration retains a question and updates
        out = recipe.step(step)
        if not out.metrics["skipped"]:
            break
    assert out.metrics["updates"] == 1.0 and out.metrics["proposer/optimizer_steps"] == 1  # 6 proposals, one step
    trained = sum(s["trained"] for s in records(out) if s["role"] == "solver")
    assert out.metrics["solver/optimizer_steps"] == -(-trained // 5) * 2  # 4 answers per question, 5 per step, 2 epochs
    proposals = [g for g in records(out) if g["role"] == "generator"]
    assert out.metrics["generator/advantage_abs_mean"] == pytest.approx(
        sum(abs(g["advantage"]) for g in proposals) / len(proposals))
    done = recipe.step(step + 1)  # max_updates reached: nothing is sampled or trained
    assert done.metrics["done"] == 1.0 and done.metrics["updates"] == 1.0 and not records(done)
    assert recipe.state_dict()["updates"] == 1
