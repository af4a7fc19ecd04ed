"""The r_zero recipe: schedule, parsing, hand-checked questioner rewards, pool filter, SolverInit, resume, CLI."""

from __future__ import annotations

import json

import helpers
import pytest
import torch
from helpers import records
from typer.testing import CliRunner

from coevolve.cli import app
from coevolve.grading.vote import majority_vote
from coevolve.loop import run
from coevolve.recipes import resolve
from coevolve.recipes.r_zero import Question, RZero
from coevolve.rollout import Completion
from coevolve.tasks import arith

TINY = ["eval_sets=[]", "rollout.max_new_tokens=8", "params.questioner_steps=2", "params.solver_steps=2",
        "params.questioner_prompts=2", "params.questioner_group=2", "params.score_samples=2", "params.pool_size=6",
        "params.label_samples=4", "params.solver_questions=2", "params.solver_group=2", "params.question_max_tokens=8"]


def make(recipe_name, model_dir, *sets):
    recipe = helpers.make_recipe(recipe_name, model_dir, *TINY, *sets)
    return recipe, recipe.config


def completion(text: str = "") -> Completion:
    return Completion(prompt="W:\n", prompt_ids=[1], token_ids=[5, 6], text=text, logprobs=[-1.0, -1.0])


def question(text: str | None, p: float | None) -> Question:
    q = Question(completion(), text, None)
    q.p = p
    return q


def stub_questions(recipe, texts):
    """Every questioner output reads as the next of ``texts`` (the random model never writes a valid question)."""
    state = {"i": 0}

    def read(output):
        text = texts[state["i"] % len(texts)]
        state["i"] += 1
        return Question(output, text, None)

    recipe.read_question = read


def stub_labels(recipe, votes):
    """The solver's answers for each valid question, in order, instead of sampling it."""
    queue = list(votes)

    def label(questions, samples, seed, denominator, sampling=None, tools=True):
        for q in questions:
            if q.text is not None:
                q.answers = queue.pop(0)
                q.vote = majority_vote(q.answers, None)
                q.p = q.vote.p

    recipe.label = label


def test_schedule_maps_steps_to_iterations_and_phases(random_model_dir):
    recipe, _ = make("r_zero", random_model_dir, "params.questioner_steps=6", "params.solver_steps=20")

    def at(step):
        position = recipe.schedule.at(step)
        return position.iteration, position.role, position.index

    assert at(1) == (1, "questioner", 0)
    assert at(6) == (1, "questioner", 5)
    assert at(7) == (1, "solver", 0)
    assert at(26) == (1, "solver", 19)
    assert at(27) == (2, "questioner", 0)
    assert at(104) == (4, "solver", 19)
    assert [phase["role"] for phase in recipe.schedule.describe()] == ["questioner", "solver"]


def test_chat_questions_need_the_last_question_block_and_a_box(random_model_dir):
    recipe, _ = make("r_zero", random_model_dir)
    recipe.generator_format = RZero.formats["chat"]
    text = "<question>old</question> draft \\boxed{1}\n<question> What is 2+3? </question>\n\n\\boxed{5}"
    q = recipe.read_question(completion(text))
    assert q.text == "What is 2+3?" and q.own_answer == "5"
    assert recipe.read_question(completion("<question>What is 2+3?</question>")).text is None
    assert recipe.read_question(completion("\\boxed{5}")).text is None


def test_questioner_rewards_by_hand(random_model_dir):
    recipe, _ = make("r_zero", random_model_dir)
    qs = [question("3+4*5", 0.5), question("3+4*5", 0.5), question("3+4*5", 0.75), question("(12-7)*9", 0.5),
          question(None, None)]
    recipe.questioner_rewards(qs)
    # clusters {0,1,2} (3/5), {3} (1/5), {4: invalid, empty text} (1/5)
    assert [q.terms["repetition"] for q in qs] == pytest.approx([0.6, 0.6, 0.6, 0.2, 0.2])
    assert [q.reward for q in qs] == pytest.approx([0.4, 0.4, 0.0, 0.8, 0.0])  # max(0, r_unc - r_rep); bad: 0
    code, _ = make("r_zero", random_model_dir, "params.reward_form=code")
    code.questioner_rewards(qs)
    assert [q.reward for q in qs] == pytest.approx([-0.1, -0.1, -0.35, 0.3, -1.2])


