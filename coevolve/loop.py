"""The one training loop every recipe runs in: step, log, evaluate, checkpoint, resume."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from coevolve import distributed
from coevolve.config import RunConfig
from coevolve.grading.guard import pop_bound_counts
from coevolve.recipes.base import Recipe, StepOutput
from coevolve.records import accuracy_line, is_evaluation
from coevolve.rundir import check_run_dir
from coevolve.store import RunStore, atomic_write_text, dumps
from coevolve.tracking import Tracker, open_trackers

log = logging.getLogger(__name__)


class NonFiniteWeights(RuntimeError):
    """A step left a role's weights with NaN or inf; the run stopped before checkpointing them (one-line message)."""


class NothingTrained(RuntimeError):
    """Every update of a run was skipped for a non-finite loss: its weights are the ones it started from."""


def _non_finite_roles(models: dict[str, torch.nn.Module]) -> list[str]:
    """Roles whose weights (this rank's shards) hold NaN or inf, agreed over all ranks."""
    bad = [role for role, model in models.items()
           if not torch.stack([torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()
                               for p in model.parameters()]).all().item()]
    return sorted({role for rank_bad in distributed.all_gather_objects(bad) for role in rank_bad})


def evaluate_solver(recipe: Recipe, config: RunConfig, store: RunStore, step: int) -> dict[str, float]:
    """Accuracy of the recipe's solver on the configured evaluation sets (one metrics row), sampled as the
    ``eval_preset`` says (greedy by default; a sampled protocol's accuracy is the mean over its n samples per
    question, avg@n) within ``eval_max_new_tokens``: ``eval/<set>/accuracy`` (strict answer format) and
    ``eval/<set>/accuracy_lenient`` (last number or expression). With ``rollout.tools`` the solver answers in
    tool-using episodes, as it trains, and ``eval/<set>/tool_call_rate`` is the share of samples that called a tool."""
    from coevolve.evaluation.harness import evaluate

    if not config.eval_sets:
        return {}
    policy = recipe.solver()
    started = time.perf_counter()
    summaries = evaluate(policy, recipe.solving_engine(policy), config.eval_sets, preset=config.eval_preset,
                         max_new_tokens=config.eval_max_new_tokens, limit=config.eval_limit,
                         seed=config.seed, data_dir=config.data_dir,
                         out_dir=store.eval_dir / f"step_{step:06d}" if distributed.is_main() else None,
                         progress=False)
    keys = ["accuracy", "accuracy_lenient"] + (["tool_call_rate"] if config.rollout.tools else [])
    row = {f"eval/{name}/{key}": s[key] for name, s in summaries.items() for key in keys}
    row["time/eval_s"] = time.perf_counter() - started
    row.update(recipe.engine_metrics())
    row.update(pop_bound_counts())  # model text the evaluation's parsers refused (bounds/*)
    return row


