"""Claiming a run directory before a run writes to it.

A new run starts only in an absent or empty folder, or, with ``overwrite``, over an earlier run that holds nothing but
what coevolve writes into a run directory (``RUN_LAYOUT``: names and folders only a run, ``coevolve eval RUN`` or
``coevolve report`` write). The whole removal is planned before anything is deleted: anything else in the folder or
in any of its run folders (a user's file, a symlink, a folder where a run writes a file) refuses it with one line
and nothing is removed; symlinks are never followed. A resume that falls back past a damaged checkpoint removes what
the run wrote after it by the same rule (``RunStore.truncate_after``). A resumed run needs the folder's
``config.yaml``. While a run writes, it holds an exclusive lock on ``RUN/.lock``, so a second writer is refused. A run
that stops before it wrote ``config.yaml`` leaves the folder as it found it.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Union

from filelock import FileLock, Timeout

LOCK_NAME = ".lock"
# A layout maps a name pattern (a full-match regex) to what stands there: FILE, LINK (a symlink a tool makes: removed,
# never followed) or the layout of a folder of that name (a layout may contain itself: folders nested to any depth).
Layout = dict[str, Union[str, "Layout"]]
FILE, LINK = "file", "link"
_STEP = r"step_\d{6}"
_EVAL_SET = {"summary.json": FILE, "results.jsonl": FILE}
_WANDB_MEDIA: Layout = {r"[\w.-]+_\d+_[0-9a-f]{20}\.[\w.]+": FILE}  # W&B's media files: <key>_<step>_<hash>.<type>
_WANDB_MEDIA[r"[\w.-]+"] = _WANDB_MEDIA  # under the folders of the logged key (eval/table -> media/table/eval/)
_WANDB_RUN: Layout = {  # what wandb (0.2x) writes into one run's folder
    r"run-\w+\.wandb(\.synced|\.syncstate)?": FILE,
    "files": {r"config\.yaml|output\.log|requirements\.txt|wandb-(metadata|summary)\.json|diff\.patch|"
              r"conda-environment\.yaml|upstream_diff_\w+\.patch": FILE, "media": _WANDB_MEDIA},
    "logs": {r"debug(-internal|-core)?\.log": FILE},
    "tmp": {"code": {}},
}
RUN_LAYOUT: Layout = {
    "config.yaml": FILE, "metrics.jsonl": FILE, "summary.json": FILE, "wandb_run.json": FILE,
    "samples": {rf"{_STEP}\.jsonl": FILE},
    "checkpoints": {rf"(damaged_)?{_STEP}": {r"[\w-]+(\.optim)?\.safetensors|state\.json|checksums\.json": FILE},
                    rf"\.{_STEP}\.\w+": {r"[^/]+": FILE}},  # a checkpoint that never finished writing
    "eval": {rf"{_STEP}|model": {"summary.json": FILE, r"[\w.-]+": _EVAL_SET}},
    "tb": {r"events\.out\.tfevents\.[^/]+": FILE},
    "report": {r"report\.html|[\w-]+\.png": FILE},
    "analytics": {"curriculum.json": FILE, "embeddings.npz": FILE,
                  "cluster_space": {"centroids.npy": FILE, "cluster_space.json": FILE}},
    "wandb": {r"(offline-)?run-\d{8}_\d{6}-\w+": _WANDB_RUN, r"latest-run|debug\.log|debug-internal\.log": LINK},
}  # everything `coevolve run`, `eval RUN` and `report` write into a run directory, but the lock


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


def _written_by_coevolve(name: str, layout: Layout) -> str | Layout | None:
    """What ``layout`` expects under ``name`` (FILE or a folder's layout), or None for a name no run writes. An
    atomic write's leftover temporary file (``.<name>.<random>``) counts as the file it was writing."""
    for pattern, kind in layout.items():
        if re.fullmatch(pattern, name):
            return kind
    if name.startswith("."):  # an atomic write's temporary file: .<name>.<suffixes>
        parts = name[1:].split(".")
        if any(_written_by_coevolve(".".join(parts[:i]), layout) == FILE for i in range(1, len(parts))):
            return FILE
    return None


def removal_plan(folder: Path, layout: Layout = RUN_LAYOUT, entries: Iterable[str] | None = None,
                 ) -> tuple[list[Path], list[str]]:
    """What removing an earlier run from ``folder`` would delete: (paths in deletion order, files before their
    folders; entries no run writes, relative to ``folder``). ``entries``: only these paths (relative to ``folder``;
    an absent one is skipped), each with what ``layout`` expects at its place, instead of everything. Reads only;
    symlinks are never followed: a symlink is foreign unless the layout names a tool's own link there (W&B's), which
    is removed, not followed."""
    remove: list[Path] = []
    foreign: list[str] = []

    def visit(path: Path, expected: str | Layout | None, name: str) -> None:
        mode = path.lstat().st_mode
        if (expected == FILE and stat.S_ISREG(mode)) or (expected == LINK and stat.S_ISLNK(mode)):
            remove.append(path)
        elif isinstance(expected, dict) and stat.S_ISDIR(mode):
            walk(path, expected, f"{name}/")
            remove.append(path)
        else:
            foreign.append(name + ("/" if stat.S_ISDIR(mode) else " (a symlink)" if stat.S_ISLNK(mode) else ""))

    def walk(path: Path, layout: Layout, relative: str) -> None:
        with os.scandir(path) as found:
            for entry in sorted(found, key=lambda e: e.name):
                if not (entry.name == LOCK_NAME and path == folder):
                    visit(Path(entry.path), _written_by_coevolve(entry.name, layout), f"{relative}{entry.name}")

    if entries is None:
        walk(folder, layout, "")
    for relative in entries or ():
        if os.path.lexists(folder / relative):
            visit(folder / relative, _expected_at(relative, layout), relative)
    return remove, foreign


def _expected_at(relative: str, layout: Layout) -> str | Layout | None:
    """What ``layout`` expects at a path relative to its folder (None: nothing a run writes)."""
    expected: str | Layout | None = layout
    for part in Path(relative).parts:
        expected = _written_by_coevolve(part, expected) if isinstance(expected, dict) else None
    return expected


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
    if not folder.is_dir() or folder.is_symlink():
        raise RunDirError(f"--out {folder} is {'a symlink' if folder.is_symlink() else 'a file'}, not a folder")
    entries = sorted(p.name for p in folder.iterdir() if p.name != LOCK_NAME)
    if not entries:
        return
    if not _holds_run(folder):
        raise RunDirError(f"--out {folder} is not empty and not a run directory (it holds {_names(entries)}); a new "
                          f"run needs an empty or absent folder")
    if not overwrite:
        raise RunDirError(f"{folder} already holds a run: continue it with --resume {folder}, replace it with "
                          f"--overwrite, or choose another --out")
    _, foreign = removal_plan(folder)
    if foreign:
        raise RunDirError(f"--overwrite removes only what a run wrote, and {folder} also holds {_names(foreign)}: "
                          f"move that away or choose another --out; nothing was removed")


def _names(entries: list[str]) -> str:
    return ", ".join(entries[:4]) + (f", ... ({len(entries)} in all)" if len(entries) > 4 else "")


def remove_planned(paths: list[Path]) -> None:
    """Delete what :func:`removal_plan` listed: files unlinked, then their (by then empty) folders removed."""
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()


@contextmanager
def claim_run_dir(folder: Path, *, resume: bool = False, overwrite: bool = False) -> Iterator[None]:
    """Create ``folder`` if needed and hold its lock while the block runs; with ``overwrite``, first remove what an
    earlier run wrote there. If the block ends before ``config.yaml`` exists, the folder is left as it was found."""
    check_run_dir(folder, resume=resume, overwrite=overwrite)
    with locked_folder(folder, kept=lambda: (folder / "config.yaml").exists()):
        check_run_dir(folder, resume=resume, overwrite=overwrite)  # again, now that no other writer can change it
        if overwrite and not resume:
            remove_planned(removal_plan(folder)[0])
        yield


@contextmanager
def locked_folder(folder: Path, kept: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """Create ``folder`` (and its missing parents) if needed and hold its exclusive writer lock (``folder/.lock``)
    while the block runs; :class:`RunDirError` at once when another process holds it (a run, ``coevolve export``).
    Unless ``kept()`` says the block left something to keep locked, the lock file is removed after, and with it the
    folders this created that are still empty."""
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
        yield
    finally:
        if not kept():  # nothing left to guard: no lock file or new folder left behind
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
