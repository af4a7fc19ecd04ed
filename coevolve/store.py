"""The run directory: config, metrics, samples, checkpoints, summary; atomic writes and resume.

Layout::

    RUN/config.yaml                 resolved config
    RUN/metrics.jsonl               one JSON object per training step and per evaluation
    RUN/samples/step_000012.jsonl   every prompt, completion, answer, label and reward term of a step
    RUN/checkpoints/step_000012/    <role>.safetensors, <role>.optim.safetensors, state.json, rng.safetensors
    RUN/eval/step_000012/           per-question evaluation results
    RUN/tb/                         TensorBoard event files
    RUN/summary.json                written when the run finishes

A step counts as completed once its checkpoint directory exists: it is written under a temporary name with the
SHA-256 of each of its files (``checksums.json``), its files and folder are fsynced, and it is renamed into place. A
checkpoint is verified before anything is read from it (on resume, by ``coevolve eval RUN`` and by ``coevolve
export``): every file present, as long as its header says and with its recorded checksum, ``state.json`` and the
recipe's state readable, and the weights finite. On resume a damaged checkpoint is named in one warning and set
aside, the run continues from the newest intact one, and metric rows and sample files of later steps are removed, so
no step is lost or repeated.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, load_model, save_file, save_model

from coevolve import distributed
from coevolve.jsonio import atomic_write_text, dumps, fsync_path, read_jsonl
from coevolve.optim_state import is_subclass_state, join_state, plain_groups, split_state, tensor_groups
from coevolve.records import SampleRow, current_metric_names
from coevolve.rundir import RunDirError, removal_plan, remove_planned

log = logging.getLogger(__name__)

STEP_DIR = "step_{:06d}"
_STEP_NAME = re.compile(r"step_(\d{6})")  # a checkpoint's or evaluation's folder (STEP_DIR)
_SAMPLES_NAME = re.compile(r"step_(\d{6})\.jsonl")
_STATE_KEYS = ("step", "optimizers", "python_rng", "numpy_rng", "recipe")
CHECKSUMS = "checksums.json"  # {file name: SHA-256 hex digest} of every other file of a checkpoint


class CheckpointDamaged(RuntimeError):
    """A checkpoint has a missing, truncated or unreadable file; the message names the checkpoint and the file."""


class RunStore:
    """Reads and writes one run directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.metrics_path = self.root / "metrics.jsonl"
        self.samples_dir = self.root / "samples"
        self.checkpoints_dir = self.root / "checkpoints"
        self.eval_dir = self.root / "eval"

    # -- metrics and samples -------------------------------------------------------------------------
    def append_metrics(self, record: Mapping[str, Any]) -> None:
        """Append one row to metrics.jsonl and flush it to disk."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.metrics_path, "a", encoding="utf-8") as handle:
            handle.write(dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def metrics(self) -> list[dict]:
        """The rows of ``metrics.jsonl``, with today's metric names."""
        return [current_metric_names(row) for row in read_jsonl(self.metrics_path)]

    def write_samples(self, step: int, rows: Iterable[SampleRow]) -> None:
        """Write the sample rows of one step as JSON lines (atomically, one file per step)."""
        text = "".join(dumps(row.as_record()) + "\n" for row in rows)
        atomic_write_text(self.samples_dir / f"{STEP_DIR.format(step)}.jsonl", text)

    def samples(self, step: int) -> list[dict]:
        return read_jsonl(self.samples_dir / f"{STEP_DIR.format(step)}.jsonl")

    # -- checkpoints -----------------------------------------------------------------------------------
    def checkpoint_steps(self) -> list[int]:
        """Steps with a checkpoint folder (renamed into place once written), ascending; a damaged one included."""
        if not self.checkpoints_dir.exists():
            return []
        return sorted(int(match[1]) for child in self.checkpoints_dir.iterdir()
                      if child.is_dir() and (match := _STEP_NAME.fullmatch(child.name)))

    def save_checkpoint(self, step: int, models: Mapping[str, torch.nn.Module],
                        optimizers: Mapping[str, torch.optim.Optimizer], state: Mapping[str, Any],
                        keep: int = 2) -> Path | None:
        """Save weights, optimizer and RNG state and the recipe's state; rename into place when complete.

        Every rank calls it: a sharded (``train.fsdp``) role's whole weights and optimizer state are gathered from
        all ranks first, so the files are those of one process. Rank 0 writes; the others return None.
        """
        gathered = {role: (distributed.full_model_state(model),  # weights without an optimizer: a KL reference
                           distributed.full_optimizer_state(model, optimizers[role]) if role in optimizers else None)
                    for role, model in models.items() if distributed.is_sharded(model)}
        if not distributed.is_main():
            return None
        self.checkpoints_dir.mkdir(parents=True, exist_ok=True)
        final = self.checkpoints_dir / STEP_DIR.format(step)
        tmp = Path(tempfile.mkdtemp(dir=self.checkpoints_dir, prefix=f".{final.name}."))
        try:
            _write_checkpoint(tmp, step, {role: gathered[role][0] if role in gathered else model
                                          for role, model in models.items()},
                              {role: {**(cast(dict[str, Any], gathered[role][1]) if role in gathered
                                         else optimizer.state_dict()), "optimizer": type(optimizer).__name__}
                               for role, optimizer in optimizers.items()}, state)
        except BaseException:  # a full disk, an interrupt: no half-written folder left behind
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_path(self.checkpoints_dir)
        for old in self.checkpoint_steps()[:-keep]:
            shutil.rmtree(self.checkpoints_dir / STEP_DIR.format(old), ignore_errors=True)
        return final

    def checkpoint_roles(self, step: int) -> list[str]:
        """The roles whose weights checkpoint ``step`` holds (``<role>.safetensors``), sorted."""
        folder = self.checkpoints_dir / STEP_DIR.format(step)
        return sorted(p.name.removesuffix(".safetensors") for p in folder.glob("*.safetensors")
                      if not p.name.endswith(".optim.safetensors") and p.name != "rng.safetensors")

    def load_latest_checkpoint(self, models: Mapping[str, torch.nn.Module],
                               optimizers: Mapping[str, torch.optim.Optimizer],
                               restore: Callable[[dict[str, Any]], None] = lambda state: None,
                               ) -> tuple[int, dict[str, Any]] | None:
        """Restore the newest intact checkpoint (see :meth:`load_checkpoint`) and hand the recipe's saved state to
        ``restore``: (its step, that state), or None when there is no checkpoint. A checkpoint whose state
        ``restore`` cannot read (a KeyError, TypeError, ValueError, ...) is damaged too. Damaged newer ones are named
        in one warning; with none intact, :class:`CheckpointDamaged` names them all."""
        damaged = []
        for step in reversed(self.checkpoint_steps()):
            try:
                state = self.load_checkpoint(step, models, optimizers)
                try:
                    restore(state)
                except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
                    raise CheckpointDamaged(f"{STEP_DIR.format(step)}/state.json: unreadable recipe state "
                                            f"({type(exc).__name__}: {exc})") from exc
            except CheckpointDamaged as exc:
                damaged.append(str(exc))
                continue
            if damaged and distributed.is_main():
                log.warning("damaged checkpoint: %s; resuming from %s (later checkpoints are set aside as damaged_*)",
                            "; ".join(damaged), STEP_DIR.format(step))
            return step, state
        if damaged:
            raise CheckpointDamaged(f"no intact checkpoint in {self.checkpoints_dir}: {'; '.join(damaged)}")
        return None

    def load_checkpoint(self, step: int, models: Mapping[str, torch.nn.Module],
                        optimizers: Mapping[str, torch.optim.Optimizer]) -> dict[str, Any]:
        """Restore weights, optimizer and RNG state in place; returns the recipe's saved state.

        The checkpoint is verified first (:meth:`verify_checkpoint`); a damaged one raises :class:`CheckpointDamaged`
        before anything is restored. Restoring an intact checkpoint overwrites all of that state, so a fall-back to an
        older one after a failure is complete."""
        folder = self.verify_checkpoint(step, models, optimizers)
        state = json.loads((folder / "state.json").read_bytes())
        for role, model in models.items():
            if distributed.is_sharded(model):
                distributed.load_full_model_state(model, load_file(str(folder / f"{role}.safetensors")))
            else:
                load_model(model, str(folder / f"{role}.safetensors"))
        for role, optimizer in optimizers.items():
            tensors = load_file(str(folder / f"{role}.optim.safetensors"))
            try:
                kind = state["optimizers"][role].get("optimizer", type(optimizer).__name__)  # older: not recorded
                if kind != type(optimizer).__name__:
                    raise CheckpointDamaged(f"{folder.name}: the {role} optimizer state is {kind}'s, this run's "
                                            f"optimizer is {type(optimizer).__name__} (resume with the train.optimizer "
                                            "it was saved with)")
                saved = _optimizer_state(tensors, state["optimizers"][role])
            except (KeyError, TypeError, ValueError, AttributeError, ImportError) as exc:
                raise CheckpointDamaged(f"{folder.name}: unreadable {role} optimizer state in state.json") from exc
            if distributed.is_sharded(models[role]):
                distributed.load_full_optimizer_state(models[role], optimizer, saved)
            else:
                optimizer.load_state_dict(saved)
        try:
            torch.set_rng_state(load_file(str(folder / "rng.safetensors"))["torch"])
            random.setstate(_tuple_state(state["python_rng"]))
            np.random.set_state(tuple(state["numpy_rng"][:1]) + (np.array(state["numpy_rng"][1], dtype=np.uint32),)
                                + tuple(state["numpy_rng"][2:]))
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as exc:
            raise CheckpointDamaged(f"{folder.name}: unreadable RNG state ({type(exc).__name__}: {exc})") from exc
        return state["recipe"]

    def verify_checkpoint(self, step: int, models: Iterable[str] | None = None, optimizers: Iterable[str] = ()) -> Path:
        """The folder of step ``step``'s checkpoint, verified for reading the weights of ``models`` (role names;
        None: every role it holds) and the optimizer state of ``optimizers``: ``state.json`` parses and has the
        checkpoint's keys, every file is present and as long as its header says, every file has the SHA-256 that
        ``checksums.json`` recorded (a checkpoint written before checksums were recorded has none to check), and the
        weights are finite. Raises :class:`CheckpointDamaged` (one line naming the file) otherwise; the check every
        reader of a checkpoint makes first (resume, ``coevolve eval RUN``, ``coevolve export``)."""
        folder = self.checkpoints_dir / STEP_DIR.format(step)
        models = self.checkpoint_roles(step) if models is None else list(models)
        optimizers = list(optimizers)
        if not folder.is_dir():
            raise CheckpointDamaged(f"{folder.name} does not exist (checkpoints: {self.checkpoint_steps()})")
        try:
            state = json.loads((folder / "state.json").read_bytes().decode("utf-8"))
        except (OSError, ValueError) as exc:  # missing, unreadable, invalid UTF-8 or JSON
            raise CheckpointDamaged(f"{folder.name}/state.json unreadable ({type(exc).__name__}: {exc})") from exc
        if not isinstance(state, dict) or any(key not in state for key in _STATE_KEYS) \
                or not isinstance(state["optimizers"], dict) or any(role not in state["optimizers"]
                                                                    for role in optimizers):
            raise CheckpointDamaged(f"{folder.name}/state.json lacks the checkpoint's keys")
        files = [f"{role}.safetensors" for role in models] + [f"{role}.optim.safetensors" for role in optimizers]
        for name in files + ["rng.safetensors"]:
            problem = _safetensors_problem(folder / name)
            if problem:
                raise CheckpointDamaged(f"{folder.name}/{name} {problem}")
        _check_digests(folder)
        for role in models:
            try:
                bad = _non_finite_tensor(folder / f"{role}.safetensors")
            except Exception as exc:  # safetensors' own error types for a header it cannot read
                raise CheckpointDamaged(f"{folder.name}/{role}.safetensors unreadable ({type(exc).__name__})") from exc
            if bad:
                raise CheckpointDamaged(f"{folder.name}/{role}.safetensors holds non-finite values (NaN or inf) in "
                                        f"{bad}")
        return folder

    def truncate_after(self, step: int) -> None:
        """Forget everything logged after ``step`` (metrics rows, samples, eval outputs, partial checkpoints); later
        checkpoints (damaged ones, since ``step`` is the newest intact) are renamed ``damaged_step_NNNNNN``. It removes
        only what a run wrote (``RUN_LAYOUT``, the rule of ``--overwrite``): a file of the user's inside a folder it
        would remove raises :class:`RunDirError` naming it before anything changes; names a run never writes
        (``samples/step_3_notes.txt``) are left alone."""
        later = [f"{folder.name}/{child.name}" for folder, pattern in ((self.samples_dir, _SAMPLES_NAME),
                                                                       (self.eval_dir, _STEP_NAME))
                 if folder.is_dir() for child in folder.iterdir()
                 if (match := pattern.fullmatch(child.name)) and int(match[1]) > step]
        later_checkpoints = [s for s in self.checkpoint_steps() if s > step]
        if self.checkpoints_dir.is_dir():
            later += [f"checkpoints/{child.name}" for child in self.checkpoints_dir.iterdir()
                      if child.name.startswith(".step_")]  # a checkpoint that never finished writing
            later += [f"checkpoints/damaged_{STEP_DIR.format(s)}" for s in later_checkpoints]  # replaced below
        remove, foreign = removal_plan(self.root, entries=sorted(later))
        if foreign:
            raise RunDirError(f"--resume continues from {STEP_DIR.format(step)} and removes what the run wrote after "
                              f"it, and {self.root} also holds {', '.join(foreign[:4])} there: move that away, then "
                              f"resume again; nothing was removed")
        rows = [r for r in self.metrics() if r.get("step", -1) <= step]
        atomic_write_text(self.metrics_path, "".join(dumps(r) + "\n" for r in rows))
        remove_planned(remove)
        for later_step in later_checkpoints:
            os.replace(self.checkpoints_dir / STEP_DIR.format(later_step),
                       self.checkpoints_dir / f"damaged_{STEP_DIR.format(later_step)}")


