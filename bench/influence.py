"""Cost of INFUSER's influence phase (Phase 4) against one solver update over the same rollouts.

For each model (default: ``tiny-arith`` and ``smollm2-135m``) it builds Q questions x n rollouts (random completion
tokens of a fixed length with mean-centred 0/1 advantages: the cost does not depend on what the tokens say), takes one
real solver update first so the AdamW second moment is live, computes the dev reference gradient ĝ_dev on D x n dev
rollouts, and then measures

- time: Phase 4 (:func:`coevolve.rl.influence.influence_scores`, one backward per question plus the streamed
  preconditioned cosine) divided by one ``PolicyTrainer.update`` pass over the same Q x n rollouts (old log-probs,
  forward + backward, one AdamW step); the dev gradient's time is shown beside it, over its own rollouts;
- memory: the peak resident memory above the level before ĝ_dev is computed, over Phase 1's gradient and Phase 4
  (so ĝ_dev, the gradient buffer, streaming temporaries and activations), divided by the parameters' memory; the same
  for the solver update for comparison, and the difference of the two (what the influence phase holds beyond what
  a solver update needs anyway: activations and the gradient buffer are common to both). Peaks come from Linux's
  VmHWM, reset through ``/proc/self/clear_refs``; the
  script re-executes itself with ``MALLOC_MMAP_THRESHOLD_`` low so freed tensors return to the system.

It prints a table and writes ``bench/results/influence.json`` with the machine, load average, command and time.
Run from the repository root, pinned to one core:
``OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python bench/influence.py [--models tiny-arith smollm2-135m]``
(``--quick``: tiny sizes on tiny-arith, a smoke run whose figures mean nothing).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speed import RESULTS_DIR, machine_info, run_header, warn_if_busy, write_json

MMAP_THRESHOLD = "65536"


@dataclass(frozen=True)
class Sizes:
    questions: int  # Q
    group: int  # n
    dev_questions: int  # D
    completion_tokens: int
    micro_batch: int
    repeats: int


SIZES = {"compact": Sizes(questions=32, group=8, dev_questions=16, completion_tokens=48, micro_batch=8, repeats=3),
         "chat": Sizes(questions=4, group=8, dev_questions=2, completion_tokens=48, micro_batch=8, repeats=1),
         "quick": Sizes(questions=2, group=2, dev_questions=1, completion_tokens=8, micro_batch=2, repeats=1)}


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class PeakMemory:
    """Peak resident memory above the level at entry (KiB), from VmHWM after a reset of the high-water mark."""

    def __enter__(self) -> PeakMemory:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
        self.base = rss_kib("VmRSS")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.extra_bytes = (rss_kib("VmHWM") - self.base) * 1024


def rollouts(tokenizer, rng: random.Random, questions: int, group: int, length: int, offset: int):
    """Q groups of n rollouts with random completion tokens and mean-centred 0/1 advantages (never all equal)."""
    from coevolve.rl.trainer import TrainSample
    from coevolve.tasks import arith

    vocab = [t for t in range(len(tokenizer)) if t not in tokenizer.all_special_ids]
    problems = arith.sample_problems(questions + offset, rng, grounded=True)[offset:]
    out = []
    for problem in problems:
        prompt = tokenizer(arith.solver_prompt(problem.question, problem.doc), add_special_tokens=False)["input_ids"]
        rewards = [float(i % 2) for i in range(group)]
        out.append([TrainSample(prompt, [rng.choice(vocab) for _ in range(length)], [], r - 0.5) for r in rewards])
    return out


def measure(model: str, sizes: Sizes) -> dict[str, Any]:
    from coevolve.models import load_policy
    from coevolve.rl.influence import dev_gradient, influence_scores, trainable
    from coevolve.rl.trainer import PolicyTrainer, UpdateSettings

    started = time.perf_counter()
    policy = load_policy(model)
    load_s = time.perf_counter() - started
    trainer = PolicyTrainer(policy.model, policy.tokenizer, UpdateSettings(
        lr=1e-6, weight_decay=0.01, loss_agg="token_sum_norm", norm_constant=sizes.completion_tokens,
        micro_batch_size=sizes.micro_batch))
    param_bytes = sum(p.numel() * p.element_size() for p in trainable(trainer))
    rng = random.Random(0)
    questions = rollouts(policy.tokenizer, rng, sizes.questions, sizes.group, sizes.completion_tokens, 0)
    dev = rollouts(policy.tokenizer, rng, sizes.dev_questions, sizes.group, sizes.completion_tokens, 1000)
    batch = [s for q in questions for s in q]
    trainer.update(batch)  # warm-up and a live AdamW state
    influence_s, update_s, dev_s, influence_mem, update_mem = [], [], [], [], []
    for _ in range(sizes.repeats):
        with PeakMemory() as mem:
            t0 = time.perf_counter()
            reference = dev_gradient(trainer, [s for q in dev for s in q]).grads
            t1 = time.perf_counter()
            influence_scores(trainer, questions, reference)
            t2 = time.perf_counter()
            del reference
        dev_s.append(t1 - t0)
        influence_s.append(t2 - t1)
        influence_mem.append(mem.extra_bytes)
        trainer.optimizer.zero_grad(set_to_none=True)
        with PeakMemory() as mem:
            t0 = time.perf_counter()
            trainer.update(batch)
            update_s.append(time.perf_counter() - t0)
        update_mem.append(mem.extra_bytes)
        trainer.optimizer.zero_grad(set_to_none=True)
    inf, upd = statistics.median(influence_s), statistics.median(update_s)
    return {
        "model": model, "parameters": sum(p.numel() for p in trainable(trainer)), "param_mib": param_bytes / 2**20,
        "load_s": round(load_s, 2), "sizes": vars(sizes), "rollouts": len(batch),
        "influence_s": round(inf, 4), "solver_update_s": round(upd, 4),
        "dev_gradient_s": round(statistics.median(dev_s), 4),
        "time_ratio": round(inf / upd, 3),
        "influence_extra_mib": round(max(influence_mem) / 2**20, 1),
        "update_extra_mib": round(max(update_mem) / 2**20, 1),
        "memory_ratio": round(max(influence_mem) / param_bytes, 3),
        "update_memory_ratio": round(max(update_mem) / param_bytes, 3),
        "memory_ratio_beyond_update": round((max(influence_mem) - max(update_mem)) / param_bytes, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", help="built-in names or model folders (default: tiny-arith and "
                        "smollm2-135m; --quick: tiny-arith)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "influence.json")
    parser.add_argument("--quick", action="store_true", help="tiny sizes on tiny-arith only: a smoke run")
    args = parser.parse_args()
    args.models = args.models or (["tiny-arith"] if args.quick else ["tiny-arith", "smollm2-135m"])
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != MMAP_THRESHOLD:  # freed tensors must leave the resident set
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD})
    warn_if_busy()
    header = run_header()
    rows = []
    for model in args.models:  # tiny-arith reads the compact format; every other model is a chat model
        rows.append(measure(model, SIZES["quick" if args.quick else "compact" if model == "tiny-arith" else "chat"]))
    print(f"{'model':<14} {'params':>10} {'rollouts':>8} {'phase 4 s':>10} {'update s':>9} {'time x':>7} "
          f"{'dev grad s':>10} {'extra MiB':>9} {'mem x param':>11} {'update mem x':>12} {'beyond update x':>15}")
    for r in rows:
        print(f"{r['model']:<14} {r['parameters']:>10} {r['rollouts']:>8} {r['influence_s']:>10.3f} "
              f"{r['solver_update_s']:>9.3f} {r['time_ratio']:>7.2f} {r['dev_gradient_s']:>10.3f} "
              f"{r['influence_extra_mib']:>9.1f} {r['memory_ratio']:>11.2f} {r['update_memory_ratio']:>12.2f} "
              f"{r['memory_ratio_beyond_update']:>15.2f}")
    write_json(args.out, {**header, "machine": machine_info(), "goal": {"time_ratio": 1.2, "memory_ratio": 2.0},
                          "results": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
