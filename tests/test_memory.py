"""Memory planning (coevolve.memory) with given memory figures: the arithmetic, the HF engine's planned batches and
out-of-memory retries, and the trainer's planned passes. The CUDA readings themselves are not exercised here."""

from __future__ import annotations

import pytest
import torch
from helpers import random_samples

from coevolve.config import SamplingConfig
from coevolve.memory import (
    CPU_BATCH_SIZE,
    HEADROOM,
    ModelShape,
    TrainingPass,
    layer_activation_bytes,
    plan_sampling_rows,
    plan_training_pass,
    plan_training_state,
    role_state_bytes,
    sampling_bytes,
    training_bytes_per_token,
    training_workspace_bytes,
)
from coevolve.rollout import SamplingParams
from coevolve.rollout.hf import HFRolloutEngine
from coevolve.rollout.static_decode import BUCKETS

QWEN_1_5B = ModelShape(layers=28, hidden=1536, intermediate=8960, heads=12, kv_heads=2, head_dim=128, vocab=151936)
GIB = 2**30


def test_the_kv_cache_of_a_qwen_1_5b_token_is_28_7_kb_in_bf16():
    from transformers import Qwen2Config

    config = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936)
    assert ModelShape.of(config) == QWEN_1_5B
    assert QWEN_1_5B.kv_bytes_per_token(2) == 28 * 2 * 2 * 128 * 2 == 28672


def test_sampling_memory_grows_with_rows_and_tokens_and_the_cache_dominates_long_budgets():
    def gib(rows, new):
        return sampling_bytes(QWEN_1_5B, rows, 256 + new, new, 256, dtype_bytes=2, truncated=True) / GIB

    assert gib(256, 4096) > gib(128, 4096) > gib(256, 512)
    cache = 256 * (256 + 4096) * 28672 / GIB  # 29.7 GiB: the README's "about 30 GB per role"
    assert cache < gib(256, 4096) < 1.3 * cache


@pytest.mark.parametrize("free_gib", [2, 12, 40, 75])
def test_a_planned_batch_fits_and_the_next_bucket_would_not(free_gib):
    new, prompt = 4096, 256
    slots = prompt + new
    rows = plan_sampling_rows(free_gib * GIB, QWEN_1_5B, 2048, prompt, new, slots, dtype_bytes=2, truncated=True,
                              buckets=BUCKETS)

    def need(r):
        return sampling_bytes(QWEN_1_5B, r, slots, new, prompt, dtype_bytes=2, truncated=True)

    assert rows in BUCKETS or rows < BUCKETS[0]
    assert rows == 1 or need(rows) <= HEADROOM * free_gib * GIB
    bigger = next(b for b in BUCKETS if b > rows)
    assert need(bigger) > HEADROOM * free_gib * GIB


def test_a_call_that_fits_whole_is_one_batch_and_nothing_is_below_one_row():
    assert plan_sampling_rows(80 * GIB, QWEN_1_5B, 100, 128, 512, 640, dtype_bytes=2, truncated=False,
                              buckets=BUCKETS) == 100
    assert plan_sampling_rows(1, QWEN_1_5B, 100, 128, 512, 640, dtype_bytes=2, truncated=False, buckets=BUCKETS) == 1