def file_sha256(path: Path) -> str:
    """SHA-256 hex digest of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_checkpoint(folder: Path, step: int, weights: Mapping[str, torch.nn.Module | dict[str, torch.Tensor]],
                      optimizer_states: Mapping[str, Mapping[str, Any]], state: Mapping[str, Any]) -> None:
    """Write a checkpoint's files into ``folder`` (a module's or a gathered state dict's weights per role, optimizer
    states, RNG states, the recipe's state), then their checksums, and fsync them all."""
    for role, source in weights.items():
        _save_safetensors(folder / f"{role}.safetensors", source)
    optimizer_meta = {}
    for role, optimizer_state in optimizer_states.items():
        tensors, optimizer_meta[role] = _flatten_optimizer(optimizer_state)
        _save_safetensors(folder / f"{role}.optim.safetensors", tensors)
    _save_safetensors(folder / "rng.safetensors", {"torch": torch.get_rng_state()})
    full_state = {"step": step, "optimizers": optimizer_meta, "python_rng": _py_rng_state(),
                  "numpy_rng": _np_rng_state(), "recipe": state}
    (folder / "state.json").write_text(dumps(full_state), encoding="utf-8")
    (folder / CHECKSUMS).write_text(dumps({path.name: file_sha256(path) for path in sorted(folder.iterdir())}),
                                    encoding="utf-8")
    for path in folder.iterdir():
        fsync_path(path)
    fsync_path(folder)


