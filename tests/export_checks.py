"""An exported folder read back by other tools and compared with coevolve's own evaluation of the checkpoint it came
from (tests/test_export.py, tests/test_distributed.py): transformers' greedy tokens and per-token log-probs, vLLM's
greedy tokens, and ``coevolve eval DIR`` against ``coevolve eval RUN --step N``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from typer.testing import CliRunner

from coevolve.cli import app
from coevolve.data.benchmarks import load_benchmark
from coevolve.evaluation.harness import build_prompt
from coevolve.rollout import SamplingParams
from coevolve.rollout.hf import HFRolloutEngine
from coevolve.run_models import find_checkpoint, load_role

EVAL = ["--sets", "arith_l1", "--limit", "8", "--max-new-tokens", "32"]
NEW_TOKENS = 32
LOGPROB_TOLERANCE = 1e-4  # fp32: the same weights, the same kernels, another code path (measured below 1e-5)


def export(run: Path, out: Path, *args: str):
    """``coevolve export RUN --out OUT ARGS`` in this process."""
    return CliRunner().invoke(app, ["export", str(run), "--out", str(out), *args])


def coevolve_greedy(run: Path, step: int, role: str | None = None) -> tuple[list[str], list]:
    """The prompts of the first arith_l1 questions and coevolve's greedy completions of them (its HF engine, as its
    evaluation samples) from the run's checkpoint."""
    policy = load_role(find_checkpoint(run, step, role))
    prompts = [build_prompt(item, policy) for item in load_benchmark("arith_l1", limit=8)]
    engine = HFRolloutEngine(policy.model, policy.tokenizer, eos_token_ids=policy.eos_token_ids)
    return prompts, engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS), seed=0)


def transformers_greedy(folder: Path, prompts: list[str]) -> list[tuple[list[int], list[int], list[float]]]:
    """(prompt ids, greedy tokens, their log-probs) of each prompt from ``AutoModelForCausalLM.from_pretrained``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    out = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")
        with torch.no_grad():
            done = model.generate(**ids, do_sample=False, max_new_tokens=NEW_TOKENS, output_logits=True,
                                  return_dict_in_generate=True)
        tokens = done.sequences[0, ids["input_ids"].shape[1]:].tolist()
        logprobs = [float(logits[0].log_softmax(-1)[token]) for logits, token in zip(done.logits, tokens)]
        out.append((ids["input_ids"][0].tolist(), tokens, logprobs))
    return out


def vllm_greedy(folder: Path, prompts: list[str]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, greedy tokens) of each prompt from vLLM loading ``folder`` (in this process, CPU build)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from vllm import LLM
    from vllm import SamplingParams as VLLMSampling

    threads = torch.get_num_threads()
    set_threads = torch.set_num_threads
    llm = LLM(model=str(folder), dtype="float32", enforce_eager=True, max_model_len=256, seed=0,
              kv_cache_memory_bytes=1 << 25, enable_chunked_prefill=False, max_num_batched_tokens=4096)
    torch.set_num_threads = set_threads  # vLLM's CPU worker replaces it with a no-op for the whole process
    torch.set_num_threads(threads)
    try:
        done = llm.generate(prompts, VLLMSampling(temperature=0.0, max_tokens=NEW_TOKENS), use_tqdm=False)
        return [(list(r.prompt_token_ids), list(r.outputs[0].token_ids)) for r in done]
    finally:
        del llm


def assert_round_trip(run: Path, step: int, folder: Path, tmp: Path, *, role: str | None = None,
                      vllm: bool = True) -> float:
    """``folder`` (an export of ``run``'s checkpoint ``step``) decodes what coevolve decodes from the checkpoint:
    transformers gives the same greedy tokens and log-probs within LOGPROB_TOLERANCE, vLLM the same greedy tokens,
    and ``coevolve eval`` the same completions and accuracy. Returns the largest log-prob gap."""
    prompts, ours = coevolve_greedy(run, step, role)
    assert any(len(c.token_ids) > 1 for c in ours)
    gap = 0.0
    for completion, (prompt_ids, tokens, logprobs) in zip(ours, transformers_greedy(folder, prompts)):
        assert prompt_ids == completion.prompt_ids
        assert tokens == completion.token_ids
        gap = max([gap, *(abs(a - b) for a, b in zip(logprobs, completion.logprobs))])
    assert gap < LOGPROB_TOLERANCE, gap
    if vllm:
        for completion, (prompt_ids, tokens) in zip(ours, vllm_greedy(folder, prompts)):
            assert prompt_ids == completion.prompt_ids
            assert tokens == completion.token_ids
    from_run, from_folder = tmp / "eval-run", tmp / "eval-folder"
    for target, out in ((run, from_run), (folder, from_folder)):
        step_args = ["--step", str(step)] if target == run else []
        done = CliRunner().invoke(app, ["eval", str(target), *EVAL, *step_args, "--out", str(out)])
        assert done.exit_code == 0, done.output
    want, got = (json.loads((out / "arith_l1" / "summary.json").read_text()) for out in (from_run, from_folder))
    assert (got["accuracy"], got["accuracy_lenient"]) == (want["accuracy"], want["accuracy_lenient"])
    completions = [[json.loads(line)["completions"] for line in (out / "arith_l1" / "results.jsonl").open()]
                   for out in (from_run, from_folder)]
    assert completions[0] == completions[1]
    return gap


def assert_same_export(one: Path, other: Path, tmp: Path, gap: float) -> Path:
    """``other`` (a run trained on several processes) exports the folder that ``one`` (one process, the same global
    batch) exports: the same files, byte for byte but the weights and the manifest (which names its run), and every
    weight within ``gap`` of one's (relative L2 per tensor). Returns ``other``'s export."""
    from safetensors.torch import load_file

    folders = [tmp / f"export-{i}" for i in range(2)]
    for run, folder in zip((one, other), folders):
        done = export(run, folder)
        assert done.exit_code == 0, done.output
    names = sorted(p.name for p in folders[0].iterdir())
    assert sorted(p.name for p in folders[1].iterdir()) == names
    for name in names:
        if name not in ("model.safetensors", "coevolve_export.json"):
            assert (folders[0] / name).read_bytes() == (folders[1] / name).read_bytes(), name
    wa, wb = (load_file(folder / "model.safetensors") for folder in folders)
    assert wa.keys() == wb.keys()
    assert max(float((wa[k] - wb[k]).norm() / wa[k].norm()) for k in wa) < gap
    return folders[1]
