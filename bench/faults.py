"""Fault probes at scale: hostile model outputs through every recipe's parsers, slow answer votes, random SIGKILL and
resume cycles, damaged checkpoints. The probes are ``tests/test_faults.py``'s (its parsers, fixed hostile texts and
damage kinds); this runs larger, randomized versions and prints what was tried and what held.

- texts: N random hostile outputs (format fragments at random, one fragment repeated, deep nesting, a valid output
  inside noise; 1 character to 1.3 x the length cap) and the fixed probes, through every parser; held: nothing raised
  and no call took a second;
- votes: V majority votes over 8 answers built to be slow for math-verify, with the real equivalence and budget;
  held: no vote took longer than its budget plus one comparison's timeout;
- kills: a GRPO run on a random tiny model killed with SIGKILL at K random moments, resumed after each, then run to
  the end; held: no resume printed a traceback or found a damaged checkpoint, every step was logged once, and the
  rewards, losses and final weights are the uninterrupted run's;
- damages: M copies of a finished run, each with a random damage to its latest checkpoint (or, one in five, to both)
  and invalid UTF-8 in its metrics and samples; held: the resume named the damaged checkpoint in one warning,
  continued from the intact one and ended with the uninterrupted run's weights (both damaged: one error naming both,
  nothing deleted). Damage that keeps a file's size (random or NaN bytes in a tensor, an edited state.json) is found
  by the checkpoint's checksums;
- overwrites: O copies of a finished run, four in five with 1-3 things of the user's put at random places in its
  folders (a file, a folder where a run writes a file, a symlink in place of a run's file or folder), then
  ``--overwrite``; held: with something of the user's, one error line (exit code 2) naming it and not a byte changed
  (symlink targets included); with nothing, a fresh 1-step run in the folder and nothing of the old one left;
- rundir: a resume past a damaged checkpoint with a note of the user's in ``eval/step_N`` (held: refused in one
  line, nothing changed; without the note it resumes and keeps user files named ``step_*``), W&B online with no API
  key and with no server (a closed local port; held: one warning, the run logs offline), ``--overwrite`` with a file
  of the user's in a W&B run folder (held: refused, untouched), ``train.kl_beta=1e308`` (held: one error line, exit 1,
  not ``done``), a full disk on a 3 MiB tmpfs (root only; held: one line, exit 2, the last checkpoint intact, and a
  resume once space is freed);
- early: every bad command of ``tests/test_faults_cli.py``'s ``config_errors`` with an empty model cache and model
  loading replaced by a tripwire; held: one error line with the expected exit code before any model was loaded or
  built, nothing written;
- exports: ``coevolve export`` and ``coevolve eval DIR`` through the real CLI: E pairs of exports started together
  into one --out, exports of a run that is training and rotating its checkpoints, a full and a read-only device (a
  small tmpfs where mount is allowed), bad --max-shard-size values and impossible --out paths, a truncated export, an
  export without its manifest, an exported program-world (AZR) model; held: each ends with its exit code and, for an
  error, one line and no traceback; nothing mixed or half-written is left; the unlabelled export is prompted as the
  labelled one; the AZR export evaluates the program sets;
- programs: every hostile program of ``tests/execution/test_execution.py`` (runaways, escapes, forged results and
  the rebinding liars) through the sandboxed executor, each followed by a plain one; held: each graded as the tests
  allow (the liars: their honest value), every plain program answered 42 (skipped where no sandbox can be set up).

``--smoke``: seconds: 20 texts, and the forgers and liars of the programs (not the runaways, which take the limits);
none of the runs (for the test suite).

Run from the repository root:
``.venv/bin/python bench/faults.py [--texts N] [--votes V] [--kills K] [--damages M] [--overwrites O] [--exports E]``.
Writes ``bench/results/faults.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from speed import RESULTS_DIR, machine_info, run_header, write_json

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import save_random_llama  # noqa: E402  (the tests' random model)
from test_faults import DAMAGES, HOSTILE, NAN_BYTES, PARSERS  # noqa: E402  (the probes this scales up)
from test_faults_cli import config_errors, model_loaders  # noqa: E402

from coevolve.grading import MAX_TEXT_CHARS, majority_vote, pop_bound_counts  # noqa: E402
from coevolve.grading.guard import PARSE_ERROR, TEXT_TOO_LONG, VOTE_OVER_BUDGET  # noqa: E402
from coevolve.grading.vote import VOTE_BUDGET_S  # noqa: E402
from coevolve.rewards.filters import filter_reasons  # noqa: E402
from coevolve.store import CheckpointDamaged, RunStore  # noqa: E402

FRAGMENTS = ["<question>", "</question>", "<problem>", "</PROBLEM>", "<think>", "</think>", "<concepts>",
             "</concepts>", "<answer>", "</answer>", "\\boxed{", "\\fbox {", "{", "}", "[", "]", "(", ")",
             '{"question_text": "', '", "ground_truth": ', '"', ",", ":", "\\", "\\\\", "\\text{", "\\frac{1}{2}",
             "Question: ", "Solution:", "Answer: ", "\nA:", "Q:", "####", "the answer is ", "(C)",
             "Therefore, the final answer is: $", "find ", " and the ", " 1. ", " (b) ", "?", "\n", " ", "\t",
             "7" * 64, "x+1", "a*b-3", "\u2028", "\x00", "\ud800", "\u00e9", "```json\n", "```", "1e999", "-0"]
NESTERS = [("[", "]"), ("{", "}"), ("\\boxed{", "}"), ("<think>", "</think>"), ("(", ")"), ('{"a":', "}")]
SLOW_ANSWERS = ["9^{9^{9^{9}}}", "x^{100000}-1", "\\frac{" * 30 + "1" + "}{2}" * 30, "\\sqrt{" * 40 + "2" + "}" * 40,
                "(x+1)^{5000}", "10^{10^{10}}+1", "\\sum_{k=1}^{10^{9}} k^{k}", "e^{e^{e^{e^{10}}}}",
                "\\int_0^1 x^{x^{x}} dx", "1+" * 300 + "1", "\\binom{10^{8}}{5 \\cdot 10^{7}}", "2^{2^{2^{2^{2}}}}"]
STEPS = 16
KILL_SETS = [f"steps={STEPS}", "eval_sets=[]", "params.questions_per_step=2", "params.group_size=2",
             "rollout.max_new_tokens=8", "train.lr=1e-2", "keep_checkpoints=2"]


def hostile_text(rng: random.Random) -> str:
    """One random hostile output, 1 character to 1.3 x the length cap."""
    length = int(10 ** rng.uniform(0, math.log10(1.3 * MAX_TEXT_CHARS)))
    mode = rng.choice(["fragments", "repeat", "nest", "valid_in_noise"])
    if mode == "repeat":
        text = rng.choice(FRAGMENTS) * (length // 2 + 1)
    elif mode == "nest":
        opening, closing = rng.choice(NESTERS)
        depth = length // (len(opening) + len(closing)) + 1
        text = opening * depth + rng.choice(FRAGMENTS) + closing * rng.randint(0, depth)
    elif mode == "valid_in_noise":
        valid = rng.choice(list(PARSERS.values()))[2]
        noise = "".join(rng.choice(FRAGMENTS) for _ in range(length // 8 + 1))
        cut = rng.randint(0, len(noise))
        text = noise[:cut] + valid + noise[cut:]
    else:
        text = "".join(rng.choice(FRAGMENTS) for _ in range(length // 4 + 1))
    return text[:length] if mode != "valid_in_noise" else text


def probe_texts(n: int, seed: int) -> dict[str, Any]:
    """Every parser on the fixed probes and n random hostile texts."""
    rng = random.Random(seed)
    texts = list(HOSTILE.values()) + [hostile_text(rng) for _ in range(n)]
    parsers: dict[str, Callable[[str], Any]] = {name: parse for name, (parse, _, _) in PARSERS.items()}
    parsers["dynamic_rl filters"] = lambda t: filter_reasons(t, broad_multi_part=True)
    invalid = {name: value for name, (_, value, _) in PARSERS.items()}
    pop_bound_counts()
    rows = {name: {"calls": 0, "raised": 0, "invalid": 0, "max_s": 0.0, "total_s": 0.0} for name in parsers}
    for text in texts:
        for name, parse in parsers.items():
            row = rows[name]
            started = time.perf_counter()
            try:
                result = parse(text)
            except Exception:  # noqa: BLE001  (what the probe looks for)
                row["raised"] += 1
                result = None
            seconds = time.perf_counter() - started
            row["calls"] += 1
            row["invalid"] += name in invalid and result == invalid[name]
            row["max_s"], row["total_s"] = max(row["max_s"], seconds), row["total_s"] + seconds
    bounds = pop_bound_counts()
    lengths = [len(t) for t in texts]
    return {"texts": len(texts), "over_cap": sum(n > MAX_TEXT_CHARS for n in lengths), "max_chars": max(lengths),
            "parsers": rows, "too_long_refusals": bounds[TEXT_TOO_LONG], "parse_errors": bounds[PARSE_ERROR],
            "held": all(r["raised"] == 0 and r["max_s"] < 1.0 for r in rows.values())}


def probe_votes(n: int, seed: int) -> dict[str, Any]:
    """n votes over 8 slow answers each, with math-verify and the default budget."""
    from coevolve.grading import verify_equivalent

    rng = random.Random(seed)
    times = []
    pop_bound_counts()
    for _ in range(n):
        answers = rng.sample(SLOW_ANSWERS, 8)
        started = time.perf_counter()
        majority_vote(answers, lambda a, b: verify_equivalent(a, b, timeout_s=5.0))
        times.append(time.perf_counter() - started)
    limit = VOTE_BUDGET_S + 5.0 + 1.0  # the budget, one comparison's timeout, restarting the worker
    return {"votes": n, "max_s": max(times, default=0.0), "over_budget": pop_bound_counts()[VOTE_OVER_BUDGET],
            "limit_s": limit, "held": all(t <= limit for t in times)}


def _cli(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "coevolve", "run", *args, "--quiet"]


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    final = run / "checkpoints" / f"step_{STEPS:06d}" / "solver.safetensors"
    return {k: v.clone() for k, v in load_file(final).items()}


def _same_run(run: Path, reference: Path) -> tuple[bool, float]:
    """Whether every step was logged once with the reference's reward and loss; and the final weights' max gap."""
    rows = [r for r in RunStore(run).metrics() if "solver/loss" in r]
    ref = [r for r in RunStore(reference).metrics() if "solver/loss" in r]
    same = [r["step"] for r in rows] == list(range(1, STEPS + 1)) and all(
        a["solver/reward_mean"] == b["solver/reward_mean"] and abs(a["solver/loss"] - b["solver/loss"]) < 1e-6
        for a, b in zip(rows, ref))
    got, want = _final_weights(run), _final_weights(reference)
    return same, max(float((got[k] - want[k]).abs().max()) for k in want)


def probe_kills(n: int, seed: int, model: Path, reference: Path, ref_seconds: float, work: Path) -> dict[str, Any]:
    """n SIGKILLs at random moments of a run (resuming after each), then the run to its end. Each kill falls at a
    uniform moment of what the process has left to do: its start-up, then the steps after the last checkpoint (both
    timed on the reference run)."""
    rng = random.Random(seed)
    step_s = sum(r["time/step_s"] for r in RunStore(reference).metrics() if "time/step_s" in r) / STEPS
    startup_s = max(ref_seconds - STEPS * step_s, 1.0)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = work / "killed"
    sets = [a for s in [f"model={model}", *KILL_SETS] for a in ("--set", s)]
    kills = finished_early = after_checkpoint = 0
    errors: list[str] = []
    for _ in range(n):
        args = ["--resume", str(run)] if (run / "config.yaml").exists() else ["grpo", *sets, "--out", str(run)]
        left = STEPS - max(RunStore(run).checkpoint_steps(), default=0)
        proc = subprocess.Popen(_cli(args), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=rng.uniform(0.5, startup_s + left * step_s))
            finished_early += 1
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, stderr = proc.communicate()
            kills += 1
            after_checkpoint += bool(RunStore(run).checkpoint_steps())
        if "Traceback" in stderr or "damaged" in stderr:
            errors.append(stderr.strip().splitlines()[-1])
        if finished_early:
            break
    done = subprocess.run(_cli(["--resume", str(run)]), env=env, capture_output=True, text=True)
    if done.returncode != 0 or "Traceback" in done.stderr or "damaged" in done.stderr:
        errors.append(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
    same, gap = _same_run(run, reference) if done.returncode == 0 else (False, math.inf)
    return {"kills": kills, "kills_after_a_checkpoint": after_checkpoint, "finished_before_kill": finished_early,
            "bad_resumes": len(errors), "errors": errors, "steps_once_and_equal": same, "final_weight_gap": gap,
            "held": not errors and same and gap <= 1e-6}


def _overwrite_data(folder: Path, name: str = "solver.safetensors", data: bytes | None = None) -> None:
    """Random bytes (or ``data``) over the last quarter of a file, its size unchanged (found by the checksums)."""
    path = folder / name
    raw = bytearray(path.read_bytes())
    start = len(raw) * 3 // 4
    tail = len(raw) - start
    raw[start:] = (data * (tail // len(data) + 1))[:tail] if data else os.urandom(tail)
    path.write_bytes(bytes(raw))


def _random_damage(rng: random.Random) -> tuple[str, Callable[[Path], None]]:
    files = ["solver.safetensors", "solver.optim.safetensors", "rng.safetensors", "state.json"]
    name = rng.choice(files)
    kinds: dict[str, Callable[[Path], None]] = {
        f"{name} truncated at random": lambda f: (f / name).write_bytes(
            (f / name).read_bytes()[: rng.randrange(max((f / name).stat().st_size, 1))]),
        f"{name} deleted": lambda f: (f / name).unlink(),
        f"{name} garbage appended": lambda f: (f / name).write_bytes((f / name).read_bytes() + os.urandom(64)),
        f"{name} header overwritten": lambda f: (f / name).write_bytes(
            os.urandom(16) + (f / name).read_bytes()[16:]),
        "state.json a JSON list": lambda f: (f / "state.json").write_text("[1, 2]"),
        "state.json without optimizers": lambda f: (f / "state.json").write_text('{"step": 2}'),
        "tensor bytes overwritten (size unchanged)": _overwrite_data,
        "optimizer bytes overwritten (size unchanged)": lambda f: _overwrite_data(f, "solver.optim.safetensors"),
        "NaN over the weights' last quarter": lambda f: _overwrite_data(f, data=NAN_BYTES),
    }
    kinds.update({f"test: {k}": v for k, v in DAMAGES.items()})
    kind = rng.choice(sorted(kinds))
    return kind, kinds[kind]


class _Messages(logging.Handler):
    """Keeps the text of every record coevolve logs (the damaged-checkpoint warnings), printing none."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def probe_damages(n: int, seed: int, model: Path, reference: Path, work: Path) -> dict[str, Any]:
    """n copies of the finished reference run, each with a random damage, resumed in this process."""
    from coevolve.loop import run as run_loop
    from coevolve.recipes import resolve

    rng = random.Random(seed)
    config, params, cls = resolve("grpo", sets=[f"model={model}", *KILL_SETS])
    want = _final_weights(reference)
    kinds: dict[str, dict[str, int]] = {}
    for i in range(n):
        both = rng.random() < 0.2
        kind, damage = _random_damage(rng)
        copy = work / f"damaged{i}"
        shutil.copytree(reference, copy)
        latest, previous = (f"step_{STEPS:06d}", f"step_{STEPS - 1:06d}")
        damage(copy / "checkpoints" / latest)
        if both:
            damage(copy / "checkpoints" / previous)
        with open(copy / "metrics.jsonl", "ab") as handle:
            handle.write(b'{"step": 3, "x": "\xff"}\n\xc3\x28\n')
        collected = _Messages()
        logger = logging.getLogger("coevolve")
        logger.addHandler(collected)
        logger.setLevel(logging.WARNING)
        logger.propagate = False
        try:
            run_loop(cls(config, params), config, copy, resume=True, progress=False)
            error = None
        except CheckpointDamaged as exc:
            error = str(exc)
        finally:
            logger.removeHandler(collected)
            logger.propagate = True
        warned = [m for m in collected.messages if "damaged checkpoint" in m]
        if both:
            held = error is not None and previous in error and latest in error \
                and sorted(p.name for p in (copy / "checkpoints").iterdir()) == [previous, latest]
        else:
            got = _final_weights(copy) if error is None else None
            held = error is None and len(warned) == 1 and latest in warned[0] \
                and (copy / "checkpoints" / f"damaged_{latest}").is_dir() \
                and max(float((got[k] - want[k]).abs().max()) for k in want) <= 1e-6
        row = kinds.setdefault(("both: " if both else "") + kind, {"tried": 0, "held": 0})
        row["tried"] += 1
        row["held"] += bool(held)
        shutil.rmtree(copy)
    return {"variants": n, "kinds": kinds, "held_count": sum(r["held"] for r in kinds.values())}


