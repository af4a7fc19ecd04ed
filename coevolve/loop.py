"""The one training loop every recipe runs in: step, log, evaluate, checkpoint, resume."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from coevolve import distributed
from coevolve.config import RunConfig, to_yaml
from coevolve.grading.guard import pop_bound_counts
from coevolve.recipes.base import Recipe
from coevolve.rundir import check_run_dir
from coevolve.store import RunStore, atomic_write_text, dumps

log = logging.getLogger(__name__)


class NonFiniteWeights(RuntimeError):
    """A step left a role's weights with NaN or inf; the run stopped before checkpointing them (one-line message)."""


def _non_finite_roles(models: dict[str, torch.nn.Module]) -> list[str]:
    """Roles whose weights (this rank's shards) hold NaN or inf, agreed over all ranks."""
    bad = [role for role, model in models.items()
           if not torch.stack([torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()
                               for p in model.parameters()]).all().item()]
    return sorted({role for rank_bad in distributed.all_gather_objects(bad) for role in rank_bad})


def _tensorboard(root: Path, purge_step: int | None):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is a dependency; a broken install only loses the event files
        log.warning("tensorboard is not importable; no event files will be written")
        return None
    return SummaryWriter(str(root / "tb"), purge_step=purge_step)


def evaluate_solver(recipe: Recipe, config: RunConfig, store: RunStore, step: int) -> dict[str, float]:
    """Accuracy of the recipe's solver on the configured evaluation sets (one metrics row), sampled as the
    ``eval_preset`` says (greedy by default; a sampled protocol's accuracy is the mean over its n samples per
    question, avg@n) within ``eval_max_new_tokens``: ``eval/<set>/accuracy`` (strict answer format) and
    ``eval/<set>/accuracy_lenient`` (last number or expression)."""
    from coevolve.evaluation.harness import evaluate

    if not config.eval_sets:
        return {}
    policy = recipe.solver()
    started = time.perf_counter()
    summaries = evaluate(policy, recipe.engine(policy), config.eval_sets, preset=config.eval_preset,
                         max_new_tokens=config.eval_max_new_tokens, limit=config.eval_limit,
                         seed=config.seed, data_dir=config.data_dir,
                         out_dir=store.eval_dir / f"step_{step:06d}" if distributed.is_main() else None,
                         progress=False)
    row = {f"eval/{name}/{key}": s[key] for name, s in summaries.items() for key in ("accuracy", "accuracy_lenient")}
    row["time/eval_s"] = time.perf_counter() - started
    row.update(recipe.engine_metrics())
    row.update(pop_bound_counts())  # model text the evaluation's parsers refused (bounds/*)
    return row


