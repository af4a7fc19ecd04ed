"""Issue 26: dual clip, a fresh AdamW and the lr schedule per phase, Prism's pool denominator, PasoDoble's skip rule
and its stop at ``max_updates`` (the preset values themselves: tests/test_presets.py)."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from coevolve.formats import Generation
from coevolve.grading.vote import majority_vote
from coevolve.loop import run
from coevolve.recipes import resolve
from coevolve.recipes.r_zero import Question
from coevolve.rl import trainer as trainer_module
from coevolve.rl.trainer import PolicyTrainer, TrainSample, UpdateSettings, phase_lr_factor
from tests.test_r_zero import completion, make, stub_labels, stub_questions


def test_cosine_phase_schedule_decays_towards_ten_percent():
    constant = UpdateSettings()
    assert {phase_lr_factor(constant, i, 50) for i in range(50)} == {1.0}
    cosine = UpdateSettings(lr_schedule="cosine", lr_min_ratio=0.1)
    factors = [phase_lr_factor(cosine, i, 50) for i in range(50)]
    assert factors[0] == 1.0 and factors[25] == pytest.approx(0.55)
    assert all(a > b for a, b in zip(factors, factors[1:])) and 0.1 < factors[-1] < 0.11
    # a constant peak lr gives about 1.8x the lr budget of the schedule (issue 26 item 4)
    assert 1 / statistics.fmean(factors) == pytest.approx(1.8, abs=0.03)
    warm = UpdateSettings(lr_schedule="cosine", lr_warmup_ratio=0.2, lr_min_ratio=0.0)
    assert [phase_lr_factor(warm, i, 10) for i in range(3)] == [0.0, 0.5, 1.0]


def _samples(advantage: float) -> list[TrainSample]:
    return [TrainSample([1, 2], [5, 6, 7], [-1.0, -1.0, -1.0], advantage)]


def test_phase_step_resets_adamw_at_a_phase_start_and_sets_the_lr(random_policy):
    for reset, kept in (("phase", False), ("never", True)):
        trainer = PolicyTrainer(random_policy.model, random_policy.tokenizer,
                                UpdateSettings(lr=1e-3, optimizer_reset=reset, lr_schedule="cosine",
                                               lr_min_ratio=0.1))
        trainer.phase_step(0, 4)
        trainer.update(_samples(1.0))
        trainer.phase_step(1, 4)  # within the phase: the state stays
        assert trainer.optimizer.state and trainer.optimizer.param_groups[0]["lr"] == pytest.approx(
            1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4))))
        trainer.phase_step(0, 4)  # the next phase
        assert bool(trainer.optimizer.state) == kept and trainer.optimizer.param_groups[0]["lr"] == 1e-3


def test_the_trainer_passes_dual_clip_to_the_loss(random_policy, monkeypatch):
    seen = []
    real = trainer_module.policy_loss

    def spy(*args, **kwargs):
        seen.append(kwargs["dual_clip"])
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "policy_loss", spy)
    for dual in (3.0, None):
        trainer = PolicyTrainer(random_policy.model, random_policy.tokenizer, UpdateSettings(dual_clip=dual))
        trainer.update(_samples(-1.0))
        assert seen[-1] == dual
    config, _, _ = resolve("r_zero", preset="small")
    assert config.train.dual_clip == 3.0


def test_r_zero_solver_phases_start_a_fresh_adamw_and_follow_the_schedule(random_model_dir):
    """Steps 3-4 and 7-8 are the solver's phases (2 + 2 steps per iteration): its AdamW step count restarts at the
    second phase only with ``phase``; the cosine lr is at 55% of the peak at the phase's second step."""
    for reset, count in (("phase", 1), ("never", 3)):
        recipe, _ = make("r_zero", random_model_dir, "params.pool_size=4", f"roles.solver.optimizer_reset={reset}",
                         "roles.solver.lr_schedule=cosine", "train.lr_min_ratio=0.1", "train.lr=1e-3")
        stub_questions(recipe, ["1+2", "2+2", "3+3", "4+4"])
        stub_labels(recipe, [["1", "1", "2", "3"]] * 100)  # p = 1/2: every pool question kept
        opt = recipe.solver_trainer.optimizer
        for step in (1, 2, 3, 4):
            recipe.step(step)
        assert max(s["step"].item() for s in opt.state.values()) == 2
        assert opt.param_groups[0]["lr"] == pytest.approx(0.55e-3)
        assert recipe.questioner_trainer.optimizer.param_groups[0]["lr"] == 1e-3  # unset: train.lr_schedule
        for step in (5, 6, 7):
            recipe.step(step)
        assert max(s["step"].item() for s in opt.state.values()) == count, reset


