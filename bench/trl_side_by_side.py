"""One GRPO step of coevolve next to TRL's ``GRPOTrainer`` doing the same work on the same model.

Both sides: the same weights (two fresh loads; TRL's from the model's plain HF folder, since TRL will not train the
GGUF-loaded smollm2-135m), the same prompts (TRL's dataset is the prompts coevolve drew, in
step order, unshuffled), B prompts x G samples per step, the same max completion length, temperature 1 with no
top-k / top-p, the exact-answer reward, one optimizer step per generation batch (AdamW, constant lr, grad clip
1.0), no KL (no reference model), sequence-mean loss (TRL ``loss_type="grpo"``), the same micro-batch size, fp32
on CPU, no vLLM, no gradient checkpointing, no logging or saving. coevolve samples the whole B x G batch in one
batch as TRL's ``model.generate`` does (``rollout.batch_size = B*G``).

What differs by design: each side samples with its own random stream, so completions (and where they stop at EOS)
differ; tokens per step are reported for both, with seconds per 1000 generated tokens. With one optimizer step per
generation batch (as here) neither side runs a separate pi_old pass; TRL computes the token entropy in its loss pass.

The comparison runs once per torch thread count (``--threads``, default 1 and 2), so one invocation gives both
ratios. Within a setting the order is coevolve, TRL, coevolve again (a fresh recipe redoing the same steps), so
load that drifts during the run falls on both sides. Each block runs ``--warmup`` untimed steps, then ``--steps``
timed steps; the report gives the median seconds per step (coevolve: over both of its blocks), the ratio
TRL / coevolve (above 1: coevolve is faster) and a split into sampling, reward and the rest.
Writes ``bench/results/trl.json`` (``trl_<model>.json`` for another model). Run from the repository root:
``.venv/bin/python bench/trl_side_by_side.py [--quick] [--threads 1 2]`` (needs ``pip install "trl>=0.14"``, the
``bench`` extra).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from speed import (
    RESULTS_DIR,
    grpo_recipe,
    machine_info,
    run_header,
    warn_if_busy,
    wrap_timer,
    write_json,
)


def run_coevolve(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Warm-up + timed steps of a fresh grpo recipe; returns every step's row and the prompts drawn, in order."""
    batch = args.prompts * args.group
    recipe = grpo_recipe(args.model, args.prompts, args.group, args.max_new_tokens, [
        f"rollout.batch_size={batch}", f"train.micro_batch_size={args.micro_batch}", f"train.lr={args.lr}",
        "train.kl_beta=0", "train.loss_agg=seq_mean", "train.epochs=1", "train.mini_batch_size=0",
        "rollout.temperature=1.0", "rollout.top_p=1.0", "rollout.top_k=0", f"seed={args.seed}"])
    rows, dataset = [], []
    for step in range(1, args.warmup + args.steps + 1):
        started = time.perf_counter()
        out = recipe.step(step)
        wall = time.perf_counter() - started
        m = out.metrics
        rows.append({"step": step, "wall_s": wall, "tokens": m["tokens/solver"], "sample_s": m["time/solve_s"],
                     "reward_s": m["time/reward_s"], "reward_mean": m["solver/reward_mean"],
                     "prompts": sorted({r.prompt for r in out.samples})})
        dataset += [{"prompt": r.prompt, "answer": r.label} for r in out.samples[::args.group]]
    return rows, dataset