class _Run:
    """One run's state while the loop trains: the recipe, its trainers, the run store and the trackers (rank 0 alone
    writes), and the clock (continued across a resume)."""

    def __init__(self, recipe: Recipe, config: RunConfig, store: RunStore):
        self.recipe, self.config, self.store = recipe, config, store
        self.trainers = recipe.trainers()
        self.models = {role: t.model for role, t in self.trainers.items()}
        self.optimizers = {role: t.optimizer for role, t in self.trainers.items()}
        # KL references that phases move (train.kl_reference: phase_start) are saved and restored with the weights
        self.saved_models = {**self.models, **{f"{role}_reference": t.checkpointed_reference
                                               for role, t in self.trainers.items()
                                               if t.checkpointed_reference is not None}}
        self.main = distributed.is_main()
        self.tracker: Tracker = Tracker()
        self.elapsed_before, self.started = 0.0, time.perf_counter()

    def now(self) -> float:
        """Seconds of training, the time before a resume included."""
        return self.elapsed_before + time.perf_counter() - self.started

    def begin(self, resume: bool) -> int:
        """Restore the newest intact checkpoint (``resume``) or check the folder is free; write ``config.yaml`` and
        open the trackers. Returns the first step to run."""
        start = 1
        if resume:
            loaded = self.store.load_latest_checkpoint(self.saved_models, self.optimizers, self.restore)
            if loaded:
                start, self.elapsed_before = loaded[0] + 1, loaded[1]["time_s"]
                for trainer in self.trainers.values():  # the samplers reload the checkpoint's weights
                    trainer.publish_weights()
                if self.recipe.schedule is not None and start <= self.config.steps:
                    at = self.recipe.schedule.at(start)
                    log.info("resuming at step %d: iteration %d, step %d of %d of the %s phase", start, at.iteration,
                             at.index + 1, at.phase.steps, at.role)
            distributed.barrier()  # every rank has read the checkpoint before rank 0 trims what follows it
            if self.main:
                self.store.truncate_after(start - 1 if loaded else -1)
        else:
            if self.main:
                check_run_dir(self.store.root)  # a new run only in an empty or absent folder
            distributed.barrier()  # rank 0 has checked before it writes
        if self.main:  # on resume too, so that --set overrides (more steps) are what a later plain --resume reads
            self.store.root.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.store.root / "config.yaml", self.recipe.config_yaml(self.config, self.recipe.params))
            self.tracker = open_trackers(self.config.report_to, self.store.root, self.config.model_dump(mode="json"),
                                         resume=resume, start=start)
            if resume:
                self.tracker.resumed(self.store.metrics())  # the rows before the resume point, for a tracker that
                # lost the last ones
        self.started = time.perf_counter()
        return start

    def restore(self, state: dict[str, Any]) -> None:
        """The loop's and the recipe's part of a checkpoint (a KeyError, TypeError or ValueError: it is damaged)."""
        updates_done = {role: state["updates_done"][role] for role in self.trainers}
        if not isinstance(state["time_s"], (int, float)) or not all(isinstance(n, int) and n >= 0
                                                                    for n in updates_done.values()):
            raise ValueError("time_s or updates_done is not a number")
        self.recipe.load_state_dict(state["loop_recipe"])
        for role, trainer in self.trainers.items():
            trainer.updates_done = updates_done[role]

    def log_row(self, step: int, row: dict[str, Any]) -> None:
        """Append a metrics row (with step and time) to ``metrics.jsonl`` and the trackers."""
        if self.main:
            row = {"step": step, "time_s": round(self.now(), 3), **row}
            self.store.append_metrics(row)
            self.tracker.log(step, row)

    def train_step(self, step: int) -> StepOutput:
        """One step of the recipe, its samples written and its metrics row logged."""
        started = time.perf_counter()
        out = self.recipe.step(step)
        for role in self.trainers:  # a role that sat the step out took 0 optimizer steps: every row has every role
            out.metrics.setdefault(f"{role}/optimizer_steps", 0)
        out.metrics["time/step_s"] = time.perf_counter() - started
        out.metrics.update(self.recipe.engine_metrics())
        out.metrics.update(pop_bound_counts())  # over-long or unparsable model text, votes over budget (bounds/*)
        if self.main:
            self.store.write_samples(step, out.samples)
        self.log_row(step, out.metrics)
        return out

    def stop_unless_finite(self, step: int) -> None:
        """NonFiniteWeights if a step left a role's weights NaN or inf, before anything evaluates or checkpoints
        them (every checkpoint so far passed this check)."""
        bad = _non_finite_roles(self.models)
        if bad:
            done = self.store.checkpoint_steps()
            kept = (f"the last checkpoint, step {done[-1]}, holds finite weights (checked before it was written, "
                    f"verified by checksum when read)" if done else "no checkpoint was written")
            raise NonFiniteWeights(f"step {step}: the {' and '.join(bad)} weights are not finite (NaN or inf) after "
                                   f"the update; the run stopped and {kept} (lower train.lr, then --resume "
                                   f"{self.store.root} --set train.lr=...)")

    def evaluate(self, step: int) -> dict[str, Any]:
        """Evaluate the solver and log the row."""
        row = evaluate_solver(self.recipe, self.config, self.store, step)
        self.log_row(step, row)
        return row

    def checkpoint(self, step: int) -> None:
        """Every rank: a sharded role's state is gathered; rank 0 writes."""
        self.store.save_checkpoint(step, self.saved_models, self.optimizers, {
            "time_s": self.now(), "recipe_name": self.config.recipe, "loop_recipe": self.recipe.state_dict(),
            "updates_done": {role: t.updates_done for role, t in self.trainers.items()},
        }, keep=self.config.keep_checkpoints)

    def finish(self, last_metrics: dict[str, Any]) -> dict[str, Any]:
        """Write ``summary.json`` (rank 0) and close the trackers; the summary, or {} on other ranks.
        :class:`NothingTrained` if every update of the run was skipped (non-finite losses)."""
        distributed.barrier()
        if not self.main:
            return {}
        rows = self.store.metrics()
        evals = [r for r in rows if is_evaluation(r)]
        summary = {
            "recipe": self.config.recipe, "model": self.config.model, "task": self.config.task,
            "seed": self.config.seed, "steps": self.config.steps, "steps_run": max([r["step"] for r in rows] or [0]),
            "wall_s": round(self.now(), 3),
            "skipped_steps": sum(int(r.get("skipped_steps", 0) or 0) for r in rows if not is_evaluation(r)),
            "first_eval": evals[0] if evals else None, "final_eval": evals[-1] if evals else None,
            "last_step_metrics": last_metrics, "torch": torch.__version__,
            **({"schedule": self.recipe.schedule.describe()} if self.recipe.schedule is not None else {}),
            **self.recipe.run_summary(),
        }
        atomic_write_text(self.store.root / "summary.json", dumps(summary) + "\n")
        self.tracker.finish(summary)
        trained = sum(v for r in rows if not is_evaluation(r) for k, v in r.items()
                      if k.endswith("/optimizer_steps") and isinstance(v, (int, float)))
        if summary["skipped_steps"] and not trained:
            raise NothingTrained(f"every update of the run was skipped: the loss was not finite in all "
                                 f"{summary['skipped_steps']} optimizer steps (skipped_steps in metrics.jsonl), so "
                                 f"the weights are the ones it started from; lower train.kl_beta or train.lr and run "
                                 f"again")
        return summary


