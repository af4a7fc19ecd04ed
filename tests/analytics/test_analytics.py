"""Curriculum analytics on a fabricated run directory with planted values.

``make_fake_run`` (also used by test_report.py) writes a run in the run-store format: per step 8
generator rows (6 valid: solve rates 0, .25, .5, .75, 1, .5; row 5 repeats row 0's question; row
3 leaks its answer; row 4's own answer is wrong) and 3 solver rollouts per valid question whose
majority label is wrong exactly for the two questions with solve rate < 0.5.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import yaml

from coevolve.analytics.curriculum import analyze_run, answer_leaks, load_run
from coevolve.embeddings import embed

SOLVE_RATES = [0.0, 0.25, 0.5, 0.75, 1.0, 0.5]
PHASES = ["generate_questions", "solve", "reward", "update_solver", "update_generator"]
EVAL_SETS = ["arith_l1", "arith_l2", "arith_l3", "gsm8k"]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_fake_run(root: Path, *, steps: int = 10, iterations: int = 2, seed: int = 0,
                  recipe: str = "r_zero", complete: bool = True) -> Path:
    """Fabricate a run directory (steps 1..steps, split evenly into iterations) with planted values."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text(yaml.safe_dump(
        {"recipe": recipe, "model": "tiny-arith", "task": "arith", "seed": seed, "steps": steps}))
    (root / "samples").mkdir(exist_ok=True)
    per_iter = -(-steps // iterations)
    metrics: list[dict] = []
    t = 0.0
    metrics.append({"step": 0, "time_s": t, **{f"eval/{s}/accuracy": rng.uniform(0.1, 0.3) for s in EVAL_SETS}})
    for step in range(1, steps + 1):
        it = (step - 1) // per_iter
        rows: list[dict] = []
        questions = []
        for i in range(6):
            a, b = 10 * step + i + 10, rng.randint(10, 99)
            q, ans = f"What is {a} + {b}?", str(a + b)
            if i == 3:
                q, ans = f"What is {a} + 0? It is {a}.", str(a)
            if i == 5:
                q, ans = questions[0]
            questions.append((q, ans))
        for i in range(8):
            valid = i < 6
            q, ans = questions[i] if valid else (None, None)
            rows.append({
                "step": step, "iteration": it, "role": "generator", "phase": "generate_questions",
                "prompt": "Write a question.", "completion": f"<question>{q}</question> \\boxed{{{ans}}}" if valid
                else "I cannot <think>", "question": q, "question_id": f"s{step}-g{i}", "valid": valid,
                "answer": ans, "label": ans if valid else None, "label_source": "majority" if valid else None,
                "solve_rate": SOLVE_RATES[i] if valid else None, "reward": rng.uniform(-1, 1),
                "reward_terms": {"uncertainty": rng.random(), "repetition": -rng.random()},
                "advantage": rng.gauss(0, 1), "tokens": rng.randint(10, 40),
                "oracle": {"answer": ans, "level": 1 + i % 3, "label_correct": i >= 2, "correct": i != 4}
                if valid else None,
            })
        for i in range(6):
            q, true = questions[i]
            label = true if i >= 2 else str(int(true) + 1)
            for _ in range(3):
                answer = label if rng.random() < 0.7 else str(rng.randint(0, 200))
                rows.append({
                    "step": step, "iteration": it, "role": "solver", "phase": "solve", "prompt": q,
                    "completion": f"\\boxed{{{answer}}}", "question": q, "question_id": f"s{step}-g{i}",
                    "valid": True, "answer": answer, "label": label, "label_source": "majority",
                    "solve_rate": None, "reward": float(answer == label),
                    "reward_terms": {"accuracy": float(answer == label)},
                    "advantage": rng.gauss(0, 1), "tokens": rng.randint(5, 20),
                    "oracle": {"answer": true, "level": 1 + i % 3, "label_correct": i >= 2, "correct": answer == true},
                })
        _write_jsonl(root / "samples" / f"step_{step:06d}.jsonl", rows)
        phase_s = {f"time/{p}_s": 1.0 + j * 0.5 for j, p in enumerate(PHASES)}
        t += sum(phase_s.values())
        metrics.append({
            "step": step, "time_s": t, "solver/reward_mean": rng.uniform(0.3, 0.8), "solver/loss": rng.gauss(0, 0.1),
            "generator/reward_mean": rng.uniform(-0.5, 0.5), "generator/loss": rng.gauss(0, 0.1),
            "reward/uncertainty": rng.random(), "reward/repetition": -rng.random() / 4, "reward/format": rng.random(),
            "tokens/solver": 1000 + step, "tokens/generator": 500, **phase_s, "skipped": step == 7,
        })
        if step % 5 == 0:
            metrics.append({"step": step, "time_s": t, **{f"eval/{s}/accuracy": min(1.0, 0.2 + 0.05 * step
                                                                                    + rng.uniform(0, 0.05))
                                                          for s in EVAL_SETS}})
    _write_jsonl(root / "metrics.jsonl", metrics)
    if complete:
        (root / "summary.json").write_text(json.dumps(
            {"recipe": recipe, "model": "tiny-arith", "steps": steps, "wall_s": t + 3.0}))
    return root


@pytest.fixture(scope="session")
def encoder() -> object:
    """The packaged sentence encoder, loaded once per test session."""
    from coevolve.embeddings import load_encoder

    return load_encoder()


@pytest.fixture()
def fake_run(tmp_path: Path) -> Path:
    return make_fake_run(tmp_path / "run")


def test_answer_leaks_tokens() -> None:
    assert answer_leaks("What is 20 + 3? It is 23.", "23")
    assert not answer_leaks("What is 123 + 4?", "23")
    assert not answer_leaks("Compute 2.23 times 1", "23")
    assert answer_leaks("Is the answer Seven?", "seven")
    assert answer_leaks("half is 1/2 of it", "1/2")
    assert not answer_leaks("anything", "  ")


def test_load_run_merges_metrics(fake_run: Path) -> None:
    run = load_run(fake_run)
    assert run.complete and run.info("wall_s") > 0
    assert run.eval_sets() == sorted(EVAL_SETS)
    assert run.training_steps() == list(range(1, 11))
    steps, acc = run.series("eval/arith_l1/accuracy")
    assert steps == [0, 5, 10] and len(acc) == 3
    assert "solver/reward_mean" in run.metrics[5] and "eval/gsm8k/accuracy" in run.metrics[5]


def test_runs_logged_before_the_metric_names_were_pinned_read_with_todays_names(tmp_path: Path) -> None:
    from coevolve.store import RunStore

    old = [{"step": 1, "time_s": 1.0, "proposer/reward_mean": 0.5, "proposer/advantage_abs_mean": 0.25,
            "tokens/proposer": 40, "opensir/valid_rate": 0.75, "proposer/loss": 0.1},
           {"step": 2, "time_s": 2.0, "questioner/advantage_abs_mean": 0.5, "generator/reward_mean": -1.0,
            "questioner/reward_mean": 9.0}]
    (tmp_path / "config.yaml").write_text("recipe: pasodoble\n")
    _write_jsonl(tmp_path / "metrics.jsonl", old)
    expected = [{"step": 1, "time_s": 1.0, "generator/reward_mean": 0.5, "generator/advantage_abs_mean": 0.25,
                 "tokens/generator": 40, "questions/valid_rate": 0.75, "proposer/loss": 0.1},  # a trainer's: kept
                {"step": 2, "time_s": 2.0, "generator/advantage_abs_mean": 0.5, "generator/reward_mean": -1.0}]
    assert RunStore(tmp_path).metrics() == expected  # where both names are there, the new one wins
    assert [load_run(tmp_path).metrics[step] for step in (1, 2)] == expected


def test_analyze_run_planted_values(fake_run: Path) -> None:
    res = analyze_run(fake_run, embed=False)
    overall = res["overall"]
    labels = overall["labels"]
    assert labels["n"] == 60 and labels["error_rate"] == pytest.approx(1 / 3)
    assert [b["band"] for b in labels["by_band"]] == ["[0,0.25)", "[0.25,0.5)", "[0.5,0.75)", "[0.75,1]"]
    assert [b["n"] for b in labels["by_band"]] == [10, 10, 20, 20]
    assert [b["error_rate"] for b in labels["by_band"]] == [1.0, 1.0, 0.0, 0.0]
    assert labels["by_source"] == {"majority": {"n": 60, "error_rate": pytest.approx(1 / 3)}}

    validity = overall["validity"]
    assert validity["valid_rate"] == 0.75 and validity["n_generated"] == 80
    assert validity["answer_leak_rate"] == pytest.approx(1 / 6)
    assert validity["generator_answer_accuracy"] == pytest.approx(5 / 6)

    diff = overall["difficulty"]
    assert diff["solve_rate_hist"] == [10, 0, 10, 0, 0, 20, 0, 10, 0, 10]
    assert diff["level_counts"] == {"1": 20, "2": 20, "3": 20}
    assert diff["mean_solve_rate"] == pytest.approx(np.mean(SOLVE_RATES))

    div = overall["diversity"]
    assert div["unit"] == "char" and div["n"] == 60
    assert div["duplicate_rate"] == pytest.approx(10 / 60)
    assert 0 < div["distinct_2"] < div["distinct_3"] <= 1
    assert div["mean_pairwise_distance"] is None and div["clusters"] is None

    cost = overall["cost"]
    assert cost["tokens"] == {"generator": 5000, "solver": 10055}
    assert cost["seconds"]["generate_questions"] == 10.0 and cost["seconds"]["update_generator"] == 30.0
    assert cost["n_skipped"] == 1

    assert [s["step"] for s in res["steps"]] == list(range(1, 11))
    step3 = res["steps"][2]
    assert step3["iteration"] == 0 and step3["labels"]["error_rate"] == pytest.approx(1 / 3)
    assert step3["diversity"]["duplicate_rate"] == pytest.approx(1 / 6)
    assert step3["cost"]["tokens"]["solver"] == 1003
    assert [(i["iteration"], i["first_step"], i["last_step"]) for i in res["iterations"]] == [(0, 1, 5), (1, 6, 10)]
    assert res["iterations"][1]["cost"]["tokens"]["solver"] == sum(1000 + s for s in range(6, 11))

    saved = json.loads((fake_run / "analytics" / "curriculum.json").read_text())
    assert saved == json.loads(json.dumps(res))


def test_analyze_partial_run(tmp_path: Path) -> None:
    run_dir = make_fake_run(tmp_path / "live", complete=False)
    for step in (9, 10):
        (run_dir / "samples" / f"step_{step:06d}.jsonl").unlink()
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 11, "time_s": 99.0, "solver/lo')  # torn last line of a live writer
    res = analyze_run(run_dir, embed=False, write=False)
    assert not res["complete"] and res["last_step"] == 10
    assert res["overall"]["labels"]["n"] == 48
    assert res["steps"][-1]["difficulty"]["n"] == 0  # metrics but no samples yet
    assert not (run_dir / "analytics" / "curriculum.json").exists()


def test_analyze_run_with_embeddings(fake_run: Path, encoder: object) -> None:
    res = analyze_run(fake_run, embed=True, k=4)
    space = res["settings"]["cluster_space"]
    assert space["k"] == 4 and space["info"]["reference"] == "run" and space["n_corpus"] == 50
    clusters = res["overall"]["diversity"]["clusters"]
    counts = clusters["counts"]  # the run's 60 valid questions over K = 4 clusters; the statistics by definition:
    assert clusters["n"] == 60 and sum(counts) == 60 and len(counts) == 4
    assert clusters["active"] == sum(c > 0 for c in counts)
    assert clusters["normalized_entropy"] == pytest.approx(-sum(c / 60 * math.log2(c / 60) for c in counts if c) / 2)
    assert clusters["gini"] == pytest.approx(sum(abs(a - b) for a in counts for b in counts) / (2 * 4 * 4 * 15))
    assert clusters["lorenz_y"] == pytest.approx([0.0, *(np.cumsum(sorted(counts)) / 60)])
    questions = [r["question"] for f in sorted((fake_run / "samples").glob("*.jsonl"))
                 for r in map(json.loads, f.read_text().splitlines())
                 if r["role"] == "generator" and r["valid"] and isinstance(r["question"], str)]
    unit = embed(questions)  # 1 - cosine, averaged over the 1770 pairs
    assert len(questions) == 60 and res["overall"]["diversity"]["mean_pairwise_distance"] == pytest.approx(
        1 - (unit @ unit.T)[np.triu_indices(60, 1)].mean(), abs=1e-5)
    assert res["steps"][0]["diversity"]["clusters"]["n"] == 6
    cache = fake_run / "analytics"
    assert (cache / "cluster_space" / "centroids.npy").is_file() and (cache / "embeddings.npz").is_file()
    stamp = (cache / "cluster_space" / "centroids.npy").stat().st_mtime_ns
    again = analyze_run(fake_run, embed=True, k=4)
    assert (cache / "cluster_space" / "centroids.npy").stat().st_mtime_ns == stamp  # cached, not rebuilt
    assert again["overall"]["diversity"] == res["overall"]["diversity"]