def _save_safetensors(path: Path, source: torch.nn.Module | dict[str, torch.Tensor]) -> None:
    """A module's weights or named tensors to ``path``; safetensors' error for a failed write (``... No space left on
    device (os error 28)``) is raised as the OSError it reports, with the file's name, like any other write's."""
    try:
        if isinstance(source, torch.nn.Module):
            save_model(source, str(path))
        else:
            save_file(source, str(path))
    except SafetensorError as exc:
        error = safetensors_os_error(exc, path)
        if error is None:
            raise
        raise error from exc


def safetensors_os_error(exc: SafetensorError, path: Path) -> OSError | None:
    """The OSError a failed safetensors write reports in its text (``... (os error 28)``, or its debug form
    ``IoError(Os { code: 28, ... })``), named after ``path``; None when it reports none."""
    found = re.search(r"os error (\d+)|Os \{ code: (\d+)", str(exc))
    if found is None:
        return None
    code = int(found[1] or found[2])
    return OSError(code, os.strerror(code), str(path))


def _check_digests(folder: Path) -> None:
    """CheckpointDamaged unless every file ``checksums.json`` lists has its digest and every safetensors file and
    ``state.json`` is listed (a checkpoint without ``checksums.json`` predates them: nothing to check)."""
    path = folder / CHECKSUMS
    if not path.exists():
        return
    try:
        recorded = json.loads(path.read_bytes().decode("utf-8"))
        if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
            raise ValueError("not a mapping of file names to digests")
    except (OSError, ValueError) as exc:
        raise CheckpointDamaged(f"{folder.name}/{CHECKSUMS} unreadable ({type(exc).__name__}: {exc})") from exc
    present = {p.name for p in folder.iterdir() if p.name.endswith(".safetensors") or p.name == "state.json"}
    unlisted = sorted(present - set(recorded))
    if unlisted:
        raise CheckpointDamaged(f"{folder.name}/{unlisted[0]} is not in {CHECKSUMS}")
    for name, digest in sorted(recorded.items()):
        file = folder / Path(name).name
        if not file.is_file():
            raise CheckpointDamaged(f"{folder.name}/{name} missing")
        if file_sha256(file) != digest:
            raise CheckpointDamaged(f"{folder.name}/{name} does not match its checksum (the file changed after it "
                                    f"was written)")