def test_a_schedule_needs_a_recipe_with_phases():
    """Refused while the config resolves, before any model is built (issue 32: it used to build tiny-arith first)."""
    from coevolve.config import ConfigError

    for setting in ("train.lr_schedule=cosine", "train.optimizer_reset=phase"):
        with pytest.raises(ConfigError, match=setting.split("=")[0]):
            resolve("grpo", preset="small", sets=[setting])


def test_scoring_settings_need_a_recipe_that_scores_questions():
    """rollout.scoring on a recipe without scoring votes would change nothing: one ConfigError, not silence."""
    from coevolve.config import ConfigError

    with pytest.raises(ConfigError, match="rollout.scoring.*only prism, r_zero"):
        resolve("pasodoble", preset="small", sets=["rollout.scoring.top_k=40"])


def test_unanswered_samples_stay_in_the_pool_denominator(random_model_dir):
    """Issue 26's example: 3 x "5", 1 x "7", 4 unanswered. Over all 8 samples p = 3/8 and Prism's band [0.5, 0.9]
    drops the question (as its code does); over the 4 answered ones p = 0.75 would keep it."""
    answers = ["5", "5", "5", "7", None, None, None, None]
    for denominator, p, kept in (("all", 3 / 8, False), ("answered", 0.75, True)):
        recipe, _ = make("r_zero", random_model_dir, "params.band=[0.5,0.9]", "params.filter_prove=false")
        recipe.solve_groups = lambda policy, prompts, n, seed, params=None: [([completion()] * n, answers)
                                                                             for _ in prompts]
        q = Question(completion(), "1+2", None)
        recipe.label([q], 8, 0, denominator)
        assert (q.label, q.p, recipe.keep(q)) == ("5", pytest.approx(p), kept)
    assert majority_vote(answers, None).p == pytest.approx(3 / 8)
    for recipe_name, preset in (("prism", "reference_code"), ("r_zero", "prism_code"), ("prism", "small")):
        assert resolve(recipe_name, preset=preset)[1].pool_p_denominator == "all"


def _pasodoble(model_dir, *sets):
    config, params, cls = resolve("pasodoble", preset="small", sets=[
        f"model={model_dir}", "eval_sets=[]", "params.passages_per_step=2", "params.proposals=3",
        "params.solutions=4", "rollout.max_new_tokens=8", "params.proposer_max_tokens=8", "train.lr=1e-2",
        "params.solver_reward=random_full", "params.tau_low=0", *sets])
    recipe = cls(config, params)
    recipe.read_generation = lambda output, document: Generation("a+b", "7")
    return recipe, config


def test_pasodoble_skips_a_flat_proposer_batch_only_with_the_code_rule(random_model_dir):
    """Every Proposer advantage 0 but some question retained: Algorithm 1 still updates both roles; the released
    code (``skip_zero_advantages``) skips the iteration."""
    for skip in (False, True):
        recipe, _ = _pasodoble(random_model_dir, f"params.skip_zero_advantages={str(skip).lower()}")
        score = recipe.propose_and_score

        def flat(step, timer, score=score):
            proposals = score(step, timer)
            for x in proposals:
                x.advantage = 0.0
            return proposals

        recipe.propose_and_score = flat
        for step in range(1, 20):  # random solver rewards: some step retains a question
            out = recipe.step(step)
            if out.metrics["questions/retained"]:
                break
        assert out.metrics["questions/retained"] and out.metrics["skipped"] == float(skip)
        assert ("solver/loss" in out.metrics, "proposer/loss" in out.metrics) == (not skip, not skip)
    assert resolve("pasodoble", preset="paper")[1].skip_zero_advantages is False
    assert resolve("pasodoble", preset="reference_code")[1].skip_zero_advantages is True
    assert resolve("pasodoble", preset="small_offline")[1].skip_zero_advantages is False


