"""Speed of coevolve on this machine: sampling and training throughput, and one GRPO step split by phase.

For each model (default: ``tiny-arith`` and ``smollm2-135m``) it measures

- sampling: ``HFRolloutEngine.generate`` on N sequences x T new tokens at temperature 1, EOS ignored so every
  sequence is exactly T tokens; the same work through transformers' ``model.generate`` as a reference;
- training: ``sequence_logprobs`` forward (no grad) and forward + backward on N sequences x L tokens;
- a GRPO step: ``recipe.step()`` of the ``grpo`` recipe (arith task), median over a few steps after a warm-up
  step, split into the recipe's phases (solve, reward, update_solver; the old-log-prob pass inside the update is
  shown on its own) plus what is left (building the sample records).

It prints tables and writes ``bench/results/speed.json`` with the machine, load average, command and time.
Run from the repository root: ``.venv/bin/python bench/speed.py [--quick] [--models tiny-arith ...]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from coevolve.models import Policy
    from coevolve.recipes.base import Recipe

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much work each measurement does."""

    sample_seqs: int
    sample_tokens: int
    train_seqs: int
    train_len: int
    grpo_prompts: int
    grpo_group: int
    grpo_tokens: int
    grpo_steps: int
    repeats: int


# Full sizes by prompt style: "compact" is tiny-arith (and its build folders), "chat" every other model.
FULL_SIZES = {
    "compact": Sizes(sample_seqs=64, sample_tokens=128, train_seqs=16, train_len=160,
                     grpo_prompts=16, grpo_group=8, grpo_tokens=64, grpo_steps=5, repeats=5),
    "chat": Sizes(sample_seqs=64, sample_tokens=128, train_seqs=16, train_len=160,
                  grpo_prompts=4, grpo_group=4, grpo_tokens=128, grpo_steps=2, repeats=1),
}
QUICK_SIZES = Sizes(sample_seqs=8, sample_tokens=16, train_seqs=4, train_len=48,
                    grpo_prompts=2, grpo_group=4, grpo_tokens=16, grpo_steps=1, repeats=1)


# ----------------------------------------------------------------------------- shared with trl_side_by_side.py


def machine_info() -> dict[str, Any]:
    """CPU, library versions, torch threads and the load average now."""
    import transformers

    cpu_model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        cpu_model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                          if line.startswith("model name")), "")
    return {
        "cpu_count": os.cpu_count(), "cpu_model": cpu_model, "platform": platform.platform(),
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(), "load_avg_1_5_15": list(os.getloadavg()),
    }


def warn_if_busy() -> None:
    """Say so when the 1-minute load average shows other work on the CPUs (the timings will be inflated)."""
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    if load > 0.75 * cpus:
        print(f"warning: load average {load:.2f} on {cpus} CPUs: other processes compete for the cores, so these "
              "timings are inflated (with 2 torch threads, far more than in proportion); rerun on a quiet machine",
              file=sys.stderr, flush=True)


def run_header() -> dict[str, Any]:
    """The command line and a UTC timestamp, for a results file."""
    return {"command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
            "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write a results file (creating its folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def grpo_recipe(model: str, prompts: int, group: int, max_new_tokens: int, sets: list[str]) -> Recipe:
    """The ``grpo`` recipe on the arith task with B prompts x G samples per step (more --set overrides last)."""
    from coevolve.recipes import resolve

    config, params, cls = resolve("grpo", sets=[f"model={model}", "task=arith", f"params.questions_per_step={prompts}",
                                                f"params.group_size={group}",
                                                f"rollout.max_new_tokens={max_new_tokens}", *sets])
    return cls(config, params)


def wrap_timer(obj: Any, method: str, sink: list[float]) -> None:
    """Record the seconds of every call of ``obj.method`` in ``sink`` (instance-level wrapper)."""
    inner = getattr(obj, method)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - started)

    setattr(obj, method, wrapper)


# ----------------------------------------------------------------------------- measurements