def test_training_passes_take_the_cap_or_what_fits():
    every = training_bytes_per_token(QWEN_1_5B, dtype_bytes=2, checkpointed_layers=28)
    assert every < training_bytes_per_token(QWEN_1_5B, dtype_bytes=2, checkpointed_layers=0)
    assert plan_training_pass(80 * GIB, QWEN_1_5B, 16384, dtype_bytes=2, checkpointing=True) == TrainingPass(16384, 28)
    small = plan_training_pass(GIB, QWEN_1_5B, 16384, dtype_bytes=2, checkpointing=True)
    assert small == TrainingPass(int(HEADROOM * GIB) // every, 28) and small.tokens < 16384
    assert plan_training_pass(0, QWEN_1_5B, 16384, dtype_bytes=2, checkpointing=True).tokens == 1
    unchecked = plan_training_pass(GIB, QWEN_1_5B, 16384, dtype_bytes=2, checkpointing=False)
    assert unchecked.checkpointed_layers == 0 and unchecked.tokens < small.tokens


def test_selective_checkpointing_recomputes_the_fewest_layers_that_fit_a_full_pass():
    def plan(free_gib: float) -> TrainingPass:
        return plan_training_pass(int(free_gib * GIB), QWEN_1_5B, 16384, dtype_bytes=2, checkpointing=True,
                                  selective=True)

    def need_gib(layers: int) -> float:
        return 16384 * training_bytes_per_token(QWEN_1_5B, dtype_bytes=2, checkpointed_layers=layers) / HEADROOM / GIB

    assert plan(80) == TrainingPass(16384, 0)  # 1.5B: about 52 GiB of activations for 16,384 tokens, none recomputed
    assert 50 < need_gib(0) * HEADROOM < 55
    middle = plan(need_gib(0) / 2)
    assert 0 < middle.checkpointed_layers < 28 and middle.tokens == 16384
    assert need_gib(middle.checkpointed_layers) <= need_gib(0) / 2 < need_gib(middle.checkpointed_layers - 1)
    assert plan(1) == plan_training_pass(GIB, QWEN_1_5B, 16384, dtype_bytes=2, checkpointing=True)  # all, fewer tokens


@pytest.mark.parametrize("autocast", [True, False])
def test_a_decoder_layer_keeps_the_activation_bytes_the_plan_counts(autocast):
    """The per-layer figure against what autograd saves: the saved tensors of a 4-layer minus a 2-layer Qwen2, per
    token (a prime length, so that no weight's bf16 copy is counted as an activation)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokens = 257

    def saved_bytes(layers: int) -> int:
        config = Qwen2Config(hidden_size=128, intermediate_size=704, num_hidden_layers=layers, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=300, attn_implementation="sdpa")
        model = Qwen2ForCausalLM(config).train()
        storages: dict[int, int] = {}

        def keep(tensor: torch.Tensor) -> torch.Tensor:
            if tensor.numel() % tokens == 0:
                storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                hidden = model.model(input_ids=torch.randint(0, 300, (1, tokens))).last_hidden_state
        del hidden
        return sum(storages.values())

    per_layer = (saved_bytes(4) - saved_bytes(2)) / 2 / tokens
    shape = ModelShape(layers=4, hidden=128, intermediate=704, heads=4, kv_heads=2, head_dim=32, vocab=300)
    assert per_layer == pytest.approx(layer_activation_bytes(shape, 2 if autocast else 4), rel=0.02)


def test_rollout_batch_size_is_auto_or_a_positive_number():
    assert SamplingConfig().batch_size == "auto"
    assert SamplingConfig(batch_size=8).batch_size == 8
    for bad in (0, -4, "half"):
        with pytest.raises(ValueError):
            SamplingConfig(batch_size=bad)


PROMPTS = [f"Q:{i}+{i * 7}=?" for i in range(40)]
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=12)


def test_auto_batches_off_cuda_sample_as_batches_of_64(random_policy):
    auto = HFRolloutEngine(random_policy.model, random_policy.tokenizer, batch_size=None)
    fixed = HFRolloutEngine(random_policy.model, random_policy.tokenizer, batch_size=CPU_BATCH_SIZE)
    assert [c.token_ids for c in auto.generate(PROMPTS, PARAMS, seed=5)] == [
        c.token_ids for c in fixed.generate(PROMPTS, PARAMS, seed=5)]
    assert "rollout/planned_batch" not in auto.pop_metrics()


def test_a_planned_batch_samples_as_that_fixed_batch_and_halves_on_out_of_memory(random_policy, monkeypatch):
    """With 8 rows' worth of free memory the engine samples in batches of 8 (the seed contract: the same samples as
    batch_size=8); a batch that runs out of memory is halved and sampled again, as batch_size=4 would have."""
    import coevolve.rollout.hf as hf

    model, tokenizer = random_policy.model, random_policy.tokenizer
    shape = ModelShape.of(model.config)
    prompt = max(len(hf.encode_prompt(tokenizer, p)) for p in PROMPTS)
    slots = -(-(prompt + 12) // hf.SLOT_ROUNDING) * hf.SLOT_ROUNDING
    eight_rows = sampling_bytes(shape, 8, slots, 12, prompt, dtype_bytes=4, truncated=False) / HEADROOM + 1
    monkeypatch.setattr(hf, "free_device_memory", lambda device: int(eight_rows))
    planned = HFRolloutEngine(model, tokenizer, batch_size=None)
    got = planned.generate(PROMPTS, PARAMS, seed=5)
    assert planned.pop_metrics() == {"rollout/planned_batch": 8.0}
    fixed = HFRolloutEngine(model, tokenizer, batch_size=8).generate(PROMPTS, PARAMS, seed=5)
    assert [c.token_ids for c in got] == [c.token_ids for c in fixed]

    plain_batch = HFRolloutEngine._generate_batch

    def short_of_memory(self, model, prompts, prompt_ids, params, generator):
        if len(prompts) > 4:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return plain_batch(self, model, prompts, prompt_ids, params, generator)

    monkeypatch.setattr(HFRolloutEngine, "_generate_batch", short_of_memory)
    retried = HFRolloutEngine(model, tokenizer, batch_size=None).generate(PROMPTS, PARAMS, seed=5)
    monkeypatch.undo()
    halves = HFRolloutEngine(model, tokenizer, batch_size=4).generate(PROMPTS, PARAMS, seed=5)
    assert [c.token_ids for c in retried] == [c.token_ids for c in halves]

    monkeypatch.setattr(HFRolloutEngine, "_generate_batch", short_of_memory)
    with pytest.raises(torch.OutOfMemoryError):  # an explicit batch size is the user's: no retry
        HFRolloutEngine(model, tokenizer, batch_size=8).generate(PROMPTS, PARAMS, seed=5)


def test_planned_training_passes_give_the_same_update(random_policy, monkeypatch):
    """A budget lowered by the plan cuts the batch into more passes; the update is the same up to float error. The
    free memory first pays for what the update allocates itself (fp32: gradients and AdamW's two moments)."""
    import copy

    import coevolve.rl.trainer as trainer_module
    from coevolve.rl.trainer import PolicyTrainer, UpdateSettings

    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 40, (6,), generator=gen).tolist() for _ in range(8)]
    samples = random_samples(prompts, [10] * 8, rollout_logprob=-3.0, advantages=(1.0, -1.0))
    shape = ModelShape.of(random_policy.model.config)
    per_token = training_bytes_per_token(shape, dtype_bytes=4, checkpointed_layers=0)
    state = 3 * sum(4 * p.numel() for p in random_policy.model.parameters())
    monkeypatch.setattr(trainer_module, "free_device_memory",
                        lambda device: state + int(40 * per_token / HEADROOM) + 1)
    results = {}
    for fit in (False, True):
        model = copy.deepcopy(random_policy.model)
        settings = UpdateSettings(lr=1e-3, micro_batch_tokens=1000, fit_memory=fit)
        stats = PolicyTrainer(model, random_policy.tokenizer, settings).update(samples)
        results[fit] = stats, torch.cat([p.detach().flatten() for p in model.parameters()])
    assert "pass_tokens" not in results[False][0]
    assert results[True][0]["pass_tokens"] == 40
    assert results[True][0]["loss"] == pytest.approx(results[False][0]["loss"], abs=1e-6)
    torch.testing.assert_close(results[True][1], results[False][1], atol=1e-6, rtol=1e-5)


