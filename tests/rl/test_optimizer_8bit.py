"""train.optimizer: adamw_8bit (torchao's AdamW8bit): it trains, its state checkpoints without pickle and resumes to
the uninterrupted step, it takes LoRA, the memory estimates count 8-bit moments, and a missing torchao is one line."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from helpers import random_samples

from coevolve.config import ConfigError, check_runtime
from coevolve.memory import adam_state_bytes
from coevolve.optim_state import copy_state_dict, is_subclass_state
from coevolve.recipes import resolve
from coevolve.rl.trainer import PolicyTrainer, UpdateSettings, make_optimizer, sequence_logprobs
from coevolve.store import CheckpointDamaged, RunStore

pytest.importorskip("torchao", reason="the optim8bit extra (in dev) is not installed")


@pytest.fixture
def model():
    """A random 2-layer Llama whose projections are all 64 x 64 (4,096 values: 8-bit moments), so that torchao's
    step, compiled per shape, compiles for three shapes only."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                        pad_token_id=0)).eval()


class Tokenizer:
    pad_token_id = 0


SAMPLES = random_samples([[1, 2, 3, 4], [5, 6, 7]], [6, 5, 7, 4], tokens=(8, 40), advantages=(1.0, -0.5))
SETTINGS = UpdateSettings(lr=1e-2, optimizer="adamw_8bit", micro_batch_size=4)


def eight_bit_states(optimizer: torch.optim.Optimizer) -> int:
    return sum(is_subclass_state(v) for slots in optimizer.state.values() for v in slots.values())


def test_an_adamw_8bit_update_changes_the_weights_with_8_bit_moments_and_raises_rewarded_log_probs(model):
    trainer = PolicyTrainer(model, Tokenizer(), SETTINGS)
    before = [p.detach().clone() for p in model.parameters()]
    rewarded = [s for s in SAMPLES if s.advantage > 0]

    @torch.no_grad()
    def rewarded_logprob() -> float:
        logprobs, mask = sequence_logprobs(model, rewarded, 0, 1.0)
        return float((logprobs * mask).sum())

    start = rewarded_logprob()
    for _ in range(4):
        stats = trainer.update(SAMPLES)
        assert stats["optimizer_steps"] == 1
    assert type(trainer.optimizer).__name__ == "AdamW8bit"
    assert eight_bit_states(trainer.optimizer) == 2 * 14  # both moments of the 14 projections (not the embeddings)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert rewarded_logprob() > start + 1.0  # the policy-gradient loss of the rewarded completions falls