def _timed(fn: Callable[[], Any], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return times


def _summary(times: list[float], tokens: int) -> dict[str, Any]:
    med = statistics.median(times)
    return {"seconds": times, "median_s": med, "tokens": tokens, "tokens_per_s": tokens / med}


def _prompts(policy: Policy, n: int, seed: int = 0) -> list[str]:
    from coevolve.tasks import arith

    problems = arith.sample_problems(n, random.Random(seed), levels=(1, 2, 3, 4))
    return [policy.format_prompt(arith.solver_prompt(p.question, None, policy.prompt_style)) for p in problems]


def bench_sampling(policy: Policy, seqs: int, tokens: int, repeats: int) -> dict[str, Any]:
    """Our engine: ``seqs`` sequences x ``tokens`` new tokens in one batch, temperature 1, EOS ignored."""
    from coevolve.rollout import SamplingParams
    from coevolve.rollout.hf import HFRolloutEngine

    engine = HFRolloutEngine(policy.model, policy.tokenizer, batch_size=seqs, eos_token_ids=[])
    prompts = _prompts(policy, seqs)
    params = SamplingParams(temperature=1.0, max_new_tokens=tokens)
    engine.generate(prompts[:2], SamplingParams(temperature=1.0, max_new_tokens=2), seed=0)  # warm-up
    return _summary(_timed(lambda: engine.generate(prompts, params, seed=1), repeats), seqs * tokens)


def bench_hf_generate(policy: Policy, seqs: int, tokens: int, repeats: int) -> dict[str, Any]:
    """The same work through transformers' ``model.generate`` (sampling, KV cache, EOS suppressed)."""
    from coevolve.padding import left_pad
    from coevolve.rollout.hf import encode_prompt

    ids, mask = left_pad([encode_prompt(policy.tokenizer, p) for p in _prompts(policy, seqs)],
                         policy.tokenizer.pad_token_id)
    kwargs = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
              "pad_token_id": policy.tokenizer.pad_token_id}

    @torch.no_grad()
    def generate(n_tokens: int, rows: slice = slice(None)) -> None:
        policy.model.generate(input_ids=ids[rows], attention_mask=mask[rows], max_new_tokens=n_tokens,
                              min_new_tokens=n_tokens, **kwargs)

    generate(2, slice(0, 2))  # warm-up
    return _summary(_timed(lambda: generate(tokens), repeats), seqs * tokens)