def test_selective_checkpointing_recomputes_the_planned_layers_and_updates_alike(random_policy, monkeypatch):
    """Memory for a full pass with three of six layers checkpointed: those recompute, the others keep their
    activations, and the update equals the update with every layer checkpointed and with none."""
    import copy

    from transformers import LlamaForCausalLM

    import coevolve.rl.trainer as trainer_module
    from coevolve.rl.compiled_layers import decoder_layers
    from coevolve.rl.trainer import PolicyTrainer, UpdateSettings

    torch.manual_seed(0)
    six_layers = LlamaForCausalLM(random_policy.model.config.__class__(
        **{**random_policy.model.config.to_dict(), "num_hidden_layers": 6})).eval()

    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 40, (6,), generator=gen).tolist() for _ in range(8)]
    samples = random_samples(prompts, [10] * 8, rollout_logprob=-3.0, advantages=(1.0, -1.0))
    shape = ModelShape.of(six_layers.config)
    three = training_bytes_per_token(shape, dtype_bytes=4, checkpointed_layers=3)
    state = 3 * sum(4 * p.numel() for p in six_layers.parameters())
    monkeypatch.setattr(trainer_module, "free_device_memory", lambda device: state + int(128 * three / HEADROOM) + 1)
    results = {}
    for name, selective, checkpointing in (("selective", True, True), ("every", False, True), ("none", False, False)):
        model = copy.deepcopy(six_layers)
        settings = UpdateSettings(lr=1e-3, micro_batch_tokens=128, fit_memory=name == "selective",
                                  gradient_checkpointing=checkpointing, selective_checkpointing=selective)
        trainer = PolicyTrainer(model, random_policy.tokenizer, settings)
        stats = trainer.update(samples)
        results[name] = stats, torch.cat([p.detach().flatten() for p in model.parameters()])
        if name == "selective":
            assert [layer.gradient_checkpointing for layer in decoder_layers(model)] == [True] * 3 + [False] * 3
            assert stats["checkpointed_layers"] == trainer.checkpointed_layers == 3
            assert stats["pass_tokens"] == 128
    for name in ("every", "none"):
        assert results["selective"][0]["loss"] == pytest.approx(results[name][0]["loss"], abs=1e-6)
        torch.testing.assert_close(results["selective"][1], results[name][1], atol=1e-6, rtol=1e-5)


# Qwen2.5-1.5B's parameters (tied embeddings) and the workspace the run gives the plan (roles.HEAD_BYTES_PER_LOGIT x
# logprob_head.HEAD_CHUNK_LOGITS: 3 GiB, and a pass of 2,048 tokens with every layer checkpointed: 0.78 GiB).
QWEN_1_5B_PARAMETERS = 1_543_714_304
WORKSPACE = training_workspace_bytes(QWEN_1_5B, dtype_bytes=2, head_bytes=12 * 2**28)