def test_questioner_step_trains_the_questioner_only(random_model_dir):
    recipe, _ = make("r_zero", random_model_dir, "train.lr=1e-2")
    stub_questions(recipe, ["1+2", "1+2", "3*4", "5-1"])
    stub_labels(recipe, [["3", "3"], ["3", "3"], ["12", "7"], ["4", "4"]])  # group 2's rewards: 0.75, 0
    solver_before = [t.clone() for t in recipe.solver_policy.model.parameters()]
    questioner_before = [t.clone() for t in recipe.questioner.model.parameters()]
    out = recipe.step(1)
    assert all(torch.equal(a, b) for a, b in zip(solver_before, recipe.solver_policy.model.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(questioner_before, recipe.questioner.model.parameters()))
    rows = records(out)
    assert [r["solve_rate"] for r in rows] == [1.0, 1.0, 0.5, 1.0]
    assert [r["reward"] for r in rows] == pytest.approx([0.0, 0.0, 0.75, 0.0])
    assert all(r["role"] == "generator" and r["phase"] == "question" and r["iteration"] == 1 for r in rows)
    assert rows[0]["oracle"]["answer"] == "3" and rows[0]["label"] == "3"
    assert out.metrics["phase"] == "questioner" and out.metrics["questions/in_band_rate"] == 0.25


@pytest.mark.parametrize("recipe_name", ["r_zero", "prism"])
def test_frozen_generator_never_updates_the_questioner(random_model_dir, recipe_name):
    recipe, _ = make(recipe_name, random_model_dir, "train.lr=1e-2", "frozen_generator=true",
                     "params.questioner_init=solver")
    stub_questions(recipe, ["1+2", "1+2", "3*4", "5-1"])
    stub_labels(recipe, [["3", "3"], ["3", "3"], ["12", "7"], ["4", "4"]] * 10)
    questioner_before = [t.clone() for t in recipe.questioner.model.parameters()]
    out = recipe.step(1)  # a questioner step with a non-zero reward
    assert any(r["reward"] for r in records(out))
    assert all(torch.equal(a, b) for a, b in zip(questioner_before, recipe.questioner.model.parameters()))
    assert not recipe.questioner_trainer.optimizer.state


def test_pool_band_and_solver_step(random_model_dir):
    recipe, _ = make("r_zero", random_model_dir, "params.pool_size=4", "params.band=[0.25,0.75]")
    stub_questions(recipe, ["1+2", "2+2", "3+3", "4+4"])
    # p = 1.0 (dropped), 0.5 (kept), 0.25 (kept), 0.75 (kept); the 3+3 label is 6
    stub_labels(recipe, [["3"] * 4, ["4", "4", "5", "6"], ["6", "1", "2", "3"], ["8", "8", "8", None]])
    out = recipe.step(3)  # first solver step of iteration 1: builds the pool, then trains
    assert recipe.pool_iteration == 1
    assert sorted((i.question, i.label, i.p) for i in recipe.pool) == [
        ("2+2", "4", 0.5), ("3+3", "6", 0.25), ("4+4", "8", 0.75)]
    pool_rows = [r for r in records(out) if r["phase"] == "pool"]
    assert [r["in_pool"] for r in pool_rows] == [False, True, True, True]
    solver_rows = [r for r in records(out) if r["role"] == "solver"]
    assert len(solver_rows) == 2 * 2 and {r["label_source"] for r in solver_rows} == {"majority"}
    by_question = {i.question: i.label for i in recipe.pool}
    assert all(r["label"] == by_question[r["question"]] for r in solver_rows)
    assert out.metrics["pool/kept_rate"] == 0.75 and out.metrics["pool/size"] == 3
    assert "solver/loss" in out.metrics
    rebuilt = recipe.pool
    recipe.step(4)  # the pool is built once per iteration
    assert recipe.pool is rebuilt


def test_pool_p_over_all_or_answered_samples_through_the_labeller(random_model_dir):
    """The real labeller on canned solver answers: with ``answered`` an unparsed answer leaves the denominator, which
    moves one question out of the band [0.25, 0.75] and another within it."""
    answers = {"1+2": ["A:3", "A:3", "A:3", "S:?"], "2+2": ["A:4", "S:?", "S:?", "A:5"]}

    def canned(solver):
        def sample_groups(policy, prompts, n, seed, sampling=None):
            if policy is not solver:  # the questioner's outputs (read by stub_questions)
                return [[completion() for _ in range(n)] for _ in prompts]
            return [[completion(a) for a in answers[p.removeprefix("Q:").removesuffix("=?\n")]] for p in prompts]
        return sample_groups

    for denominator, pool in (("all", [("1+2", "3", 0.75), ("2+2", "4", 0.25)]), ("answered", [("2+2", "4", 0.5)])):
        recipe, _ = make("r_zero", random_model_dir, "params.pool_size=2", f"params.pool_p_denominator={denominator}")
        stub_questions(recipe, ["1+2", "2+2"])
        recipe.sample_groups = canned(recipe.solver_policy)
        recipe.build_pool(3, 1)
        assert sorted((i.question, i.label, i.p) for i in recipe.pool) == pool


def test_solver_reward_weighs_agreement_and_format(random_model_dir):
    """The code's solver reward 0.9 agree + 0.1 format on canned solutions (the pool labels are 3 and 4)."""
    recipe, _ = make("r_zero", random_model_dir, "params.solver_format_weight=0.1", "params.pool_size=2",
                     "params.solver_group=4")
    stub_questions(recipe, ["1+2", "2+2"])
    stub_labels(recipe, [["3", "5"], ["4", "6"]])  # ties: the first answer labels, p = 1/2
    sample = recipe.sample_groups
    texts = ["A:{}", "<think>x</think>\\boxed{{{}}}", "<think>x</think>\\boxed{{{}}}\nA:{}", "A:9"]

    def sample_groups(policy, prompts, n, seed, sampling=None):
        if policy is not recipe.solver_policy:
            return sample(policy, prompts, n, seed, sampling)
        labels = [str(arith.evaluate(p.removeprefix("Q:").removesuffix("=?\n"))) for p in prompts]
        return [[completion(t.format(label, label)) for t in texts] for label in labels]

    recipe.sample_groups = sample_groups
    rows = [r for r in records(recipe.step(3)) if r["role"] == "solver"]
    assert [r["reward_terms"] for r in rows[:4]] == [{"agree": 1.0, "format": 0.0}, {"agree": 0.0, "format": 1.0},
                                                     {"agree": 1.0, "format": 1.0}, {"agree": 0.0, "format": 0.0}]
    assert [r["reward"] for r in rows] == pytest.approx([0.9, 0.1, 1.0, 0.0] * 2)


def test_solver_init_copies_weights_and_resets_the_optimizer(random_model_dir):
    recipe, _ = make("r_zero", random_model_dir, "params.questioner_init=solver", "train.lr=1e-2")
    stub_questions(recipe, ["1+2"])
    stub_labels(recipe, [["3", "4"]] * 100)
    recipe.step(1)  # trains the questioner: weights differ from the solver, optimizer has state
    assert recipe.questioner_trainer.optimizer.state
    with torch.no_grad():
        next(recipe.solver_policy.model.parameters()).add_(1.0)
    recipe.start_phase(recipe.schedule.at(5))  # iteration 2's questioner phase starts: Q_2 <- S_1
    assert not recipe.questioner_trainer.optimizer.state
    assert all(torch.equal(a, b) for a, b in zip(recipe.questioner.model.parameters(),
                                                  recipe.solver_policy.model.parameters()))
    previous, _ = make("r_zero", random_model_dir)
    before = [t.clone() for t in previous.questioner.model.parameters()]
    with torch.no_grad():
        next(previous.solver_policy.model.parameters()).add_(1.0)
    previous.start_phase(previous.schedule.at(5))  # Q_t <- Q_{t-1}: nothing changes
    assert all(torch.equal(a, b) for a, b in zip(before, previous.questioner.model.parameters()))


def test_resume_reproduces_a_straight_run(tmp_path, random_model_dir):
    """Resumed after step 4, the questioner's steps 5-6 train as in the straight run: the same samples, rewards,
    weights and AdamW state (the questioner trains in steps 1, 2, 5 and 6, on canned outputs with rewards 0 and 1)."""
    answers = {"1+2": ["3", "3"], "2+2": ["4", "5"]}  # p = 1 (reward 0) and 1/2 (reward 1)

    def recipe_for(steps):
        recipe, config = make("r_zero", random_model_dir, f"steps={steps}", "train.lr=1e-2",
                              "params.repetition_weight=0")
        sample = recipe.sample_groups

        def sample_groups(policy, prompts, n, seed, sampling=None):  # the questioner writes both questions in turn
            if policy is recipe.solver_policy:
                return sample(policy, prompts, n, seed, sampling)
            return [[completion(f"Q:{list(answers)[i % 2]}") for i in range(n)] for _ in prompts]

        def label(questions, samples, seed, denominator, sampling=None, tools=True):
            for q in questions:
                q.answers = answers[q.text]
                q.vote = majority_vote(q.answers, None)
                q.p = q.vote.p

        recipe.sample_groups, recipe.label = sample_groups, label
        return recipe, config

    straight, config = recipe_for(6)  # 2 questioner + 2 solver steps, then iteration 2
    run(straight, config, tmp_path / "straight", progress=False)
    first, config = recipe_for(4)
    run(first, config, tmp_path / "resumed", progress=False)
    second, config = recipe_for(6)
    run(second, config, tmp_path / "resumed", resume=True, progress=False)
    assert [vars(i) for i in second.pool] == [vars(i) for i in straight.pool]
    for step in (5, 6):
        a, b = ([json.loads(line) for line in (root / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()]
                for root in (tmp_path / "straight", tmp_path / "resumed"))
        assert [r["completion"] for r in a] == [r["completion"] for r in b]
        assert [r["reward"] for r in a] == [r["reward"] for r in b]
    rows = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("questioner/grad_norm", 0) > 0] == [1, 2, 5, 6]
    # the loop logs 0 optimizer steps for the role a step leaves idle: every training row has both roles
    assert [(r["questioner/optimizer_steps"] > 0, r["solver/optimizer_steps"] > 0) for r in rows if "time/step_s" in r
            ] == [(True, False)] * 2 + [(False, True)] * 2 + [(True, False)] * 2
    for role, trainer in straight.trainers().items():
        resumed = second.trainers()[role]
        assert all(torch.equal(a, b) for a, b in zip(trainer.model.state_dict().values(),
                                                     resumed.model.state_dict().values())), role
        sa, sb = trainer.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
        assert sa.keys() == sb.keys() and all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i]), role