def test_adamw_8bit_fits_a_toy_regression():
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64, bias=False)  # 4,096 weights: 8-bit moments
    target = torch.randn(64, 64)
    optimizer = make_optimizer(list(layer.parameters()), UpdateSettings(lr=3e-2, optimizer="adamw_8bit"))
    x = torch.randn(256, 64)
    losses = []
    for _ in range(30):
        loss = ((layer(x) - x @ target.T) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    assert eight_bit_states(optimizer) == 2
    assert losses[-1] < 0.5 * losses[0] and losses[10] < losses[0]


def test_a_checkpointed_8_bit_state_resumes_to_the_uninterrupted_step(model, tmp_path):
    """Save after two updates, load into a fresh trainer of the initial weights, and the third update equals the
    uninterrupted run's exactly: the codes, scales, maps, step counts and the float32 lr are restored bit for bit and
    the same deterministic kernel runs on the same inputs."""
    fresh = copy.deepcopy(model)
    trainer = PolicyTrainer(model, Tokenizer(), SETTINGS)
    trainer.update(SAMPLES)
    trainer.phase_step(1, 4)  # a tensor lr is set in place (torchao refuses a float)
    trainer.update(SAMPLES)
    store = RunStore(tmp_path)
    store.save_checkpoint(2, {"policy": trainer.model}, {"policy": trainer.optimizer}, {})
    assert not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.pkl"))  # safetensors and JSON only

    resumed = PolicyTrainer(fresh, Tokenizer(), SETTINGS)
    store.load_checkpoint(2, {"policy": resumed.model}, {"policy": resumed.optimizer})
    assert eight_bit_states(resumed.optimizer) == eight_bit_states(trainer.optimizer) > 0
    assert isinstance(resumed.optimizer.param_groups[0]["lr"], torch.Tensor)
    assert float(resumed.optimizer.param_groups[0]["lr"]) == float(trainer.optimizer.param_groups[0]["lr"])
    trainer.update(SAMPLES)
    resumed.update(SAMPLES)
    for (name, a), b in zip(trainer.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(a, b), name


def test_an_8_bit_state_does_not_load_into_plain_adamw(model, tmp_path):
    trainer = PolicyTrainer(model, Tokenizer(), SETTINGS)
    trainer.update(SAMPLES)
    store = RunStore(tmp_path)
    store.save_checkpoint(1, {"policy": trainer.model}, {"policy": trainer.optimizer}, {})
    plain = PolicyTrainer(copy.deepcopy(model), Tokenizer(), UpdateSettings())
    with pytest.raises(CheckpointDamaged, match="optimizer state is AdamW8bit's, this run's optimizer is AdamW"):
        store.load_checkpoint(1, {"policy": plain.model}, {"policy": plain.optimizer})


def test_8_bit_moments_move_between_devices_as_residency_moves_them(model):
    """train.offload_idle_role moves each state with ``.to(device)``; torchao's subclass keeps its kind and values
    (here host to host: the CPU is the only device of this machine)."""
    from coevolve.rl.residency import move_optimizer_state

    trainer = PolicyTrainer(model, Tokenizer(), SETTINGS)
    trainer.update(SAMPLES)
    before = copy_state_dict(trainer.optimizer.state_dict())
    move_optimizer_state(trainer.optimizer, torch.device("cpu"))
    after = trainer.optimizer.state_dict()["state"]
    for index, slots in before["state"].items():
        for name, value in slots.items():
            assert type(after[index][name]) is type(value)
            assert torch.equal(after[index][name].dequantize() if is_subclass_state(value) else after[index][name],
                               value.dequantize() if is_subclass_state(value) else value)
    assert trainer.update(SAMPLES)["optimizer_steps"] == 1


def test_a_copied_8_bit_state_is_independent_and_loads_back(model):
    """What the influence phase does around each question: copy the state, update, load the copy back."""
    trainer = PolicyTrainer(model, Tokenizer(), SETTINGS)
    trainer.update(SAMPLES)
    saved = copy_state_dict(trainer.optimizer.state_dict())
    codes = {i: s["exp_avg"].codes.clone() for i, s in saved["state"].items() if is_subclass_state(s["exp_avg"])}
    trainer.update(SAMPLES)
    trainer.optimizer.load_state_dict(copy_state_dict(saved))
    for i, state in enumerate(trainer.optimizer.state_dict()["state"].values()):
        if i in codes:
            assert torch.equal(state["exp_avg"].codes, codes[i])


def test_lora_with_adamw_8bit_trains_the_adapters(model):
    trainer = PolicyTrainer(model, Tokenizer(), replace_settings(lora={"r": 64, "lora_alpha": 64}))
    adapters = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.update(SAMPLES)
    trainer.update(SAMPLES)
    assert adapters and all("lora_" in n for n in adapters)
    assert eight_bit_states(trainer.optimizer) > 0  # r 64 x hidden 64: 4,096 values an adapter
    moved = [n for n, p in trainer.model.named_parameters() if n in adapters and not torch.equal(p, adapters[n])]
    assert moved


def replace_settings(**changes) -> UpdateSettings:
    from dataclasses import replace

    return replace(SETTINGS, **changes)


def test_8_bit_moments_take_about_2_bytes_a_parameter_in_the_estimates(model):
    assert adam_state_bytes(1536 * 8960, 4, eight_bit=False) == 8 * 1536 * 8960
    assert adam_state_bytes(1536 * 8960, 4, eight_bit=True) == 2 * 1536 * 8960 * (1 + 4 / 256)
    assert adam_state_bytes(1536, 4, eight_bit=True) == 8 * 1536  # below 4,096 values: fp32 moments
    plain = PolicyTrainer(copy.deepcopy(model), Tokenizer(), UpdateSettings())._update_state_bytes()
    eight = PolicyTrainer(model, Tokenizer(), SETTINGS)._update_state_bytes()
    quantised = sum(p.numel() for p in model.parameters() if p.numel() >= 4096)
    assert plain - eight == quantised * (8 - 2 * (1 + 4 / 256))


def test_the_optimizer_setting_is_checked_in_one_line(monkeypatch):
    with pytest.raises(ConfigError, match="train.optimizer") as bad:
        resolve("grpo", sets=["train.optimizer=adam8"])
    assert "\n" not in str(bad.value)
    config = resolve("grpo", sets=["train.optimizer=adamw_8bit"])[0]
    check_runtime(config)
    with pytest.raises(ConfigError, match="train.fsdp.*train.optimizer=adamw_8bit"):
        check_runtime(resolve("grpo", sets=["train.optimizer=adamw_8bit", "train.fsdp=true"])[0], processes=2)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    with pytest.raises(ConfigError, match=r"adamw_8bit needs torchao: pip install 'coevolve\[optim8bit\]'$"):
        check_runtime(config)


@pytest.mark.slow
def test_a_run_resumed_with_8_bit_moments_trains_as_the_uninterrupted_run(tmp_path):
    """coevolve run (grpo, 3 steps) against the same run stopped after step 2 and resumed for step 3: the same final
    weights and 8-bit moments, bit for bit (one process: the same samples, the same kernels, the state restored
    exactly)."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM
    from typer.testing import CliRunner

    from coevolve.cli import app
    from coevolve.models.tiny_arith import build_tokenizer

    folder = tmp_path / "model"
    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                                 pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                                 eos_token_id=tokenizer.eos_token_id)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "build_info.json").write_text('{"note": "random weights for tests"}\n')

    def run(*args: str):
        result = CliRunner().invoke(app, ["run", *args, "--quiet"])
        assert result.exit_code == 0, result.output

    sets = ["--set", f"model={folder}", "--set", "eval_sets=[]", "--set", "rollout.max_new_tokens=4", "--set",
            "params.questions_per_step=2", "--set", "params.group_size=2", "--set", "train.optimizer=adamw_8bit",
            "--set", "train.lr=1e-2"]
    run("grpo", "--out", str(tmp_path / "whole"), *sets, "--set", "steps=3")
    run("grpo", "--out", str(tmp_path / "resumed"), *sets, "--set", "steps=2")
    run("--resume", str(tmp_path / "resumed"), "--set", "steps=3")
    for name in ("solver.safetensors", "solver.optim.safetensors"):
        whole, resumed = (load_file(tmp_path / run_dir / "checkpoints" / "step_000003" / name)
                          for run_dir in ("whole", "resumed"))
        assert whole.keys() == resumed.keys()
        assert all(torch.equal(whole[k], resumed[k]) for k in whole), name
    assert any(key.endswith("exp_avg/codes") for key in whole)  # the 8-bit moments, as their plain parts