def _tree(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder`` without following symlinks: a file's bytes, a symlink's target, a folder's '/'."""
    entries: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        entries[key] = (f"-> {os.readlink(path)}" if path.is_symlink() else "/" if path.is_dir()
                        else path.read_bytes())
    return entries


def _put_users_thing(run: Path, rng: random.Random, outside: Path) -> str:
    """One thing of the user's at a random place of a run directory; returns what an error line should name."""
    folders = [p for p in run.rglob("*") if p.is_dir() and not p.is_symlink()] + [run]
    files = [p for p in run.rglob("*") if p.is_file() and not p.is_symlink() and p.name != ".lock"]
    kind = rng.choice(["file", "folder", "symlink"])
    if kind == "symlink":
        victim = rng.choice(folders[:-1] + files)
        target = outside / f"target{rng.randrange(10**6)}"
        (shutil.copytree if victim.is_dir() else shutil.copy)(victim, target)
        (shutil.rmtree if victim.is_dir() else Path.unlink)(victim)
        victim.symlink_to(target, target_is_directory=target.is_dir())
        return victim.name
    place = rng.choice(folders)
    name = rng.choice(["notes.txt", "best_step3", "my.csv", "custom", "step_3.jsonl", "summary.json.bak"])
    if kind == "folder" and files:
        victim = rng.choice(files)
        victim.unlink()
        victim.mkdir()
        (victim / name).write_text("mine\n")
        return victim.name
    (place / name).write_text("mine\n")
    return name


def probe_overwrites(n: int, seed: int, model: Path, reference: Path, work: Path) -> dict[str, Any]:
    """n copies of the finished run, most with things of the user's in its folders, overwritten by a new run."""
    from typer.testing import CliRunner

    from coevolve.cli import app

    rng = random.Random(seed)
    outcomes = {"refused and untouched": [0, 0], "replaced": [0, 0]}
    for i in range(n):
        copy, outside = work / f"overwrite{i}", work / f"outside{i}"
        shutil.copytree(reference, copy)
        outside.mkdir()
        named = [_put_users_thing(copy, rng, outside) for _ in range(rng.randint(1, 3))] if rng.random() < 0.8 else []
        before, targets = _tree(copy), _tree(outside)
        result = CliRunner().invoke(app, ["run", "grpo", "--out", str(copy), "--overwrite", "--quiet",
                                          *[a for s in [f"model={model}", *KILL_SETS, "steps=1"]
                                            for a in ("--set", s)]])
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        if named:
            held = (result.exit_code == 2 and len(errors) == 1 and any(name in errors[0] for name in named)
                    and _tree(copy) == before and _tree(outside) == targets)
            row = outcomes["refused and untouched"]
        else:
            held = (result.exit_code == 0 and [r["step"] for r in RunStore(copy).metrics()] == [1]
                    and RunStore(copy).checkpoint_steps() == [1])
            row = outcomes["replaced"]
        row[0] += 1
        row[1] += bool(held)
        shutil.rmtree(copy)
        shutil.rmtree(outside)
    return {"variants": n, "outcomes": {k: {"tried": t, "held": h} for k, (t, h) in outcomes.items()},
            "held": all(h == t for t, h in outcomes.values())}


def _run_cli(args: list[str], env: dict[str, str] | None = None) -> tuple[int, list[str], str]:
    """A ``coevolve run`` in a subprocess (``env``: its whole environment, default this one's): (exit code, its
    ``error:`` lines, its whole stderr)."""
    done = subprocess.run(_cli(args), capture_output=True, text=True,
                          env={**(os.environ if env is None else env), "OMP_NUM_THREADS": "1"})
    return done.returncode, [line for line in done.stderr.splitlines() if line.startswith("error:")], done.stderr


def _short_run(model: Path, out: Path, steps: int, *sets: str) -> list[str]:
    return ["grpo", "--out", str(out), *[a for s in [f"model={model}", *KILL_SETS, f"steps={steps}", *sets]
                                         for a in ("--set", s)]]


def _full_disk_rows(model: Path, work: Path) -> list[dict[str, Any]]:
    """A run on a 3 MiB tmpfs filled to 100 KB after step 1: the checkpoint of step 2, then a resume while the disk is
    still full, then one after space is freed. Needs root to mount the tmpfs; without it, one row says so."""
    disk = work / "small-disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], capture_output=True).returncode:
        return [{"probe": "full disk during a checkpoint", "held": None, "detail": "not tried: mounting a tmpfs "
                 "needs root"}]
    rows = []
    try:
        out = disk / "run"
        code, _, _ = _run_cli(_short_run(model, out, 1))
        free = shutil.disk_usage(disk).free
        (disk / "filler").write_bytes(b"\0" * max(free - 100_000, 0))
        kept = _tree(out / "checkpoints")
        for attempt in ("full disk during a checkpoint", "resume while the disk is still full"):
            code, errors, stderr = _run_cli(["--resume", str(out), "--set", "steps=3"])
            rows.append({"probe": attempt, "held": code == 2 and len(errors) == 1 and "no space left" in errors[0]
                         and "Traceback" not in stderr and _tree(out / "checkpoints") == kept,
                         "detail": errors[0][:160] if errors else stderr[-160:]})
        (disk / "filler").unlink()
        code, _, _ = _run_cli(["--resume", str(out), "--set", "steps=3"])
        rows.append({"probe": "resume after space is freed", "held": code == 0
                     and [r["step"] for r in RunStore(out).metrics() if "solver/loss" in r] == [1, 2, 3], "detail": ""})
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
    return rows


def probe_rundir(model: Path, work: Path) -> dict[str, Any]:
    """The run folder's rules beyond --overwrite: resume past a damaged checkpoint removes only what the run wrote
    (a note of the user's in eval/step_N refuses it, user files named step_* stay and stop nothing); --overwrite
    keeps a file of the user's inside W&B's folders; a full disk; W&B online with no key or no server (a closed
    port on this machine, never the network); a run whose every update is skipped."""
    rows = []
    base = work / "rundir"
    base.mkdir()

    out = base / "damaged"
    _run_cli(_short_run(model, out, 2))
    (out / "checkpoints" / "step_000002" / "solver.safetensors").write_bytes(b"truncated")
    for name in ("eval/step_000002/summary.json", "eval/step_000002/notes.txt", "samples/step_notes.txt",
                 "eval/step_best/mine.csv"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("mine\n")
    before = _tree(out)
    code, errors, stderr = _run_cli(["--resume", str(out)])
    rows.append({"probe": "resume past a damaged checkpoint, a note in eval/step_N", "held": code == 2
                 and len(errors) == 1 and "eval/step_000002/notes.txt" in errors[0] and _tree(out) == before,
                 "detail": errors[0][:160] if errors else stderr[-160:]})
    (out / "eval" / "step_000002" / "notes.txt").unlink()
    code, errors, stderr = _run_cli(["--resume", str(out)])
    rows.append({"probe": "the same resume without the note; user files named step_*", "held": code == 0
                 and not (out / "eval" / "step_000002").exists() and (out / "samples" / "step_notes.txt").exists()
                 and (out / "eval" / "step_best" / "mine.csv").exists(), "detail": stderr[-160:] if code else ""})

    wandb_env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR")}
    for name in ("CACHE_DIR", "CONFIG_DIR", "DATA_DIR", "ARTIFACT_DIR"):  # W&B's run folder: RUN/wandb
        wandb_env[f"WANDB_{name}"] = str(base / f"wandb-{name.lower()}")
    wandb_env.update(WANDB_SILENT="true", WANDB_BASE_URL="http://127.0.0.1:9", WANDB_INIT_TIMEOUT="5")
    for trouble, key in (("no API key", {}), ("no server", {"WANDB_API_KEY": "a" * 40})):
        out = base / f"wandb-{trouble.replace(' ', '-')}"
        started = time.perf_counter()
        code, errors, stderr = _run_cli(_short_run(model, out, 1, "report_to=[wandb]"), {**wandb_env, **key})
        warned = [line for line in stderr.splitlines() if "W&B online failed" in line]
        rows.append({"probe": f"W&B online, {trouble}", "held": code == 0 and len(warned) == 1
                     and "Traceback" not in stderr and bool(list((out / "wandb").glob("offline-run-*"))),
                     "detail": f"{time.perf_counter() - started:.0f} s; " + (warned[0][:120] if warned
                                                                            else stderr[-120:])})
    out = base / "wandb-no-server"
    for offline in (out / "wandb").glob("offline-run-*"):
        (offline / "files" / "notes.txt").write_text("mine\n")
    before = _tree(out)
    code, errors, _ = _run_cli(_short_run(model, out, 1) + ["--overwrite"])
    rows.append({"probe": "--overwrite, a file of the user's inside a W&B run folder", "held": code == 2
                 and len(errors) == 1 and "notes.txt" in errors[0] and _tree(out) == before,
                 "detail": errors[0][:160] if errors else ""})

    code, errors, stderr = _run_cli(_short_run(model, base / "kl", 2, "train.kl_beta=1e308"))
    rows.append({"probe": "train.kl_beta=1e308: every update skipped", "held": code == 1 and len(errors) == 1
                 and "every update of the run was skipped" in errors[0], "detail": errors[0][:160] if errors else ""})
    rows += _full_disk_rows(model, base)
    return {"rows": rows, "held": all(r["held"] is not False for r in rows)}


def probe_early(work: Path) -> dict[str, Any]:
    """Every bad command the tests know, with an empty model cache and model loading replaced by a tripwire."""
    from typer.testing import CliRunner

    from coevolve.cli import app

    def tripwire(*args, **kwargs):
        raise AssertionError("a model was loaded or built before the error")

    patched = model_loaders()
    saved = [getattr(module, name) for module, name in patched]
    cache, before = work / "empty-cache", os.environ.get("COEVOLVE_CACHE")
    (work / "early").mkdir()
    os.environ["COEVOLVE_CACHE"] = str(cache)
    cases = []
    try:
        for module, name in patched:
            setattr(module, name, tripwire)
        for args, needle, code in config_errors(work / "early"):
            started = time.perf_counter()
            result = CliRunner().invoke(app, [str(a) for a in args])
            errors = [line for line in result.output.splitlines() if line.startswith("error:")]
            held = (result.exit_code == code and len(errors) == 1 and needle in errors[0]
                    and not (work / "early" / "run").exists() and not cache.exists())
            cases.append({"command": " ".join(str(a) for a in args[4:] if "/" not in str(a))[:80], "held": held,
                          "seconds": time.perf_counter() - started, "error": errors[0][:160] if errors else None})
    finally:
        for (module, name), value in zip(patched, saved):
            setattr(module, name, value)
        if before is None:
            os.environ.pop("COEVOLVE_CACHE")
        else:
            os.environ["COEVOLVE_CACHE"] = before
    return {"cases": cases, "held": all(c["held"] for c in cases)}


# -- exports (issue 42): coevolve export and eval DIR under hostile conditions, through the real CLI ---------------

def _coevolve(args: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "coevolve", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, **kwargs)


def _ended(proc: subprocess.Popen) -> tuple[int, bool, str]:
    """``proc``'s exit code; whether it ended cleanly (no traceback, and for an error exactly one ``error:``
    line); its last line."""
    out, err = proc.communicate()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    last = (errors or (err + out).strip().splitlines() or [""])[-1][:200]
    return proc.returncode, "Traceback" not in err and (proc.returncode == 0 or len(errors) == 1), last


def _one_line(proc: subprocess.Popen, code: int) -> tuple[bool, str]:
    """Whether ``proc`` ended cleanly with exit code ``code``; and its last line."""
    returncode, clean, last = _ended(proc)
    return returncode == code and clean, last


def _mount_tmpfs(folder: Path, options: str) -> bool:
    """A small tmpfs at ``folder`` (a full or read-only device without filling a real disk), where mount is
    allowed (root in a container); False elsewhere."""
    folder.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                          capture_output=True).returncode == 0


def probe_exports(races: int, model: Path, work: Path) -> dict[str, Any]:
    """``coevolve export`` and ``coevolve eval DIR`` as a hostile user drives them: two exports started together into
    one --out (``races`` times), exports of a run that is still training and rotating its checkpoints, a full and a
    read-only device (a small tmpfs, where mount is allowed), bad --max-shard-size values, an --out that cannot be,
    a truncated export, an export without its manifest, an exported program-world model. Held: every command ends
    with its exit code and, for an error, one line and no traceback; nothing mixed or half-written is left."""
    rows: dict[str, dict[str, Any]] = {}

    def row(name: str, held: bool, detail: str = "") -> None:
        entry = rows.setdefault(name, {"tried": 0, "held": 0, "details": []})
        entry["tried"] += 1
        entry["held"] += bool(held)
        if detail and not held:
            entry["details"].append(detail)

    run = work / "export-run"
    sets = ["steps=3", "eval_sets=[arith_l1]", "eval_limit=4", "eval_max_new_tokens=16", *KILL_SETS[2:5]]
    subprocess.run(_cli(["grpo", *[a for s in [f"model={model}", *sets] for a in ("--set", s)], "--out", str(run)]),
                   check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})

    for i in range(races):  # two exports at once into one --out: one writes, the other is refused
        out = work / f"race{i}"
        procs = [_coevolve(["export", str(run), "--out", str(out), "--step", str(step), *extra])
                 for step, extra in ((2, ["--max-shard-size", "100KB"]), (3, []))]
        ends = [_ended(p) for p in procs]
        codes = sorted(code for code, _, _ in ends)
        lines = [(clean, last) for _, clean, last in ends]
        manifest = json.loads((out / "coevolve_export.json").read_text()) if (out / "coevolve_export.json").exists() \
            else {}
        same = sorted(os.listdir(out)) == manifest.get("files") if out.exists() else False
        row("two exports into one --out", codes == [0, 2] and all(ok for ok, _ in lines) and same,
            f"exit codes {codes}; {[line for _, line in lines]}")

    training = work / "training"  # exports while a run trains and rotates checkpoints (keep_checkpoints=1)
    trainer = subprocess.Popen(_cli(["grpo", *[a for s in [f"model={model}", *KILL_SETS[1:5], "steps=1000",
                                                             "keep_checkpoints=1"] for a in ("--set", s)],
                                     "--out", str(training)]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    exported = 0
    while trainer.poll() is None and exported < 2 * races:  # then the run is stopped
        if not RunStore(training).checkpoint_steps():
            time.sleep(0.2)
            continue
        ok, last = _one_line(_coevolve(["export", str(training), "--out", str(work / f"live{exported}")]), 0)
        if not ok:  # refused in one line is also held: the checkpoint went before the copy was taken
            ok = "removed while it was read" in last and "Traceback" not in last
        row("export while the run trains", ok, last)
        exported += 1
    trainer.terminate()
    trainer.wait()

    bad = [["--max-shard-size", "abc"], ["--max-shard-size", "0"], ["--max-shard-size", "-1"]]
    (work / "a-file").write_text("")
    for args, where in [(a, work / "bad-size") for a in bad] + [([], Path("/proc/coevolve-x")),
                                                                ([], work / "a-file" / "x")]:
        ok, last = _one_line(_coevolve(["export", str(run), "--out", str(where), *args]), 2)
        row("bad --max-shard-size or --out", ok and not (work / "bad-size").exists(), last)
    for where in (Path("/proc/coevolve-x"), work / "a-file" / "x"):
        ok, last = _one_line(_coevolve(["eval", str(run), "--limit", "2", "--out", str(where)]), 2)
        row("eval --out that cannot be", ok, last)

    full, read_only = work / "full", work / "read-only"
    if _mount_tmpfs(full, "size=200k") and _mount_tmpfs(read_only, "ro,size=1m"):
        try:
            ok, last = _one_line(_coevolve(["export", str(run), "--out", str(full / "out")]), 2)
            row("full or read-only device", ok and "no space left" in last and not os.listdir(full), last)
            for command in (["export", str(run)], ["eval", str(run), "--limit", "2"]):
                ok, last = _one_line(_coevolve([*command, "--out", str(read_only / "out")]), 2)
                row("full or read-only device", ok, last)
        finally:
            subprocess.run(["umount", str(full)], check=False)
            subprocess.run(["umount", str(read_only)], check=False)
    else:
        rows["full or read-only device"] = {"tried": 0, "held": 0, "details": ["not run: mount is not allowed here"]}

    folder = work / "exported"
    _one_line(_coevolve(["export", str(run), "--out", str(folder)]), 0)
    truncated = work / "truncated"
    shutil.copytree(folder, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    ok, last = _one_line(_coevolve(["eval", str(truncated), "--limit", "2"]), 2)
    row("truncated model.safetensors to eval", ok and "model.safetensors" in last, last)

    prompts = {}
    for name in ("with", "without"):
        if name == "without":
            (folder / "coevolve_export.json").unlink()
        proc = _coevolve(["eval", str(folder), "--sets", "arith_l1", "--limit", "4", "--max-new-tokens", "16",
                          "--out", str(work / f"eval-{name}")])
        ok, last = _one_line(proc, 0)
        results = work / f"eval-{name}" / "arith_l1" / "results.jsonl"
        prompts[name] = [json.loads(line)["prompt"] for line in results.open()] if results.exists() else None
    row("export without its manifest: prompted as trained", prompts["with"] is not None
        and prompts["with"] == prompts["without"], str(prompts)[:200])

    from coevolve.config import to_yaml
    from coevolve.models import load_policy
    from coevolve.recipes import resolve

    config, _, _ = resolve("azr", sets=[f"model={model}", "steps=1", "task=program"])
    azr = work / "azr"
    azr.mkdir()
    (azr / "config.yaml").write_text(to_yaml(config))
    policy = load_policy(str(model)).model
    RunStore(azr).save_checkpoint(1, {"solver": policy}, {"solver": torch.optim.AdamW(policy.parameters())}, {})
    _one_line(_coevolve(["export", str(azr), "--out", str(work / "azr-export")]), 0)
    proc = _coevolve(["eval", str(work / "azr-export"), "--limit", "1", "--max-new-tokens", "8"])
    out, err = proc.communicate()
    evaluated = [line.split()[0] for line in out.splitlines() if "accuracy:" in line]
    row("exported AZR model evaluates its own sets", proc.returncode == 0 and bool(evaluated)
        and all(name.startswith("prog_") for name in evaluated), f"{evaluated} {err[-200:]}")
    return {"rows": rows, "held": all(r["held"] == r["tried"] for r in rows.values())}


def probe_programs(hostile: bool = True) -> dict[str, Any]:
    """The sandbox tests' hostile programs (unless ``hostile`` is False: they include runaways that take the limits),
    forgers and liars, each followed by a plain program, through one executor."""
    sys.path.insert(0, str(ROOT / "tests" / "execution"))
    from test_execution import FORGERS, HOSTILE, LIARS, LIMITS, SENTINEL

    from coevolve.execution import Executor, Job, sandbox_problem

    problem = sandbox_problem()
    if problem is not None:
        return {"skipped": problem, "held": True}
    cases = {name: (Job(code, expression), kinds) for name, (code, expression, kinds) in HOSTILE.items() if hostile}
    honest = "def f(x):\n    return x\n"
    cases |= {name: (Job(honest + code, "f(1)"), kinds) for name, (code, kinds) in FORGERS.items()}
    cases |= {name: (Job(code + "\n" + honest, "f(1)"), {"ok"}) for name, code in LIARS.items()}
    started = time.perf_counter()
    with Executor(LIMITS, workers=2) as executor:
        outcomes = executor.run([job for job, _ in cases.values() for job in (job, SENTINEL)])
    rows = [{"program": name, "status": o.status, "detail": o.detail[:120],
             "held": o.status in kinds and (o.value == "1" if name in LIARS else o.value is None)}
            for (name, (_, kinds)), o in zip(cases.items(), outcomes[0::2])]
    plain = all(o.status == "ok" and o.value == "42" for o in outcomes[1::2])
    return {"programs": rows, "plain_ok": plain, "seconds": time.perf_counter() - started,
            "held": plain and all(r["held"] for r in rows)}


def print_table(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    texts = results["texts"]
    table = Table(title=f"hostile outputs: {texts['texts']} texts (up to {texts['max_chars']:,} characters, "
                        f"{texts['over_cap']} over the {MAX_TEXT_CHARS:,} cap) through every parser")
    for column in ("parser", "calls", "raised", "invalid", "max ms", "mean ms"):
        table.add_column(column, justify="left" if column == "parser" else "right")
    for name, row in texts["parsers"].items():
        invalid = str(row["invalid"]) if name in PARSERS else "-"  # the filters have no invalid output
        table.add_row(name, str(row["calls"]), str(row["raised"]), invalid, f"{1e3 * row['max_s']:.1f}",
                      f"{1e3 * row['total_s'] / max(row['calls'], 1):.2f}")
    console.print(table)
    summary = Table(title="what was tried and what held")
    for column in ("probe", "tried", "held", "detail"):
        summary.add_column(column)
    summary.add_row("hostile outputs x parsers", f"{sum(r['calls'] for r in texts['parsers'].values()):,} calls",
                    "yes" if texts["held"] else "NO",
                    f"{sum(r['raised'] for r in texts['parsers'].values())} raised, slowest call "
                    f"{1e3 * max(r['max_s'] for r in texts['parsers'].values()):.0f} ms; bounds counted: "
                    f"{texts['too_long_refusals']:.0f} over-long, {texts['parse_errors']:.0f} parse errors")
    if "votes" in results:
        votes = results["votes"]
        summary.add_row("slow votes (math-verify)", f"{votes['votes']} votes of 8", "yes" if votes["held"] else "NO",
                        f"max {votes['max_s']:.1f} s (limit {votes['limit_s']:.0f} s), {votes['over_budget']:.0f} "
                        "over budget")
    if "kills" in results:
        kills = results["kills"]
        summary.add_row("SIGKILL + resume", f"{kills['kills']} kills ({kills['kills_after_a_checkpoint']} after a "
                        f"checkpoint), {STEPS} steps", "yes" if kills["held"] else "NO",
                        f"bad resumes {kills['bad_resumes']}, steps once and equal: {kills['steps_once_and_equal']}, "
                        f"final weight gap {kills['final_weight_gap']:.1e}")
    if "damages" in results:
        for kind, row in sorted(results["damages"]["kinds"].items()):
            summary.add_row(f"damaged: {kind}", str(row["tried"]), f"{row['held']}/{row['tried']}", "")
    if "overwrites" in results:
        for kind, row in results["overwrites"]["outcomes"].items():
            summary.add_row(f"--overwrite: {kind}", str(row["tried"]), f"{row['held']}/{row['tried']}", "")
    for row in results.get("rundir", {}).get("rows", []):
        summary.add_row(row["probe"], "1", {True: "yes", False: "NO", None: "-"}[row["held"]], row["detail"][:100])
    if "early" in results:
        cases = results["early"]["cases"]
        summary.add_row("bad command, empty model cache", f"{len(cases)} commands",
                        f"{sum(c['held'] for c in cases)}/{len(cases)}",
                        f"slowest {max(c['seconds'] for c in cases):.1f} s; no model loaded or built")
    if "exports" in results:
        for name, row in results["exports"]["rows"].items():
            summary.add_row(f"export/eval: {name}", str(row["tried"]), f"{row['held']}/{row['tried']}",
                            "; ".join(row["details"])[:120])
    if "programs" in results:
        programs = results["programs"]
        rows = programs.get("programs", [])
        summary.add_row("hostile programs, sandbox", f"{len(rows)} programs", "yes" if programs["held"] else "NO",
                        programs.get("skipped") or f"{sum(r['held'] for r in rows)}/{len(rows)} graded as allowed, "
                        f"plain programs after each answered: {programs['plain_ok']}")
    console.print(summary)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--texts", type=int, default=2000, help="random hostile outputs")
    parser.add_argument("--votes", type=int, default=4, help="majority votes over slow answers (0: none)")
    parser.add_argument("--kills", type=int, default=8, help="SIGKILL and resume cycles (0: none)")
    parser.add_argument("--damages", type=int, default=40, help="damaged-checkpoint variants (0: none)")
    parser.add_argument("--overwrites", type=int, default=20, help="--overwrite variants (0: none)")
    parser.add_argument("--no-early", dest="early", action="store_false", help="skip the bad-command probe")
    parser.add_argument("--no-rundir", dest="rundir", action="store_false", help="skip the run-folder probes (resume "
                        "past damage with user files, W&B folders and fallback, full disk, all updates skipped)")
    parser.add_argument("--exports", type=int, default=3, help="export races into one --out; 0 skips every "
                        "export and eval DIR probe")
    parser.add_argument("--no-programs", dest="programs", action="store_false", help="skip the sandbox probe")
    parser.add_argument("--smoke", action="store_true", help="20 texts and the programs only: seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "faults.json")
    args = parser.parse_args(argv)
    if args.smoke:
        args.texts, args.votes, args.kills, args.damages, args.overwrites, args.early = 20, 0, 0, 0, 0, False
        args.rundir, args.exports = False, 0
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    header, results = run_header(), {}
    started = time.perf_counter()
    results["texts"] = probe_texts(args.texts, args.seed)
    print(f"texts done ({time.perf_counter() - started:.0f} s)", flush=True)
    if args.votes:
        results["votes"] = probe_votes(args.votes, args.seed)
        print(f"votes done ({time.perf_counter() - started:.0f} s)", flush=True)
    if args.early:
        with tempfile.TemporaryDirectory() as scratch:
            results["early"] = probe_early(Path(scratch))
        print(f"early done ({time.perf_counter() - started:.0f} s)", flush=True)
    if args.programs:
        results["programs"] = probe_programs(hostile=not args.smoke)
        print(f"programs done ({time.perf_counter() - started:.0f} s)", flush=True)
    if args.kills or args.damages or args.overwrites or args.rundir:
        with tempfile.TemporaryDirectory() as scratch:
            work = Path(scratch)
            model = save_random_llama(work / "model", hidden=32)
            reference = work / "reference"
            clock = time.perf_counter()
            subprocess.run(_cli(["grpo", *[a for s in [f"model={model}", *KILL_SETS] for a in ("--set", s)],
                                 "--out", str(reference)]), check=True, capture_output=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
            ref_seconds = time.perf_counter() - clock
            if args.kills:
                results["kills"] = probe_kills(args.kills, args.seed, model, reference, ref_seconds, work)
                print(f"kills done ({time.perf_counter() - started:.0f} s)", flush=True)
            if args.damages:
                results["damages"] = probe_damages(args.damages, args.seed, model, reference, work)
                print(f"damages done ({time.perf_counter() - started:.0f} s)", flush=True)
            if args.overwrites:
                results["overwrites"] = probe_overwrites(args.overwrites, args.seed, model, reference, work)
                print(f"overwrites done ({time.perf_counter() - started:.0f} s)", flush=True)
            if args.rundir:
                results["rundir"] = probe_rundir(model, work)
                print(f"run folder done ({time.perf_counter() - started:.0f} s)", flush=True)
    if args.exports:
        with tempfile.TemporaryDirectory() as scratch:
            work = Path(scratch)
            results["exports"] = probe_exports(args.exports, save_random_llama(work / "model", hidden=32), work)
        print(f"exports done ({time.perf_counter() - started:.0f} s)", flush=True)
    results["wall_s"] = time.perf_counter() - started
    write_json(args.out, {**header, "machine": machine_info(), "args": vars(args) | {"out": str(args.out)},
                          "results": results})
    print_table(results)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