class _StepClock:
    """Times TRL's optimizer steps (``on_step_end`` to ``on_step_end``) and what its sampler and reward took."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        clock = self
        self.generate: list[float] = []
        self.reward: list[float] = []
        self.tokens: list[int] = []
        self.rewards: list[float] = []
        self.prompts: list[str] = []
        self.rows: list[dict[str, Any]] = []
        self.last = 0.0

        class Callback(TrainerCallback):
            def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                clock.last = time.perf_counter()

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                now = time.perf_counter()
                clock.rows.append({"step": state.global_step, "wall_s": now - clock.last,
                                   "tokens": sum(clock.tokens), "sample_s": sum(clock.generate),
                                   "reward_s": sum(clock.reward),
                                   "reward_mean": statistics.fmean(clock.rewards) if clock.rewards else 0.0,
                                   "prompts": sorted(set(clock.prompts))})
                for sink in (clock.generate, clock.reward, clock.tokens, clock.rewards, clock.prompts):
                    sink.clear()
                clock.last = time.perf_counter()

        self.callback = Callback()


def run_trl(args: argparse.Namespace, dataset: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The same steps through ``trl.GRPOTrainer``; returns every step's row."""
    from datasets import Dataset
    from datasets.table import InMemoryTable
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl import __version__ as trl_version

    from coevolve.models import hf_model_source, load_policy
    from coevolve.tasks.registry import get_task

    if not hasattr(GRPOTrainer, "_generate_single_turn"):
        raise SystemExit(f"TRL {trl_version} has no GRPOTrainer._generate_single_turn, which this script times as "
                         "TRL's sampling phase; it was written against TRL 1.16: pip install 'trl>=1.16'")
    # the model as a plain HF folder: TRL refuses to train a GGUF-loaded model (smollm2-135m) as 'quantized'
    policy = load_policy(hf_model_source(args.model))
    task, style = get_task("arith"), policy.prompt_style
    clock = _StepClock()

    def exact_answer(prompts: list[str], completions: list[str], answer: list[str],
                     completion_ids: list[list[int]], **_: Any) -> list[float]:
        """1.0 when the parsed answer equals the reference (the grpo recipe's reward)."""
        started = time.perf_counter()
        rewards = [float(task.is_correct(task.parse_answer(c, style), a)) for c, a in zip(completions, answer)]
        clock.reward.append(time.perf_counter() - started)
        clock.tokens.append(sum(len(ids) for ids in completion_ids))
        clock.rewards.extend(rewards)
        clock.prompts.extend(prompts)
        return rewards

    batch = args.prompts * args.group
    # transformers 5 renamed gradient_checkpointing (TRL's default: on) to activation_checkpointing
    renamed = "activation_checkpointing" in GRPOConfig.__dataclass_fields__
    no_checkpointing = {"activation_checkpointing" if renamed else "gradient_checkpointing": False}
    with tempfile.TemporaryDirectory(prefix="trl-bench-") as out_dir:
        config = GRPOConfig(
            output_dir=out_dir, max_steps=args.warmup + args.steps, seed=args.seed,
            per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=batch // args.micro_batch,
            num_generations=args.group, max_completion_length=args.max_new_tokens,
            temperature=1.0, top_p=1.0, top_k=0, num_iterations=1, beta=0.0, epsilon=0.2, loss_type="grpo",
            scale_rewards="group", learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
            weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch", use_vllm=False, use_cpu=True, bf16=False,
            fp16=False, shuffle_dataset=False, report_to="none", **no_checkpointing,
            logging_strategy="no", save_strategy="no", disable_tqdm=True, log_completions=False,
            dataloader_num_workers=0, dataloader_pin_memory=False)
        # A fingerprint of our own: datasets 5.2 fails to hash a table under pyarrow 26 (dill cannot pickle its
        # MonthDayNano type), which Dataset.from_list does to make one
        prompts = Dataset(InMemoryTable.from_pylist(dataset), fingerprint="coevolve-prompts")
        trainer = GRPOTrainer(model=policy.model, reward_funcs=exact_answer, args=config,
                              train_dataset=prompts, processing_class=policy.tokenizer,
                              callbacks=[clock.callback])
        trainer.remove_callback(PrinterCallback)  # it prints the end-of-training summary
        wrap_timer(trainer, "_generate_single_turn", clock.generate)
        trainer.train()
    return clock.rows


def summarize(blocks: list[list[dict[str, Any]]], warmup: int) -> dict[str, Any]:
    """Medians over the timed steps of every block (each after its ``warmup`` steps), and every step's row."""
    timed = [r for rows in blocks for r in rows[warmup:]]
    med = {k: statistics.median(r[k] for r in timed) for k in ("wall_s", "tokens", "sample_s", "reward_s")}
    return {
        "median_s": med["wall_s"], "median_tokens": med["tokens"], "median_sample_s": med["sample_s"],
        "median_reward_s": med["reward_s"], "median_rest_s": statistics.median(
            r["wall_s"] - r["sample_s"] - r["reward_s"] for r in timed),
        "median_s_per_1k_tokens": statistics.median(1000 * r["wall_s"] / max(r["tokens"], 1) for r in timed),
        "warmup_steps": warmup, "blocks": blocks,
    }


