"""Every script in bench/ runs: its smoke mode (``--quick``/``--smoke``) on the CPU, writing to a temporary folder,
never to bench/results/ or the home. The figures of a smoke run mean nothing; what is checked is that the script runs
to the end and writes its JSON (a benchmark nobody runs rots: bench/trl_side_by_side.py failed at its first step for
weeks). Skipped only where an optional dependency (TRL, vLLM) is missing, with the reason."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.execution import sandbox_problem

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _results_snapshot() -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in RESULTS.iterdir()} if RESULTS.exists() else {}


def run_bench(script: str, *args: object, timeout: float = 600) -> subprocess.CompletedProcess:
    """``bench/<script>`` with ``args`` from the repository root, one torch thread; it must exit 0 and leave
    bench/results/ as it was."""
    before = _results_snapshot()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, f"bench/{script}", *map(str, args)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert _results_snapshot() == before, "a smoke run wrote to bench/results/"
    return done


def _needs(module: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[{extra}]')")


def test_executor_quick(tmp_path: Path) -> None:
    problem = sandbox_problem()
    if problem is not None:
        pytest.skip(problem)
    run_bench("executor.py", "--quick", "--programs", 16, "--per-program-bwraps", 2, "--out", tmp_path / "e.json")
    result = json.loads((tmp_path / "e.json").read_text())
    assert result["programs_per_second"] > 0 and result["bwrap_per_program_programs_per_second"] > 0


def test_speed_quick(tmp_path: Path, small_tiny_arith) -> None:
    run_bench("speed.py", "--quick", "--models", small_tiny_arith[1], "--threads", 1, "--out", tmp_path / "s.json")
    assert list(tmp_path.glob("s*.json"))


def test_trl_side_by_side_quick(tmp_path: Path, small_tiny_arith) -> None:
    _needs("trl", "dev")
    run_bench("trl_side_by_side.py", "--quick", "--model", small_tiny_arith[1], "--threads", 1, "--warmup", 0,
              "--out", tmp_path / "t.json")
    result = json.loads((tmp_path / "t.json").read_text())["by_threads"]["1"]
    assert result["same_prompts_every_step"] and result["ratio_trl_over_coevolve"] > 0


def test_gpu_smoke(tmp_path: Path) -> None:
    run_bench("gpu.py", "--smoke", "--scratch", tmp_path / "scratch", "--out", tmp_path / "g.json")
    result = json.loads((tmp_path / "g.json").read_text())
    rows = {key: row for key, row in result.items() if "/" in key}
    assert "smoke/sampling/continuous" in rows and "smoke/two_role_step" in rows
    assert not [key for key, row in rows.items() if "error" in row], rows


def test_influence_quick(tmp_path: Path, small_tiny_arith) -> None:
    run_bench("influence.py", "--quick", "--models", small_tiny_arith[1], "--out", tmp_path / "i.json")
    assert json.loads((tmp_path / "i.json").read_text())["results"][0]["time_ratio"] > 0


def test_mutation_smoke(tmp_path: Path) -> None:
    """Every mutation still applies to today's code (a stale one exits 1) and its test files exist."""
    run_bench("mutation.py", "--smoke", "--out", tmp_path / "m.json")
    result = json.loads((tmp_path / "m.json").read_text())
    assert result["stale"] == [] and result["missing_tests"] == [] and result["mutations"] > 40


def test_faults_smoke(tmp_path: Path) -> None:
    run_bench("faults.py", "--smoke", "--out", tmp_path / "f.json")
    results = json.loads((tmp_path / "f.json").read_text())["results"]
    assert results["texts"]["held"] and results["programs"]["held"]


@pytest.mark.heavy
def test_vllm_engine_quick(tmp_path: Path) -> None:
    """Heavy: it samples smollm2-135m and starts vLLM on the CPU, minutes rather than seconds."""
    _needs("vllm", "vllm")
    run_bench("vllm_engine.py", "--quick", "--out", tmp_path / "v.json")
    assert (tmp_path / "v.json").exists()


def test_episodes_quick(tmp_path: Path) -> None:
    problem = sandbox_problem()
    if problem is not None:
        pytest.skip(problem)
    run_bench("episodes.py", "--quick", "--out", tmp_path / "ep.json")
    result = json.loads((tmp_path / "ep.json").read_text())
    assert result["episodes_per_second"] > 0 and 0 <= result["tool_share"] < 1
    assert 0 < result["continuation_seconds"] and 0 < result["reprefill_seconds"]


def test_every_bench_script_has_a_smoke_test() -> None:
    """A new script in bench/ gets its smoke run here (speed.py is also the others' shared module)."""
    source = Path(__file__).read_text()
    scripts = sorted(p.name for p in (ROOT / "bench").glob("*.py"))
    assert [s for s in scripts if f'run_bench("{s}"' not in source] == []
