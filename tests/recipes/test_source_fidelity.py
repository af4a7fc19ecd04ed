"""Issue 26: dual clip, a fresh AdamW and the lr schedule per phase, Prism's pool denominator, PasoDoble's skip rule
and its stop at ``max_updates``. Issue 35: a pool band of its own, the codes' votes for unboxed samples, Prism's lr
schedules, the KL reference per phase, evaluation protocols in training (the preset values themselves:
tests/recipes/test_presets.py; Prism's count reset: tests/recipes/test_prism.py)."""

from __future__ import annotations

import itertools
import json
import math
import statistics

import pytest
import torch
from test_r_zero import completion, make, stub_labels, stub_questions

from coevolve.formats import Generation
from coevolve.grading.vote import majority_vote
from coevolve.loop import run
from coevolve.recipes import resolve
from coevolve.recipes.r_zero import Question
from coevolve.rl import trainer as trainer_module
from coevolve.rl.trainer import PolicyTrainer, TrainSample, UpdateSettings, phase_lr_factor, update_settings


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

    with pytest.raises(ConfigError, match="rollout.scoring.*only agent0, prism, r_zero"):
        resolve("pasodoble", preset="small", sets=["rollout.scoring.top_k=40"])


def test_unanswered_samples_stay_in_the_pool_denominator(random_model_dir):
    """Issue 26's example: 3 x "5", 1 x "7", 4 unanswered. Over all 8 samples p = 3/8 and Prism's band [0.5, 0.9]
    drops the question (as its code does); over the 4 answered ones p = 0.75 would keep it."""
    answers = ["5", "5", "5", "7", None, None, None, None]
    for denominator, p, kept in (("all", 3 / 8, False), ("answered", 0.75, True)):
        recipe, _ = make("r_zero", random_model_dir, "params.band=[0.5,0.9]", "params.filter_prove=false")
        recipe.solve_groups = lambda policy, prompts, n, seed, params=None, tools=True: [
            ([completion()] * n, answers) for _ in prompts]
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


# --- issue 35 ---------------------------------------------------------------------------------------------------


def _answering(answers):
    """A solve_groups stand-in: every question gets ``answers`` (None: no answer parsed)."""
    return lambda policy, prompts, n, seed, params=None, tools=True: [([completion()] * n, list(answers))
                                                                      for _ in prompts]


def test_a_pool_band_of_its_own_drops_seven_of_eight(random_model_dir):
    """Prism's released solver script keeps pool questions with 0.49 <= p <= 0.81 of 8 labels (4, 5 or 6 agreeing)
    while its reward band is [0.5, 0.9]: p = 7/8 enters the paper's pool and not the code's; p = 4/8 enters both."""
    seven, four = ["5"] * 7 + ["7"], ["5"] * 4 + ["7", "8", "9", None]
    for pool_band, kept in (([], (True, True)), (["params.pool_band=[0.49,0.81]"], (False, True))):
        recipe, _ = make("r_zero", random_model_dir, "params.band=[0.5,0.9]", "params.filter_prove=false", *pool_band)
        verdicts = []
        for answers in (seven, four):
            recipe.solve_groups = _answering(answers)
            q = Question(completion(), "1+2", None)
            recipe.label([q], 8, 0, "all")
            verdicts.append(recipe.keep(q))
        assert tuple(verdicts) == kept
    assert resolve("prism", preset="reference_code")[1].pool_band == [0.49, 0.81]
    for recipe_name, preset in (("prism", "paper"), ("prism", "small"), ("r_zero", "reference_code")):
        assert resolve(recipe_name, preset=preset)[1].pool_band is None  # the band is the pool's


# The example: 10 scoring votes, 6 without a box, 2 x "5" and 2 x "7"
UNBOXED = ["5", None, "7", None, None, "5", None, "7", None, None]


