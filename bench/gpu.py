"""coevolve on one GPU at Qwen2.5 sizes, with no model download: sampling, training and a colocated two-role step.

Models are built from Qwen2.5-0.5B- and Qwen2.5-1.5B-shaped configs (``Qwen2ForCausalLM``, vocabulary 151,936, tied
embeddings) with random weights, saved once to a scratch folder with a stand-in tokenizer (one token per printable
character plus filler tokens up to the vocabulary size). Random weights make the figures about speed and memory
only. For each size it measures

- sampling: ``HFRolloutEngine.generate`` (the HF engine, fp32 weights as a recipe trains them) on B prompts x T new
  tokens, EOS ignored so every sequence is exactly T tokens (default 256 x 512);
- training: one ``PolicyTrainer.update`` (bf16 autocast, fp32 master weights and AdamW state; the trainer's GPU
  defaults and the candidate variants of ``TRAINING_VARIANTS``) on N sequences of P prompt + C completion tokens;
  tokens/s and model FLOP utilisation, counting
  6 x parameters + 6 x layers x hidden x sequence length FLOPs per token (causal attention) against the GPU's
  dense bf16 peak;
- a two-role step: ``r_zero`` with both roles' models, optimizers and samplers colocated on the one GPU (bf16,
  gradient checkpointing; ``train.offload_idle_role`` with ``--offload``, else on CUDA, with ``train.optimizer`` and
  ``train.lora`` under ``--set train.lora_if_needed=true``, as the run's memory plan chooses from the free memory,
  recorded as ``memory_settings``), one questioner step then one solver step; peak
  GPU memory (``torch.cuda.max_memory_allocated``) over both, and seconds per phase. A random model writes no
  parseable question, so every questioner output is read as the same question and a sampled answer as one of four
  values by its characters; all sampling, voting, rewards and updates run as in a real run.

``--paper-presets``: instead, one complete step of each recipe's ``paper`` preset at its full token budgets on the
1.5B shape (``bench/README.md``).

Goals (figures, not tests): training at 40% or more of the bf16 peak at 1.5B, and the colocated two-role step at
1.5B within 80 GB.

Run from the repository root on a CUDA machine: ``.venv/bin/python bench/gpu.py`` (``--sizes 0.5b`` for one size,
``--offload`` to take turns on the GPU). ``--smoke`` runs every measurement on a tiny model at tiny sizes on the CPU
(to check the benchmark runs; its figures mean nothing), but the compiled training variant (minutes of compilation on
the CPU) unless ``--only compile`` names it. Writes ``bench/results/gpu.json`` (``gpu_smoke.json``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import string
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from speed import RESULTS_DIR, machine_info, run_header, write_json

SHAPES: dict[str, dict[str, Any]] = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936),
    "smoke": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512),
}
# Dense bf16 tensor-core peak, TFLOP/s, by a substring of the device name (first match wins).
PEAK_BF16_TFLOPS = [("H100 PCIe", 756.0), ("H100", 989.4), ("H200", 989.4), ("H800", 989.4), ("A100", 312.0),
                    ("L40S", 362.0), ("A10", 125.0)]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def build_model_folder(shape: str, folder: Path) -> Path:
    """A random-weight model of ``shape`` with a stand-in tokenizer, saved as a Hugging Face folder."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    if (folder / "config.json").exists():
        return folder
    dims = SHAPES[shape]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    vocab = {tok: i for i, tok in enumerate([*specials, *chars])}
    vocab.update({f"<f{i}>": i for i in range(len(vocab), dims["vocab_size"])})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|endoftext|>"))
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        additional_special_tokens=specials[1:])
    tokenizer.chat_template = CHAT_TEMPLATE
    config = Qwen2Config(**dims, tie_word_embeddings=True, max_position_embeddings=4096, rope_theta=1e6,
                         eos_token_id=vocab["<|im_end|>"], pad_token_id=vocab["<|endoftext|>"])
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS if key in name), None)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


SAMPLERS = {  # what each sampling variant runs: (engine dtype, CUDA graphs); "generate" is transformers' own loop
    "fp32": (None, False),  # the HF engine's plain loop on the trainer's fp32 weights (before this work, the default)
    "bf16": (torch.bfloat16, False),  # the static decoder on a bf16 copy, each step launched from Python
    "bf16_graphs": (torch.bfloat16, True),  # the same with each step replayed as a CUDA graph (the GPU default)
}


