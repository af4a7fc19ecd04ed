"""TTRL: the seeded majority vote and its reward on worked examples, the training subset, the recipe's step on canned
samples (ground truth never a reward), two real steps that move the policy, and a run killed mid-step that resumes as
the uninterrupted run trained (the vote history included)."""

from __future__ import annotations

import json
import math
import signal

import helpers
import pytest
import torch
from helpers import records
from run_checks import assert_same_training, run_killed, train_rows
from typer.testing import CliRunner

from coevolve.analytics.collapse import collapse_step, vote_summary
from coevolve.analytics.curriculum import load_run
from coevolve.cli import app
from coevolve.config import ConfigError
from coevolve.recipes import resolve
from coevolve.recipes.ttrl import training_subset
from coevolve.rewards.majority import agreement_rewards, seeded_vote, vote_margin
from coevolve.rollout import Completion
from coevolve.rollout.hf import encode_prompt
from coevolve.tasks import arith
from coevolve.tasks.registry import TaskDataError


# --- the vote and the reward ----------------------------------------------------------------------
def test_unparseable_answers_never_form_the_majority():
    vote = seeded_vote(["3", None, None, "3", "5", None, None], seed=0)
    assert (vote.label, vote.support, vote.n, vote.n_valid) == ("3", 2, 7, 3)
    assert agreement_rewards(vote, range(7)) == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert vote.p == pytest.approx(2 / 7) and vote_margin(vote) == pytest.approx(1 / 7)


def test_no_parseable_answer_gives_no_label_and_no_reward():
    vote = seeded_vote([None, "", None], seed=0)
    assert vote.label is None and agreement_rewards(vote, [0, 1, 2]) == [0.0, 0.0, 0.0] and vote_margin(vote) == 0.0


def test_a_majority_of_wrong_answers_is_rewarded_and_the_right_minority_is_not():
    answers = ["41", "41", "42", "41", "42"]  # the truth is 42
    vote = seeded_vote(answers, seed=0)
    assert vote.label == "41" and agreement_rewards(vote, range(5)) == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert vote_margin(vote) == pytest.approx(1 / 5)


def test_ties_are_broken_by_the_seed_and_only_among_the_largest_classes():
    answers = ["7", "4", "4", "9", "7", None, None, None]  # 7 and 4 tie at 2; the three unparseable ones do not count
    labels = {seed: seeded_vote(answers, seed).label for seed in range(40)}
    assert set(labels.values()) == {"7", "4"}  # either can win, never "9" or None
    assert all(seeded_vote(answers, seed).label == label for seed, label in labels.items())  # same seed, same label
    for seed in (0, 1, 2):
        vote = seeded_vote(answers, seed)
        assert agreement_rewards(vote, range(8)) == [float(a == vote.label) for a in answers]
        assert vote.support == 2 and vote_margin(vote) == 0.0


def test_equivalent_answers_vote_together():
    vote = seeded_vote(["1/2", "0.5", "3"], seed=0, equivalent=lambda a, b: {a, b} == {"1/2", "0.5"})
    assert vote.label == "1/2" and vote.support == 2 and vote.agree == [True, True, False]


def test_training_subset():
    assert training_subset(8, 3, "first", seed=5) == [0, 1, 2]
    drawn = training_subset(64, 32, "random", seed=5)
    assert drawn == sorted(set(drawn)) and len(drawn) == 32 and all(0 <= i < 64 for i in drawn)
    assert drawn == training_subset(64, 32, "random", seed=5) and drawn != training_subset(64, 32, "random", seed=6)
    assert training_subset(4, 4, "random", seed=1) == [0, 1, 2, 3]


def test_params_need_the_subset_inside_the_vote():
    with pytest.raises(Exception, match="train_samples"):
        resolve("ttrl", sets=["params.vote_samples=4", "params.train_samples=8"])


