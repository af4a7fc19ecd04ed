"""The HTML run report (self-contained, escaped, renders in headless Chromium) and run comparison."""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from test_analytics import encoder, make_fake_run  # noqa: F401  (session fixture)

from coevolve.analytics.compare import compare_runs, rich_table
from coevolve.analytics.curriculum import generated_questions, load_run
from coevolve.analytics.report import SECTIONS, write_report
from coevolve.embeddings import embed

DATA_URI = re.compile(r'<img[^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
CHROMIUM_INSTALL = "apt-get update && apt-get install -y chromium"


def _images(page: str) -> list[Image.Image]:
    images = []
    for b64 in DATA_URI.findall(page):
        raw = base64.b64decode(b64, validate=True)
        assert raw.startswith(b"\x89PNG\r\n\x1a\n")
        img = Image.open(io.BytesIO(raw))
        img.load()
        images.append(img)
    return images


def _plant_hostile_question(run_dir: Path) -> str:
    """Replace step 1's first generated question with text that must be escaped."""
    path = run_dir / "samples" / "step_000001.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    hostile = '<script>alert("x")</script> & <img src=x onerror=1> What is 2+2?'
    rows[0]["question"] = hostile
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return hostile


def test_report_is_self_contained_and_escaped(tmp_path: Path) -> None:
    run_dir = make_fake_run(tmp_path / "run")
    hostile = _plant_hostile_question(run_dir)
    html_path = write_report(run_dir, embed=False, samples_per_group=100)
    assert html_path == run_dir / "report" / "report.html"
    page = html_path.read_text()
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r'(?:src|href)="(?!data:)', page)  # nothing loaded from outside the file
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &lt;img src=x onerror=1&gt;" in page
    assert hostile not in page
    images = _images(page)
    pngs = sorted(p.name for p in (run_dir / "report").glob("*.png"))
    # embed=False: no cluster statistics, so the per-iteration coverage section has no plot; no majority vote (TTRL),
    # no task types (AZR)
    assert len(images) == len(pngs) == len(SECTIONS) - 3 and not {"coverage.png", "vote.png", "task_types.png"} & \
        set(pngs)
    assert all(img.size[0] >= 600 and img.size[1] >= 200 for img in images)
    assert page.count('class="nodata"') == 3
    for step in ("iteration 0", "iteration 1"):
        assert f"<h3>{step}</h3>" in page


