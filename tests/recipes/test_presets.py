"""Every ``paper`` / ``reference_code`` preset against a table of its source's values, step structure included.

A "step" of the authors' verl / EasyR1 / TRL code is one rollout batch split into PPO mini-batches and epochs; our
trainer's ``mini_batch_size`` counts sequences (prompts x samples), 0 meaning the whole batch. OPT_STEPS is the number
of AdamW steps one loop step takes in the source, written out by hand from the source's numbers.
"""

from __future__ import annotations

import math

import pytest

from coevolve.recipes import RECIPES, resolve

# Both codes' optimizer (verl / EasyR1 actor configs): what every GPU preset of r_zero and prism takes
CODE_OPTIMIZER = {"train.clip_low": 0.2, "train.clip_high": 0.3, "train.dual_clip": 3.0, "train.weight_decay": 0.01,
                  "train.optimizer_reset": "phase", "train.kl_reference": "phase_start"}
# Prism's config, loaded by the jobs of both roles: cosine with a 10% warm-up, down to 10% of the peak
PRISM_LR = {"train.lr_warmup_ratio": 0.1, "train.lr_min_ratio": 0.1, "roles.questioner.lr_schedule": "cosine",
            "roles.solver.lr_schedule": "cosine"}
# Both codes' sampling: training rollouts (either role) top_p 0.99, no top_k, 4,096 tokens; the solver's scoring and
# labelling votes top_p 1, top_k 40; the questioner's pool top_p 0.95
CODE_SAMPLING = {"config.rollout.top_p": 0.99, "config.rollout.top_k": 0, "config.rollout.max_new_tokens": 4096,
                 "config.rollout.scoring.top_p": 1.0, "config.rollout.scoring.top_k": 40,
                 "config.rollout.scoring.max_new_tokens": None, "question_max_tokens": 4096, "pool_top_p": 0.95}