def test_pasodoble_run_stops_at_max_updates_and_states_its_schedule(tmp_path, random_model_dir):
    recipe, config = _pasodoble(random_model_dir, "params.max_updates=2", "steps=40", "eval_every=0")
    summary = run(recipe, config, tmp_path / "run", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert summary["updates"] == 2 and summary["steps_run"] == len(rows) < 40
    assert rows[-1]["updates"] == 2 and rows[-2]["updates"] == 1  # it stopped at the step that reached the cap
    assert summary["schedule"].startswith("online: 2 joint updates") and "max_updates = 2" in summary["schedule"]


def test_training_scoring_labelling_and_pool_sample_with_their_own_settings(random_model_dir):
    """Training rollouts take rollout.*, the solver's scoring and labelling votes rollout.scoring (the pool labels
    with their own budget), the questioner's pool params.pool_top_p."""
    recipe, _ = make("r_zero", random_model_dir, "rollout.top_p=0.99", "rollout.scoring.top_k=40",
                     "rollout.scoring.top_p=1.0", "params.pool_top_p=0.95", "params.label_max_tokens=5",
                     "params.pool_size=4")
    stub_questions(recipe, ["1+2", "2+2"])
    calls = []
    sample = recipe.sample_groups

    def spy(policy, prompts, n, seed, params=None):
        role = "solver" if policy is recipe.solver_policy else "questioner"
        used = params or recipe.solver_sampling
        calls.append((role, n, used.top_p, used.top_k, used.max_new_tokens))
        return sample(policy, prompts, n, seed, params)

    recipe.sample_groups = spy
    recipe.step(1)  # questioner training rollouts, then m_s = 2 scoring votes per question
    recipe.step(3)  # the pool (4 questions, m_l = 4 label votes each), then solver training rollouts
    tokens = recipe.config.rollout.max_new_tokens
    assert calls[0] == ("questioner", 2, 0.99, 0, 8) and calls[1] == ("solver", 2, 1.0, 40, tokens)
    assert ("questioner", 4, 0.95, 0, 8) in calls and ("solver", 4, 1.0, 40, 5) in calls
    assert calls[-1] == ("solver", 2, 0.99, 0, tokens) or not recipe.pool
    small, _, _ = resolve("r_zero", preset="small")
    assert (small.rollout.top_k, small.rollout.scoring.top_k) == (0, None)  # small samples every use alike


def test_the_code_corpus_stand_in_is_math_without_math500_plus_gsm8k_train():
    from coevolve.rewards.coverage import reference_questions

    texts, info = reference_questions("math_minus_math500_gsm8k_train")
    assert (info["n"], info["gsm8k_train"], info["math500"]) == (4500 + 7473, 7473, 500) and len(texts) == info["n"]
    assert resolve("prism", preset="reference_code")[1].reference_corpus == "math_minus_math500_gsm8k_train"


def test_constrained_votes_keep_the_answer_format_at_their_own_budget(random_model_dir):
    from coevolve.formats import solver_answer_regex

    recipe, _ = make("r_zero", random_model_dir, "task=math", "params.solver_format_constraint=true",
                     "params.label_max_tokens=5", "params.pool_top_p=0.95")
    assert recipe.scoring_sampling.regex == recipe.solver_sampling.regex == solver_answer_regex(8)
    assert recipe.label_sampling.regex == solver_answer_regex(5) and recipe.label_sampling.max_new_tokens == 5
    assert recipe.pool_sampling.regex == recipe.question_sampling.regex and recipe.pool_sampling.top_p == 0.95
