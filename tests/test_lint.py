"""ruff (pyflakes, import order, bugbear, line length, pyupgrade; settings in pyproject.toml) over the code, and mypy
over the files ``[tool.mypy]`` names (the recipes, their rewards, evaluation, execution, the core below them, the
loop, the store, the CLI and export), so the README's test command also lints and type-checks."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "coevolve", "bench", "experiments",
                             "tests"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing(tmp_path) -> None:
    result = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy")], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
