"""Claiming a run directory before a run writes to it.

A new run starts only in an absent or empty folder, or, with ``overwrite``, over an earlier run that holds nothing
but what a run writes (``RUN_ENTRIES``, which it removes); a resumed run needs the folder's ``config.yaml``. While a run writes, it holds
an exclusive lock on ``RUN/.lock``, so a second writer is refused. A run that stops before it wrote ``config.yaml``
leaves the folder as it found it.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

LOCK_NAME = ".lock"
RUN_ENTRIES = ("config.yaml", "metrics.jsonl", "summary.json", "samples", "checkpoints", "eval", "tb",
               "report", "analytics", "wandb", "wandb_run.json")  # what `run`, `eval` and `report` write, not the lock


class RunDirError(RuntimeError):
    """The folder cannot take this run; the message is one line saying why and what to pass instead."""


def _holds_run(folder: Path) -> bool:
    """Whether ``folder`` is a run directory: its config.yaml is a run's resolved config."""
    from coevolve.config import ConfigError, load_yaml
    from coevolve.recipes import RECIPES

    if not (folder / "config.yaml").is_file():
        return False
    try:
        return load_yaml(folder / "config.yaml").get("recipe") in RECIPES
    except ConfigError:
        return False


def check_run_dir(folder: Path, *, resume: bool = False, overwrite: bool = False) -> None:
    """Raise :class:`RunDirError` unless a run may write to ``folder`` (reads only; nothing is created)."""
    if resume:
        if not (folder / "config.yaml").is_file():
            raise RunDirError(f"{folder} is not a run directory (no config.yaml)")
        return
    if not folder.exists():
        parent = next(p for p in folder.absolute().parents if p.exists())
        if not parent.is_dir():
            raise RunDirError(f"--out {folder}: {parent} is a file, not a folder")
        return
    if not folder.is_dir():
        raise RunDirError(f"--out {folder} is a file, not a folder")
    entries = sorted(p.name for p in folder.iterdir() if p.name != LOCK_NAME)
    if not entries:
        return
    if not _holds_run(folder):
        raise RunDirError(f"--out {folder} is not empty and not a run directory (it holds {_names(entries)}); a new "
                          f"run needs an empty or absent folder")
    if not overwrite:
        raise RunDirError(f"{folder} already holds a run: continue it with --resume {folder}, replace it with "
                          f"--overwrite, or choose another --out")
    foreign = [name for name in entries if name not in RUN_ENTRIES]
    if foreign:
        raise RunDirError(f"--overwrite removes only what a run wrote, and {folder} also holds {_names(foreign)}: "
                          f"move that away or choose another --out")


def _names(entries: list[str]) -> str:
    return ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")


@contextmanager
def claim_run_dir(folder: Path, *, resume: bool = False, overwrite: bool = False) -> Iterator[None]:
    """Create ``folder`` if needed and hold its lock while the block runs; with ``overwrite``, first remove what an
    earlier run wrote there. If the block ends before ``config.yaml`` exists, the folder is left as it was found."""
    check_run_dir(folder, resume=resume, overwrite=overwrite)
    created = [p for p in (folder.absolute(), *folder.absolute().parents) if not p.exists()]  # deepest first
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"--out {folder} cannot be created: {exc.strerror or exc}") from None
    lock = FileLock(folder / LOCK_NAME, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise RunDirError(f"another process is writing {folder} (it holds {folder / LOCK_NAME}); wait for it to end "
                          f"or stop it") from None
    except OSError as exc:
        _remove_empty(created)
        raise RunDirError(f"--out {folder} is not writable: {exc.strerror or exc}") from None
    try:
        check_run_dir(folder, resume=resume, overwrite=overwrite)  # again, now that no other writer can change it
        if overwrite and not resume:
            for name in RUN_ENTRIES:
                path = folder / name
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
        yield
    finally:
        if not (folder / "config.yaml").exists():  # the run never started: no lock file or new folder left behind
            (folder / LOCK_NAME).unlink(missing_ok=True)
            _remove_empty(created)
        lock.release()


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders this claim created (deepest first) where they are still empty."""
    for path in folders:
        try:
            path.rmdir()
        except OSError:
            return