def _non_finite_tensor(path: Path) -> str | None:
    """The name of the first floating-point tensor of a safetensors file with NaN or inf values, or None."""
    with safe_open(str(path), framework="pt") as handle:
        for name in handle.keys():
            tensor = handle.get_tensor(name)
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                return name
    return None


def _safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is not complete (missing, truncated, unreadable header), or None: its size must be the
    8-byte header length, the JSON header and the data its tensors' offsets end at."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            (header_len,) = struct.unpack("<Q", handle.read(8).ljust(8, b"\0"))
            if size < 8 or header_len > size - 8:
                return f"truncated ({size} bytes)"
            header = json.loads(handle.read(header_len).decode("utf-8"))
        end = max((info["data_offsets"][1] for key, info in header.items() if key != "__metadata__"), default=0)
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        return f"unreadable ({type(exc).__name__})"
    expected = 8 + header_len + end
    return None if size == expected else f"is {size} bytes, its header says {expected}"


def _flatten_optimizer(sd: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict]:
    """An optimizer's ``state_dict()`` as named tensors (for safetensors) plus JSON metadata (no pickle). A tensor
    subclass state (torchao's 8-bit moments) is stored as its plain parts, ``<index>.<name>/<part>``, described in
    ``subclasses`` (:mod:`coevolve.optim_state`); 0-d tensors in the param groups (torchao's lr) as numbers."""
    tensors, scalars, subclasses = {}, {}, {}
    for index, slots in sd["state"].items():
        for name, value in slots.items():
            if is_subclass_state(value):
                parts, subclasses[f"{index}.{name}"] = split_state(value)
                tensors.update({f"{index}.{name}/{part}": t.contiguous() for part, t in parts.items()})
            elif isinstance(value, torch.Tensor):
                tensors[f"{index}.{name}"] = value.contiguous()
            else:
                scalars[f"{index}.{name}"] = value
    if not tensors:
        tensors["__empty__"] = torch.zeros(1)
    groups, group_tensors = plain_groups(sd["param_groups"])
    meta = {"param_groups": groups, "scalars": scalars, **({"optimizer": sd["optimizer"]} if "optimizer" in sd else {})}
    if subclasses or any(group_tensors):
        meta.update(subclasses=subclasses, group_tensors=group_tensors)
    return tensors, meta


def _optimizer_state(tensors: dict[str, torch.Tensor], meta: dict) -> dict[str, Any]:
    """The ``state_dict()`` that :func:`_flatten_optimizer` flattened."""
    state: dict[int, dict] = {}
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in list(tensors.items()) + list(meta["scalars"].items()):
        if key == "__empty__":
            continue
        key, slash, part = key.partition("/")
        if slash:
            parts.setdefault(key, {})[part] = value
            continue
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    for key, description in meta.get("subclasses", {}).items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = join_state(parts[key], description)
    groups = meta["param_groups"]
    if "group_tensors" in meta:
        groups = tensor_groups(groups, meta["group_tensors"])
    return {"state": state, "param_groups": groups}


def _py_rng_state() -> list:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _tuple_state(saved: list) -> tuple:
    return (saved[0], tuple(saved[1]), saved[2])


def _np_rng_state() -> list:
    state: Any = np.random.get_state()  # (name, keys, pos, has_gauss, cached)
    name, keys, pos, has_gauss, cached = state
    return [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]
