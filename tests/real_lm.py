"""The two-step runs of the real-LM loop tests (tests/test_real_lm_loop.py, tests/test_real_lm_warmup_loop.py): each
two-role recipe on smollm2-135m at the smallest sizes whose two steps contain a solver phase, with format help on."""

from __future__ import annotations

import json
import shutil

COMMON = ["task=math", "steps=2", "eval_sets=[]", "checkpoint_every=100", "rollout.max_new_tokens=48",
          "params.format_constraint=true", "params.solver_format_constraint=true"]
# Per recipe: the smallest sizes whose two steps contain a solver phase, with the help the experiment chose
# (experiments/real_lm/README.md).
R_ZERO_SIZES = ["params.questioner_steps=1", "params.solver_steps=1", "params.questioner_prompts=2",
                "params.questioner_group=2", "params.score_samples=2", "params.pool_size=4", "params.label_samples=4",
                "params.band=[0.0,1.0]", "params.solver_questions=2", "params.solver_group=8",
                "params.question_max_tokens=128"]
CASES = {
    "r_zero": R_ZERO_SIZES,
    "prism": R_ZERO_SIZES,  # R-Zero's schedule
    "pasodoble": ["params.passages_per_step=1", "params.proposals=4", "params.solutions=6", "params.tau_low=0.0",
                  "params.knowledge_pool_size=20", "params.proposer_max_tokens=224", "rollout.max_new_tokens=96"],
    "infuser": ["params.documents_per_step=1", "params.group_size=4", "params.minibatch_prompts=1",
                "params.dev_size=2", "params.document_pool_size=20", "params.document_min_tokens=100",
                "params.document_max_tokens=400", "params.generator_max_tokens=128"],
    "opensir": ["params.batch_size=4", "params.group_size=2", "params.teacher_upscale=1",
                "rollout.max_new_tokens=144", "params.l_base=144", "params.l_cap=144"],
    "dynamic_rl": ["params.n=4", "params.m=4", "params.question_max_tokens=128"],
    # AZR in the python world: deduction and abduction (induction's checks are tests/tasks/test_python_world.py's;
    # with it the two steps took 5 CPU-minutes), 2 tasks per type and role, 2 learnability rollouts, 96 tokens for a
    # proposal (64 cut 2 of 6 short in a measured run); seeding stops after one round (tests/test_real_lm_loop.py)
    "azr": ["task=python", "params.task_types=[deduction,abduction]", "rollout.max_new_tokens=64",
            "params.proposer_max_tokens=96", "params.batch_size=2", "params.references=1",
            "params.learnability_samples=2", "params.seed_batch_factor=1", "params.seed_max_rounds=1",
            "params.execution_timeout_s=5", "params.execution_workers=2"],
}
# Agent0 after its executor's tool warm-up (below): R-Zero's sizes, episodes of at most 2 calls in 64 tokens, all 4
# pool tasks x 6 episodes per executor step (with R-Zero's 2 x 8 one measured run had no group with both a right and a
# wrong answer); the solver's answer-format constraint would forbid the python block (the warm-up is its format help).
CASES["agent0"] = [*R_ZERO_SIZES, "rollout.max_new_tokens=64", "rollout.max_tool_calls=2", "params.solver_questions=4",
                   "params.solver_group=6", "params.solver_format_constraint=false"]
SOLVER_STEPS = {"opensir": "policy/optimizer_steps", "dynamic_rl": "policy/optimizer_steps",
                "azr": "policy/optimizer_steps"}
# The format warm-up (`coevolve sft` keys) of the recipes whose solver must agree with the generator's answer.
# INFUSER's 4 steps suffice. PasoDoble needs 16 steps: after 4, 8 or 12 steps of 4 no question was retained in the
# two steps; 16 of 2 (here) retain 2 in step 2, the experiment's 16 of 4 in both (experiments/real_lm/README.md).
# Agent0's is the tool warm-up of its executor (both roles start from it, as both start from M_0): 4 steps of 4
# arithmetic episodes (loss 1.16 -> 0.02); without it no episode of 16 wrote a python block.
WARMUP = {"pasodoble": {"examples": 32, "steps": 16, "batch_size": 2, "lr": 5e-5},
          "infuser": {"examples": 16, "steps": 4, "batch_size": 4, "lr": 1e-4, "max_tokens": 448},
          "agent0": {"warmup": "tools", "examples": 16, "steps": 4, "batch_size": 4, "lr": 1e-4}}


def two_steps(recipe: str, model_dir: str, tmp_path) -> list[dict]:
    """The metrics rows of a two-step run of ``recipe`` on ``model_dir`` (after its format warm-up, where it has
    one)."""
    from coevolve.loop import run
    from coevolve.recipes import resolve
    from coevolve.sft import resolve_sft, run_sft

    sets = [f"model={model_dir}", *COMMON, *CASES[recipe]]
    if recipe == "prism":  # its cluster space from 64 GSM8K-train questions: seconds (the default corpus: minutes)
        from coevolve.embeddings import ClusterSpace
        from coevolve.rewards.coverage import reference_questions

        questions, info = reference_questions("gsm8k_train")
        ClusterSpace.build(questions[:64], 8, seed=0, info=info).save(tmp_path / "space")
        sets.append(f"params.cluster_space={tmp_path / 'space'}")
    if recipe in WARMUP:
        run_sft(resolve_sft(recipe, {"model": model_dir, **WARMUP[recipe]}), tmp_path / "sft", progress=False)
        tools = WARMUP[recipe].get("warmup") == "tools"
        sets.append(f"model={tmp_path / 'sft' / 'model'}" if tools else f"params.generator_init={tmp_path / 'sft'}")
    cfg, params, cls = resolve(recipe, sets=sets)
    run(cls(cfg, params), cfg, tmp_path / "run", progress=False)
    for weights in (tmp_path / "run" / "checkpoints", tmp_path / "sft" / "model"):  # 0.5-3 GB; pytest keeps 3 runs
        shutil.rmtree(weights, ignore_errors=True)
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def solver_updates(recipe: str, rows: list[dict]) -> list[int]:
    """The steps in which the recipe's solver took an optimizer step with a non-zero advantage."""
    key = SOLVER_STEPS.get(recipe, "solver/optimizer_steps")
    return [r["step"] for r in rows if r.get(key, 0) >= 1 and (r.get("solver/advantage_abs_mean") or 0) > 0]