def bench_training(policy: Policy, seqs: int, length: int, repeats: int) -> dict[str, dict[str, Any]]:
    """``sequence_logprobs`` on ``seqs`` x ``length`` tokens (a fifth prompt): forward only, and forward + backward."""
    from coevolve.rl.trainer import TrainSample, sequence_logprobs

    gen = torch.Generator().manual_seed(0)
    n_special = len(policy.tokenizer.all_special_ids)
    vocab = policy.model.get_input_embeddings().num_embeddings

    def ids(n: int) -> list[int]:
        return torch.randint(n_special, vocab, (n,), generator=gen).tolist()

    prompt_len = max(1, length // 5)
    samples = [TrainSample(ids(prompt_len), ids(length - prompt_len), [0.0] * (length - prompt_len), 1.0)
               for _ in range(seqs)]
    pad = policy.tokenizer.pad_token_id
    model = policy.model

    @torch.no_grad()
    def forward() -> None:
        sequence_logprobs(model, samples, pad, 1.0)

    def forward_backward() -> None:
        logprobs, mask = sequence_logprobs(model, samples, pad, 1.0)
        (-(logprobs * mask).sum() / mask.sum()).backward()
        model.zero_grad(set_to_none=True)

    model.train()
    forward_backward()  # warm-up
    result = {"forward": _summary(_timed(forward, repeats), seqs * length),
              "forward_backward": _summary(_timed(forward_backward, repeats), seqs * length)}
    model.eval()
    return result


def bench_grpo_step(model: str, prompts: int, group: int, max_new_tokens: int, steps: int,
                    sets: list[str]) -> dict[str, Any]:
    """``steps`` GRPO steps after one warm-up step: wall time, phases and tokens per step (medians)."""
    recipe = grpo_recipe(model, prompts, group, max_new_tokens, sets)
    old_pass: list[float] = []
    if hasattr(recipe.trainer, "_frozen_logprobs"):  # the pi_old recomputation inside the update
        wrap_timer(recipe.trainer, "_frozen_logprobs", old_pass)
    rows = []
    for step in range(1, steps + 2):
        old_pass.clear()
        started = time.perf_counter()
        metrics = recipe.step(step).metrics
        wall = time.perf_counter() - started
        phases = {k[len("time/"):-len("_s")]: v for k, v in metrics.items() if k.startswith("time/")}
        phases["update_solver.old_logprobs"] = sum(old_pass)
        phases["other"] = wall - sum(v for k, v in phases.items() if "." not in k)
        rows.append({"step": step, "wall_s": wall, "tokens": metrics["tokens/solver"], "phases_s": phases,
                     "reward_mean": metrics["solver/reward_mean"]})
    measured = rows[1:]
    return {
        "config": {"prompts": prompts, "group": group, "max_new_tokens": max_new_tokens,
                   "rollout_batch_size": recipe.config.rollout.batch_size,
                   "micro_batch_size": recipe.config.train.micro_batch_size, "sets": sets},
        "warmup_steps": 1, "steps": rows,
        "median_s": statistics.median(r["wall_s"] for r in measured),
        "median_tokens": statistics.median(r["tokens"] for r in measured),
        "median_phases_s": {k: statistics.median(r["phases_s"][k] for r in measured) for k in measured[0]["phases_s"]},
    }


# ----------------------------------------------------------------------------- report


def print_tables(results: dict[str, dict[str, Any]], machine: dict[str, Any]) -> None:
    """Throughput table and GRPO phase table (rich)."""
    from rich.console import Console
    from rich.table import Table

    load = ", ".join(f"{x:.2f}" for x in machine["load_avg_1_5_15"])
    through = Table(title=f"coevolve speed ({machine['cpu_count']} CPUs, {machine['torch_threads']} torch threads, "
                          f"torch {machine['torch']}, load avg {load})")
    for col in ("model", "measurement", "work", "median s", "tokens/s"):
        through.add_column(col, justify="left" if col in ("model", "measurement", "work") else "right")
    phases = Table(title="GRPO step (median over measured steps)")
    for col in ("model", "B x G x T", "tokens", "solve s", "reward s", "update s", "(old-logprob pass)", "other s",
                "step s"):
        phases.add_column(col, justify="left" if col in ("model", "B x G x T") else "right")
    for name, res in results.items():
        model = Path(name).name if os.sep in name else name
        for label, key, work in (("sampling (coevolve engine)", "sampling", res.get("sampling_work")),
                                 ("sampling (HF generate)", "sampling_hf_generate", res.get("sampling_work"))):
            if key in res:
                r = res[key]
                through.add_row(model, label, work, f"{r['median_s']:.2f}", f"{r['tokens_per_s']:.0f}")
        if "training" in res:
            for label, key in (("training forward", "forward"), ("training forward+backward", "forward_backward")):
                r = res["training"][key]
                through.add_row(model, label, res["training_work"], f"{r['median_s']:.2f}", f"{r['tokens_per_s']:.0f}")
        if "grpo_step" in res:
            g = res["grpo_step"]
            p, c = g["median_phases_s"], g["config"]
            phases.add_row(model, f"{c['prompts']} x {c['group']} x {c['max_new_tokens']}", f"{g['median_tokens']:.0f}",
                           f"{p.get('solve', 0):.2f}", f"{p.get('reward', 0):.3f}", f"{p.get('update_solver', 0):.2f}",
                           f"{p['update_solver.old_logprobs']:.2f}", f"{p['other']:.3f}", f"{g['median_s']:.2f}")
    console = Console(width=130)
    console.print(through)
    console.print(phases)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; sizes left unset take the per-model defaults."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny-arith", "smollm2-135m"],
                        help="built-in names or local model folders")
    parser.add_argument("--only", nargs="+", choices=["sampling", "training", "grpo"],
                        default=["sampling", "training", "grpo"], help="which measurements to run")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run (about a minute for both models)")
    for field in dataclasses.fields(Sizes):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=int, default=None,
                            help="override the size (default: per model, see FULL_SIZES / QUICK_SIZES)")
    parser.add_argument("--set", dest="sets", action="append", default=[],
                        help="extra config override for the GRPO step, e.g. --set train.micro_batch_size=16")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "speed.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from coevolve.models import load_policy

    warn_if_busy()
    header, machine_start = run_header(), machine_info()
    results: dict[str, dict[str, Any]] = {}
    for name in args.models:
        policy = load_policy(name)
        base = QUICK_SIZES if args.quick else FULL_SIZES[policy.prompt_style]
        sizes = dataclasses.replace(base, **{f.name: getattr(args, f.name) for f in dataclasses.fields(Sizes)
                                             if getattr(args, f.name) is not None})
        res: dict[str, Any] = {"sizes": dataclasses.asdict(sizes),
                               "parameters": sum(p.numel() for p in policy.model.parameters())}
        print(f"[{name}] {res['parameters'] / 1e6:.2f}M parameters, sizes {res['sizes']}", flush=True)
        if "sampling" in args.only:
            res["sampling_work"] = f"{sizes.sample_seqs} seqs x {sizes.sample_tokens} new tokens"
            res["sampling"] = bench_sampling(policy, sizes.sample_seqs, sizes.sample_tokens, sizes.repeats)
            res["sampling_hf_generate"] = bench_hf_generate(policy, sizes.sample_seqs, sizes.sample_tokens,
                                                            sizes.repeats)
            print(f"[{name}] sampling done", flush=True)
        if "training" in args.only:
            res["training_work"] = f"{sizes.train_seqs} seqs x {sizes.train_len} tokens"
            res["training"] = bench_training(policy, sizes.train_seqs, sizes.train_len, sizes.repeats)
            print(f"[{name}] training done", flush=True)
        del policy
        if "grpo" in args.only:
            res["grpo_step"] = bench_grpo_step(name, sizes.grpo_prompts, sizes.grpo_group, sizes.grpo_tokens,
                                               sizes.grpo_steps, args.sets)
            print(f"[{name}] grpo step done", flush=True)
        results[name] = res
    machine = machine_info()
    machine["load_avg_at_start"] = machine_start["load_avg_1_5_15"]
    write_json(args.out, {**header, "machine": machine, "quick": args.quick, "results": results})
    print_tables(results, machine)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