def two_role_plan(usable_gib: float, *, offload=None, optimizer=None, lora=False, reference=False, models=2):
    return plan_training_state(int(usable_gib * GIB), QWEN_1_5B, QWEN_1_5B_PARAMETERS, models,
                               workspace_bytes=WORKSPACE, bf16=True, sampler_copy=True, reference=reference,
                               offload=offload, optimizer=optimizer, lora=lora)


def test_a_1_5b_role_holds_20_bytes_a_parameter_and_8_bit_moments_save_6():
    """fp32 weights 4 + gradients 4 + AdamW moments 8 + autocast's bf16 copies 2 + the sampler's bf16 copy 2."""
    full = role_state_bytes(QWEN_1_5B_PARAMETERS, QWEN_1_5B_PARAMETERS, eight_bit=False, bf16=True,
                            sampler_copy=True, reference=False)
    eight = role_state_bytes(QWEN_1_5B_PARAMETERS, QWEN_1_5B_PARAMETERS, eight_bit=True, bf16=True,
                             sampler_copy=True, reference=False)
    assert full == 20 * QWEN_1_5B_PARAMETERS
    assert full - eight == pytest.approx(6 * QWEN_1_5B_PARAMETERS, rel=0.01)  # 8 bytes of moments -> 2 + 1/32
    assert WORKSPACE / GIB == pytest.approx(3.78, abs=0.01)


def test_at_80_gib_two_1_5b_roles_need_nothing():
    plan = two_role_plan(80)
    assert plan.fits and not plan.offload_idle_role and plan.optimizer == "adamw" and not plan.lora
    assert plan.needed_bytes / GIB == pytest.approx(61.3, abs=0.1)  # measured peak of an r_zero step: 60 GiB
    assert "nothing changed" in plan.describe() and "fits" in plan.describe()


def test_at_40_gib_the_idle_role_is_offloaded_and_at_32_its_moments_are_8_bit_too():
    assert (two_role_plan(40).offload_idle_role, two_role_plan(40).optimizer) == (True, "adamw")
    plan = two_role_plan(32)
    assert plan.fits and plan.offload_idle_role and plan.optimizer == "adamw_8bit" and not plan.lora
    assert "8-bit AdamW moments" in plan.describe()


def test_at_24_gib_full_training_does_not_fit_and_lora_is_chosen_only_when_allowed():
    refused = two_role_plan(24)  # LoRA not allowed: the leanest full fine-tuning, said not to fit
    assert not refused.fits and refused.offload_idle_role and refused.optimizer == "adamw_8bit" and not refused.lora
    assert refused.needed_bytes / GIB == pytest.approx(24.0, abs=0.1)
    assert refused.budget_bytes == int(24 * GIB * HEADROOM)
    assert "does NOT fit" in refused.describe()
    allowed = two_role_plan(24, lora=None)  # train.lora_if_needed
    assert allowed.fits and allowed.lora and allowed.offload_idle_role and allowed.optimizer == "adamw"
    assert allowed.needed_bytes / GIB == pytest.approx(12.5, abs=0.1)
    assert "LoRA adapters" in allowed.describe()


def test_explicit_settings_are_kept_whatever_the_memory():
    kept = two_role_plan(32, offload=False, lora=None)  # offloading refused: both roles resident, on adapters
    assert not kept.offload_idle_role and kept.lora and kept.optimizer == "adamw" and kept.fits
    plain = two_role_plan(24, optimizer="adamw", offload=True)
    assert plain.optimizer == "adamw" and plain.offload_idle_role and not plain.fits
    chosen = two_role_plan(80, offload=True, optimizer="adamw_8bit", lora=True)  # all set: all kept, though 80 GiB
    assert (chosen.offload_idle_role, chosen.optimizer, chosen.lora) == (True, "adamw_8bit", True)


def test_one_model_is_never_offloaded_and_a_kl_reference_counts():
    single = two_role_plan(24, models=1)
    assert not single.offload_idle_role and single.optimizer == "adamw_8bit"
    assert two_role_plan(200, reference=True).needed_bytes - two_role_plan(200).needed_bytes == 2 * 4 * (
        QWEN_1_5B_PARAMETERS)


def test_lora_adapters_of_every_linear_layer_are_counted():
    """Qwen2.5-1.5B at rank 8: q and o (1,536 + 1,536), k and v (1,536 + 256), gate, up and down (1,536 + 8,960)."""
    per_layer = 2 * (1536 + 1536) + 2 * (1536 + 256) + 3 * (1536 + 8960)
    assert QWEN_1_5B.lora_parameters(8) == 8 * 28 * per_layer == 9_232_384