def test_unboxed_votes_count_as_an_answer_only_with_the_code_switch(random_model_dir):
    """code: the 6 unboxed samples vote "None" (mathruler's string in both codes), which wins: p = 0.6 and R-Zero's
    code-form reward min(p, 1 - p) = 0.4, and the pool drops the question for its "None" label; drop: they never
    vote, "5" wins with 2 of 10: p = 0.2, reward 0.2 (repetition penalty off)."""
    for votes, label, p, reward in (("code", "None", 0.6, 0.4), ("drop", "5", 0.2, 0.2)):
        recipe, _ = make("r_zero", random_model_dir, f"params.missing_answer_votes={votes}", "params.reward_form=code",
                         "params.repetition_weight=0", "params.band=[0.1,0.9]")
        recipe.solve_groups = _answering(UNBOXED)
        q = Question(completion(), "1+2", None)
        recipe.label([q], 10, 0, "all")
        recipe.questioner_rewards([q])
        assert (q.label, q.p, q.reward) == (label, pytest.approx(p), pytest.approx(reward))
        assert recipe.keep(q) == (votes == "drop")  # p inside [0.1, 0.9] both ways; "None" is no label
        assert q.answers == UNBOXED  # the rows keep what was parsed
    for recipe_name, preset, votes in (("r_zero", "reference_code", "code"), ("r_zero", "prism_code", "code"),
                                       ("prism", "reference_code", "code"), ("r_zero", "paper", "drop"),
                                       ("prism", "paper", "drop"), ("r_zero", "small", "drop")):
        assert resolve(recipe_name, preset=preset)[1].missing_answer_votes == votes, (recipe_name, preset)


def test_a_question_without_a_box_is_valid_only_with_the_code_switch(random_model_dir):
    for votes, valid in (("drop", None), ("code", "What is 2+3?")):
        recipe, _ = make("r_zero", random_model_dir, "task=math", f"params.missing_answer_votes={votes}")
        q = recipe.read_question(completion("<question> What is 2+3? </question>"))
        assert (q.text, q.own_answer) == (valid, None), votes
        q = recipe.read_question(completion("<question>What is 2+3?</question>\n\n\\boxed{5}"))
        assert (q.text, q.own_answer) == ("What is 2+3?", "5"), votes
        assert recipe.read_question(completion("<question> </question> \\boxed{5}")).text is None
    recipe, _ = make("r_zero", random_model_dir, "params.missing_answer_votes=code")  # arith: no box in the format
    assert recipe.read_question(completion("Q:1+2")).text == "1+2"


def _lr_factors(recipe: str, preset: str) -> dict[str, list[float]]:
    config, params, _ = resolve(recipe, preset=preset)
    return {role: [phase_lr_factor(settings, i, total) for i in range(total)]
            for role, total in (("questioner", params.questioner_steps), ("solver", params.solver_steps))
            for settings in [update_settings(config.train, config.roles.get(role))]}


def test_prism_derived_presets_warm_up_and_decay_both_roles():
    """Prism's config (both roles' jobs): 10% linear warm-up, then cosine to 10% of the peak over the job's steps.
    6 questioner steps: int(0.6) = 0 warm-up steps, factors 0.55 + 0.45 cos(pi i / 6), mean 3.75 / 6 = 0.625;
    50 solver steps: 5 warm-up steps 0, 0.2, ..., 0.8, the peak at step 5. R-Zero's own config: constant."""
    questioner = [1.0, 0.55 + 0.45 * math.cos(math.pi / 6), 0.775, 0.55, 0.325, 0.55 - 0.45 * math.cos(math.pi / 6)]
    for recipe, preset in (("prism", "reference_code"), ("r_zero", "prism_code")):
        factors = _lr_factors(recipe, preset)
        assert factors["questioner"] == pytest.approx(questioner)
        assert statistics.fmean(factors["questioner"]) == pytest.approx(0.625)
        assert factors["solver"][:6] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
        assert factors["solver"][-1] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 44 / 45)))
    for recipe in ("prism", "r_zero"):  # the paper presets' 20 solver steps: 2 warm-up steps
        factors = _lr_factors(recipe, "paper")
        assert factors["questioner"] == pytest.approx(questioner) and factors["solver"][:3] == [0.0, 0.5, 1.0]
    assert _lr_factors("r_zero", "reference_code") == {"questioner": [1.0] * 5, "solver": [1.0] * 15}
    for recipe in ("prism", "r_zero"):  # small keeps its constant lr (docs/recipes/r_zero.md)
        assert set(sum(_lr_factors(recipe, "small").values(), [])) == {1.0}


