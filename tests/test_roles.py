"""roles.py: a sampler with its own copy of the weights (here the HF engine's bf16 copy, as on a GPU) sees every
change of weights the trainer publishes (an update, a load, a phase's re-initialisation, a resume), and a write that
is not published leaves it on the old weights, which the check below detects."""

from __future__ import annotations

import helpers
import torch

from coevolve.loop import _Run, run
from coevolve.rollout import SamplingParams
from coevolve.store import RunStore

BF16 = ["rollout.dtype=bf16", "rollout.max_new_tokens=4", "eval_sets=[]"]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=2)


def sampled_is_live(engine, model: torch.nn.Module) -> bool:
    """Whether the weights the engine sampled its last call with are the live model's (in the sampler's dtype)."""
    copy = engine.copy.model
    assert copy is not None, "the engine did not sample from its own copy"
    live = dict(model.named_parameters())
    return all(torch.equal(p, live[name].detach().to(p.dtype)) for name, p in copy.named_parameters())


def sample(recipe, policy) -> None:
    recipe.engine(policy).generate(["Q:1+2=?\n"], GREEDY, seed=0)


def test_an_update_and_a_load_reach_the_sampler(random_model_dir):
    recipe = helpers.make_recipe("grpo", random_model_dir, *BF16, "train.lr=1e-2")
    policy, trainer = recipe.solver(), recipe.trainers()["solver"]
    sample(recipe, policy)
    assert sampled_is_live(recipe.engine(policy), policy.model)
    version = trainer.weights_version
    trainer.update(helpers.random_samples([[1, 5, 6]], [3, 4], advantages=(1.0, -1.0)))
    assert trainer.weights_version == version + 1
    sample(recipe, policy)
    assert sampled_is_live(recipe.engine(policy), policy.model)
    state = {k: v + 0.5 for k, v in policy.model.state_dict().items()}
    trainer.load_weights(state)
    sample(recipe, policy)
    assert sampled_is_live(recipe.engine(policy), policy.model)


def test_an_update_that_steps_nothing_publishes_nothing(random_model_dir):
    recipe = helpers.make_recipe("grpo", random_model_dir, *BF16)
    trainer = recipe.trainers()["solver"]
    trainer.update([])
    assert trainer.weights_version == 0


def test_a_phase_reinitialisation_reaches_the_sampler(random_model_dir):
    """Prism's SolverInit: at the questioner phase of iteration 2, Q_2 <- S_1; the questioner's sampler sees it."""
    recipe = helpers.make_recipe("r_zero", random_model_dir, *BF16, "params.questioner_init=solver",
                                 "params.questioner_steps=1", "params.solver_steps=1")
    questioner = recipe.questioner
    sample(recipe, questioner)
    with torch.no_grad():
        next(recipe.solver_policy.model.parameters()).add_(1.0)
    recipe.start_phase(recipe.schedule.at(3))  # iteration 2's questioner phase starts
    sample(recipe, questioner)
    assert sampled_is_live(recipe.engine(questioner), questioner.model)
    assert torch.equal(next(questioner.model.parameters()), next(recipe.solver_policy.model.parameters()))


def test_a_resume_reaches_the_sampler(tmp_path, random_model_dir):
    trained = helpers.make_recipe("grpo", random_model_dir, *BF16, "steps=1", "train.lr=1e-2")
    run(trained, trained.config, tmp_path / "run", progress=False)
    resumed = helpers.make_recipe("grpo", random_model_dir, *BF16, "steps=2")
    policy = resumed.solver()
    sample(resumed, policy)  # the sampler holds the start weights
    _Run(resumed, resumed.config, RunStore(tmp_path / "run")).begin(resume=True)
    assert torch.equal(next(policy.model.parameters()), next(trained.solver().model.parameters()))
    sample(resumed, policy)
    assert sampled_is_live(resumed.engine(policy), policy.model)


def test_a_write_that_is_not_published_is_detected(random_model_dir):
    """The negative control: weights written behind the trainer's back (no publish) leave the sampler on the old
    weights, and the check above sees it; so each test above would fail if its path skipped the publish."""
    recipe = helpers.make_recipe("grpo", random_model_dir, *BF16)
    policy = recipe.solver()
    sample(recipe, policy)
    with torch.no_grad():
        next(policy.model.parameters()).add_(1.0)  # an in-place write: torch's _version moves, the published one not
    sample(recipe, policy)
    assert not sampled_is_live(recipe.engine(policy), policy.model)
    recipe.trainers()["solver"].publish_weights()
    sample(recipe, policy)
    assert sampled_is_live(recipe.engine(policy), policy.model)
