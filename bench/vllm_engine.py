"""The vLLM rollout engine next to our HF engine on ``smollm2-135m``: sampling speed, weight sync, a GRPO step, memory.

Each measurement runs in its own process (so thread settings and peak resident memory are its own), one after the
other, all in one invocation:

- sampling: ``generate`` of P chat prompts (arith questions in the chat template) x T new tokens at temperature 1,
  EOS ignored so every sequence is exactly T tokens; for each engine at 1 and at 2 torch threads. The vLLM figure
  excludes the engine's start-up and its first weight load, which are reported on their own;
- weight sync (vLLM): pushing the full set of weights into the running engine after they changed, median of 3;
- a GRPO step: ``recipe.step()`` of ``grpo`` (arith task, chat prompts) with each engine at 2 threads; step 1 is
  a warm-up (it starts the vLLM engine), step 2 is reported, split into the recipe's phases and the weight sync;
- peak resident memory of each process (``ru_maxrss``).

Run from the repository root: ``.venv/bin/python bench/vllm_engine.py [--quick]``. Writes
``bench/results/vllm_engine.json`` with the machine, load average, command and time.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from speed import RESULTS_DIR, _prompts, grpo_recipe, machine_info, run_header, warn_if_busy, write_json

MODEL = "smollm2-135m"


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_sampling(engine_name: str, prompts: int, tokens: int) -> dict[str, Any]:
    """Tokens/s of one engine on P prompts x T tokens (EOS ignored), after a warm-up call."""
    from coevolve.config import SamplingConfig
    from coevolve.models import hf_model_source, load_policy
    from coevolve.rollout import SamplingParams
    from coevolve.rollout.hf import HFRolloutEngine
    from coevolve.rollout.vllm_engine import VLLMRolloutEngine, VLLMSettings

    policy = load_policy(MODEL)
    texts = _prompts(policy, prompts)
    params = SamplingParams(temperature=1.0, max_new_tokens=tokens)
    result: dict[str, Any] = {}
    if engine_name == "hf":
        engine = HFRolloutEngine(policy.model, policy.tokenizer, batch_size=prompts, eos_token_ids=[])
    else:
        settings = VLLMSettings(**SamplingConfig().vllm.model_dump())
        engine = VLLMRolloutEngine(policy.model, policy.tokenizer, hf_model_source(MODEL), eos_token_ids=[],
                                   settings=settings)
        started = time.perf_counter()
        engine._ensure_engine()
        result["engine_start_s"] = time.perf_counter() - started
        result["first_sync_s"] = engine.sync_weights()
    engine.generate(texts[:4], SamplingParams(temperature=1.0, max_new_tokens=8), seed=1)  # warm-up
    started = time.perf_counter()
    completions = engine.generate(texts, params, seed=0)
    seconds = time.perf_counter() - started
    generated = sum(len(c.token_ids) for c in completions)
    result.update(seconds=seconds, tokens=generated, tokens_per_s=generated / seconds)
    if engine_name == "vllm":
        syncs = []
        for _ in range(3):
            with torch.no_grad():
                policy.model.model.norm.weight.mul_(1.0)  # an in-place write: the engine must reload
            syncs.append(engine.sync_weights())
        result["weight_sync_s"] = statistics.median(syncs)
        result["weight_sync_all_s"] = syncs
    return result


def child_grpo(engine_name: str, questions: int, group: int, tokens: int, micro: int) -> dict[str, Any]:
    """Step 2 of ``grpo`` (step 1 warms up) with one engine: seconds, phases, weight sync."""
    recipe = grpo_recipe(MODEL, questions, group, tokens, [f"rollout.engine={engine_name}",
                                                           f"train.micro_batch_size={micro}",
                                                           f"rollout.batch_size={questions * group}"])
    timings = {}
    for step in (1, 2):
        started = time.perf_counter()
        out = recipe.step(step)
        out.metrics.update(recipe.engine_metrics())
        timings[step] = {"step_s": time.perf_counter() - started,
                         **{k: v for k, v in out.metrics.items() if k.startswith(("time/", "tokens/", "rollout/"))}}
    return {"warmup_step": timings[1], "step": timings[2]}


def run_child(args: list[str], threads: int) -> dict[str, Any]:
    """Run this script as a child with ``threads`` torch threads; its last stdout line is its JSON result."""
    command = [sys.executable, __file__, "--child", *args, "--threads", str(threads)]
    print("  $", " ".join(command[1:]), flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--grpo-questions", type=int, default=8)
    parser.add_argument("--grpo-group", type=int, default=4)
    parser.add_argument("--grpo-tokens", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "vllm_engine.json")
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.tokens, args.grpo_questions, args.grpo_group, args.grpo_tokens = 8, 16, 2, 2, 16
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child is not None:
        torch.set_num_threads(args.threads)
        kind, engine_name = args.child[0], args.child[1]
        if kind == "sampling":
            result = child_sampling(engine_name, args.prompts, args.tokens)
        else:
            result = child_grpo(engine_name, args.grpo_questions, args.grpo_group, args.grpo_tokens, args.micro_batch)
        result.update(threads=args.threads, peak_rss_mib=peak_rss_mib())
        print(json.dumps(result))
        return
    warn_if_busy()
    machine = machine_info()
    sizes = ["--prompts", str(args.prompts), "--tokens", str(args.tokens), "--grpo-questions", str(args.grpo_questions),
             "--grpo-group", str(args.grpo_group), "--grpo-tokens", str(args.grpo_tokens),
             "--micro-batch", str(args.micro_batch)]
    started = time.perf_counter()
    sampling = {f"{engine}@{threads}": run_child(["sampling", engine, *sizes], threads)
                for threads in (1, 2) for engine in ("hf", "vllm")}
    grpo = {engine: run_child(["grpo", engine, *sizes], 2) for engine in ("hf", "vllm")}
    machine["load_avg_end"] = list(__import__("os").getloadavg())
    payload = {**run_header(), "machine": machine, "model": MODEL, "wall_s": time.perf_counter() - started,
               "sizes": {"prompts": args.prompts, "tokens": args.tokens, "grpo_questions": args.grpo_questions,
                         "grpo_group": args.grpo_group, "grpo_tokens": args.grpo_tokens,
                         "micro_batch": args.micro_batch},
               "sampling": sampling, "grpo": grpo}
    print(f"\nsampling, {MODEL}, {args.prompts} prompts x {args.tokens} tokens, temperature 1, EOS ignored")
    print(f"{'engine':<8}{'threads':>8}{'tok/s':>9}{'seconds':>9}{'peak RSS MiB':>14}")
    for key, r in sampling.items():
        engine, threads = key.split("@")
        print(f"{engine:<8}{threads:>8}{r['tokens_per_s']:>9.1f}{r['seconds']:>9.1f}{r['peak_rss_mib']:>14.0f}")
    v = sampling["vllm@2"]
    print(f"vLLM engine start {v['engine_start_s']:.1f} s, first weight load {v['first_sync_s']:.2f} s, "
          f"weight sync {v['weight_sync_s']:.2f} s (median of 3)")
    print(f"\ngrpo step 2 (step 1 warms up), {args.grpo_questions} questions x {args.grpo_group} x "
          f"{args.grpo_tokens} tokens, 2 threads")
    for engine, r in grpo.items():
        step = r["step"]
        phases = "  ".join(f"{k[5:-2]} {val:.1f}s" for k, val in step.items()
                           if k.startswith("time/") and k != "time/step_s")
        print(f"{engine:<6} step {step['step_s']:.1f} s  ({phases})  peak RSS {r['peak_rss_mib']:.0f} MiB")
    write_json(args.out, payload)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
