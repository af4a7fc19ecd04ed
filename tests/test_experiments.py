"""The experiment scripts' measurements and results tables, on hand-written run folders (no training)."""

import json
from pathlib import Path

import pytest

from experiments.harness import LEVEL_KEYS, Arm, ArmResult, launch, trained_label_errors, write_results


def _write_samples(run: Path, step: int, rows: list[dict]) -> None:
    (run / "samples").mkdir(parents=True, exist_ok=True)
    (run / "samples" / f"step_{step:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _solver(step: int, qid: str, trained: bool, label_correct: bool | None) -> dict:
    oracle = None if label_correct is None else {"label_correct": label_correct}
    return {"step": step, "role": "solver", "question_id": qid, "trained": trained, "oracle": oracle}


def test_trained_label_errors_counts_only_trained_rows_with_a_checkable_key(tmp_path):
    _write_samples(tmp_path, 1, [
        _solver(1, "q0", True, False), _solver(1, "q0", True, False),   # one wrong question, two rows
        _solver(1, "q1", True, True),                                   # one right question
        _solver(1, "q2", False, False),                                 # not trained on: ignored
        _solver(1, "q3", True, None),                                   # no oracle verdict: ignored
        {"step": 1, "role": "generator", "question_id": "q0", "oracle": {"label_correct": False}},
    ])
    _write_samples(tmp_path, 2, [_solver(2, "q0", True, True)])  # same id, other step: another question
    measured = trained_label_errors(tmp_path)
    assert measured["trained_rows_wrong_key"] == pytest.approx(2 / 4)
    assert measured["trained_questions_wrong_key"] == pytest.approx(1 / 3)
    assert measured["trained_questions"] == 3


def test_trained_label_errors_is_empty_without_trained_rows(tmp_path):
    _write_samples(tmp_path, 1, [_solver(1, "q0", False, True)])
    assert trained_label_errors(tmp_path) == {}


def test_launch_resumes_an_interrupted_run_and_skips_a_finished_one(tmp_path):
    arm = Arm("x", "grpo", ("train.lr=1e-4",), preset="small")
    fresh, out = launch(arm, 3, tmp_path)
    assert fresh[3:6] == ["run", "grpo", "--preset"] and "seed=3" in fresh and "train.lr=1e-4" in fresh
    out.mkdir(parents=True)
    (out / "config.yaml").write_text("recipe: grpo\n")
    assert launch(arm, 3, tmp_path)[0][3:5] == ["run", "--resume"]
    (out / "summary.json").write_text("{}")
    assert launch(arm, 3, tmp_path)[0] == []


def test_write_results_tables_and_extra_report(tmp_path):
    result = ArmResult(Arm("a", "grpo"))
    result.final = {k: [0.5, 0.7] for k in LEVEL_KEYS}
    result.start = {k: 0.1 for k in LEVEL_KEYS}
    result.wall_s = [10.0, 20.0]
    result.extra = {"iteration 1/gini": [0.2, 0.4]}
    seen = {}

    def report(results, here, seeds):
        seen.update(here=here, seeds=list(seeds), arms=[r.arm.name for r in results])
        return ["EXTRA TABLE"]

    markdown = write_results([result], [0, 1], tmp_path, "T", report)
    assert seen == {"here": tmp_path, "seeds": [0, 1], "arms": ["a"]}
    assert "| a | 0.600 ± 0.141 |" in markdown and "EXTRA TABLE" in markdown
    assert "iteration 1/gini" not in markdown  # the extra report replaces the generic table
    assert json.loads((tmp_path / "results.json").read_text())["arms"][0]["extra"] == result.extra
    assert (tmp_path / "accuracy.png").stat().st_size > 0


def test_dynamic_rl_collapse_trajectory_per_window(tmp_path):
    from experiments.dynamic_rl.run import WINDOW, collapse_trajectory

    def generator(step: int, question: str, label: str | None) -> dict:
        return {"step": step, "role": "generator", "question": question, "label": label, "valid": True,
                "oracle": {"level": 1}}

    _write_samples(tmp_path, 1, [generator(1, "1+1", "2"), generator(1, "2+2", "4"), generator(1, "3+3", "6"),
                                 generator(1, "4+4", None)])
    # the second window: a collapsed batch, three of four the same question, every label the same
    _write_samples(tmp_path, WINDOW + 1, [generator(WINDOW + 1, "1+1", "2")] * 3 + [generator(WINDOW + 1, "0+2", "2")])
    measured = collapse_trajectory(tmp_path)
    assert measured[f"distinct_questions@{WINDOW}"] == pytest.approx(1.0)
    assert measured[f"top_question@{WINDOW}"] == pytest.approx(0.25)
    assert measured[f"top_answer@{WINDOW}"] == pytest.approx(0.25)
    assert measured[f"distinct_questions@{2 * WINDOW}"] == pytest.approx(0.5)
    assert measured[f"top_question@{2 * WINDOW}"] == pytest.approx(0.75)
    assert measured[f"top_answer@{2 * WINDOW}"] == pytest.approx(1.0)
    assert measured[f"question_chars@{2 * WINDOW}"] == pytest.approx(3.0)
    assert measured[f"question_level@{WINDOW}"] == pytest.approx(1.0)
    assert f"solver_tokens@{WINDOW}" not in measured  # no solver rows: no value rather than a zero


def test_real_lm_short_run_counts_only_solver_steps_with_a_nonzero_advantage(tmp_path):
    from experiments.real_lm.report import _eval_cell, _gsm8k, short_run

    rows = [{"step": 1, "time_s": 10.0, "time/step_s": 10.0, "time/generate_s": 6.0, "questions/valid_rate": 1.0,
             "generator/reward_mean": 0.5, "solver/optimizer_steps": 0},
            {"step": 2, "time_s": 25.0, "time/step_s": 15.0, "time/generate_s": 4.0, "pool/valid_rate": 0.5,
             "solver/reward_mean": 0.0, "solver/optimizer_steps": 1, "solver/advantage_abs_mean": 0.0},
            {"step": 3, "time_s": 40.0, "time/step_s": 15.0, "solver/reward_mean": 0.25, "solver/optimizer_steps": 1,
             "solver/advantage_abs_mean": 0.4}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    measured = short_run(tmp_path)
    assert measured["generator_valid_rate"] == [1.0, 0.5, None]
    assert measured["solver_optimizer_steps"] == 2 and measured["solver_updates"] == 1  # step 2's advantages are 0
    assert measured["first_solver_update_step"] == 3
    assert measured["phase_seconds"] == {"generate": 10.0, "step": 40.0}

    evaluated = tmp_path / "eval"
    evaluated.mkdir()
    (evaluated / "summary.json").write_text(json.dumps({"gsm8k": {  # as coevolve eval writes it
        "accuracy": 0.25, "answered": 0.5, "truncated": 0.25, "sampling": {"max_new_tokens": 256}}}))
    assert _gsm8k(evaluated) == {"accuracy": 0.25, "finished": 0.75, "answered": 0.5, "max_new_tokens": 256}
    assert _eval_cell(_gsm8k(evaluated)) == "0.25 (75% finished, 50% answered)"
    assert _gsm8k(tmp_path / "missing") is None


def test_ttrl_answer_entropy_is_the_mean_over_questions_of_the_votes_entropy(tmp_path):
    from coevolve.analytics.curriculum import load_run
    from experiments.ttrl.run import answer_entropy

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    votes = {"q0": ["7", "7", "7", "7"], "q1": ["3", "4", None, None]}  # 0 bits; counts 1, 1, 2: 1.5 bits
    _write_samples(tmp_path, 1, [{"step": 1, "role": "solver", "question_id": q, "answer": a}
                                 for q, answers in votes.items() for a in answers])
    _write_samples(tmp_path, 2, [{"step": 2, "role": "solver", "question_id": "q0", "answer": a} for a in "1234"])
    steps, values = answer_entropy(load_run(tmp_path))
    assert steps == [1, 2]
    assert values == pytest.approx([0.75, 2.0])


def test_spice_success_rates_read_the_generator_rows_and_bin_them(tmp_path):
    from experiments.spice.run import BINS, bin_of, solve_rates

    for step, rates in ((1, [0.0, 0.25, None]), (2, [0.5, 1.0]), (3, [0.75]), (4, [1.0])):
        _write_samples(tmp_path, step, [{"step": step, "role": "generator", "solve_rate": p} for p in rates]
                       + [{"step": step, "role": "solver", "solve_rate": 0.5}])  # solver rows are not tasks
    assert solve_rates(tmp_path) == [0.0, 0.25, 0.5, 1.0, 0.75, 1.0]
    assert solve_rates(tmp_path, 0.25) == [1.0]  # the last quarter of 4 step files
    assert [bin_of(p) for p in (0.0, 0.25, 0.5, 0.75, 1.0)] == list(BINS)
