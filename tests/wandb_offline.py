"""Weights & Biases offline runs read back from their files: each ``run-<id>.wandb`` transaction log (LevelDB's log
format of 32 KiB blocks behind W&B's 7-byte header) decoded into wandb's own ``Record`` protobuf messages."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 32768
HEADER = 7  # ":W&B", a 2-byte magic number and a version byte
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    """What one offline run file holds: its run's id, config, history rows (keys as logged, W&B's own ``_`` keys
    left out) and artifact names."""

    id: str
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    artifacts: list[str] = field(default_factory=list)


def records(path: Path):
    """The ``Record`` messages of one ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    pos, parts = HEADER, []
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            pos += left
            continue
        parts.append(data[pos + 7:pos + 7 + length])
        pos += 7 + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


def read_offline_run(path: Path) -> OfflineRun:
    run = OfflineRun(id=path.stem.removeprefix("run-"))  # the file is named after the run's id
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.id = record.run.run_id
            run.config.update({u.key: json.loads(u.value_json) for u in record.run.config.update})
        elif kind == "config":
            run.config.update({u.key: json.loads(u.value_json) for u in record.config.update})
        elif kind == "history":
            items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
            run.history.append({k: json.loads(v) for k, v in items.items() if not k.startswith("_")})
        elif kind == "artifact":
            run.artifacts.append(record.artifact.name)
    return run


def offline_runs(wandb_dir: Path) -> list[OfflineRun]:
    """Every offline run under ``WANDB_DIR``, oldest first."""
    return [read_offline_run(f) for f in sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))]