def _phase_trainer(policy, reference: str) -> PolicyTrainer:
    return PolicyTrainer(policy.model, policy.tokenizer, UpdateSettings(lr=1e-2, kl_beta=0.1, kl_reference=reference))


def _weights(module) -> list:
    return [p.detach().clone() for p in module.parameters()]


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_phase_start_reference_moves_at_each_phase_start_into_the_same_tensors(random_policy):
    """phase_start: the reference takes the weights at index 0 of a phase, not within it, copied into the one frozen
    copy the trainer already holds (same module, same storage: no second copy); initial: it never moves."""
    trainer = _phase_trainer(random_policy, "phase_start")
    reference, start = trainer.reference, _weights(trainer.model)
    storage = [p.data_ptr() for p in reference.parameters()]
    trainer.phase_step(0, 3)
    trainer.update(_samples(1.0))
    trainer.phase_step(1, 3)  # within the phase
    trainer.update(_samples(1.0))
    moved = _weights(trainer.model)
    assert _same(reference.parameters(), start) and not _same(moved, start)
    trainer.phase_step(0, 3)  # the next phase starts: the reference is the weights now
    assert trainer.reference is reference and [p.data_ptr() for p in reference.parameters()] == storage
    assert _same(reference.parameters(), moved)
    assert trainer.update(_samples(1.0))["kl_mean"] == pytest.approx(0.0, abs=1e-7)  # policy = reference
    assert _same(reference.parameters(), moved) and not _same(trainer.model.parameters(), moved)  # a copy, not a view
    assert trainer.checkpointed_reference is reference

    initial = PolicyTrainer(random_policy.model, random_policy.tokenizer, UpdateSettings(lr=1e-2, kl_beta=0.1))
    start = _weights(initial.model)
    initial.update(_samples(1.0))
    initial.phase_step(0, 3)
    assert _same(initial.reference.parameters(), start) and initial.checkpointed_reference is None


def _kl_run(model_dir, reference, steps, *sets):
    """r_zero on canned questions and labels (p = 1/2: the whole pool kept) whose solver rollouts agree with the label
    in turn (rewards 1, 0, 1, 0, ...: every update moves the solver), a strong KL term to ``reference``."""
    recipe, config = make("r_zero", model_dir, f"steps={steps}", "train.lr=1e-2", "train.kl_beta=0.5",
                          f"train.kl_reference={reference}", "params.pool_size=4", "params.repetition_weight=0", *sets)
    stub_questions(recipe, ["1+2", "2+2", "3+3", "4+4"])
    stub_labels(recipe, [["1", "1", "2", "3"]] * 100)
    turns = itertools.cycle([1.0, 0.0])
    recipe.solver_terms = lambda completion, answer, label: {"agree": next(turns), "format": 0.0}
    return recipe, config


def _rows(root) -> dict[int, dict]:
    rows = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "time/step_s" in r}