# r_zero / prism: (recipe, preset) -> resolved values (params unless prefixed "train." or "config.")
R_ZERO_TABLE = {
    ("r_zero", "paper"): {  # Prism's App. A for R-Zero; the step structure of Prism's scripts
        "config.steps": 4 * (6 + 20), "questioner_steps": 6, "solver_steps": 20,
        "questioner_prompts": 512, "questioner_group": 4, "roles.questioner.mini_batch_size": 64,
        "roles.questioner.epochs": 2,
        "solver_questions": 512, "solver_group": 8, "roles.solver.mini_batch_size": 1024, "roles.solver.epochs": 2,
        "score_samples": 10, "label_samples": 8, "pool_size": 8000, "band": [0.25, 0.75], "pool_p_denominator": "all",
        "reward_form": "paper", "advantage": "dr_grpo", "solver_format_weight": 0.0, "filter_prove": True,
        "questioner_init": "previous_questioner",
        "train.lr": 5e-6, "train.kl_beta": 1e-4, **CODE_OPTIMIZER, **PRISM_LR, **CODE_SAMPLING,
        "label_max_tokens": 2048, "pool_band": None, "missing_answer_votes": "drop"},
    ("r_zero", "reference_code"): {  # R-Zero's repository (EasyR1): 5 iterations, checkpoints 5 / 15 kept
        "config.steps": 5 * (5 + 15), "questioner_steps": 5, "solver_steps": 15,
        "questioner_prompts": 512, "questioner_group": 4, "roles.questioner.mini_batch_size": 64,
        "roles.questioner.epochs": 1,
        "solver_questions": 512, "solver_group": 5, "roles.solver.mini_batch_size": 640, "roles.solver.epochs": 1,
        "score_samples": 10, "label_samples": 9, "pool_size": 8000, "band": [0.3, 0.8], "pool_p_denominator": "all",
        "reward_form": "code", "advantage": "grpo", "solver_format_weight": 0.1, "filter_prove": False,
        "questioner_init": "previous_questioner", "question_max_tokens": 4096, "config.rollout.max_new_tokens": 4096,
        "train.lr": 1e-6, "train.kl_beta": 1e-2, **CODE_OPTIMIZER, "roles.solver.lr_schedule": None,
        "roles.questioner.lr_schedule": None, "config.train.lr_schedule": "constant", "train.lr_warmup_ratio": 0.0,
        **CODE_SAMPLING, "label_max_tokens": None, "pool_band": None, "missing_answer_votes": "code"},
    ("r_zero", "prism_code"): {  # the R-Zero baseline of Prism's scripts
        "config.steps": 4 * (6 + 50), "questioner_steps": 6, "solver_steps": 50,
        "questioner_prompts": 512, "questioner_group": 4, "roles.questioner.mini_batch_size": 64,
        "roles.questioner.epochs": 2,
        "solver_questions": 512, "solver_group": 8, "roles.solver.mini_batch_size": 1024, "roles.solver.epochs": 2,
        "score_samples": 10, "label_samples": 8, "band": [0.3, 0.8], "pool_p_denominator": "all",
        "reward_form": "code", "advantage": "grpo", "solver_format_weight": 0.1, "filter_prove": False,
        "train.lr": 1e-6, "train.kl_beta": 1e-4, **CODE_OPTIMIZER, **PRISM_LR, **CODE_SAMPLING,
        "label_max_tokens": 2048, "pool_band": None, "missing_answer_votes": "code"},
    ("prism", "paper"): {
        "config.steps": 4 * (6 + 20), "questioner_steps": 6, "solver_steps": 20,
        "questioner_prompts": 512, "questioner_group": 4, "roles.questioner.mini_batch_size": 64,
        "roles.questioner.epochs": 2,
        "solver_questions": 512, "solver_group": 8, "roles.solver.mini_batch_size": 1024, "roles.solver.epochs": 2,
        "score_samples": 10, "label_samples": 8, "band": [0.5, 0.9], "pool_p_denominator": "all",
        "advantage": "dr_grpo", "questioner_init": "solver", "k": 128, "lam": 5.0, "gamma": 0.99, "alpha": 1.0,
        "reference_corpus": "math_minus_math500", "train.lr": 5e-6, "train.kl_beta": 1e-4, **CODE_OPTIMIZER,
        **PRISM_LR, **CODE_SAMPLING, "label_max_tokens": 2048, "pool_band": None, "missing_answer_votes": "drop",
        "count_reset": "never"},
    ("prism", "reference_code"): {
        "config.steps": 4 * (6 + 50), "questioner_steps": 6, "solver_steps": 50,
        "roles.questioner.mini_batch_size": 64, "roles.questioner.epochs": 2, "solver_questions": 512,
        "solver_group": 8, "roles.solver.mini_batch_size": 1024, "roles.solver.epochs": 2,
        "pool_p_denominator": "all", "advantage": "grpo", "solver_format_weight": 0.1, "filter_prove": False,
        "k": 128, "reference_corpus": "math_minus_math500_gsm8k_train",
        "train.lr": 1e-6, "train.kl_beta": 1e-4, **CODE_OPTIMIZER, **PRISM_LR, **CODE_SAMPLING,
        "label_max_tokens": 2048, "band": [0.5, 0.9], "pool_band": [0.49, 0.81], "missing_answer_votes": "code",
        "questioner_init": "previous_questioner", "count_reset": "iteration"},
}
# AdamW steps per questioner / solver loop step in the source (spec prism.md §7; R-Zero's EasyR1 config)
OPT_STEPS = {
    ("r_zero", "paper"): (512 // 16 * 2, 512 // 128 * 2),  # 64, 8
    ("r_zero", "reference_code"): (512 // 16, 512 // 128),  # 32, 4
    ("r_zero", "prism_code"): (64, 8),
    ("prism", "paper"): (64, 8),
    ("prism", "reference_code"): (64, 8),
}


def resolved(recipe: str, preset: str, key: str):
    config, params, _ = resolve(recipe, preset=preset)
    if key.startswith("train."):
        return getattr(config.train, key.split(".", 1)[1])
    if key.startswith("roles."):  # a role's own setting; None: the run's train.* value
        _, role, name = key.split(".")
        return getattr(config.roles.get(role), name, None)
    if key.startswith("config."):
        node = config
        for part in key.split(".")[1:]:
            node = getattr(node, part)
        return node
    return getattr(params, key)


@pytest.mark.parametrize("recipe, preset", sorted(R_ZERO_TABLE))
def test_r_zero_and_prism_presets(recipe, preset):
    for key, want in R_ZERO_TABLE[(recipe, preset)].items():
        assert resolved(recipe, preset, key) == want, key
    config, p, _ = resolve(recipe, preset=preset)
    q, s = config.roles["questioner"], config.roles["solver"]
    questioner = math.ceil(p.questioner_prompts * p.questioner_group / q.mini_batch_size) * q.epochs
    solver = math.ceil(p.solver_questions * p.solver_group / s.mini_batch_size) * s.epochs
    assert (questioner, solver) == OPT_STEPS[(recipe, preset)]


def test_every_paper_and_code_preset_states_its_step_structure():
    """The one-policy recipes take one whole-batch step (their sources: one update per rollout batch, 1 epoch)."""
    for recipe in ("grpo", "dynamic_rl", "opensir", "spice"):
        for preset in ("paper", "reference_code"):
            if preset in RECIPES[recipe].presets:
                config, _, _ = resolve(recipe, preset=preset)
                assert (config.train.mini_batch_size, config.train.epochs) == (0, 1), (recipe, preset)
    # INFUSER: M = 32 prompts x n = 8 per AdamW step for both roles, 1 epoch (paper and code)
    for preset in ("paper", "reference_code"):
        config, p, _ = resolve("infuser", preset=preset)
        assert (p.minibatch_prompts * p.group_size, config.train.epochs) == (256, 1)
    # Agent0: the curriculum 512 prompts x 4 in AdamW steps of 128 prompts (EasyR1's global_batch_size), the executor
    # 128 tasks x 16 episodes in one step (ppo_mini_batch_size 128), 1 epoch each (paper and code)
    for preset in ("paper", "reference_code"):
        config, p, _ = resolve("agent0", preset=preset)
        q, s = config.roles["questioner"], config.roles["solver"]
        assert (p.questioner_prompts * p.questioner_group // q.mini_batch_size, q.epochs) == (4, 1), preset
        assert (p.solver_questions * p.solver_group // s.mini_batch_size, s.epochs) == (1, 1), preset
    # PasoDoble: one step per batch for both roles in the paper; the code's Solver steps every 2 sequences
    for preset, solver_mini_batch in (("paper", 0), ("reference_code", 2)):
        roles = resolve("pasodoble", preset=preset)[0].roles
        assert (roles["proposer"].mini_batch_size, roles["proposer"].epochs, roles["solver"].mini_batch_size,
                roles["solver"].epochs) == (0, 1, solver_mini_batch, 1), preset


def test_pasodoble_counts_updates():
    config, paper, _ = resolve("pasodoble", preset="paper")
    assert paper.max_updates == 600 and config.steps == 2000  # 600 updates within at most 2000 iterations
    config, code, _ = resolve("pasodoble", preset="reference_code")
    assert code.max_updates is None and config.steps == 2000  # the code's loop counts iterations
    for preset in ("small", "small_offline"):
        assert resolve("pasodoble", preset=preset)[1].proposer_max_tokens >= 96


# ttrl: TTRL's §4 (MATH-500: 64 votes, 32 trained, lr 5e-7 cosine, 3072 tokens) and its released verl scripts (every
# one: the actor's KL loss 0.001, verl's low_var_kl clamped to [-10, 10]; training top-p 1, verl's default; verl's dual
# clip 3 and weight decay 0.01; the general-model scripts' temperature 0.6, which SmolLM2 takes); the code adds a 3%
# warm-up and verl's token-mean loss
TTRL_CODE = {"vote_samples": 64, "train_samples": 32, "questions_per_step": 32, "pool_source": "math500",
             "subset": "first", "config.rollout.temperature": 0.6, "config.rollout.top_p": 1.0,
             "config.rollout.max_new_tokens": 3072, "train.lr": 5e-7, "train.lr_schedule": "cosine",
             "train.kl_beta": 1e-3, "train.kl_clamp": 10.0, "train.dual_clip": 3.0, "train.weight_decay": 0.01}
TTRL_TABLE = {
    "paper": {**TTRL_CODE, "pool_size": 500, "config.steps": 160, "train.lr_warmup_ratio": 0.0,
              "train.loss_agg": "seq_mean"},
    "reference_code": {**TTRL_CODE, "train.lr_warmup_ratio": 0.03, "train.loss_agg": "token_mean"},
}


@pytest.mark.parametrize("preset", sorted(TTRL_TABLE))
def test_ttrl_presets(preset):
    for key, want in TTRL_TABLE[preset].items():
        assert resolved("ttrl", preset, key) == want, key
    config, p, _ = resolve("ttrl", preset=preset)
    # verl's ppo_mini_batch_size 1 prompt = 32 sequences: 32 AdamW steps per rollout batch of 32 prompts, 1 epoch
    assert (p.questions_per_step * p.train_samples // config.train.mini_batch_size, config.train.epochs) == (32, 1)