# --- one step on canned samples -------------------------------------------------------------------
def _canned(tokenizer, texts_of):
    def sample_groups(policy, prompts, group_size, seed, sampling=None):
        groups = []
        for g, prompt in enumerate(prompts):
            right = arith.evaluate(prompt.removeprefix("Q:").removesuffix("=?\n"))
            texts = texts_of(g, right)
            assert len(texts) == group_size
            groups.append([Completion(prompt, encode_prompt(tokenizer, prompt),
                                      tokenizer(t, add_special_tokens=False)["input_ids"], t, [-1.0] * len(t), "eos")
                           for t in texts])
        return groups
    return sample_groups


def _texts(g, right):
    """Question 0: a majority of wrong answers; 1: mostly unparseable, the right answer the largest class; 2: a
    tie between the right and a wrong answer."""
    wrong = f"A:{right + 1}"
    return [[wrong, wrong, wrong, f"A:{right}", f"A:{right}", "S:?"],
            ["S:?", "S:?", "S:?", f"A:{right}", f"A:{right}", wrong],
            [f"A:{right}", wrong, f"A:{right}", wrong, "S:?", "S:?"]][g]


def _recipe(model_dir, *extra):
    return helpers.make_recipe("ttrl", model_dir, "params.pool_size=3", "params.questions_per_step=3",
                               "params.vote_samples=6", "params.train_samples=4", *extra)


def test_the_papers_cosine_schedule_runs_over_the_whole_run(random_model_dir):
    """The paper and code presets schedule the lr (cosine over all steps; the code warms up over 3%), which a recipe
    without phases refuses."""
    for preset, warmup in (("paper", 0.0), ("reference_code", 0.03)):
        config, params, cls = resolve("ttrl", preset=preset, sets=[f"model={random_model_dir}", "task=arith",
                                                                   "params.pool_source=train", "eval_sets=[]"])
        trainer = cls(config, params).trainer
        assert (trainer.settings.lr_schedule, trainer.settings.lr_warmup_ratio) == ("cosine", warmup)
        half, warm = config.steps // 2, int(warmup * config.steps)
        trainer.phase_step(half, config.steps)  # half way: about half the peak of 5e-7
        factor = 0.5 * (1 + math.cos(math.pi * (half - warm) / (config.steps - warm)))
        assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(5e-7 * factor) and 0.5 <= factor < 0.53
    with pytest.raises(ConfigError, match="grpo has no phases; only recipes with phases .*ttrl"):
        resolve("grpo", sets=[f"model={random_model_dir}", "train.lr_schedule=cosine"])


