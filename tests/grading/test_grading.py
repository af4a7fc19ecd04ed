"""Tests for coevolve.grading: extraction, equivalence (with the math-verify worker) and majority vote."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from coevolve.grading import (
    MAX_VERIFY_CHARS,
    answers_equivalent,
    batch_equivalent,
    braces_balanced,
    equivalence,
    extract_answer,
    extract_boxed,
    extract_choice,
    extract_hash_answer,
    extract_prefixed,
    extract_tagged,
    fast_equivalent,
    majority_vote,
    normalize_answer,
    shutdown_worker,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
HOSTILE_TIMEOUT_S = 1.0
MARGIN_S = 1.0  # killing the worker and returning, on a loaded 2-core machine
_FRESH = itertools.count()


def _timed(fn, *args, clock=time.perf_counter, **kwargs):
    start = clock()
    result = fn(*args, **kwargs)
    return result, clock() - start


def _worker_still_works() -> bool:
    """A comparison only math-verify can decide, never asked before (so not answered from the cache)."""
    k = next(_FRESH)
    return answers_equivalent(f"w+{k}", f"{k}+w")


# ---------------------------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
        (r"\boxed{{a}+{b}}", "{a}+{b}"),
        (r"first \boxed{1}, then \boxed{2}, finally \boxed{ 3 }", "3"),
        (r"\boxed {5}", "5"),
        (r"\fbox{7}", "7"),
        (r"$\boxed{\{1, 2\}}$", r"\{1, 2\}"),
        (r"\boxed{\left\{ x \right.}", r"\left\{ x \right."),
        (r"\boxed{1} and then \boxed{\frac{1}{2}", None),  # the last box is never closed
        (r"\boxed{}", None),
        ("no box here", None),
        (r"\boxed 5", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_extract_hash_answer():
    assert extract_hash_answer("She pays 1,000 + 234.\n#### 1,234") == "1234"
    assert extract_hash_answer("#### 42.\n") == "42"
    assert extract_hash_answer("#### 1\nthen #### -7 ") == "-7"
    assert extract_hash_answer("42") is None
    assert extract_hash_answer("####   \n") is None


def test_extract_tagged():
    assert extract_tagged("<answer> 3 </answer> then <answer>4</answer>") == "4"
    assert extract_tagged("<answer>4") is None
    assert extract_tagged("<result>5</result>", tag="result") == "5"
    assert extract_tagged("<answer></answer>") is None


def test_extract_prefixed():
    assert extract_prefixed("S:4*5=20;3+20=23\nA:23") == "23"
    assert extract_prefixed("A:1\nS:x\n  A: 2 \nS:y") == "2"
    assert extract_prefixed("S:3+4=7;A:7") is None  # not at the start of a line
    assert extract_prefixed("A:") is None
    assert extract_prefixed("Q:1+1=?\nAns=2", prefix="Ans=") == "2"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"\boxed{C}", "C"),
        (r"\boxed{\text{C}}", "C"),
        (r"\boxed{(c)}", "C"),
        ("<answer>B</answer>", "B"),
        ("I pick (C) here", "C"),
        ("The answer is D.", "D"),
        ("Answer: C", "C"),
        ("**Answer:** (D)", "D"),
        ("the answer is option E", "E"),
        ("The answer is (B), not (C)", "B"),
        ("Let me think.\nA.", "A"),
        ("C", "C"),
        (r"\boxed{K}", None),  # out of range for 10 choices
        ("K", None),
        ("the answer is a number", None),
        (r"\boxed{a+b}", None),
        ("nothing", None),
    ],
)
def test_extract_choice(text, expected):
    assert extract_choice(text) == expected


def test_extract_choice_range():
    assert extract_choice("The answer is E", n_choices=4) is None
    assert extract_choice("The answer is D", n_choices=4) == "D"
    with pytest.raises(ValueError):
        extract_choice("A", n_choices=27)


def test_extract_answer_order_and_fallbacks():
    assert extract_answer(r"<answer>1</answer> \boxed{2} #### 3") == "2"
    assert extract_answer("<answer>1</answer>\n#### 3") == "1"
    assert extract_answer("#### 3\nA:4") == "3"
    assert extract_answer("S:1+2=3\nA:3") == "3"
    assert extract_answer("So the answer is $\\frac{1}{2}$. Done.") == r"\frac{1}{2}"
    assert extract_answer("The final answer: **42**.") == "42"
    assert extract_answer("I do not know") is None
    assert extract_answer("Thus the answer is (B).", kind="mcq") == "B"
    assert extract_answer(None) is None
    assert extract_answer(b"\\boxed{1}") is None
    with pytest.raises(ValueError):
        extract_answer("x", kind="essay")


def test_braces_balanced():
    assert braces_balanced(r"\frac{1}{2}")
    assert braces_balanced(r"\{1, 2\}")  # escaped braces do not count
    assert not braces_balanced("}{")
    assert not braces_balanced("1}+\\boxed{2")


# About 300 KB each: a quadratic algorithm would need ~1e11 steps on these, a linear one well under a second.
ADVERSARIAL_TEXTS = {
    "box openings": "\\boxed{" * 40_000,
    "open braces": "\\boxed{" + "{" * 300_000,
    "answer words": "answer " * 40_000,
    "answer is + spaces": "answer is" + " " * 300_000 + "x",
    "backslashes": "\\" * 300_000,
    "newlines": "\n" * 300_000,
    "prefix lines": "A:1\n" * 75_000,
    "tags": "<answer>" * 40_000,
    "parentheses": "(" * 300_000,
    "boxed + spaces": "\\boxed" + " " * 300_000,
}


@pytest.mark.parametrize("name", list(ADVERSARIAL_TEXTS))
def test_extraction_is_fast_on_adversarial_text(name):
    text = ADVERSARIAL_TEXTS[name]

    def grade_everything():
        return extract_answer(text), extract_answer(text, kind="mcq"), braces_balanced(text), normalize_answer(text)

    _, cpu_seconds = _timed(grade_everything, clock=time.process_time)
    assert cpu_seconds < 1.0, f"{name}: {cpu_seconds:.2f} s of CPU for 300 KB"


def test_extraction_of_unbalanced_box_flood():
    assert extract_boxed("\\boxed{" * 100_000) is None


# --------------------------------------------------------------------------------------------- equivalence


def test_normalize_answer():
    assert normalize_answer(r" $\left( 1, 2 \right)$. ") == "(1,2)"
    assert normalize_answer(r"\text{ 5 }") == "5"
    assert normalize_answer("1,234,567.5") == "1234567.5"
    assert normalize_answer("1,2") == "1,2"  # not a thousands separator: keep (could be a tuple)
    assert normalize_answer(r"\dfrac{1}{2}") == r"\frac{1}{2}"
    assert normalize_answer(r"1\!000\,000") == "1000000"
    assert normalize_answer(r"\rightarrow") == r"\rightarrow"


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("0.5", "1/2", True),
        (r"\frac{1}{2}", "0.5", True),
        (r"-\frac{3}{6}", "-0.5", True),
        ("2", "2.0", True),
        ("1,234", "1234", True),
        (r"$\text{C}$", "C", True),
        ("3", "2", False),  # two different integers never need math-verify
        ("2.0", "3", False),
        (None, "1", False),
        ("1", None, False),
        ("", "", False),
        ("x+1", "1+x", None),
        ("0.333333", "1/3", None),  # not exactly equal, math-verify decides
        ("1/0", "2/0", None),
    ],
)
def test_fast_equivalent(pred, gold, expected):
    assert fast_equivalent(pred, gold) is expected


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        (r"\frac{1}{2}", "0.5", True),
        ("1/2", "0.5", True),
        ("2", "2.0", True),
        ("x+1", "1+x", True),
        (r"\sqrt{4}", "2", True),
        (r"\frac12", r"\dfrac{1}{2}", True),
        ("x+1", "x+2", False),
        (r"\sqrt{2}", "1.41", False),
        ("7}+\\boxed{3", "3", False),  # unbalanced braces never reach math-verify
        (None, "1", False),
    ],
)
def test_answers_equivalent(pred, gold, expected):
    assert answers_equivalent(pred, gold) is expected


def test_fast_path_only_mode_never_uses_the_worker(monkeypatch):
    def fail(*args):
        raise AssertionError("the worker was used")

    monkeypatch.setattr(equivalence._WORKER, "verify", fail)
    assert answers_equivalent("0.5", "1/2", use_math_verify=False)
    assert not answers_equivalent("x+17", "17+x", use_math_verify=False)
    assert batch_equivalent([("x+17", "17+x")], use_math_verify=False) == [False]
    assert majority_vote(["x+17", "17+x"], equivalent=None).classes == [0, 1]


def test_shutdown_worker_stops_it_and_next_call_restarts_it():
    assert _worker_still_works()
    old_pid = equivalence._WORKER.pid
    shutdown_worker()
    assert equivalence._WORKER.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(old_pid, 0)
    assert _worker_still_works()


def test_batch_equivalent():
    pairs = [("1/2", "0.5"), ("3", "4"), (None, "1"), ("2+x", "x+2")]
    assert batch_equivalent(pairs) == [True, False, False, True]
    assert batch_equivalent(pairs, use_math_verify=False) == [True, False, False, False]


def test_worker_start_cost_is_paid_once():
    assert _worker_still_works()
    pid = equivalence._WORKER.pid
    results, seconds = _timed(lambda: [_worker_still_works() for _ in range(20)])
    assert all(results)
    assert equivalence._WORKER.pid == pid
    assert seconds < 3.0


def test_worker_is_stopped_at_interpreter_exit():
    script = textwrap.dedent(
        """
        from coevolve.grading import answers_equivalent, equivalence
        assert answers_equivalent("x+1", "1+x")
        print(equivalence._WORKER.pid)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    worker_pid = int(done.stdout.strip())
    with pytest.raises(ProcessLookupError):
        os.kill(worker_pid, 0)