def test_report_without_data(tmp_path: Path) -> None:
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"recipe": "grpo", "model": "tiny-arith", "task": "gsm8k"}))
    (run_dir / "metrics.jsonl").write_text('{"step": 0, "time_s": 1.0, "eval/gsm8k/accuracy": 0.25}\n')
    page = write_report(run_dir, embed=False).read_text()
    assert len(_images(page)) == 1  # only the accuracy plot
    assert page.count('class="nodata"') == len(SECTIONS) - 1 + 1  # other sections and the sample table


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        message = f"chromium is not installed (install it with: {CHROMIUM_INSTALL})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    run_dir = make_fake_run(tmp_path / "run")
    html_path = write_report(run_dir, embed=False)
    shot = tmp_path / "shot.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars"]
    url = html_path.resolve().as_uri()
    subprocess.run([browser, *flags, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                    "--window-size=1200,3000", url], capture_output=True, timeout=120, check=False)
    assert shot.is_file(), "chromium wrote no screenshot"
    colours = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 500, f"screenshot looks blank ({len(colours or [])} colours)"
    dom = subprocess.run([browser, *flags, f"--user-data-dir={tmp_path / 'profile2'}", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120, check=False).stdout
    assert len(DATA_URI.findall(dom)) == len(SECTIONS) - 3  # all but coverage (needs embeddings), TTRL's vote and AZR's
    # task types


def _normalized_entropy(run_dir: Path, centroids: np.ndarray, step: int | None = None) -> float:
    """H / log2 K of a run's valid generated questions (of one step, or all) over the nearest of ``centroids``."""
    files = [run_dir / "samples" / f"step_{step:06d}.jsonl"] if step else sorted((run_dir / "samples").iterdir())
    questions = [r["question"] for f in files for r in map(json.loads, f.read_text().splitlines())
                 if r["role"] == "generator" and r["valid"] and isinstance(r["question"], str)]
    counts = np.bincount(np.argmax(embed(questions) @ centroids.T, axis=1), minlength=len(centroids))
    shares = counts[counts > 0] / counts.sum()
    return float(-(shares * np.log2(shares)).sum() / np.log2(len(centroids)))


def test_compare_runs(tmp_path: Path, encoder: object) -> None:  # noqa: F811
    a = make_fake_run(tmp_path / "a" / "run", seed=1, recipe="r_zero")
    b = make_fake_run(tmp_path / "b" / "run", seed=2, recipe="prism", steps=6, complete=False)
    rows, html_path = compare_runs([a, b], tmp_path / "cmp", embed=True, k=8)
    assert [r["run"] for r in rows] == ["a/run", "b/run"]
    ra, rb = rows
    assert (ra["recipe"], rb["recipe"], ra["steps"], rb["steps"]) == ("r_zero", "prism", 10, 6)
    assert ra["finished"] is True and rb["finished"] is False
    assert ra["tokens/solver"] == 10055 and ra["tokens"] == 15055
    assert ra["label_error_rate"] == pytest.approx(1 / 3) and ra["mean_duplicate_rate"] == pytest.approx(1 / 6)
    metrics = [json.loads(line) for line in (a / "metrics.jsonl").read_text().splitlines()]
    l1 = [m["eval/arith_l1/accuracy"] for m in metrics if "eval/arith_l1/accuracy" in m]
    assert ra["final/arith_l1"] == pytest.approx(l1[-1]) and ra["best/arith_l1"] == pytest.approx(max(l1))
    centroids = np.load(tmp_path / "cmp" / "cluster_space" / "centroids.npy")
    assert ra["normalized_entropy"] == pytest.approx(_normalized_entropy(a, centroids), abs=1e-6)
    assert rb["mean_normalized_entropy"] == pytest.approx(
        np.mean([_normalized_entropy(b, centroids, step) for step in range(1, 7)]), abs=1e-6)
    space = json.loads((tmp_path / "cmp" / "cluster_space" / "cluster_space.json").read_text())
    pooled = set(generated_questions(load_run(a))) | set(generated_questions(load_run(b)))
    assert space["k"] == 8 and space["n_corpus"] == len(pooled) == 74  # 50 + 30 minus 6 shared questions

    out = tmp_path / "cmp"
    with open(out / "compare.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [t["run"] for t in table] == ["a/run", "b/run"] and "final/gsm8k" in table[0]
    assert json.loads((out / "compare.json").read_text()) == json.loads(json.dumps(rows))
    page = html_path.read_text()
    assert len(_images(page)) == 4 and (out / "accuracy_gsm8k.png").is_file()
    assert len(rich_table(rows).columns) == 3 and rich_table(rows).row_count == len(rows[0]) - 1
    assert not (a / "analytics" / "curriculum.json").exists()  # comparison leaves run analytics alone


def test_task_types_in_the_report_and_the_comparison(tmp_path: Path) -> None:
    """A run that logs tasks/<type>/... (azr) gets the task-type figure and table, and compare gets its columns."""
    runs = []
    for name, valid in (("a", 0.5), ("b", 0.9)):
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / "config.yaml").write_text(yaml.safe_dump({"recipe": "azr", "model": "tiny-program",
                                                             "task": "program", "steps": 2}))
        rows = [{"step": step, "time_s": float(step), **{f"tasks/{kind}/{key}": value for kind in
                 ("deduction", "abduction", "induction") for key, value in (
                     ("valid_rate", valid), ("invalid_syntax", 1 - valid), ("invalid_timeout", 0.0),
                     ("learnability", 0.25), ("solve_rate", 0.1 * step), ("buffer_size", 10 * step),
                     ("buffer_distinct_ops", 3), ("executor_s", 0.5), ("executor_timeouts", 1))}}
                for step in (1, 2)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append(run_dir)
    page = write_report(runs[0], embed=False).read_text()
    assert (runs[0] / "report" / "task_types.png").is_file() and 'id="task_types"' in page
    assert "<td class=\"text\">abduction</td>" in page
    rows, _ = compare_runs(runs, tmp_path / "cmp")
    assert [r["tasks/deduction/valid_rate"] for r in rows] == [0.5, 0.9]
    assert rows[1]["tasks/induction/solve_rate_final"] == pytest.approx(0.2)
    assert rows[0]["tasks/abduction/buffer_size_final"] == 20
    assert rows[0]["tasks/abduction/executor_timeouts_total"] == 2
    assert rows[0]["tasks/deduction/invalid_syntax"] == 0.5
