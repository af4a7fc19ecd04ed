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


def planned_runtime(random_policy, monkeypatch, *sets: str, fill: float, cuda: bool = True, torchao: bool = True):
    """A two-role runtime whose device reads as CUDA with ``fill`` x (one role's full training state) + the workspace
    usable (within HEADROOM), torchao installed or not (no trainer is built: the plan only asks whether it is), and
    the settings of its first role."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if torchao else None) if name == "torchao" else real(name, *a))
    from coevolve.memory import HEADROOM, ModelShape, role_state_bytes, training_workspace_bytes
    from coevolve.recipes import resolve
    from coevolve.rl import logprob_head
    from coevolve.roles import HEAD_BYTES_PER_LOGIT, RoleRuntime

    config = resolve("r_zero", sets=list(sets))[0]
    runtime = RoleRuntime(config, models=2)
    model = random_policy.model
    parameters = sum(p.numel() for p in model.parameters())
    role = role_state_bytes(parameters, parameters, eight_bit=False, bf16=True, sampler_copy=True, reference=False)
    workspace = training_workspace_bytes(ModelShape.of(model.config), dtype_bytes=2,
                                         head_bytes=HEAD_BYTES_PER_LOGIT * logprob_head.HEAD_CHUNK_LOGITS)
    if cuda:
        runtime.device = torch.device("cuda")
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 0)
        usable = int((workspace + fill * role) / HEADROOM)
        monkeypatch.setattr("coevolve.roles.free_device_memory", lambda device: usable)
    return runtime, runtime.update_settings(random_policy, None, constrained=False)


def test_on_cuda_unset_settings_take_the_memory_plan_logged_once(random_policy, monkeypatch, caplog):
    with caplog.at_level("INFO", logger="coevolve.roles"):
        runtime, settings = planned_runtime(random_policy, monkeypatch, fill=1.5)  # one role fits, two do not
        runtime.update_settings(random_policy, None, constrained=False)  # the second role: the same plan
    assert runtime.residency is not None and settings.optimizer == "adamw" and settings.lora is None
    assert [r.getMessage() for r in caplog.records if "memory plan" in r.getMessage()] == [
        f"memory plan for 2 model(s) of 0.00B parameters in {runtime.state_plan.budget_bytes / 0.85 / 2**30:.1f} GiB: "
        f"{runtime.state_plan.describe()}"]
    assert "the idle role waits in host memory:" in caplog.text


def test_the_plan_keeps_explicit_settings_and_chooses_lora_only_when_allowed(random_policy, monkeypatch):
    runtime, settings = planned_runtime(random_policy, monkeypatch, "train.offload_idle_role=false", fill=1.5)
    assert runtime.residency is None and settings.optimizer == "adamw_8bit", runtime.state_plan  # 2 x 14 of 30 fit
    runtime, settings = planned_runtime(random_policy, monkeypatch, "train.optimizer=adamw", fill=0.5)
    assert runtime.residency is not None and settings.optimizer == "adamw" and settings.lora is None
    assert not runtime.state_plan.fits
    runtime, settings = planned_runtime(random_policy, monkeypatch, "train.optimizer=adamw",
                                        "train.lora_if_needed=true", fill=0.5)
    assert settings.lora == {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear"}


def test_off_cuda_nothing_is_planned(random_policy, monkeypatch):
    runtime, settings = planned_runtime(random_policy, monkeypatch, "train.lora_if_needed=true", fill=0.0, cuda=False)
    assert runtime.state_plan is None and runtime.residency is None
    assert settings.optimizer == "adamw" and settings.lora is None


def test_without_torchao_the_plan_never_chooses_8_bit_moments(random_policy, monkeypatch):
    runtime, settings = planned_runtime(random_policy, monkeypatch, "train.offload_idle_role=false", fill=1.5,
                                        torchao=False)
    assert settings.optimizer == "adamw" and not runtime.state_plan.fits