def test_step_rewards_agreement_with_the_majority_never_the_ground_truth(random_model_dir):
    recipe = _recipe(random_model_dir)
    recipe.sample_groups = _canned(recipe.policy.tokenizer, _texts)
    recipe.batch = lambda step: [0, 1, 2]  # pool order fixed for the worked example
    out = recipe.step(1)
    rows = records(out)
    assert len(rows) == 3 * 6 and [r["trained"] for r in rows[:6]] == [True] * 4 + [False] * 2
    truth = [str(arith.evaluate(recipe.pool[i].question, recipe.pool[i].doc)) for i in range(3)]
    assert [recipe.pool[i].answer for i in range(3)] == truth
    q0, q1, q2 = rows[:6], rows[6:12], rows[12:]
    assert q0[0]["label"] != truth[0] and [r["reward"] for r in q0[:4]] == [1.0, 1.0, 1.0, 0.0]  # the wrong majority
    assert q1[0]["label"] == truth[1] and [r["reward"] for r in q1[:4]] == [0.0, 0.0, 0.0, 1.0]  # None never wins
    tie_label = q2[0]["label"]
    assert tie_label in {truth[2], str(int(truth[2]) + 1)}
    assert [r["reward"] for r in q2[:4]] == [float(r["answer"] == tie_label) for r in q2[:4]]
    assert all(r["label_source"] == "majority" and r["oracle"]["label_correct"] == (r["label"] == truth[i // 6])
               for i, r in enumerate(rows))
    m = out.metrics
    assert m["ttrl/label_accuracy"] == pytest.approx((0 + 1 + (tie_label == truth[2])) / 3)
    assert m["ttrl/label_error_rate"] == pytest.approx(1 - m["ttrl/label_accuracy"])
    assert m["ttrl/majority_ratio"] == pytest.approx((3 + 2 + 2) / 18)
    assert m["ttrl/vote_margin"] == pytest.approx((1 / 6 + 1 / 6 + 0) / 3)
    assert m["reward/correct"] == pytest.approx((1 + 1 + 2) / 12)  # the right answers among the 12 trained samples
    assert m["solver/optimizer_steps"] == 1 and m["ttrl/seen_before_rate"] == 0.0
    # the same questions again, now with the right answer the clear majority of question 0: its label changes
    recipe.sample_groups = _canned(recipe.policy.tokenizer,
                                   lambda g, right: [f"A:{right}"] * 4 + ["S:?"] * 2 if g == 0 else _texts(g, right))
    again = recipe.step(2)
    tie_changed = records(again)[12]["label"] != tie_label  # a tie is drawn again with step 2's seed
    assert records(again)[0]["label"] == truth[0] and records(again)[6]["label"] == truth[1]
    assert again.metrics["ttrl/seen_before_rate"] == 1.0
    assert again.metrics["ttrl/majority_changed_rate"] == pytest.approx((1 + tie_changed) / 3)


def test_ground_truth_arm_rewards_the_hidden_answer(random_model_dir):
    recipe = _recipe(random_model_dir, "params.label_source=ground_truth")
    recipe.sample_groups = _canned(recipe.policy.tokenizer, _texts)
    recipe.batch = lambda step: [0, 1, 2]
    rows = records(recipe.step(1))
    assert [r["reward"] for r in rows[:4]] == [0.0, 0.0, 0.0, 1.0]
    assert all(r["label_source"] == "ground_truth" for r in rows)


def test_pool_is_fixed_by_the_seed_and_passes_cover_it(random_model_dir):
    recipe = _recipe(random_model_dir, "params.pool_size=5", "params.questions_per_step=2")
    assert [q.question for q in recipe.pool] == [q.question for q in _recipe(random_model_dir, "params.pool_size=5")
                                                 .pool]
    assert all(arith.level_of(q.question, q.doc) == 2 for q in recipe.pool)
    first_pass = recipe.batch(1) + recipe.batch(2) + recipe.batch(3)[:1]
    assert sorted(first_pass) == list(range(5))


# --- real steps on the test model ------------------------------------------------------------------
def test_two_steps_update_the_policy(small_tiny_arith):
    recipe = _recipe(small_tiny_arith[1], "params.vote_samples=8", "params.train_samples=4",
                     "rollout.max_new_tokens=32", "train.lr=1e-3")
    before = {k: v.detach().clone() for k, v in recipe.policy.model.named_parameters()}
    metrics = [recipe.step(step).metrics for step in (1, 2)]
    assert all(m["solver/optimizer_steps"] == 1 and m["solver/grad_norm"] > 0 for m in metrics)
    moved = sum(float((p.detach() - before[k]).abs().sum()) for k, p in recipe.policy.model.named_parameters())
    assert moved > 0 and torch.isfinite(torch.tensor(moved))


TTRL_RUN = ["run", "ttrl", "--quiet", "--set", "steps=3", "--set", "params.pool_size=3", "--set",
            "params.questions_per_step=2", "--set", "params.vote_samples=8", "--set", "params.train_samples=4",
            "--set", "rollout.max_new_tokens=32", "--set", "train.lr=1e-3", "--set", "eval_sets=[arith_l1]",
            "--set", "eval_limit=8", "--set", "eval_every=0"]
@pytest.fixture(scope="module")
def ttrl_run(tmp_path_factory, small_tiny_arith):
    """The uninterrupted run of TTRL_RUN on the test model."""
    whole = tmp_path_factory.mktemp("ttrl") / "whole"
    done = CliRunner().invoke(app, [*TTRL_RUN, "--set", f"model={small_tiny_arith[1]}", "--out", str(whole)])
    assert done.exit_code == 0, done.output
    return whole


def test_killed_mid_step_resumes_as_the_uninterrupted_run(tmp_path, small_tiny_arith, ttrl_run):
    model, whole = small_tiny_arith[1], ttrl_run
    killed = tmp_path / "killed"
    proc = run_killed("after_samples", [*TTRL_RUN, "--set", f"model={model}", "--out", str(killed)])
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    resumed = CliRunner().invoke(app, ["run", "--resume", str(killed), "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert [r["step"] for r in train_rows(killed)] == [1, 2, 3]
    assert_same_training(whole, killed, model, ("solver/loss", "solver/grad_norm"))
    # steps 2 and 3 revisit pool questions: the restored vote history gives the same change rates
    for key in ("ttrl/seen_before_rate", "ttrl/majority_changed_rate", "ttrl/label_accuracy"):
        assert [r.get(key) for r in train_rows(killed)] == [r.get(key) for r in train_rows(whole)], key


# --- the collapse step and the reports -------------------------------------------------------------
def test_collapse_step_needs_k_falls_while_the_reward_rises():
    steps = [0, 10, 20, 30, 40, 50, 60]
    accuracy = [0.2, 0.5, 0.6, 0.5, 0.4, 0.3, 0.35]  # rises to step 20, then falls three times
    rising = (list(range(1, 61)), [s / 60 for s in range(1, 61)])
    assert collapse_step(steps, accuracy, *rising, k=3) == 20
    assert collapse_step(steps, accuracy, *rising, k=4) is None  # only three falls in a row
    falling = (list(range(1, 61)), [1 - s / 60 for s in range(1, 61)])
    assert collapse_step(steps, accuracy, *falling, k=3) is None  # the reward fell too: not the URLVR collapse
    assert collapse_step([0, 10, 20, 30, 40], [0.6, 0.5, 0.4, 0.3, 0.2], *rising, k=3) == 10  # never from step 0


def test_report_and_compare_show_the_vote(tmp_path, ttrl_run):
    from coevolve.analytics.compare import compare_runs
    from coevolve.analytics.report import write_report

    page = write_report(ttrl_run, embed=False).read_text()
    assert "Majority vote (TTRL)" in page and "label_accuracy_first" in page and "collapse_step_k3" in page
    assert (ttrl_run / "report" / "vote.png").exists()
    rows, _ = compare_runs([ttrl_run], tmp_path / "cmp")
    summary = vote_summary(load_run(ttrl_run))
    assert rows[0]["label_accuracy_first"] == pytest.approx(summary["label_accuracy_first"])
    assert 0 <= rows[0]["vote_margin_mean"] <= 1 and rows[0]["heldout_final"] is not None


def test_a_vote_history_of_the_wrong_type_is_refused_as_damage(random_model_dir):
    """A checkpoint's recipe state whose vote history holds no answers raises (the loop then sets the checkpoint
    aside as damaged and resumes from an older one) instead of failing later in a step."""
    recipe = _recipe(random_model_dir)
    for bad in ({"last_label": {"pool0": [1, 2]}}, {"last_label": [["pool0", "5"], [1, "7"]]}, {}):
        with pytest.raises((TypeError, KeyError)):
            recipe.load_state_dict(bad)
    recipe.load_state_dict({"last_label": {"pool0": "5", "pool1": None}})
    assert recipe.last_label == {"pool0": "5", "pool1": None}


# --- label-free rewards that do not collapse: EVOL-RL and RESTRAIN --------------------------------
def test_evol_rl_rewards_all_votes_by_majority_and_novelty(random_model_dir):
    recipe = _recipe(random_model_dir, "params.label_free_reward=evol_rl")
    recipe.sample_groups = _canned(recipe.policy.tokenizer, _texts)
    recipe.batch = lambda step: [0, 1, 2]
    out = recipe.step(1)
    rows = records(out)
    for row in rows:
        terms = row["reward_terms"]
        if row["answer"] is None:  # unparseable: -1, no novelty
            assert terms["valid"] == 0.0 and terms["evol_rl"] == -1.0 and terms["novelty"] is None
        elif terms["agree"]:
            assert 0.5 <= terms["evol_rl"] <= 1.0
        else:
            assert -1.0 <= terms["evol_rl"] <= -0.5
        if row["trained"]:
            assert row["reward"] == terms["evol_rl"]
    assert 0.0 <= out.metrics["evol_rl/novelty_mean"] <= 1.0
    assert out.metrics["evol_rl/valid_rate"] == pytest.approx(12 / 18)


def test_restrain_weights_prompts_once_and_penalises_low_consistency(random_model_dir):
    recipe = _recipe(random_model_dir, "params.label_free_reward=restrain")
    recipe.sample_groups = _canned(recipe.policy.tokenizer, _texts)
    recipe.batch = lambda step: [0, 1, 2]
    out = recipe.step(1)
    # the base model's vote: supports 3, 2, 2 of N = 6; g(f) = exp(-(f - 1)^2 / (2 * 0.5^2))
    u = [math.exp(-0.5), math.exp(-8 / 9), math.exp(-8 / 9)]
    assert [recipe.prompt_weights[f"pool{i}"] for i in range(3)] == pytest.approx(u)
    rows = records(out)
    # questions 1 and 2 (M(x) = 2 < kappa = 3): zero reward, every advantage u_x * (-delta)
    for q in (1, 2):
        trained = [r for r in rows[6 * q:6 * q + 6] if r["trained"]]
        assert [r["advantage"] for r in trained] == pytest.approx([-0.5 * u[q]] * 4)
        assert all(r["reward"] == 0.0 and r["reward_terms"]["penalised"] == 1.0 for r in trained)
    q0 = [r for r in rows[:6] if r["trained"]]
    assert q0[0]["reward_terms"]["penalised"] == 0.0 and sum(r["advantage"] for r in q0) != 0.0
    assert out.metrics["restrain/penalised_rate"] == pytest.approx(2 / 3)
    assert out.metrics["restrain/prompt_weight_mean"] == pytest.approx(sum(u) / 3)


def test_restrain_prompt_weights_survive_a_resume_and_are_never_recomputed(random_model_dir):
    recipe = _recipe(random_model_dir, "params.label_free_reward=restrain")
    recipe.sample_groups = _canned(recipe.policy.tokenizer, _texts)
    recipe.batch = lambda step: [0, 1, 2]
    recipe.step(1)
    state = json.loads(json.dumps(recipe.state_dict()))  # as the checkpoint writes and reads it
    resumed = _recipe(random_model_dir, "params.label_free_reward=restrain")
    resumed.load_state_dict(state)
    assert resumed.prompt_weights == recipe.prompt_weights
    resumed.reference_prompt_weights = lambda: pytest.fail("prompt weights recomputed after a resume")
    resumed.sample_groups = _canned(resumed.policy.tokenizer, _texts)
    resumed.batch = lambda step: [0, 1, 2]
    resumed.step(2)
    assert resumed.prompt_weights == recipe.prompt_weights
    lost = _recipe(random_model_dir, "params.label_free_reward=restrain")
    lost.load_state_dict({"last_label": state["last_label"]})
    with pytest.raises(ValueError, match="prompt weights of the frozen base model are missing"):
        lost.step(2)
    with pytest.raises(TypeError):
        lost.load_state_dict({**state, "prompt_weights": {"pool0": "high"}})


def test_a_missing_novelty_encoder_is_one_error_before_any_model_loads(random_model_dir, tmp_path):
    config, params, cls = resolve("ttrl", preset="small", sets=[f"model={random_model_dir}",
                                                                "params.label_free_reward=evol_rl",
                                                                f"params.encoder={tmp_path / 'none'}"])
    with pytest.raises(TaskDataError, match="params.encoder: folder not found"):
        cls.check_inputs(config, params)
    with pytest.raises(ValueError, match="needs label_source majority"):
        resolve("ttrl", sets=[f"model={random_model_dir}", "params.label_free_reward=restrain",
                              "params.label_source=ground_truth"])
