"""Tables of the real-LM experiment (``results.md``, ``results.json``) from whatever finished under ``runs/``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from coevolve.records import current_metric_names

OPTIONS = ["none", "examples", "constraint", "both", "sft"]
RECIPES = ["r_zero", "prism", "pasodoble", "infuser", "opensir", "dynamic_rl"]
VALID_KEYS = ("questions/valid_rate", "pool/valid_rate")


def _read(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def _rows(path: Path) -> list[dict[str, Any]]:
    """A metrics file's rows with today's metric names."""
    return [current_metric_names(json.loads(line)) for line in path.read_text().splitlines()
            if line.strip()] if path.exists() else []


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(values) / len(values) if values else None


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _help_item(line: str) -> str:
    """A help key as the tables show it: a warm-up folder by its last two parts (``sft/pasodoble``)."""
    key, _, value = line.partition(": ")
    if key == "generator_init" and value not in ("null", ""):
        return f"{key}: {'/'.join(Path(value).parts[-2:])}"
    return line


def short_run(run_dir: Path) -> dict[str, Any] | None:
    """What a short run did: per-step rewards and valid rates, solver updates, seconds per phase."""
    rows = [r for r in _rows(run_dir / "metrics.jsonl") if r.get("step", 0) >= 1 and "time/step_s" in r]
    if not rows:
        return None
    solver_steps = [r.get("solver/optimizer_steps", r.get("policy/optimizer_steps", 0)) or 0 for r in rows]
    solver_moved = [bool(s) and (r.get("solver/advantage_abs_mean") or 0) > 0 for s, r in zip(solver_steps, rows)]
    phases: dict[str, float] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith("time/") and isinstance(v, (int, float)):
                phases[k[5:-2]] = phases.get(k[5:-2], 0.0) + v
    config = (run_dir / "config.yaml").read_text() if (run_dir / "config.yaml").exists() else ""
    return {
        "steps": len(rows),
        "generator_valid_rate": [next((r[k] for k in VALID_KEYS if r.get(k) is not None), None) for r in rows],
        "generator_reward": [r.get("generator/reward_mean") for r in rows],
        "solver_reward": [r.get("solver/reward_mean") for r in rows],
        "solver_updates": sum(solver_moved), "solver_optimizer_steps": sum(solver_steps),
        "first_solver_update_step": next((r["step"] for r, m in zip(rows, solver_moved) if m), None),
        "phase_seconds": {k: round(v, 1) for k, v in sorted(phases.items())},
        "wall_s": rows[-1].get("time_s"),
        "format_help": [_help_item(line.strip()) for line in config.splitlines()
                        if line.strip().startswith(("format_examples", "format_constraint", "generator_init",
                                                    "solver_format_constraint"))],
        "warmup": _read(run_dir / "sft" / "summary.json"),  # the loop tests train their own (copied with the run)
    }


def _gsm8k(folder: Path) -> dict[str, float] | None:
    """GSM8K accuracy, the shares of answers that ended before the token budget and that held a final answer, and
    that budget, as ``coevolve eval`` summarised them."""
    summary = _read(folder / "summary.json")
    if not summary or "gsm8k" not in summary:
        return None
    gsm8k = summary["gsm8k"]
    return {"accuracy": gsm8k["accuracy"], "finished": round(1 - gsm8k["truncated"], 4), "answered": gsm8k["answered"],
            "max_new_tokens": gsm8k["sampling"]["max_new_tokens"]}


def _eval_cell(result: dict[str, float] | None) -> str:
    if not result:
        return "-"
    return f"{result['accuracy']:.2f} ({result['finished']:.0%} finished, {result['answered']:.0%} answered)"


def _run_row(name: str, run: dict[str, Any], extra: str) -> str:
    """One table row of a short or loop-test run: help, per-step series, solver updates, ``extra``, phase seconds."""
    series = [" ".join(_fmt(v) for v in run[k]) for k in ("generator_valid_rate", "generator_reward", "solver_reward")]
    phases = ", ".join(f"{k} {v:.0f}" for k, v in run["phase_seconds"].items())
    return (f"| {name} | {'; '.join(run['format_help'])} | {run['steps']} | {series[0]} | {series[1]} | {series[2]} "
            f"| {run['solver_updates']} | {extra} | {phases} |")


def write_report(runs: Path, out: Path) -> str:
    """Write results.json and results.md; return the markdown."""
    valid = {r: {o: _read(runs / "valid" / f"{r}-{o}.json") for o in OPTIONS} for r in RECIPES}
    sft = {p.parent.name: _read(p) for p in sorted((runs / "sft").glob("*/summary.json"))}
    base = _gsm8k(runs / "eval" / "base")
    # short runs with the best help, then any with another help (folders ``<recipe>-<help>``)
    others = sorted(p.name for p in (runs / "short").glob("*-*") if p.is_dir()) if (runs / "short").exists() else []
    short = {r: short_run(runs / "short" / r) for r in RECIPES + others}
    loop = {r: short_run(runs / "loop" / r) for r in RECIPES}
    after = {r: _gsm8k(runs / "short" / r / "eval_after") for r in short}
    results = {"valid": valid, "sft": sft, "eval_base_gsm8k100": base, "short": short, "eval_after_gsm8k100": after,
               "loop_tests": loop}
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")

    lines = ["## Generator outputs the recipe's parser accepts (of 64 samples)", "",
             "| recipe | " + " | ".join(OPTIONS) + " | tokens | temperature |", "|---" * (len(OPTIONS) + 3) + "|"]
    for r in RECIPES:
        cells = [f"{c['valid']}/{c['samples']}" if c else "-" for c in valid[r].values()]
        some = next((c for c in valid[r].values() if c), None)
        lines.append(f"| {r} | " + " | ".join(cells) + f" | {some['max_new_tokens'] if some else '-'} | "
                     f"{some['temperature'] if some else '-'} |")
    lines += ["", "## Format warm-ups (`coevolve sft`)", "", "| format | examples | steps | loss first -> last | s |",
              "|---|---|---|---|---|"]
    for name, s in sft.items():
        if s:
            lines.append(f"| {name} | {s['examples']} | {s['steps']} | {s['first_loss']:.3f} -> {s['final_loss']:.3f} "
                         f"| {s['wall_s']:.0f} |")
    lines += ["", "## Short runs with the best help", "",
              f"GSM8K, 100-question subset, greedy, {base['max_new_tokens'] if base else '-'} new tokens; untrained "
              f"smollm2-135m: {_eval_cell(base)}", "",
              "| recipe | help | steps | generator valid rate per step | generator reward per step | solver reward "
              "per step | steps with a solver update | GSM8K-100 after | s per phase (total) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in short:
        s = short[r]
        if not s:
            lines.append(f"| {r} | not run | | | | | | | |")
            continue
        lines.append(_run_row(r, s, _eval_cell(after[r])))
    lines += ["", "## Two-step runs of tests/test_real_lm_loop.py (copied to runs/loop/)", "",
              "| recipe | help | steps | generator valid rate per step | generator reward per step | solver reward "
              "per step | steps with a solver update (non-zero advantage) | warm-up in the test "
              "| s per phase (total) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in RECIPES:
        s = loop[r]
        if s:
            w = s["warmup"]
            lines.append(_run_row(r, s, f"{w['steps']} steps on {w['examples']} problems, {w['wall_s']:.0f} s"
                                  if w else "-"))
    markdown = "\n".join(lines) + "\n"
    (out / "results.md").write_text(markdown)
    return markdown
