"""Benchmark loaders against the real files in shared/data, subsets, errors and gold-answer grading.

Nothing is skipped: without the data directory these tests fail with BenchmarkDataNotFound,
whose message says how to point at the files.
"""

from collections import Counter

import pytest

from coevolve.data import benchmarks
from coevolve.data.benchmarks import (
    BENCHMARKS,
    DATA_DIR_ENV,
    BenchmarkDataNotFound,
    get_benchmark,
    load_benchmark,
    split_options,
)
from coevolve.grading.extract import extract_hash_answer
from coevolve.tasks import arith
from coevolve.tasks import math as math_task
from coevolve.tasks import mcq as mcq_task
from coevolve.tasks.arith import HELD_OUT_SIZE as ARITH_HELD_OUT_SIZE

FILE_SETS = {"gsm8k": 1319, "math500": 500, "math": 5000, "college_math": 2818, "supergpqa": 300}


@pytest.mark.parametrize(("name", "rows"), FILE_SETS.items())
def test_file_sets_load_with_readme_row_counts(name: str, rows: int) -> None:
    items = load_benchmark(name)
    assert len(items) == rows == BENCHMARKS[name].expected_rows
    assert len({it.id for it in items}) == rows
    assert all(it.set_name == name and it.kind == BENCHMARKS[name].kind for it in items)
    assert all(it.question.strip() and it.answer.strip() for it in items)


def test_fields_per_set() -> None:
    gsm = load_benchmark("gsm8k")
    assert gsm[0].answer == "18" and all(it.answer.lstrip("-").replace(".", "").isdigit() for it in gsm)
    assert any("," in it.meta["solution"].rsplit("####", 1)[1] for it in gsm)  # "2,125" becomes "2125"
    m500 = load_benchmark("math500")
    assert m500[0].id == "test/precalculus/807.json" and m500[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert Counter(it.meta["level"] for it in m500).keys() == {1, 2, 3, 4, 5}
    full = load_benchmark("math")
    assert full[0].id == "math/0" and full[0].answer == "2" and full[0].meta == {
        "solution": full[0].meta["solution"], "subject": "Algebra", "level": 3}
    assert len(Counter(it.meta["subject"] for it in full)) == 7
    assert {it.question for it in m500} <= {it.question for it in full}  # MATH-500 is a subset of MATH
    college = load_benchmark("college_math")
    assert Counter(it.meta["subject"] for it in college)["algebra"] == 1000
    assert college[0].answer == "10-4 n"  # "$10-4 n$": one inline-math span loses its delimiters
    sgpqa = load_benchmark("supergpqa")
    assert Counter(len(it.choices) for it in sgpqa)[10] == 261
    assert all(4 <= len(it.choices) <= 10 and ord(it.answer) - ord("A") < len(it.choices) for it in sgpqa)
    assert "Options are" not in sgpqa[0].question and sgpqa[0].answer == "B"


def test_split_options_handles_multiline_choices() -> None:
    stem, choices = split_options("What?\n Options are:\nA. one\nline two\nB. $x$\nC. B. not a new option")
    assert stem == "What?" and choices == ["one\nline two", "$x$", "B. not a new option"]


def test_arith_sets() -> None:
    for level in range(1, 7):
        items = load_benchmark(f"arith_l{level}")
        assert len(items) == ARITH_HELD_OUT_SIZE and {it.meta["level"] for it in items} == {level}
        assert all(it.kind == "arith" and it.answer == str(arith.evaluate(it.question))
                   and arith.level_of(it.question) == level for it in items)
    everything = load_benchmark("arith")
    assert len(everything) == 6 * ARITH_HELD_OUT_SIZE and len({it.id for it in everything}) == len(everything)
    assert load_benchmark("arith_l3") == load_benchmark("arith_l3")


def test_seeded_subsets_are_deterministic_and_seed_dependent() -> None:
    a = load_benchmark("math500", limit=20, seed=1)
    assert [it.id for it in a] == [it.id for it in load_benchmark("math500", limit=20, seed=1)]
    assert [it.id for it in a] != [it.id for it in load_benchmark("math500", limit=20, seed=2)]
    full_ids = [it.id for it in load_benchmark("math500")]
    assert [full_ids.index(it.id) for it in a] == sorted(full_ids.index(it.id) for it in a)  # file order kept
    assert len(load_benchmark("gsm8k", limit=5000)) == 1319
    assert len(load_benchmark("arith_l2", limit=7, seed=3)) == 7


def test_missing_files_give_one_clear_error(tmp_path, monkeypatch) -> None:
    with pytest.raises(BenchmarkDataNotFound) as err:
        load_benchmark("gsm8k", data_dir=tmp_path)
    message = str(err.value)
    assert "'gsm8k'" in message and str(tmp_path / "gsm8k" / "test.jsonl") in message and "--data-dir" in message
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(BenchmarkDataNotFound, match="supergpqa.*nowhere"):
        load_benchmark("supergpqa")
    with pytest.raises(KeyError, match="known sets"):
        get_benchmark("mmlu")
    # nothing given and nothing found by default: the hub fallback is tried (or skipped) and the error is the same kind
    monkeypatch.delenv(DATA_DIR_ENV)
    monkeypatch.setattr(benchmarks, "default_data_dirs", lambda: [tmp_path / "a", tmp_path / "b"])
    expected = r"a/math500/test\.jsonl, .*b/math500/test\.jsonl.*HuggingFaceH4/MATH-500"
    with pytest.raises(BenchmarkDataNotFound, match=expected):
        load_benchmark("math500")


def test_data_dir_may_be_the_file_itself(tmp_path, monkeypatch) -> None:
    path = tmp_path / "mini.jsonl"
    path.write_text('{"question": "1+1?", "answer": "so 2\\n#### 2"}\n')
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "ignored"))
    [item] = load_benchmark("gsm8k", data_dir=path)
    assert (item.id, item.answer, item.kind) == ("gsm8k/0", "2", "math")


def test_gold_solutions_grade_as_correct() -> None:
    """The graders accept the sets' own gold solutions (MATH) and final answers (GSM8K)."""
    m500 = load_benchmark("math500", limit=200, seed=0)
    full = load_benchmark("math", limit=200, seed=0)
    gsm = load_benchmark("gsm8k", limit=200, seed=0)
    items = m500 + full + gsm
    preds = [math_task.parse_answer(it.meta["solution"]) for it in m500 + full]
    preds += [extract_hash_answer(it.meta["solution"]) for it in gsm]
    correct = math_task.grade(preds, [it.answer for it in items])
    for name, lo, hi in (("math500", 0, 200), ("math", 200, 400), ("gsm8k", 400, 600)):
        assert sum(correct[lo:hi]) >= 198, name
    college = load_benchmark("college_math", limit=200, seed=0)
    boxed = [math_task.parse_answer(f"so the answer is \\boxed{{{it.answer}}}.") for it in college]
    assert sum(math_task.grade(boxed, [it.answer for it in college])) >= 198
    sgpqa = load_benchmark("supergpqa")
    letters = [mcq_task.parse_answer(f"The answer is \\boxed{{{it.answer}}}.", len(it.choices)) for it in sgpqa]
    assert all(mcq_task.grade(letters, [it.answer for it in sgpqa]))