def run(recipe: Recipe, config: RunConfig, out_dir: str | Path, *, resume: bool = False,
        progress: bool = True) -> dict[str, Any]:
    """Train for ``config.steps`` steps in ``out_dir`` (continuing from its last checkpoint if ``resume``):
    step, log, evaluate every ``eval_every`` steps and at the end, checkpoint every ``checkpoint_every`` steps."""
    current = _Run(recipe, config, RunStore(out_dir))
    start = current.begin(resume)
    if start == 1 and config.eval_sets:
        current.evaluate(0)
    bar = tqdm(range(start, config.steps + 1), initial=start - 1, total=config.steps, desc=config.recipe,
               disable=not (progress and current.main), dynamic_ncols=True)
    metrics: dict[str, Any] = {}
    for step in bar:
        metrics = current.train_step(step).metrics
        stop = recipe.finished()  # the method's own end (PasoDoble's max_updates) before config.steps
        current.stop_unless_finite(step)
        last = step == config.steps or stop
        if config.eval_sets and ((config.eval_every and step % config.eval_every == 0) or last):
            row = current.evaluate(step)
            if current.main:
                bar.write(f"step {step}: {accuracy_line(row)}")
        if step % config.checkpoint_every == 0 or last:
            current.checkpoint(step)
        bar.set_postfix({k.split("/", 1)[-1]: round(v, 3) for k, v in metrics.items()
                         if k.endswith("reward_mean") and isinstance(v, float)})
        if stop:
            break
    bar.close()
    return current.finish(metrics)
