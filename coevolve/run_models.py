"""A run directory's trained roles as models: the checkpoint a command names, and its role loaded as a Policy.

``coevolve eval RUN`` and ``coevolve export RUN`` both come here. A role is rebuilt as its trainer held it: the model
it started from (:meth:`Recipe.start_model`: the run's ``model``, or ``params.generator_init`` for a generator),
wrapped in LoRA when the run trained adapters (``train.lora``, as :func:`coevolve.rl.trainer.wrap_lora` wraps it),
with the checkpoint's weights loaded into it. Every checkpoint is verified first (:meth:`RunStore.verify_checkpoint`).
This sits above the recipes and the run store, so the store itself never loads a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import load_model

from coevolve.config import RunConfig
from coevolve.models import Policy, load_policy
from coevolve.recipes import resolve_saved
from coevolve.recipes.base import SOLVER_ROLES, Recipe, RecipeParams
from coevolve.rl.trainer import wrap_lora
from coevolve.store import STEP_DIR, RunStore


class RunCheckpointError(ValueError):
    """A run, step, role or metric that names no checkpoint; the message is one line saying what there is."""


@dataclass(frozen=True)
class RunCheckpoint:
    """One role of one intact checkpoint of a run, with the run's resolved config."""

    root: Path
    step: int
    role: str
    config: RunConfig
    params: RecipeParams
    recipe: type[Recipe]

    @property
    def folder(self) -> Path:
        return RunStore(self.root).checkpoints_dir / STEP_DIR.format(self.step)

    @property
    def start_model(self) -> str:
        """The model name or folder the role's training started from."""
        return self.recipe.start_model(self.config, self.params, self.role)


def is_run(target: str | Path) -> bool:
    """Whether ``target`` is a run directory (it holds a run's ``config.yaml``)."""
    return (Path(target) / "config.yaml").is_file()


def find_checkpoint(run: str | Path, step: int | str | None = None, role: str | None = None,
                    metric: str | None = None, *, verify: bool = True) -> RunCheckpoint:
    """The checkpoint of ``run`` at ``step`` (an int, ``latest`` or None for the newest, ``best`` for the one with the
    highest ``metric``, default the strict accuracy of the run's first evaluation set) for ``role`` (default the
    solver), its files checked (unless ``verify`` is false: for a caller that verifies its own copy). Raises
    :class:`RunCheckpointError` for what does not exist and :class:`coevolve.store.CheckpointDamaged` for a damaged
    checkpoint; the config errors of a run's config.yaml (``ConfigError``) pass through."""
    root = Path(run)
    if not is_run(root):
        raise RunCheckpointError(f"{root} is not a run directory (no config.yaml)")
    config, params, recipe = resolve_saved(str(root / "config.yaml"))
    store = RunStore(root)
    steps = store.checkpoint_steps()
    if not steps:
        raise RunCheckpointError(f"{root} has no completed checkpoint yet")
    if step is None or step == "latest":
        chosen = steps[-1]
    elif step == "best":
        chosen = _best_step(store, steps, metric or _default_metric(config))
    else:
        chosen = int(step)
        if chosen not in steps:
            raise RunCheckpointError(f"{root} has no checkpoint for step {chosen} (it has: "
                                     f"{', '.join(map(str, steps))})")
    roles = store.checkpoint_roles(chosen)
    if role is None:
        role = next((r for r in SOLVER_ROLES if r in roles), None)
        if role is None:
            raise RunCheckpointError(f"{STEP_DIR.format(chosen)} of {root} holds no solver (roles: "
                                     f"{', '.join(roles) or 'none'}); name one with --role")
    elif role not in roles:
        raise RunCheckpointError(f"unknown role {role!r}: this {config.recipe} run's checkpoints hold "
                                 f"{', '.join(roles) or 'no weights'}")
    if verify:
        store.verify_checkpoint(chosen)
    return RunCheckpoint(root, chosen, role, config, params, recipe)


def _default_metric(config: RunConfig) -> str:
    if not config.eval_sets:
        raise RunCheckpointError("--step best: the run has no evaluation sets to rank its checkpoints by; pass "
                                 "--step N or --metric NAME")
    return f"eval/{config.eval_sets[0]}/accuracy"


def _best_step(store: RunStore, steps: list[int], metric: str) -> int:
    """The checkpointed step with the highest ``metric`` in ``metrics.jsonl`` (the later one on a tie)."""
    scores = {row["step"]: row[metric] for row in store.metrics()
              if isinstance(row.get(metric), (int, float)) and math.isfinite(row[metric])}
    ranked = [s for s in steps if s in scores]
    if not ranked:
        names = sorted({k for row in store.metrics() for k in row if k.startswith("eval/")})
        raise RunCheckpointError(f"--step best: no checkpoint (steps {', '.join(map(str, steps))}) has a value of "
                                 f"{metric} (evaluated: {', '.join(names) or 'nothing'}); pass --step N or --metric")
    return max(ranked, key=lambda s: (scores[s], s))


def load_role(checkpoint: RunCheckpoint, *, trust_remote_code: bool = False) -> Policy:
    """``checkpoint``'s role as a Policy in eval mode (a PEFT model when the run trained LoRA adapters). The model's
    own code runs only with ``trust_remote_code`` (the caller's flag), whatever the run's config says."""
    policy = load_policy(checkpoint.start_model, trust_remote_code=trust_remote_code)
    if checkpoint.config.train.lora is not None:
        policy.model = wrap_lora(policy.model, checkpoint.config.train.lora.model_dump())
    load_model(policy.model, str(checkpoint.folder / f"{checkpoint.role}.safetensors"))
    policy.model.eval()
    return policy


def load_run_policy(target: str, step: int | None = None, *,
                    trust_remote_code: bool = False) -> tuple[Policy, list[str] | None, str]:
    """A model to evaluate: a run directory's solver at ``step`` (default the latest checkpoint), else a model name
    or folder. Returns (policy, the run's evaluation sets or None, a label for output folders)."""
    if not is_run(target):
        return load_policy(target, trust_remote_code=trust_remote_code), None, "model"
    checkpoint = find_checkpoint(target, step)
    policy = load_role(checkpoint, trust_remote_code=trust_remote_code)
    return policy, checkpoint.config.eval_sets, STEP_DIR.format(checkpoint.step)