def bench_sampling(folder: Path, device: torch.device, prompts: int, tokens: int, variant: str,
                   profile: bool = False) -> dict[str, Any]:
    """Tokens/s of one sampling variant on ``prompts`` x ``tokens`` new tokens, EOS ignored (every row runs to the
    end). ``generate``: transformers' ``model.generate`` on the model cast to bf16, its default dynamic cache;
    ``continuous``: transformers' continuous batching (``model.generate_batch``, paged cache) in bf16."""
    from coevolve.models import load_policy
    from coevolve.rollout import SamplingParams
    from coevolve.rollout.hf import HFRolloutEngine

    policy = load_policy(str(folder), device=str(device))
    texts = [policy.format_prompt(f"What is {i} + {2 * i}?") for i in range(prompts)]
    if variant == "generate":
        model = policy.model.to(torch.bfloat16)
        batch = policy.tokenizer(texts, return_tensors="pt", padding=True, padding_side="left").to(device)

        def run(n: int, new: int) -> int:
            out = model.generate(input_ids=batch["input_ids"][:n], attention_mask=batch["attention_mask"][:n],
                                 do_sample=True, max_new_tokens=new, min_new_tokens=new,
                                 pad_token_id=policy.tokenizer.pad_token_id)
            return (out.shape[1] - batch["input_ids"].shape[1]) * n
    elif variant == "continuous":
        from transformers import ContinuousBatchingConfig, GenerationConfig

        model = policy.model.to(torch.bfloat16)
        ids = [policy.tokenizer(t)["input_ids"] for t in texts]
        # On the CPU transformers sizes the paged cache from the machine's RAM (21.8 GB resident for the smoke model):
        # a cache for exactly this batch instead (on a GPU it sizes the cache from free GPU memory, as a user's would)
        longest = max(len(i) for i in ids) + tokens + 4
        paged = None if device.type == "cuda" else ContinuousBatchingConfig(
            page_size=16, num_blocks=prompts * -(-longest // 16), max_batch_tokens=prompts * longest)

        def run(n: int, new: int) -> int:
            config = GenerationConfig(do_sample=True, max_new_tokens=new, eos_token_id=-1,
                                      pad_token_id=policy.tokenizer.pad_token_id)
            out = model.generate_batch(inputs=ids[:n], generation_config=config, continuous_batching_config=paged)
            return sum(len(o.generated_tokens) for o in out.values())
    else:
        dtype, graphs = SAMPLERS[variant]
        engine = HFRolloutEngine(policy.model, policy.tokenizer, batch_size=prompts, eos_token_ids=[], dtype=dtype,
                                 cuda_graphs=graphs)

        def run(n: int, new: int) -> int:
            params = SamplingParams(temperature=1.0, max_new_tokens=new)
            return sum(len(c.token_ids) for c in engine.generate(texts[:n], params, seed=1))
    run(prompts, 4)  # warm-up at the measured batch size: kernels, cuBLAS, the bf16 copy
    calls = []  # the first call at these sizes captures the graphs (a recipe's first step pays it once)
    for _ in range(2 if variant == "bf16_graphs" else 1):
        sync(device)
        started = time.perf_counter()
        generated = run(prompts, tokens)
        sync(device)
        calls.append(time.perf_counter() - started)
    result = {"variant": variant, "prompts": prompts, "new_tokens": tokens, "seconds": calls[-1],
              "first_call_s": calls[0], "tokens_per_s": generated / calls[-1]}
    if profile:  # where a call's time goes: kernels by device time, and the share of the wall time they fill
        result["profile"] = device_time(partial(run, prompts, min(tokens, 64)), device)
    return result


GPU_DEFAULTS = {"micro_batch_tokens": 16384, "fit_memory": True, "gradient_checkpointing": True,
                "selective_checkpointing": True}  # what a run's trainer gets on CUDA (coevolve.roles.update_settings)
TRAINING_VARIANTS: dict[str, dict[str, Any]] = {  # UpdateSettings over bf16 autocast; the first is profiled
    # the GPU default: passes of up to 16,384 tokens, only as many layers checkpointed as the free memory needs
    "defaults": GPU_DEFAULTS,
    "defaults_compile": {**GPU_DEFAULTS, "compile": True},  # and each decoder layer compiled
    "every_layer_checkpointed": {**GPU_DEFAULTS, "selective_checkpointing": False},  # the default until 2026-11-28
    "every_layer_checkpointed_compile": {**GPU_DEFAULTS, "selective_checkpointing": False, "compile": True},
    "tokens_8k_no_checkpointing": {"micro_batch_tokens": 8192, "gradient_checkpointing": False},
    "tokens_8k_no_checkpointing_compile": {"micro_batch_tokens": 8192, "gradient_checkpointing": False,
                                           "compile": True},
    "sequences_8": {"gradient_checkpointing": True},  # passes of 8 sequences, every layer checkpointed (the anchor)
}


def bench_training(folder: Path, device: torch.device, sequences: int, prompt_len: int, completion_len: int,
                   micro_batch: int, profile: bool = False, **overrides: Any) -> dict[str, Any]:
    """One ``PolicyTrainer.update`` with the GPU defaults (bf16 autocast, gradient checkpointing, micro-batch
    ``micro_batch``), ``overrides`` replacing any ``UpdateSettings`` field; timed after a warm-up update on the same
    batch shape (kernels, AdamW state, compilation)."""
    from coevolve.models import load_policy
    from coevolve.rl.trainer import PolicyTrainer, TrainSample, UpdateSettings

    policy = load_policy(str(folder), device=str(device))
    model, config = policy.model, policy.model.config
    settings = {"lr": 1e-6, "micro_batch_size": micro_batch, "dtype": "bf16", **overrides}
    trainer = PolicyTrainer(model, policy.tokenizer, UpdateSettings(**settings))
    gen = torch.Generator().manual_seed(0)

    def batch(n: int) -> list[TrainSample]:
        ids = torch.randint(200, config.vocab_size, (n, prompt_len + completion_len), generator=gen).tolist()
        return [TrainSample(row[:prompt_len], row[prompt_len:], [-5.0] * completion_len, (-1.0) ** i)
                for i, row in enumerate(ids)]

    warm_up = time.perf_counter()
    trainer.update(batch(sequences))
    warm_up = time.perf_counter() - warm_up
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    started = time.perf_counter()
    stats = trainer.update(batch(sequences))
    sync(device)
    seconds = time.perf_counter() - started
    peak_gib = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    top = top_kernels(partial(trainer.update, batch(sequences)), device) if profile else None
    tokens = sequences * (prompt_len + completion_len)
    n_params = sum(p.numel() for p in model.parameters())
    flops_per_token = 6 * n_params + 6 * config.num_hidden_layers * config.hidden_size * (prompt_len + completion_len)
    peak = peak_tflops(device)
    achieved = flops_per_token * tokens / seconds / 1e12
    result = {"settings": {k: v for k, v in settings.items() if k != "lr"}, "warm_up_s": warm_up,
              "sequences": sequences, "tokens_per_sequence": prompt_len + completion_len, "micro_batch": micro_batch,
              "parameters": n_params, "seconds": seconds, "tokens_per_s": tokens / seconds,
              "achieved_tflops": achieved, "peak_bf16_tflops": peak, "mfu": achieved / peak if peak else None,
              "peak_memory_gib": peak_gib, "pass_tokens": stats.get("pass_tokens"),
              "checkpointed_layers": stats.get("checkpointed_layers", settings.get("gradient_checkpointing") and
                                               config.num_hidden_layers or 0), "top_kernels": top}
    del trainer, policy, model
    return result


def top_kernels(work: Callable[[], object], device: torch.device, rows: int = 15) -> list[dict[str, Any]]:
    """The kernels (or, on the CPU, operators) that took the most device time in one run of ``work``
    (torch.profiler), with their share of the total."""
    return device_time(work, device, rows)["top"]


def device_time(work: Callable[[], object], device: torch.device, rows: int = 15) -> dict[str, Any]:
    """One run of ``work`` under torch.profiler: its wall time, the device time of its kernels (on the CPU, of its
    operators) and their share of the wall time (the rest: launch gaps and host work), and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        work()
        sync(device)
        wall_ms = (time.perf_counter() - started) * 1e3
    cuda = device.type == "cuda"
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    kernel = torch.autograd.DeviceType.CUDA
    events = [e for e in prof.key_averages() if getattr(e, attr, 0) > 0 and (not cuda or e.device_type == kernel)]
    total = sum(getattr(e, attr) for e in events) or 1.0
    events.sort(key=lambda e: getattr(e, attr), reverse=True)
    top = [{"name": e.key[:90], "ms": getattr(e, attr) / 1e3, "share": getattr(e, attr) / total, "calls": e.count}
           for e in events[:rows]]
    return {"wall_ms": wall_ms, "device_ms": total / 1e3, "device_share_of_wall": total / 1e3 / wall_ms, "top": top}


def bench_two_role_step(folder: Path, device: torch.device, sizes: dict[str, int], offload: bool,
                        extra: tuple[str, ...] = ()) -> dict[str, Any]:
    from coevolve.recipes import resolve
    from coevolve.recipes.r_zero import Question

    sets = [f"model={folder}", "task=arith", "eval_sets=[]", f"device={device.type}", "train.dtype=bf16",
            "train.gradient_checkpointing=true", *(["train.offload_idle_role=true"] if offload else []),
            "params.questioner_steps=1", "params.solver_steps=1", *(f"{k}={v}" for k, v in sizes.items()), *extra]
    config, params, cls = resolve("r_zero", sets=sets)
    recipe = cls(config, params)
    # Random weights write no question: read every output as the same one; a sampled answer is one of four values.
    recipe.read_question = lambda output: Question(output, "What is 17 + 25?", None)
    recipe.task.parse_answer = lambda text, style: str(sum(map(ord, text)) % 4)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    phases: dict[str, float] = {}
    steps = {}
    for step, phase in ((1, "questioner"), (2, "solver")):
        sync(device)
        started = time.perf_counter()
        out = recipe.step(step)
        sync(device)
        steps[phase] = {"seconds": time.perf_counter() - started,
                        "optimizer_steps": out.metrics.get(f"{phase}/optimizer_steps")}
        phases.update({f"{phase}/{k.removeprefix('time/')}": v for k, v in out.metrics.items()
                       if k.startswith("time/")})
    peak_gib = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    chosen = planned_settings(recipe)
    del recipe
    return {"sizes": sizes, "offload_idle_role": offload, "sets": list(extra), "steps": steps, "phases_s": phases,
            "peak_gpu_memory_gib": peak_gib, "memory_settings": chosen}


def planned_settings(recipe) -> dict[str, Any]:
    """What each role trained with, as set or as the run's memory plan chose it on CUDA (coevolve.roles.plan_state):
    the idle role offloaded, the optimizer, LoRA."""
    return {role: {"offload_idle_role": trainer.residency is not None, "optimizer": trainer.settings.optimizer,
                   "lora": trainer.settings.lora} for role, trainer in recipe.trainers().items()}


# --- paper presets at their full token budgets ----------------------------------------------------------------------
# The papers' models per recipe (the shape measured here is Qwen2.5-1.5B's, the smallest size any of them names).
PAPER_MODELS = {
    "grpo": "DeepSeekMath-7B (the GRPO paper); the specs' common solver settings",
    "ttrl": "Qwen2.5-Math-1.5B / 7B", "dynamic_rl": "Qwen2.5-Math-1.5B / 7B",
    "opensir": "Llama-3.2-3B, Gemma-2-2B, Llama-3.1-8B", "r_zero": "Qwen3-4B/8B-Base, OctoThinker-3B/8B",
    "prism": "Qwen3-4B-Base", "pasodoble": "Qwen3-1.7B (also 0.6B-14B, Qwen2.5-0.5B-3B)",
    "infuser": "Qwen3-4B/8B-Base", "azr": "Qwen2.5-7B and Qwen2.5-Coder-7B (also Coder-3B/14B, Llama-3.1-8B)",
}
# Where a full step would sample many batches of the same shape, fewer questions (same token budgets); the time is
# reported as measured and scaled by the factor (full questions / questions run).
# (R-Zero: 512 -> 4 questioner prompts x 4, scored by 10 samples each; 8,000 -> 16 pool questions x 8 labels;
# 512 -> 16 solver questions x 8; every sampling call is one batch of full-length rows.)
RZERO_CUT = {"params.questioner_prompts": 4, "params.pool_size": 16, "params.solver_questions": 16,
             "params.questioner_steps": 1, "params.solver_steps": 1}
PAPER_CUTS: dict[str, tuple[dict[str, Any], dict[str, float]]] = {  # overrides, and each phase's time factor
    "grpo": ({}, {"step": 1.0}),  # 32 questions x 8 at 512 tokens: the whole step
    "ttrl": ({"params.questions_per_step": 4}, {"step": 8.0}),  # 32 -> 4 questions, x 64 votes at 3,072 tokens
    "dynamic_rl": ({"params.n": 8}, {"step": 4.0}),  # 32 -> 8 questions of 1,024 tokens, x 16 answers at 3,072
    "opensir": ({}, {"step": 1.0}),  # 256 rollouts at 2,048 tokens: the whole step
    "r_zero": (RZERO_CUT, {"questioner": 128.0, "solver": 32.0}),
    "prism": (RZERO_CUT, {"questioner": 128.0, "solver": 32.0}),
    "pasodoble": ({}, {"step": 1.0}),  # 1 passage x 6 proposals at 6,144 tokens x 6 solutions: the whole step
    # 128 -> 1 document (x 8 questions at 8,192 tokens, x 8 answers); 800 -> 4 dev problems (x 8 rollouts at 8,192
    # tokens: Phase 1 alone sampled 400 rows with 50 and ran out of a device call's time), scaled by its own factor
    "infuser": ({"params.documents_per_step": 1, "params.minibatch_prompts": 1, "params.dev_size": 4},
                {"step": 128.0, "step/dev": 200.0}),
    # B = 64 -> 2 proposals per task type (6 at 8,096 tokens, each estimated by 8 rollouts), 6 solver tasks
    "azr": ({"params.batch_size": 2}, {"step": 32.0}),
}
PHASED = {"r_zero": ("questioner", "solver"), "prism": ("questioner", "solver")}  # one step of each phase
# --recipes also takes one phase of a phased recipe alone (r_zero/solver: its solver step, pool built first)
PHASE_SPECS = [f"{name}/{phase}" for name, phases in PHASED.items() for phase in phases]


def write_documents(folder: Path, tokens: int, count: int = 64) -> Path:
    """A ``.txt`` document source of ``count`` paragraphs of about ``tokens`` characters (the stand-in tokenizer's
    tokens), so INFUSER and PasoDoble read passages of their full length without a corpus."""
    path = folder / "documents.txt"
    words = ["ratio", "sum", "integer", "prime", "angle", "area", "root", "factor", "graph", "slope"]
    paragraphs = []
    for i in range(count):
        text = " ".join(words[(i * 7 + j * 3) % len(words)] + str(j % 97) for j in range(tokens // 8))
        paragraphs.append(text[:tokens])
    path.write_text("\n\n".join(paragraphs) + "\n")
    return path


def build_encoder_folder(folder: Path) -> Path:
    """A small random sentence-transformers encoder (one-layer BERT, mean pooling) for OpenSIR's and Prism's
    embeddings: the packaged all-MiniLM-L6-v2 does not travel to a device machine, and its values do not matter
    here."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers import models as st_models
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    if (folder / "modules.json").exists():
        return folder
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = sorted(set(string.printable) - set(string.whitespace))
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate([*specials, *chars])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    torch.manual_seed(0)
    bert = folder / "bert"
    BertModel(BertConfig(vocab_size=len(specials) + len(chars), hidden_size=32, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=64)).save_pretrained(bert)
    tokenizer.save_pretrained(bert)
    transformer = st_models.Transformer(str(bert), max_seq_length=128)
    pooling = st_models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[transformer, pooling], device="cpu").save(str(folder))
    return folder


def stand_in_reading(recipe) -> None:
    """Random weights write no parseable question or answer: read every generator output as a question whose
    answer is one of four values, and every sampled answer as one of those values by its characters, so every
    phase (voting, filtering, rewards, both roles' updates) runs on full-length outputs as in a real run."""
    from coevolve.formats import Generation

    def value(text: str) -> str:
        return str(sum(map(ord, text)) % 4)

    def read_generation(output, style: str, **_: Any) -> Generation:
        answer = value(output.text)
        return Generation(f"What is {answer} + 0?", answer, ("arithmetic",), 1.0)

    def is_correct(answer: str | None, gold: str) -> bool:  # a gold answer outside the four values: "0" is right
        return answer == (gold if gold in {"0", "1", "2", "3"} else "0")

    recipe.task.parse_answer = lambda text, style: value(text)
    recipe.task.is_correct = is_correct
    if hasattr(recipe, "generator_format"):
        recipe.generator_format = replace(recipe.generator_format, parse=read_generation)


def stand_in_programs(recipe) -> None:
    """AZR's stand-in reading: random weights write no program, so every proposer output is read as one of four
    bench-written tasks (``f(a) = a * k + 1`` on the input ``k``; induction: the given program on 0..N-1) and every
    solver answer as one of four values (deduction: an output, abduction: an input, induction: a program) by its
    characters. The buffers start with those tasks, validated by the world's executor, instead of InitSeeding (which
    at the paper's budgets samples up to 50 batches of 8,096 tokens per buffer before step 1). Validation, the
    checks and every phase run as in a real run; only bench-written programs and inputs are executed."""
    from coevolve.tasks.triplets import Proposal

    world, n = recipe.world, recipe.params.induction_inputs
    programs = [f"def f(a):\n    return a * {k} + 1" for k in range(4)]

    def value(text: str) -> int:
        return sum(map(ord, text)) % 4

    def read_proposal(kind, text, program=None, strip=False) -> Proposal:
        if kind == "induction":
            return Proposal(kind, program or programs[value(text)], tuple(str(i) for i in range(n)), "a * k + 1")
        return Proposal(kind, programs[value(text)], (str(value(text)),))

    def read_answer(kind, text) -> str:
        k = value(text)
        return programs[k] if kind == "induction" else str(k)

    world.read_proposal, world.read_answer = read_proposal, read_answer
    for kind in recipe.kinds:
        proposals = [read_proposal(kind, chr(48 + k), programs[k]) for k in range(4)]
        recipe.buffers.add(kind, [v.triplet for v in world.validate(proposals) if v.triplet], 0)


def scaled_seconds(phases: dict[str, float], metrics: dict[str, Any], scale: dict[str, float]) -> float:
    """A full step's estimated seconds: each phase's measured time times its cut factor, a timed part of a phase
    with its own factor (``scale["phase/part"]``, e.g. INFUSER's dev rollouts) times that one instead."""
    total = sum(seconds * scale[phase] for phase, seconds in phases.items())
    for key, factor in scale.items():
        phase, _, part = key.partition("/")
        if part and phase in phases:
            total += metrics.get(f"{phase}/time/{part}_s", 0.0) * (factor - scale[phase])
    return total


def bench_paper_preset(name: str, folder: Path, device: torch.device, sets: list[str],
                       scale: dict[str, float], phases_run: tuple[str, ...]) -> dict[str, Any]:
    """One complete step of ``name``'s ``paper`` preset (a step of each phase for a phased recipe) on the model in
    ``folder``: seconds per phase, tokens sampled, peak GPU memory, the planned sampling batches and passes."""
    from coevolve.recipes import resolve

    config, params, cls = resolve(name, preset="paper", sets=[f"model={folder}", f"device={device.type}",
                                                              "eval_sets=[]", "task=arith", *sets])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    recipe = cls(config, params)
    (stand_in_programs if name == "azr" else stand_in_reading)(recipe)
    setup_s = time.perf_counter() - started
    phases, metrics = {}, {}
    for step, phase in enumerate(phases_run, start=1):
        sync(device)
        started = time.perf_counter()
        out = recipe.step(step)
        sync(device)
        phases[phase] = time.perf_counter() - started
        print(f"   {phase}: {phases[phase]:.1f} s, peak "
              f"{torch.cuda.max_memory_allocated(device) / 2**30 if device.type == 'cuda' else 0:.1f} GiB, "
              + json.dumps({k: v for k, v in out.metrics.items() if k.startswith(("time/", "rollout/"))}), flush=True)
        metrics.update({f"{phase}/{k}": v for k, v in out.metrics.items()
                        if k.startswith(("time/", "rollout/")) or k.endswith(("optimizer_steps", "pass_tokens",
                                                                                "tokens", "skipped"))})
    peak_gib = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    reserved_gib = torch.cuda.max_memory_reserved(device) / 2**30 if device.type == "cuda" else None
    needed = {k: v for k, v in (("train.offload_idle_role", config.train.offload_idle_role),
                                ("train.lora", config.train.lora)) if v}
    chosen = planned_settings(recipe)
    result = {"paper_models": PAPER_MODELS[name], "sets": sets, "scale": scale, "setup_s": setup_s,
              "step_s": phases, "scaled_step_s": scaled_seconds(phases, metrics, scale),
              "peak_gpu_memory_gib": peak_gib,
              "peak_reserved_gib": reserved_gib,
              "settings_needed": needed or "none beyond the preset", "memory_settings": chosen,
              "max_new_tokens": config.rollout.max_new_tokens,
              "metrics": metrics}
    del recipe
    gc.collect()
    return result


def paper_preset_fitted(name: str, folder: Path, device: torch.device, sets: list[str],
                        scale: dict[str, float], phases_run: tuple[str, ...]) -> dict[str, Any]:
    """:func:`bench_paper_preset` with the preset as it is; after an out-of-memory error, again with
    ``train.offload_idle_role`` (the other role waits in host memory), recording both."""
    try:
        return bench_paper_preset(name, folder, device, sets, scale, phases_run)
    except torch.OutOfMemoryError as exc:
        first = f"OutOfMemoryError: {str(exc).splitlines()[0]}"
    gc.collect()
    torch.cuda.empty_cache()
    result = bench_paper_preset(name, folder, device, [*sets, "train.offload_idle_role=true"], scale, phases_run)
    return {**result, "without_offload": first}


def paper_preset_plan(args, device: torch.device) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    from coevolve.execution import sandbox_problem
    from coevolve.recipes import RECIPES

    os.environ["COEVOLVE_CACHE"] = str(args.scratch / "cache")  # the stand-ins' cluster space is not the user's
    shape = "smoke" if args.smoke else "1.5b"
    folder = build_model_folder(shape, args.scratch / shape)
    encoder = build_encoder_folder(args.scratch / "encoder")
    documents = write_documents(args.scratch, 256 if args.smoke else 2048)
    data_free = {"ttrl": ["params.pool_source=train"], "opensir": [f"params.encoder={encoder}"],
                 "prism": ["params.reference_corpus=arith", f"params.encoder={encoder}"],
                 "pasodoble": [f"params.knowledge_source={documents}"],
                 "infuser": [f"params.document_source={documents}"],
                 # the python world; without bubblewrap the executor runs unconfined (only bench-written programs)
                 "azr": ["task=python", *(["params.unconfined_execution=true"] if sandbox_problem() else [])]}
    smoke_budgets = ["rollout.max_new_tokens=16", "params.question_max_tokens=16", "params.label_max_tokens=16",
                     "params.proposer_max_tokens=16", "params.generator_max_tokens=16", "params.k=4",
                     "params.questioner_prompts=2", "params.pool_size=16", "params.solver_questions=2",
                     "params.documents_per_step=2", "params.minibatch_prompts=2", "params.dev_size=4",
                     "params.questions_per_step=2", "params.vote_samples=4", "params.train_samples=4", "params.n=2",
                     "params.m=2", "params.batch_size=16", "params.learnability_samples=2"]
    plan = []
    for spec in args.recipes:
        name, _, only = spec.partition("/")
        cut, scale = PAPER_CUTS[name]
        known = RECIPES[name].Params.model_fields
        sets = [*(f"{k}={v}" for k, v in cut.items()), *data_free.get(name, []), *args.set]
        if args.smoke:  # every budget at 16 tokens and every count at its smallest (the figures mean nothing)
            sets += [s for s in smoke_budgets if s.startswith("rollout.") or s.split("=")[0][7:] in known]
        if only == "solver":  # the solver step alone: step 1 is the solver phase's first (its pool built first)
            sets.append("params.questioner_steps=0")
        phases_run = (only,) if only else PHASED.get(name, ("step",))
        plan.append((f"paper/{spec}", partial(paper_preset_fitted, name, folder, device, sets, scale, phases_run)))
    return plan


def guarded(name: str, results: dict[str, Any], path: Path, measure: Callable[[], dict[str, Any]]) -> None:
    """Run one measurement into ``results[name]``; a failure is recorded (one line) and the next one still runs.
    The results file is rewritten after each, so a call cut short keeps what it measured."""
    print(f"-- {name}", flush=True)
    try:
        results[name] = measure()
    except Exception as exc:  # noqa: BLE001 - a benchmark records what failed and goes on
        results[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    print(json.dumps(results[name]), flush=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    write_json(path, RESULTS)


RESULTS: dict[str, Any] = {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["0.5b", "1.5b"], choices=["0.5b", "1.5b"])
    parser.add_argument("--smoke", action="store_true", help="tiny model, tiny sizes, on the CPU")
    parser.add_argument("--quick", action="store_true",
                        help="fit one 15-minute device budget: the slow samplers (fp32, generate) on --anchor-tokens "
                             "new tokens instead of all of them, the two-role step at 1.5B only")
    parser.add_argument("--offload", action="store_true", help="two-role step with train.offload_idle_role")
    parser.add_argument("--sample-prompts", type=int, default=256)
    parser.add_argument("--sample-tokens", type=int, default=512)
    parser.add_argument("--anchor-tokens", type=int, default=64, help="--quick: new tokens for fp32 and generate")
    parser.add_argument("--train-sequences", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--only", nargs="+", default=[], help="run only the measurements whose name contains one of "
                        "these (names: SIZE/sampling/VARIANT, SIZE/training/VARIANT, SIZE/two_role_step)")
    parser.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()) / "coevolve-gpu-bench")
    parser.add_argument("--out", type=Path, help="the JSON to write (default: bench/results/gpu*.json)")
    parser.add_argument("--paper-presets", action="store_true", help="one step of each recipe's paper preset at its "
                        "full token budgets (1.5B shape; --recipes to choose), instead of the measurements above")
    parser.add_argument("--memory-gib", type=float, help="use at most this much of the GPU (a per-process memory "
                        "fraction, which the memory plans respect): 79 to measure an 80 GB card on a larger one")
    parser.add_argument("--recipes", nargs="+", default=list(PAPER_CUTS), choices=[*PAPER_CUTS, *PHASE_SPECS],
                        help="recipes, in this order; NAME/PHASE runs one phase of a phased recipe alone")
    parser.add_argument("--set", action="append", default=[], help="a config override for every recipe of "
                        "--paper-presets and for the two-role step (e.g. train.lora.r=16)")
    args = parser.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench/gpu.py needs a CUDA device (or --smoke for a CPU check of the benchmark itself)")
    shapes = ["smoke"] if args.smoke else args.sizes
    small = args.smoke
    step_sizes = {  # r_zero: B_Q x G_Q questions scored by m_s solver samples; N_pool x m_l labels; B_S x G_S
        "params.questioner_prompts": 2 if small else 32, "params.questioner_group": 2 if small else 4,
        "params.score_samples": 2 if small else 10, "params.pool_size": 4 if small else 128,
        "params.label_samples": 2 if small else 8, "params.solver_questions": 2 if small else 32,
        "params.solver_group": 2 if small else 8, "params.question_max_tokens": 8 if small else 256,
        "rollout.max_new_tokens": 8 if small else 512, "rollout.batch_size": 4 if small else 256,
        "train.micro_batch_size": 2 if small else args.micro_batch,
    }
    path = args.out or RESULTS_DIR / ((("gpu_paper" if args.paper_presets else "gpu") + ("_smoke" if small else "")
                                       + ("_quick" if args.quick and not args.paper_presets else "")) + ".json")
    RESULTS.update({**run_header(), "machine": machine_info(), "smoke": small, "quick": args.quick})
    if device.type == "cuda":
        RESULTS["machine"]["gpu"] = torch.cuda.get_device_name(device)
        RESULTS["machine"]["torch"] = torch.__version__
    if args.memory_gib and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        share = min(1.0, args.memory_gib * 2**30 / total)
        torch.cuda.set_per_process_memory_fraction(share, torch.cuda.current_device())
        RESULTS["memory_limit_gib"] = args.memory_gib
    if args.paper_presets:
        for name, measure in paper_preset_plan(args, device):
            guarded(name, RESULTS, path, measure)
        return
    prompts, tokens = (4, 8) if small else (args.sample_prompts, args.sample_tokens)
    anchor = min(args.anchor_tokens, tokens) if args.quick else tokens
    sequences, prompt_len, completion_len = (4, 8, 8) if small else (args.train_sequences, 128, 512)
    folders = {shape: build_model_folder(shape, args.scratch / shape) for shape in shapes}
    plan: list[tuple[str, Callable[[], dict[str, Any]]]] = []  # in the order they run: the headline figures first
    for shape, folder in folders.items():
        for variant, new in (("bf16_graphs", tokens), ("bf16", tokens), ("fp32", anchor), ("generate", anchor)):
            plan.append((f"{shape}/sampling/{variant}", partial(bench_sampling, folder, device, prompts, new, variant,
                                                                 profile=variant.startswith("bf16"))))
        for variant, overrides in TRAINING_VARIANTS.items():
            if small and overrides.get("compile") and not any("compile" in part for part in args.only):
                continue  # compiling on the CPU takes minutes (275 s of warm-up here): a smoke leaves it out
            budget = overrides.get("micro_batch_tokens")
            if budget and small:
                overrides = {**overrides, "micro_batch_tokens": 32 if budget > 8192 else 16}
            plan.append((f"{shape}/training/{variant}", partial(
                bench_training, folder, device, sequences, prompt_len, completion_len,
                2 if small else args.micro_batch, profile=variant == "defaults", **overrides)))
        if not args.quick or shape != "0.5b":
            plan.append((f"{shape}/two_role_step", partial(bench_two_role_step, folder, device, step_sizes,
                                                           args.offload, tuple(args.set))))
    # Last, as it may spend minutes on its own warm-up: transformers' continuous batching on the first size.
    plan.append((f"{shapes[0]}/sampling/continuous",
                 partial(bench_sampling, folders[shapes[0]], device, prompts, anchor, "continuous")))
    plan.sort(key=lambda item: "compile" in item[0])  # compilation takes minutes: after everything else
    for name, measure in plan:
        if not args.only or any(part in name for part in args.only):
            guarded(name, RESULTS, path, measure)
    for key, row in RESULTS.items():
        if "/" in key:
            print(f"{key}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in row.items() if not isinstance(v, dict)))


if __name__ == "__main__":
    main()