def test_r_zero_phases_take_their_start_as_the_kl_reference_and_a_resume_restores_it(tmp_path, random_model_dir):
    """Steps 3-4 and 7-8 are the solver's phases. With phase_start the KL term of step 7, the new phase's first
    update, is 0 (the reference is the solver as it starts the phase); with initial it is not (the reference is
    M_0). Resumed after step 7, step 8 trains against the saved phase-start reference as the straight run did."""
    for reference in ("initial", "phase_start"):
        recipe, config = _kl_run(random_model_dir, reference, 8)
        run(recipe, config, tmp_path / reference, progress=False)
        rows = _rows(tmp_path / reference)
        assert rows[3]["solver/kl_mean"] == pytest.approx(0.0, abs=1e-7)  # the first phase starts at M_0 either way
        assert (rows[7]["solver/kl_mean"] < 1e-7) == (reference == "phase_start")
        assert rows[8]["solver/kl_mean"] > 1e-7
    straight = recipe
    first, config = _kl_run(random_model_dir, "phase_start", 7)
    run(first, config, tmp_path / "resumed", progress=False)
    saved = sorted(p.name for p in (tmp_path / "resumed" / "checkpoints" / "step_000007").glob("*_reference.*"))
    assert saved == ["questioner_reference.safetensors", "solver_reference.safetensors"]
    second, config = _kl_run(random_model_dir, "phase_start", 8)
    run(second, config, tmp_path / "resumed", resume=True, progress=False)
    assert _rows(tmp_path / "resumed")[8]["solver/kl_mean"] == _rows(tmp_path / "phase_start")[8]["solver/kl_mean"]
    for role, trainer in straight.trainers().items():
        assert _same(trainer.model.parameters(), second.trainers()[role].model.parameters()), role
        assert _same(trainer.reference.parameters(), second.trainers()[role].reference.parameters()), role


def test_a_phase_start_reference_needs_phases_and_full_weights():
    from coevolve.config import ConfigError

    with pytest.raises(ConfigError, match="train.kl_reference.*no phases"):
        resolve("grpo", preset="small", sets=["train.kl_reference=phase_start"])
    with pytest.raises(ConfigError, match="train.kl_reference.*train.lora"):
        resolve("r_zero", preset="small", sets=["train.kl_reference=phase_start", "train.lora.r=4"])
    for recipe_name, preset in (("r_zero", "reference_code"), ("r_zero", "paper"), ("prism", "reference_code")):
        assert resolve(recipe_name, preset=preset)[0].train.kl_reference == "phase_start"


def test_in_training_evaluation_follows_the_run_s_eval_preset(tmp_path, random_model_dir):
    """eval_preset ttrl: 16 samples per question at temperature 0.6, top-p 0.95 (TTRL's validation), accuracy the
    mean over all of them (avg@16), within the run's eval_max_new_tokens; the default stays greedy, one sample."""
    from coevolve.config import ConfigError
    from coevolve.loop import evaluate_solver
    from coevolve.store import RunStore

    for preset, n, temperature, top_p in (("greedy", 1, 0.0, 1.0), ("ttrl", 16, 0.6, 0.95)):
        sets = ["eval_sets=[arith_l1]", "eval_limit=2", "eval_max_new_tokens=4"]
        recipe, config = make("r_zero", random_model_dir, *sets, *([f"eval_preset={preset}"] * (preset != "greedy")))
        store = RunStore(tmp_path / preset)
        row = evaluate_solver(recipe, config, store, 0)
        summary = json.loads((store.eval_dir / "step_000000" / "arith_l1" / "summary.json").read_text())
        assert (summary["preset"], summary["n_samples"]) == (preset, n)
        assert (summary["sampling"]["temperature"], summary["sampling"]["top_p"]) == (temperature, top_p)
        assert summary["sampling"]["max_new_tokens"] == 4
        records = [json.loads(line) for line in
                   (store.eval_dir / "step_000000" / "arith_l1" / "results.jsonl").read_text().splitlines()]
        flags = [ok for r in records for ok in r["correct"]]
        assert len(flags) == 2 * n and row["eval/arith_l1/accuracy"] == pytest.approx(statistics.fmean(flags))
    with pytest.raises(ConfigError, match="eval_preset.*unknown evaluation preset 'nope'"):
        resolve("r_zero", preset="small", sets=["eval_preset=nope"])
