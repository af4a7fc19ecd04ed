"""Strict and lenient answer extraction: worked examples, hostile text, both accuracies from the same samples."""

import json
import subprocess
import sys
import time

import pytest

from coevolve.evaluation import EvalItem, evaluate
from coevolve.grading import MAX_TEXT_CHARS, extract_lenient
from coevolve.tasks.registry import LENIENT_RULE


@pytest.mark.parametrize("text, expected", [
    ("so the total is 18", "18"),
    ("\\boxed{12}. Wait, I added wrong: it is 18.", "18"),  # a number after the box wins
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # a box ending last is taken whole
    ("\\boxed{x^2+1}", "x^2+1"),
    ("no digits at all", None),
    ("", None),
    ("\\boxed{}", None),
    ("She pays $1,234.50.", "1234.50"),
    ("1,2,3", "3"),
    ("x = -5", "-5"),
    ("3 \u2212 \u22127", "-7"),  # unicode minus: the second is a sign, the first a binary minus
    ("7-5", "5"),
    ("10 - 3", "3"),
    ("3/4 of the cake", "3/4"),
    ("half is \\dfrac{1}{2}", "\\dfrac{1}{2}"),
    ("\u0663 apples", None),  # ASCII digits only
    (None, None),
    (42, None),
])
def test_extract_lenient_examples(text, expected) -> None:
    assert extract_lenient(text) == expected


HOSTILE = {
    "digit run": "9" * 60_000,
    "box openings": "\\boxed{" * 8_000,
    "nested braces": "\\boxed{" + "{" * 30_000 + "}" * 30_001,
    "thousands commas": "1," * 30_000,
    "minus signs": "-" * 60_000 + "1",
    "fractions": "\\frac{1}{" * 6_000,
    "slashes": "1/" * 30_000,
    "dots": "1." * 30_000,
    "unicode": "\u00e9\U0001d7d8\u2212" * 15_000,
    "code": "__import__('os').system('touch /tmp/pwned') " * 1_000,
    "over the cap": "1" * (MAX_TEXT_CHARS + 1),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_extract_lenient_is_fast_and_total_on_hostile_text(name) -> None:
    started = time.process_time()
    answer = extract_lenient(HOSTILE[name])
    assert time.process_time() - started < 0.5
    assert answer is None or isinstance(answer, str)


class Policy:
    """The part of a Policy the harness uses."""

    def __init__(self, prompt_style: str):
        self.prompt_style = prompt_style

    def format_prompt(self, user_message: str) -> str:
        return user_message


class Engine:
    """Answers each prompt with the completion scripted for the question it contains, counting calls."""

    def __init__(self, script: dict[str, str]):
        self.script, self.calls = script, 0

    def generate(self, prompts, params, seed):
        from coevolve.rollout.base import Completion

        self.calls += 1
        texts = [next(t for q, t in self.script.items() if q in p) for p in prompts]
        return [Completion(prompt=p, prompt_ids=[], token_ids=[0], text=t, finish_reason="eos")
                for p, t in zip(prompts, texts)]


def test_both_accuracies_come_from_the_same_completions(tmp_path) -> None:
    items = [EvalItem(f"m/{i}", "toy", "math", q, "18") for i, q in enumerate("ABCD")]
    script = {"A": "5 + 13 = 18, so she has 18 eggs",  # no box, right last number: lenient only
              "B": "\\boxed{12}. Checking again: 5 + 13 = 18",  # wrong box, then the right number: lenient only
              "C": "I cannot tell",  # no number: neither
              "D": "\\boxed{18}"}  # both
    engine = Engine(script)
    summary = evaluate(Policy("chat"), engine, {"toy": items}, out_dir=tmp_path, progress=False)["toy"]
    assert engine.calls == 1  # one sampling pass
    assert summary["accuracy"] == summary["accuracy_strict"] == 0.25 and summary["accuracy_lenient"] == 0.75
    assert summary["answer_rules"] == {"strict": "last \\boxed{} (else <answer> tags, ####, an 'A:' line, "
                                                 "'the answer is')", "lenient": LENIENT_RULE}
    records = [json.loads(line) for line in (tmp_path / "toy" / "results.jsonl").read_text().splitlines()]
    assert [r["extracted"] + r["extracted_lenient"] for r in records] == [
        [None, "18"], ["12", "18"], [None, None], ["18", "18"]]
    assert [r["correct"] + r["correct_lenient"] for r in records] == [
        [False, True], [False, True], [False, False], [True, True]]


def test_arith_strict_is_the_answer_line_and_lenient_the_last_number() -> None:
    items = [EvalItem("a/0", "toy", "arith", "3+4*5", "23"), EvalItem("a/1", "toy", "arith", "9-2", "7")]
    engine = Engine({"3+4*5": "S:4*5=20,3+20=23", "9-2": "S:9-2=7\nA:7"})  # the first never writes its A: line
    compact = evaluate(Policy("compact"), engine, {"toy": items}, progress=False)["toy"]
    assert compact["accuracy"] == 0.5 and compact["accuracy_lenient"] == 1.0
    assert compact["answer_rules"]["strict"] == "last 'A:' line"
    chat = evaluate(Policy("chat"), Engine({"3+4*5": "\\boxed{23}", "9-2": "\\boxed{6} or 7"}), {"toy": items},
                    progress=False)["toy"]
    assert chat["accuracy"] == 0.5 and chat["accuracy_lenient"] == 1.0
    assert chat["answer_rules"]["strict"] == "last \\boxed{}"


def test_mcq_lenient_is_strict() -> None:
    item = EvalItem("c/0", "toy", "mcq", "Which is green?", "B", ("grass is red", "grass is green"))
    summary = evaluate(Policy("chat"), Engine({"green": "It is (B), 2 of them"}), {"toy": [item]},
                       progress=False)["toy"]
    assert summary["accuracy"] == summary["accuracy_lenient"] == 1.0
    assert summary["answer_rules"]["lenient"] == "same as strict"


def test_coevolve_eval_names_both_rules(tmp_path, random_model_dir) -> None:
    result = subprocess.run([sys.executable, "-m", "coevolve.cli", "eval", str(random_model_dir), "--sets", "arith_l1",
                             "--limit", "2", "--max-new-tokens", "4", "--out", str(tmp_path)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "accuracy: strict " in result.stdout and " lenient " in result.stdout
    assert f"strict: last 'A:' line; lenient: {LENIENT_RULE}" in result.stdout
    summary = json.loads((tmp_path / "arith_l1" / "summary.json").read_text())
    assert summary["accuracy_strict"] == summary["accuracy"]
    assert summary["answer_rules"] == {"strict": "last 'A:' line", "lenient": LENIENT_RULE}


def test_report_shows_lenient_next_to_strict(tmp_path) -> None:
    from test_analytics import make_fake_run

    from coevolve.analytics.report import write_report

    run_dir = make_fake_run(tmp_path / "run", steps=2, iterations=1)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        if "eval/arith_l1/accuracy" in row:
            row["eval/arith_l1/accuracy_lenient"] = 0.875
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_report(run_dir, embed=False).read_text()
    assert "<th>final accuracy (strict)</th><th>lenient</th>" in page and ">0.875<" in page