def print_table(ours: dict[str, Any], trl: dict[str, Any], ratio: float, ratio_per_token: float,
                title: str) -> None:
    """Both sides' medians and the ratios (rich)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("", "step s", "sampling s", "reward s", "update + rest s", "tokens/step", "s per 1k tokens"):
        table.add_column(col, justify="left" if not col else "right")
    for name, r in (("coevolve", ours), ("TRL GRPOTrainer", trl)):
        table.add_row(name, f"{r['median_s']:.2f}", f"{r['median_sample_s']:.2f}", f"{r['median_reward_s']:.3f}",
                      f"{r['median_rest_s']:.2f}", f"{r['median_tokens']:.0f}", f"{r['median_s_per_1k_tokens']:.2f}")
    console = Console(width=130)
    console.print(table)
    console.print(f"TRL / coevolve: {ratio:.2f}x per step, {ratio_per_token:.2f}x per generated token "
                  "(above 1: coevolve is faster)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--quick`` replaces the sizes)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="tiny-arith", help="built-in name or local model folder")
    parser.add_argument("--prompts", type=int, default=16, help="B, prompts per step")
    parser.add_argument("--group", type=int, default=8, help="G, samples per prompt (TRL num_generations)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="max completion length")
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward pass")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per block")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                        help="torch thread counts: the whole comparison runs once per count")
    parser.add_argument("--quick", action="store_true", help="2 prompts x 4 samples x 16 tokens, 1 timed step")
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results/trl.json (tiny-arith) or "
                        "bench/results/trl_<model>.json")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = RESULTS_DIR / ("trl.json" if args.model == "tiny-arith" else f"trl_{Path(args.model).name}.json")
    if args.quick:
        args.prompts, args.group, args.max_new_tokens, args.micro_batch, args.steps = 2, 4, 16, 4, 1
    if (args.prompts * args.group) % args.micro_batch:
        parser.error("--micro-batch must divide prompts x group")
    return args


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """coevolve, TRL, coevolve again at the current torch thread count; both sides' medians and the ratios."""
    loads = [machine_info()["load_avg_1_5_15"]]
    ours_first, dataset = run_coevolve(args)
    loads.append(machine_info()["load_avg_1_5_15"])
    trl_rows = run_trl(args, dataset)
    loads.append(machine_info()["load_avg_1_5_15"])
    ours_again, _ = run_coevolve(args)
    loads.append(machine_info()["load_avg_1_5_15"])
    ours, theirs = summarize([ours_first, ours_again], args.warmup), summarize([trl_rows], args.warmup)
    same_prompts = len(ours_first) == len(trl_rows) and all(
        a["prompts"] == b["prompts"] for a, b in zip(ours_first, trl_rows))
    return {"torch_threads": torch.get_num_threads(), "load_avg_before_each_block_and_at_end": loads,
            "same_prompts_every_step": same_prompts, "coevolve": ours, "trl_grpo_trainer": theirs,
            "ratio_trl_over_coevolve": theirs["median_s"] / ours["median_s"],
            "ratio_per_token": theirs["median_s_per_1k_tokens"] / ours["median_s_per_1k_tokens"]}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import trl

    warn_if_busy()
    header = run_header()
    by_threads: dict[str, dict[str, Any]] = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        result = by_threads[str(threads)] = compare(args)
        load = ", ".join(f"{x:.2f}" for x in result["load_avg_before_each_block_and_at_end"][-1])
        print(f"same prompts on both sides at every step: {result['same_prompts_every_step']}")
        print_table(result["coevolve"], result["trl_grpo_trainer"], result["ratio_trl_over_coevolve"],
                    result["ratio_per_token"],
                    f"GRPO step, {args.model}: {args.prompts} prompts x {args.group} x {args.max_new_tokens} tokens, "
                    f"micro-batch {args.micro_batch} (TRL {trl.__version__}, {threads} threads, load avg {load})")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    write_json(args.out, {**header, "machine": machine_info(), "trl": trl.__version__, "settings": settings,
                          "by_threads": by_threads})
    for threads, result in by_threads.items():
        print(f"{threads} thread(s): TRL / coevolve {result['ratio_trl_over_coevolve']:.2f}x per step, "
              f"{result['ratio_per_token']:.2f}x per generated token")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
