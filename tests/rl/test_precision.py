"""Precision and memory settings: bf16 mixed precision, gradient checkpointing, LoRA (only adapters train)."""

from __future__ import annotations

import json

import torch
from helpers import random_samples, records
from safetensors.torch import load_file

from coevolve.rl.trainer import PolicyTrainer, TrainSample, UpdateSettings


def samples_for(policy, n: int = 8) -> list[TrainSample]:
    prompts = [policy.tokenizer(f"Q:{i}+{i}=?\n")["input_ids"] for i in range(n)]
    return random_samples(prompts, [6 + i % 3 for i in range(n)], tokens=(5, 60), rollout_logprob=-3.0,
                          advantages=(1.0, -1.0))


def gradient_after_one_update(policy, **settings) -> tuple[dict[str, float], torch.Tensor]:
    model = type(policy.model)(policy.model.config)
    model.load_state_dict(policy.model.state_dict())
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    trainer = PolicyTrainer(model, policy.tokenizer, UpdateSettings(lr=1e-3, micro_batch_size=4, **settings))
    stats = trainer.update(samples_for(policy))
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32
    return stats, after - before


def test_bf16_and_gradient_checkpointing_train_like_fp32(random_policy):
    _, reference = gradient_after_one_update(random_policy)
    stats_ckpt, with_checkpointing = gradient_after_one_update(random_policy, gradient_checkpointing=True)
    assert stats_ckpt["optimizer_steps"] == 1
    assert torch.allclose(with_checkpointing, reference, atol=1e-6)  # recomputation changes nothing
    stats_bf16, bf16 = gradient_after_one_update(random_policy, dtype="bf16")
    assert stats_bf16["optimizer_steps"] == 1 and torch.isfinite(torch.tensor(stats_bf16["loss"]))
    cosine = torch.nn.functional.cosine_similarity(bf16, reference, dim=0)
    assert cosine > 0.95, float(cosine)  # the same update up to bf16 rounding


def test_lora_trains_only_adapters_and_checkpoints_hold_them(random_model_dir, tmp_path):
    from coevolve.loop import run
    from coevolve.recipes import resolve

    config, params, cls = resolve("grpo", sets=[
        f"model={random_model_dir}", "steps=1", "params.questions_per_step=2", "params.group_size=2",
        "rollout.max_new_tokens=8", "eval_sets=[]", "train.lora.r=4", "train.lora.target_modules=[q_proj,v_proj]"])
    recipe = cls(config, params)
    model = recipe.trainer.model
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    recipe.trainer.update(samples_for(recipe.policy))
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert any(not torch.equal(p, trainable[n]) for n, p in model.named_parameters() if n in trainable)
    run(recipe, config, tmp_path / "run", progress=False)
    saved = load_file(str(tmp_path / "run" / "checkpoints" / "step_000001" / "solver.safetensors"))
    assert any("lora_A" in k for k in saved) and any("lora_B" in k for k in saved)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 1


def test_offloading_the_idle_role_moves_it_and_changes_no_result(random_model_dir):
    """train.offload_idle_role: every forward pass (sampling, dev gradient, influence, both updates) runs on the
    resident role; a step computes what it computes without offloading; activation moves weights and AdamW state."""
    from test_infuser import make_recipe

    from coevolve.rl.residency import Residency

    plain = make_recipe(random_model_dir).step(1)
    recipe = make_recipe(random_model_dir, "train.offload_idle_role=true")
    residency = recipe._runtime.residency
    assert {id(t) for t in residency.trainers} == {id(t) for t in recipe.trainers().values()}
    ran = []

    def must_be_resident(model, *_):
        assert residency.resident is not None and residency.resident.model is model
        ran.append(model)

    for trainer in recipe.trainers().values():
        trainer.model.register_forward_pre_hook(must_be_resident)
    offloaded = recipe.step(1)
    assert {id(m) for m in ran} == {id(t.model) for t in recipe.trainers().values()}
    assert [r["reward"] for r in records(offloaded)] == [r["reward"] for r in records(plain)]
    assert offloaded.metrics["solver/loss"] == plain.metrics["solver/loss"]

    # The move itself, to a stand-in device (meta holds no data: only placement is checked).
    solver, generator = recipe.solver_trainer, recipe.generator_trainer
    moving = Residency(torch.device("meta"))
    moving.register(solver)
    moving.register(generator)
    assert solver.optimizer.state and generator.optimizer.state  # both roles were updated: AdamW state to move
    moving.activate(solver)
    assert all(p.device.type == "meta" for p in solver.model.parameters())
    assert all(v.device.type == "meta" for state in solver.optimizer.state.values()
               for k, v in state.items() if k != "step")
    assert all(p.device.type == "cpu" for p in generator.model.parameters())
    assert all(v.device.type == "cpu" for state in generator.optimizer.state.values() for v in state.values())
