"""Where a run reports besides its run directory (``report_to``): TensorBoard event files and Weights & Biases.

The loop calls one :class:`Tracker` (rank 0 only): ``log`` for every metrics row (the names and values of
``metrics.jsonl``), ``resumed`` with the earlier rows when a run continues, ``finish`` at the end. ``tensorboard``
writes ``RUN/tb/``; ``wandb`` (the optional extra ``coevolve[wandb]``) sends the resolved config, the rows, the
evaluation tables and, at the end, the run's HTML report as an artifact. Its run id is kept in ``RUN/wandb_run.json``
so that ``--resume`` continues the same W&B run. Online without an API key or out of the server's reach for
``ONLINE_WAIT_S``, the run says so in one warning and logs to W&B offline instead, for ``wandb sync`` later. Rows
carry their ``step`` as W&B's step metric, so a row sent again after a resume is another point at the same step,
never a refused one. Each evaluation row also goes as a table (set, strict and lenient accuracy).
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from coevolve.records import evaluation_table

log = logging.getLogger(__name__)

WANDB_RUN_FILE = "wandb_run.json"
ONLINE_WAIT_S = 30.0  # how long W&B online may try to reach its server before the run logs offline instead (W&B's
# own default is 90 s, then a traceback); WANDB_INIT_TIMEOUT overrides it


class Tracker:
    """What a run reports to; every method does nothing by default."""

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        """One metrics row as written to ``metrics.jsonl`` (it includes ``step`` and ``time_s``; an evaluation's
        row its ``eval/<set>/accuracy`` and ``eval/<set>/accuracy_lenient``)."""

    def finish(self, summary: Mapping[str, Any]) -> None:
        """The run ended; ``summary`` is what ``summary.json`` holds."""

    def resumed(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """This process continues a run: ``rows`` are the metrics rows its earlier processes logged (metrics.jsonl
        up to the resume point), for a tracker that may have lost the last ones with a killed process."""


class Trackers(Tracker):
    """Several trackers behind one."""

    def __init__(self, trackers: Sequence[Tracker]):
        self.trackers = list(trackers)

    def log(self, step, row):
        for tracker in self.trackers:
            tracker.log(step, row)

    def finish(self, summary):
        for tracker in self.trackers:
            tracker.finish(summary)

    def resumed(self, rows):
        for tracker in self.trackers:
            tracker.resumed(rows)


def open_trackers(report_to: Iterable[str], root: Path, config: Mapping[str, Any], *, resume: bool,
                  start: int) -> Tracker:
    """The trackers named in ``report_to`` for the run in ``root`` (``config``: its resolved config; ``start``: the
    first step this process runs)."""
    trackers: list[Tracker] = []
    for name in report_to:
        if name == "tensorboard":
            trackers.append(TensorBoardTracker(root, purge_step=start if resume else None))
        elif name == "wandb":
            trackers.append(WandbTracker(root, config, resume=resume))
    return Trackers(trackers)


def _numbers(row: Mapping[str, Any]) -> dict[str, float]:
    """The row's finite numbers but its step (NaN, logged as null in metrics.jsonl, is left out)."""
    return {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}


class TensorBoardTracker(Tracker):
    """Scalars of every row in ``RUN/tb/`` (``purge_step``: drop events at and after it, written before a kill)."""

    def __init__(self, root: Path, purge_step: int | None = None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is a dependency; a broken install only loses the event files
            log.warning("tensorboard is not importable; no event files will be written")
            self.writer = None
            return
        self.writer = SummaryWriter(str(root / "tb"), purge_step=purge_step)

    def log(self, step, row):
        if self.writer is None:
            return
        for key, value in _numbers(row).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self, summary):
        if self.writer is not None:
            self.writer.close()


class WandbTracker(Tracker):
    """One W&B run per run directory: created on the first start, continued on ``--resume`` (id in
    ``RUN/wandb_run.json``). The project is ``WANDB_PROJECT`` (default ``coevolve``), the run's name its folder's;
    ``WANDB_MODE=offline`` keeps everything on disk (``WANDB_DIR``, default the run directory)."""

    def __init__(self, root: Path, config: Mapping[str, Any], *, resume: bool):
        import wandb

        self.wandb, self.root = wandb, root
        saved = root / WANDB_RUN_FILE
        run_id = None
        if resume and saved.is_file():
            try:
                run_id = json.loads(saved.read_text(encoding="utf-8"))["id"]
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("%s is unreadable; this resumed run starts a new W&B run", saved)
        folder = os.environ.get("WANDB_DIR", str(root))
        start = dict(project=os.environ.get("WANDB_PROJECT", "coevolve"), name=root.absolute().name, id=run_id,
                     resume="allow" if run_id else None, config=dict(config), dir=folder, job_type="train")
        wait = {} if os.environ.get("WANDB_INIT_TIMEOUT") else {"settings": wandb.Settings(init_timeout=ONLINE_WAIT_S)}
        try:
            self.run = wandb.init(**start, **wait)
        except wandb.errors.Error as exc:  # online without an API key (UsageError) or out of the server's reach
            reason = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
            log.warning("W&B online failed (%s); this run logs to W&B offline in %s instead: upload it later with "
                        "`wandb sync %s`", reason, Path(folder) / "wandb", Path(folder) / "wandb" / "offline-run-*")
            self.run = wandb.init(**start, mode="offline")
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        if run_id is None:
            from coevolve.jsonio import atomic_write_text

            atomic_write_text(saved, json.dumps({"id": self.run.id, "project": self.run.project}) + "\n")

    def log(self, step, row):
        self.run.log({"step": step, **_numbers(row)})
        table = evaluation_table(row)
        if table:
            rows = [[name, scores.get("accuracy"), scores.get("accuracy_lenient")] for name, scores in table.items()]
            self.run.log({"step": step, "eval/table": self.wandb.Table(
                columns=["set", "accuracy_strict", "accuracy_lenient"], data=rows)})

    def resumed(self, rows):
        """Send again the rows from the last step W&B holds on (its summary's ``step``; every row when it holds none):
        a killed process can take its last rows with it (offline, all of them: wandb-core's buffer dies with it). A
        row that did arrive is then logged twice, with the same values at the same step."""
        last = self.run.summary.get("step")
        for row in rows:
            if not isinstance(last, (int, float)) or row["step"] >= last:
                self.log(row["step"], row)

    def finish(self, summary):
        self._log_report()
        self.run.finish()
        self.wandb.teardown()  # finish() returns before wandb-core has written everything; this waits for it

    def _log_report(self) -> None:
        """The run's HTML report (``coevolve report``, without the embedding-based diversity) as an artifact."""
        from coevolve.analytics.report import write_report

        try:
            page = write_report(self.root, embed=False)
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("the run's HTML report could not be written for W&B: %s", exc)
            return
        artifact = self.wandb.Artifact(f"report-{self.run.id}", type="report")
        artifact.add_dir(str(page.parent))
        self.run.log_artifact(artifact)