def run(recipe: Recipe, config: RunConfig, out_dir: str | Path, *, resume: bool = False,
        progress: bool = True) -> dict[str, Any]:
    """Train for ``config.steps`` steps in ``out_dir`` (continuing from its last checkpoint if ``resume``)."""
    store = RunStore(out_dir)
    trainers = recipe.trainers()
    models = {role: t.model for role, t in trainers.items()}
    optimizers = {role: t.optimizer for role, t in trainers.items()}
    # KL references that phases move (train.kl_reference: phase_start) are saved and restored with the weights
    saved_models = {**models, **{f"{role}_reference": t.checkpointed_reference for role, t in trainers.items()
                                 if t.checkpointed_reference is not None}}
    start, elapsed_before = 1, 0.0
    main = distributed.is_main()  # with several processes, rank 0 alone writes the run directory
    if resume:
        def restore(state: dict[str, Any]) -> None:  # the loop's and the recipe's part of a checkpoint
            updates_done = {role: state["updates_done"][role] for role in trainers}
            if not isinstance(state["time_s"], (int, float)) or not all(isinstance(n, int) and n >= 0
                                                                        for n in updates_done.values()):
                raise ValueError("time_s or updates_done is not a number")
            recipe.load_state_dict(state["loop_recipe"])
            for role, t in trainers.items():
                t.updates_done = updates_done[role]

        loaded = store.load_latest_checkpoint(saved_models, optimizers, restore)  # the newest intact one
        if loaded:
            step, state = loaded
            start, elapsed_before = step + 1, state["time_s"]
        distributed.barrier()  # every rank has read the checkpoint before rank 0 trims what follows it
        if main:
            store.truncate_after(loaded[0] if loaded else -1)
    else:
        if main:
            check_run_dir(store.root)  # a new run only in an empty or absent folder
        distributed.barrier()  # rank 0 has checked before it writes
    if main:  # on resume too, so that --set overrides (more steps) are what a later plain --resume reads
        store.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(store.root / "config.yaml", to_yaml(config))
    writer = _tensorboard(store.root, purge_step=start if resume else None) if main else None
    t0 = time.perf_counter()

    def now() -> float:
        return elapsed_before + time.perf_counter() - t0

    def log_row(step: int, row: dict[str, Any]) -> None:
        if not main:
            return
        row = {"step": step, "time_s": round(now(), 3), **row}
        store.append_metrics(row)
        if writer is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    writer.add_scalar(key, value, step)
            writer.flush()

    if start == 1 and config.eval_sets:
        log_row(0, evaluate_solver(recipe, config, store, 0))
    bar = tqdm(range(start, config.steps + 1), initial=start - 1, total=config.steps, desc=config.recipe,
               disable=not (progress and main), dynamic_ncols=True)
    last_metrics: dict[str, Any] = {}
    for step in bar:
        started = time.perf_counter()
        out = recipe.step(step)
        for role in trainers:  # a role that sat the step out took 0 optimizer steps: every row has every role
            out.metrics.setdefault(f"{role}/optimizer_steps", 0)
        out.metrics["time/step_s"] = time.perf_counter() - started
        out.metrics.update(recipe.engine_metrics())
        out.metrics.update(pop_bound_counts())  # over-long or unparsable model text, votes over budget (bounds/*)
        if main:
            store.write_samples(step, out.samples)
        log_row(step, out.metrics)
        last_metrics = out.metrics
        stop = recipe.finished()  # the method's own end (PasoDoble's max_updates) before config.steps
        bad = _non_finite_roles(models)
        if bad:  # stop before evaluating or checkpointing garbage; every checkpoint so far passed this check
            done = store.checkpoint_steps()
            kept = (f"the last checkpoint, step {done[-1]}, holds finite weights (checked before it was written, "
                    f"verified by checksum when read)" if done else "no checkpoint was written")
            raise NonFiniteWeights(f"step {step}: the {' and '.join(bad)} weights are not finite (NaN or inf) after "
                                   f"the update; the run stopped and {kept} (lower train.lr, then --resume "
                                   f"{store.root} --set train.lr=...)")
        if config.eval_sets and ((config.eval_every and step % config.eval_every == 0) or step == config.steps
                                 or stop):
            eval_row = evaluate_solver(recipe, config, store, step)
            log_row(step, eval_row)
            if main:
                bar.write(f"step {step}: " + "  ".join(f"{k.split('/', 1)[1].replace('/accuracy', '')} {v:.3f}"
                                                       for k, v in eval_row.items() if k.startswith("eval/")))
        if step % config.checkpoint_every == 0 or step == config.steps or stop:  # every rank: sharded state gathered
            store.save_checkpoint(step, saved_models, optimizers, {
                "time_s": now(), "loop_recipe": recipe.state_dict(),
                "updates_done": {role: t.updates_done for role, t in trainers.items()},
            }, keep=config.keep_checkpoints)
        bar.set_postfix({k.split("/", 1)[-1]: round(v, 3) for k, v in out.metrics.items()
                         if k.endswith("reward_mean") and isinstance(v, float)})
        if stop:
            break
    bar.close()
    if writer is not None:
        writer.close()
    distributed.barrier()
    if not main:
        return {}
    rows = store.metrics()
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    summary = {
        "recipe": config.recipe, "model": config.model, "task": config.task, "seed": config.seed,
        "steps": config.steps, "steps_run": max([r["step"] for r in rows] or [0]), "wall_s": round(now(), 3),
        "skipped_steps": sum(int(r.get("skipped_steps", 0) or 0) for r in rows if "eval/" not in str(r)),
        "first_eval": evals[0] if evals else None, "final_eval": evals[-1] if evals else None,
        "last_step_metrics": last_metrics, "torch": torch.__version__, **recipe.run_summary(),
    }
    atomic_write_text(store.root / "summary.json", dumps(summary) + "\n")
    return summary