def test_presets_resolve():
    for preset in ("small", "paper", "reference_code", "prism_code"):  # values: tests/recipes/test_presets.py
        config, params, _ = resolve("r_zero", preset=preset)
        assert config.steps % (params.questioner_steps + params.solver_steps) == 0  # whole iterations


def test_optimizer_steps_per_role_follow_mini_batches_and_epochs(random_model_dir):
    recipe, _ = make("r_zero", random_model_dir, "roles.questioner.mini_batch_size=1", "roles.questioner.epochs=2",
                     "roles.solver.mini_batch_size=3", "roles.solver.epochs=3", "params.pool_size=4")
    stub_questions(recipe, ["1+2", "2+2", "3+3", "4+4"])
    stub_labels(recipe, [["1", "1", "2", "3"]] * 100)  # p = 1/2 everywhere: in the band, every pool question kept
    out = recipe.step(1)  # 2 prompts x 2 outputs = 4 sequences, one per AdamW step, 2 epochs
    assert (out.metrics["questioner/optimizer_steps"], "solver/optimizer_steps" in out.metrics) == (8, False)
    out = recipe.step(3)  # 2 questions x 2 rollouts = 4 sequences in mini-batches of 3 and 1, 3 epochs
    assert ("questioner/optimizer_steps" in out.metrics, out.metrics["solver/optimizer_steps"]) == (False, 6)
    assert recipe.solver_trainer.settings.mini_batch_size == 3 and recipe.questioner_trainer.settings.epochs == 2


