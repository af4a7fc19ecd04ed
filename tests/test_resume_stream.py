"""Resume restores the data stream, for every registered recipe: a run resumed from the checkpoint of step S-1 draws
at step S the questions (and samples the completions) the uninterrupted run drew, and ends step S with the same
recipe state (generator pools, R-Zero's and Prism's solver pool, AZR's buffers, TTRL's pool, PasoDoble's history,
INFUSER's document stream). In process, on random tiny models, a few steps each."""

from __future__ import annotations

import json
import shutil
import zlib

import numpy as np
import pytest

from coevolve.embeddings import ClusterSpace
from coevolve.loop import run
from coevolve.recipes import RECIPES, resolve
from coevolve.recipes.r_zero import Question

STEPS = 3  # the resume re-runs step 3 from the checkpoint of step 2
# What makes each recipe cheap, and puts step 3 where its stream is stateful: R-Zero's and Prism's solver phase
# (questioner step 1 fills the pool, solver steps 2-3 draw from it), PasoDoble's solver phase.
TWO_PHASES = ["params.questioner_steps=1", "params.solver_steps=2", "params.questioner_prompts=2",
              "params.questioner_group=2", "params.score_samples=2", "params.label_samples=2",
              "params.label_max_tokens=24", "params.pool_size=4", "params.band=[0,1]",
              "params.solver_questions=2", "params.solver_group=2"]
SETTINGS: dict[str, list[str]] = {
    "agent0": TWO_PHASES,  # with the python tool on (its default): the random model asks for no call
    "azr": ["params.batch_size=1", "params.seed_batch_factor=2", "params.learnability_samples=2",
            "params.references=1", "params.induction_inputs=2", "params.seed_max_rounds=2",
            "rollout.max_new_tokens=24"],
    "dynamic_rl": ["params.n=4", "params.m=2"],
    "grpo": ["params.questions_per_step=2", "params.group_size=2"],
    "infuser": ["params.documents_per_step=2", "params.group_size=2", "params.dev_size=4", "params.dev_rollouts=2",
                "params.minibatch_prompts=2", "params.generator_max_tokens=8", "params.document_source=arith"],
    "opensir": ["params.batch_size=4", "params.group_size=2"],
    "pasodoble": ["params.passages_per_step=1", "params.proposals=2", "params.solutions=2",
                  "params.proposer_max_tokens=8", "params.knowledge_source=arith", "params.proposer_steps=1",
                  "params.solver_steps=2"],
    "prism": TWO_PHASES,
    "r_zero": TWO_PHASES,
    "spice": ["params.documents_per_step=2", "params.challenger_samples=2", "params.reasoner_samples=2",
              "params.challenger_max_tokens=8", "params.document_source=arith"],
    "ttrl": ["params.pool_size=8", "params.questions_per_step=2", "params.vote_samples=2", "params.train_samples=2",
             "params.subset=random"],
}


def _recipe(name: str, model_dir, space_dir):
    config, params, cls = resolve(name, preset="small", sets=[
        f"model={model_dir}", "eval_sets=[]", f"steps={STEPS}", "checkpoint_every=1", f"keep_checkpoints={STEPS}",
        "rollout.max_new_tokens=8", "train.micro_batch_size=8", *SETTINGS[name],
        *([f"params.cluster_space={space_dir}"] if name == "prism" else [])])
    recipe = cls(config, params)
    if name in ("r_zero", "prism", "agent0"):  # the test build writes no valid question: each output reads as one
        # made of it
        recipe.read_question = lambda output: Question(output, _made_question(output.text), None)
    if name == "prism":  # four hand-made clusters instead of a sentence encoder's (which takes half a minute)
        recipe.embed_texts = lambda texts: np.eye(4, dtype=np.float32)[[zlib.crc32(t.encode()) % 4 for t in texts]]
    return recipe, config


def _made_question(text: str) -> str:
    """A sum that depends on the whole output (what a stub with a counter would not: the counter restarts)."""
    h = zlib.crc32(text.encode())
    return f"{1 + h % 9}+{1 + h // 9 % 9}"


def _samples(run_dir, step: int) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()]


def _recipe_state(run_dir, step: int) -> dict:
    """The recipe's part of a checkpoint (its pools and buffers) and each role's update count."""
    saved = json.loads((run_dir / "checkpoints" / f"step_{step:06d}" / "state.json").read_text())["recipe"]
    return {"recipe": saved["loop_recipe"], "updates_done": saved["updates_done"]}


def test_every_recipe_has_settings_here():
    assert sorted(SETTINGS) == sorted(RECIPES)


@pytest.fixture(scope="module")
def space_dir(tmp_path_factory):
    """Prism's cluster space: the unit vectors of a 4-d space."""
    folder = tmp_path_factory.mktemp("space")
    ClusterSpace(np.eye(4, dtype=np.float32), seed=0, encoder="hand", corpus_sha256="x", n_corpus=4).save(folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_resume_draws_what_the_uninterrupted_run_draws(name, tmp_path, small_tiny_arith, space_dir, request):
    """On the tiny test builds, which write valid questions now and then (a random model never does, and the
    generator pools would stay empty); 26 s for all nine on 2 cores, AZR 6 s of it."""
    model_dir = request.getfixturevalue("small_tiny_program" if name == "azr" else "small_tiny_arith")[1]
    straight = tmp_path / "straight"
    recipe, config = _recipe(name, model_dir, space_dir)
    run(recipe, config, straight, progress=False)
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / f"step_{STEPS:06d}")
    (resumed / "summary.json").unlink()
    recipe, config = _recipe(name, model_dir, space_dir)  # a fresh recipe: what a new process builds
    run(recipe, config, resumed, resume=True, progress=False)
    drawn, expected = _samples(resumed, STEPS), _samples(straight, STEPS)
    assert drawn and [r["prompt"] for r in drawn] == [r["prompt"] for r in expected]
    assert drawn == expected  # the same completions, labels and rewards too
    assert _recipe_state(resumed, STEPS) == _recipe_state(straight, STEPS)