# ---------------------------------------------------------------------------------------------- hostile input

INJECTIONS = [
    "__import__('os').system('touch {path}')",
    "__import__('os').system('touch PWNED')",
    "eval(\"__import__('os').system('touch {path}')\")",
    "exec(\"open('{path}', 'w').write('x')\")",
    "open('{path}', 'w')",
    "().__class__.__bases__[0].__subclasses__()",
    "lambda: __import__('os').system('touch {path}')",
]


@pytest.mark.parametrize("template", INJECTIONS)
def test_code_in_answers_is_never_executed(template, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "PWNED"
    payload = template.format(path=target)
    extracted = [extract_answer(f"\\boxed{{{payload}}}"), extract_answer(f"The answer is {payload}")]
    assert extracted == [payload, payload]
    assert answers_equivalent(payload, "0") is False
    assert answers_equivalent("0", payload) is False
    assert answers_equivalent(payload, "x+1") is False
    assert majority_vote([payload, "1", "1.0"]).label == "1"
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def _assert_fast_false_then_worker_still_works(pred):
    assert _worker_still_works()  # the worker is ready, so the timing below is only the comparison
    result, seconds = _timed(answers_equivalent, pred, "1", timeout_s=HOSTILE_TIMEOUT_S)
    assert result is False
    assert seconds < HOSTILE_TIMEOUT_S + MARGIN_S
    assert _worker_still_works()


def test_power_tower_times_out_and_worker_recovers():
    _assert_fast_false_then_worker_still_works("10^{10^{10^{10}}}")


def test_deep_fraction_within_length_limit_times_out_and_worker_recovers():
    nested = "\\frac{1}{" * 50 + "2" + "}" * 50  # math-verify takes seconds on this
    assert len(nested) <= MAX_VERIFY_CHARS
    _assert_fast_false_then_worker_still_works(nested)


@pytest.mark.parametrize(
    "pred",
    [
        "\\frac{1}{" * 2000 + "2" + "}" * 2000,
        "\\boxed{" * 100_000,
        "7" * 5_000_000,
        "x^{" * 1_000_000 + "}" * 1_000_000,
    ],
    ids=["frac-2000-deep", "boxed-flood", "5MB-digits", "5MB-nested-powers"],
)
def test_huge_answers_return_quickly(pred):
    _assert_fast_false_then_worker_still_works(pred)


def test_answer_that_crashes_math_verify_returns_false():
    assert answers_equivalent("\\frac{", "1") is False
    assert answers_equivalent("\ud800", "1") is False  # lone surrogate
    assert _worker_still_works()


# ------------------------------------------------------------------------------------------------------ vote


@pytest.mark.parametrize(
    ("answers", "label", "support", "p"),
    [  # Dynamic RL spec, worked example (m = 4)
        (["2", "2", "2", "2"], "2", 4, 1.0),
        (["5", "5", "5", "7"], "5", 3, 0.75),
        (["2", "3", None, "4"], "2", 1, 0.25),
        (["x", "x", "y", "y"], "x", 2, 0.5),
    ],
)
def test_majority_vote_spec_example(answers, label, support, p):
    result = majority_vote(answers)
    assert (result.label, result.support, result.n, result.p) == (label, support, 4, p)


def test_majority_vote_tie_goes_to_first_appearance():
    result = majority_vote(["3", "5", "5", "3"])
    assert result.label == "3"
    assert result.classes == [0, 1, 1, 0]
    assert result.agree == [True, False, False, True]


def test_majority_vote_missing_answers():
    result = majority_vote([None, "", None, "7", "  $ $ "])
    assert (result.label, result.support, result.n, result.n_valid) == ("7", 1, 5, 1)
    assert result.p == pytest.approx(1 / 5)
    assert result.classes == [-1, -1, -1, 0, -1]
    assert result.agree == [False, False, False, True, False]

    nothing = majority_vote([None, None, ""])
    assert (nothing.label, nothing.support, nothing.p, nothing.n) == (None, 0, 0.0, 3)
    assert nothing.classes == [-1, -1, -1]
    assert nothing.agree == [False, False, False]

    empty = majority_vote([])
    assert (empty.label, empty.support, empty.n, empty.p) == (None, 0, 0, 0.0)


def test_majority_vote_groups_equivalent_answers():
    result = majority_vote([None, "0.5", "x+1", "1/2", "1+x", "\\frac{1}{2}", "x + 1"])
    assert result.classes == [-1, 0, 1, 0, 1, 0, 1]
    assert (result.label, result.support, result.n_valid) == ("0.5", 3, 6)
    assert result.p == pytest.approx(3 / 7)


def test_majority_vote_calls_slow_equivalence_only_when_fast_path_is_undecided():
    calls = []

    def equivalent(answer, representative):
        calls.append((answer, representative))
        return {answer, representative} == {"x+1", "1+x"}

    result = majority_vote(["2", "2.0", "3", "x+1", "1+x", "1+x", " x+1 "], equivalent=equivalent)
    assert result.classes == [0, 0, 1, 2, 2, 2, 2]
    assert (result.label, result.support) == ("x+1", 4)
    # "2.0" vs "2" and "3" vs "2" are decided by the fast path; repeats of a seen answer cost nothing.
    assert calls == [("x+1", "2"), ("x+1", "3"), ("1+x", "2"), ("1+x", "3"), ("1+x", "x+1")]


def test_majority_vote_fast_path_only():
    result = majority_vote(["x+1", "1+x", "1+x"], equivalent=None)
    assert result.classes == [0, 1, 1]
    assert (result.label, result.support) == ("1+x", 2)


def test_random_text_never_raises():
    rng = random.Random(0)
    alphabet = ["\\boxed{", "\\fbox {", "{", "}", "\\", "$", "####", "<answer>", "</answer>", "A:", "\n", " ",
                "answer is", "Answer:", "(", ")", "C", "c", "1", ",", ".", "/", "\\frac", "\\text{", "\ud800", "é"]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        for kind in ("math", "mcq"):
            answer = extract_answer(text, kind=kind)
            assert answer is None or (isinstance(answer, str) and answer)
        fast_equivalent(text, "1")
        braces_balanced(text)
    vote = majority_vote([extract_answer(text) for text in ("\\boxed{", "####", "A:", "answer is")], equivalent=None)
    assert vote.label is None
