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
- early: every bad command of ``tests/test_faults_cli.py``'s ``config_errors`` with an empty model cache and model
  loading replaced by a tripwire; held: one error line with the expected exit code before any model was loaded or
  built, nothing written.
- programs: every hostile program of ``tests/execution/test_execution.py`` (runaways, escapes, forged results and
  the rebinding liars) through the sandboxed executor, each followed by a plain one; held: each graded as the tests
  allow (the liars: their honest value), every plain program answered 42 (skipped where no sandbox can be set up).

``--smoke``: seconds: 20 texts, and the forgers and liars of the programs (not the runaways, which take the limits);
none of the runs (for the test suite).

Run from the repository root:
``.venv/bin/python bench/faults.py [--texts N] [--votes V] [--kills K] [--damages M] [--overwrites O]``.
Writes ``bench/results/faults.json``.
"""

from __future__ import annotations

import argparse
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
    if "early" in results:
        cases = results["early"]["cases"]
        summary.add_row("bad command, empty model cache", f"{len(cases)} commands",
                        f"{sum(c['held'] for c in cases)}/{len(cases)}",
                        f"slowest {max(c['seconds'] for c in cases):.1f} s; no model loaded or built")
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
    parser.add_argument("--no-programs", dest="programs", action="store_false", help="skip the sandbox probe")
    parser.add_argument("--smoke", action="store_true", help="20 texts and the programs only: seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "faults.json")
    args = parser.parse_args(argv)
    if args.smoke:
        args.texts, args.votes, args.kills, args.damages, args.overwrites, args.early = 20, 0, 0, 0, 0, False
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
    if args.kills or args.damages or args.overwrites:
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
    results["wall_s"] = time.perf_counter() - started
    write_json(args.out, {**header, "machine": machine_info(), "args": vars(args) | {"out": str(args.out)},
                          "results": results})
    print_table(results)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