def test_unset_role_settings_are_the_runs_train_settings(random_model_dir):
    recipe, _ = make("r_zero", random_model_dir, "train.mini_batch_size=5", "train.epochs=3",
                     "roles.solver.epochs=1")
    assert (recipe.questioner_trainer.settings.mini_batch_size, recipe.questioner_trainer.settings.epochs) == (5, 3)
    assert (recipe.solver_trainer.settings.mini_batch_size, recipe.solver_trainer.settings.epochs) == (5, 1)


def test_advantage_scale_and_warnings(random_model_dir, caplog):
    recipe, _ = make("r_zero", random_model_dir, "params.pool_size=2")
    stub_questions(recipe, ["1+2", "1+2", "3*4", "5-1"])
    stub_labels(recipe, [["3", "3"], ["3", "3"], ["12", "7"], ["4", "4"]])  # group 2's rewards: 0.75, 0
    with caplog.at_level("WARNING", logger="coevolve.recipes.r_zero"):
        out = recipe.step(1)
    # group 1 all 0; group 2 (0.75, 0): mean 0.375, unbiased std 0.75/sqrt(2) -> +-1/sqrt(2)
    assert out.metrics["generator/advantage_abs_mean"] == pytest.approx(2 ** -0.5 / 2, rel=1e-5)
    assert out.metrics["questioner/zero_variance_rate"] == 0.5 and not caplog.records
    stub_labels(recipe, [["3", "3"]] * 100)  # p = 1 everywhere: every reward 0, and nothing in the pool band
    with caplog.at_level("WARNING", logger="coevolve.recipes.r_zero"):
        out = recipe.step(2)
        assert out.metrics["questioner/zero_variance_rate"] == 1.0
        assert [r.getMessage() for r in caplog.records] == [
            "step 2: every questioner group has zero reward variance (all advantages 0)"]
        caplog.clear()
        out = recipe.step(3)
    assert out.metrics["pool/size"] == 0 and out.metrics.get("solver/optimizer_steps", 0) == 0
    assert [r.getMessage() for r in caplog.records] == [
        "step 3: the solver pool of iteration 1 is empty; no solver update"]


def test_cli_run_and_resume(tmp_path, random_model_dir):
    out = tmp_path / "run"
    sets = [x for s in [f"model={random_model_dir}", "steps=3", *TINY] for x in ("--set", s)]
    result = CliRunner().invoke(app, ["run", "r_zero", *sets, "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["questioner", "questioner", "solver"]
    assert rows[2]["pool/candidates"] == 6 and "time/pool_s" in rows[2]
    result = CliRunner().invoke(app, ["run", "--resume", str(out), "--set", "steps=4", "--quiet"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[3]["iteration"] == 1
    assert (out / "samples" / "step_000004.jsonl").exists()
