"""Files every part of a run writes: atomic writes, strict JSON (NaN becomes null), tolerant JSONL reads.

Torch-free, so analytics and the grading worker can import it cheaply.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def fsync_path(path: Path) -> None:
    """Flush a file, or a folder's entries (so that a rename into it survives a crash), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temporary sibling, fsync and rename (and fsync the folder), so readers see the old or the new file,
    never a part, even after a crash."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; run outputs are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """``atomic_write_bytes`` for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def jsonable(value: Any) -> Any:
    """JSON-safe copy: numpy and 0-d tensor scalars to Python, NaN/inf to None."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()
    if isinstance(value, (np.floating, np.integer)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def dumps(record: Any) -> str:
    """One line of strict JSON."""
    return json.dumps(jsonable(record), ensure_ascii=False, allow_nan=False)


def write_json(path: Path, obj: Any) -> None:
    """Atomically write ``obj`` as indented strict JSON."""
    atomic_write_text(path, json.dumps(jsonable(obj), indent=1, ensure_ascii=False, allow_nan=False) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file; lines that do not parse (a torn last line of a killed writer) are skipped, and bytes that
    are not UTF-8 read as U+FFFD. Rows are split at newlines only (a row's text may hold U+2028 and the like)."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    for line in path.read_bytes().split(b"\n"):
        try:
            row = json.loads(line.decode("utf-8", errors="replace"))
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
