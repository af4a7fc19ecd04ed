"""Faults a run must survive: hostile model text in every recipe's parsers, slow answer votes, damaged checkpoints and
run files. ``bench/faults.py`` runs larger randomized versions of these probes."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from coevolve.formats import Generation
from coevolve.grading import MAX_TEXT_CHARS, extract_answer, majority_vote, pop_bound_counts, tag_blocks
from coevolve.grading.guard import PARSE_ERROR, TEXT_TOO_LONG, VOTE_OVER_BUDGET
from coevolve.recipes.agent0 import curriculum_tool_calls
from coevolve.recipes.dynamic_rl import parse_paper_question
from coevolve.recipes.infuser import parse_generator_json
from coevolve.recipes.pasodoble import parse_proposal
from coevolve.recipes.r_zero import has_think_format, parse_questioner_output
from coevolve.recipes.spice import parse_task
from coevolve.rewards.filters import filter_reasons, is_multi_part
from coevolve.rewards.format import _has_final_phrase, parse_teacher_output, student_format_score
from coevolve.rewards.label_free import after_think
from coevolve.rollout import Completion
from coevolve.store import RunStore
from coevolve.tasks import arith, math, mcq, program
from coevolve.tasks.python_programs import PythonWorld

BOXED = "so \\boxed{5}"
PYTHON = PythonWorld(executor=None)  # reads proposals and answers only: no program runs here
# Every parser of model text in the recipes: (parser, its "invalid output" value, a valid output).
PARSERS = {
    "extract_answer(math)": (extract_answer, None, BOXED),
    "extract_answer(mcq)": (lambda t: extract_answer(t, "mcq", 4), None, "The answer is (B)."),
    "math.parse_answer": (math.parse_answer, None, BOXED),
    "mcq.parse_answer": (lambda t: mcq.parse_answer(t, 4), None, "Answer: C"),
    "arith.parse_answer(chat)": (lambda t: arith.parse_answer(t, "chat"), None, BOXED),
    "arith.parse_question(compact)": (arith.parse_question, None, "Q:2+3\nA:5"),
    "arith.parse_question(chat)": (lambda t: arith.parse_question(t, "chat", "a=3,b=4"), None, "Question: a+b"),
    "dynamic_rl": (lambda t: parse_paper_question(Completion("", [], [], t, finish_reason="stop")), Generation(None),
                   "Question: What is 2+3?\nSolution: 5"),
    "opensir teacher": (lambda t: parse_teacher_output(t, "code").problem, None,
                        "<think>t</think><problem>What is 12 + 30?</problem><concepts>integer addition</concepts>"),
    "opensir student": (lambda t: student_format_score(t, "phrase"), 0.0, "Therefore, the final answer is: \\boxed{5}"),
    "r_zero questioner": (parse_questioner_output, (None, None), "<question>What is 2+3?</question> \\boxed{5}"),
    "r_zero solver format": (has_think_format, False, "<think>2+3=5</think> \\boxed{5}"),
    "pasodoble proposer": (parse_proposal, (None, None), "<problem>What is 2+3?</problem><answer>\\boxed{5}</answer>"),
    "infuser generator": (parse_generator_json, None, '{"question_text": "What is 2+3?", "ground_truth": "5"}'),
    "spice challenger": (parse_task, (None, None), "<question>What is 2+3?</question><answer>5</answer>"),
    "agent0 curriculum tool calls": (curriculum_tool_calls, 0, "```python\nprint(2+3)\n```\n```output"),
    "azr program proposal": (lambda t: program.read_proposal("deduction", t), "format", "P:5*x\nI:9"),
    "azr program answer": (program.read_tagged, None, "O:45"),
    "azr python proposal": (lambda t: PYTHON.read_proposal("deduction", t), "format",
                            "```python\ndef f(a):\n    return a\n```\n```input\n3\n```"),
    "azr python answer": (lambda t: PYTHON.read_answer("deduction", t), None, "```output\n3\n```"),
    "ttrl evol_rl embedded text": (after_think, "", "<think>2+3</think>\\boxed{5}"),
}

N = 60_000  # characters of each slow-regex probe (under MAX_TEXT_CHARS): the regexes replaced took 3 s to minutes
HOSTILE = {
    "nested json": '{"question_text": "Q?", "ground_truth": ' + "[" * 5000 + "]" * 5000 + "}",
    "huge json integer": '{"question_text": "Q?", "ground_truth": ' + "7" * 5000 + "}",
    "think format": "<think>" + "</think>\\boxed{" * (N // 15),
    "open question tags": "<question>" * (N // 10),
    "open problem tags": "<PROBLEM>" * (N // 9),
    "open think tags": "<think>" * (N // 7),
    "requests": "find " * (N // 5),
    "enumeration": " 1. " * (N // 4),
    "final phrases": "Therefore, the final answer is: \\boxed{" * (N // 40),
    "boxes": "\\boxed{" * (N // 7),
    "braces": "{" * N,
    "nul and surrogates": "\x00\ud800\udfff" * 1000 + "Question: 1+2\nQ:3*4",
}


@pytest.mark.parametrize("probe", sorted(HOSTILE))
def test_every_parser_reads_hostile_text_quickly_without_raising(probe):
    text = HOSTILE[probe]
    parsers = {name: parse for name, (parse, _, _) in PARSERS.items()}
    parsers["dynamic_rl filters"] = lambda t: filter_reasons(t, broad_multi_part=True)  # run on a parsed question
    for name, parse in parsers.items():
        started = time.perf_counter()
        parse(text)  # never raises
        assert time.perf_counter() - started < 1.0, (name, probe)


def test_deep_json_and_huge_integers_are_invalid_outputs_and_counted():
    pop_bound_counts()
    assert parse_generator_json(HOSTILE["nested json"]) is None  # RecursionError inside json
    assert parse_generator_json(HOSTILE["huge json integer"]) is None  # ValueError: int of more than 4,300 digits
    assert pop_bound_counts()[PARSE_ERROR] == 2
    assert parse_generator_json('{"question_text": "Q?", "ground_truth": 7}') == ("Q?", "7")


def test_over_long_text_is_an_invalid_output_of_every_parser_and_counted():
    pop_bound_counts()
    for name, (parse, invalid, valid) in PARSERS.items():
        assert parse(valid) != invalid, name
        assert parse(valid + " " * (MAX_TEXT_CHARS + 1 - len(valid))) == invalid, name
    assert pop_bound_counts()[TEXT_TOO_LONG] == len(PARSERS)


def _random_text(rng: random.Random, pieces: list[str], n: int) -> str:
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, n)))


def test_linear_rewrites_agree_with_the_regexes_they_replace():
    """The old patterns, checked on short random texts where their run time does not matter."""
    rng = random.Random(0)
    tags = ["<question>", "</question>", "<Question>", "</QUESTION>", "<think>", "</think>", "\\boxed{", "}", "a", "\n"]
    think = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)
    for _ in range(3000):
        text = _random_text(rng, tags, 10)
        for ignore_case in (False, True):
            old = re.compile(r"<question>(.*?)</question>", re.DOTALL | (re.IGNORECASE if ignore_case else 0))
            assert [m.span(1) for m in old.finditer(text)] == [
                (start, end) for _, start, end, _ in tag_blocks(text, "question", ignore_case)]
        assert has_think_format(text) == (think.fullmatch(text.strip()) is not None)
    phrase = re.compile(r"Therefore, the final answer is: \$?\\boxed\{(.+)\}\$?")
    words = ["Therefore, the final answer is: ", "$", "\\boxed{", "}", "x", "\n"]
    for _ in range(3000):
        text = _random_text(rng, words, 8)
        assert _has_final_phrase(text) == (phrase.search(text) is not None), text
    request = r"(?:find|determine|calculate|compute|what\s+is|what\s+are)"
    narrow = re.compile(rf"\b{request}\b.*\band\s+(?:{request}|the|its)\b", re.IGNORECASE)
    broad = re.compile(r"\bfind\b.*\band\b", re.IGNORECASE)
    enumeration = re.compile(r"(?:^|\s)(?:1[.)]|\(1\)|\(a\)|a\))\s.*(?:^|\s)(?:2[.)]|\(2\)|\(b\)|b\))\s",
                             re.IGNORECASE | re.DOTALL)
    words = ["find", "Find", "what", "is", "and", "the", "its", "x", " ", " ", "\n", "1.", "2)", "(a)", "(b)", "a)"]
    for _ in range(3000):
        text = _random_text(rng, words, 12)
        for paired, is_broad in ((narrow, False), (broad, True)):
            old = (text.count("?") >= 2 or enumeration.search(text + " ") is not None
                   or any(paired.search(s) for s in re.split(r"(?<=[.?!])\s+", text)))
            assert is_multi_part(text, is_broad) == old, text


def test_a_vote_over_slow_answers_stops_comparing_at_its_budget():
    calls = []

    def slow(a: str, b: str) -> bool:  # like math-verify timing out on every pair
        calls.append((a, b))
        time.sleep(0.02)
        return False

    answers = [f"x+{i}" for i in range(8)]  # 8 distinct answers the fast path cannot tell apart: 28 slow pairs
    pop_bound_counts()
    started = time.perf_counter()
    vote = majority_vote(answers, slow, budget_s=0.1)
    assert time.perf_counter() - started < 0.1 + 0.02 + 0.5
    assert len(calls) < 28
    assert vote.n_valid == 8 and vote.support == 1  # the pairs not compared count as different
    assert pop_bound_counts()[VOTE_OVER_BUDGET] == 1
    assert majority_vote(answers, lambda a, b: False, budget_s=60).support == 1  # all 28 pairs compared in time
    assert pop_bound_counts()[VOTE_OVER_BUDGET] == 0


# ------------------------------------------------------------------------------------------ damaged checkpoints


def _grpo(model_dir, steps: int = 2):
    from coevolve.recipes import resolve

    config, params, cls = resolve("grpo", sets=[
        f"model={model_dir}", f"steps={steps}", "eval_sets=[]", "params.questions_per_step=2", "params.group_size=2",
        "rollout.max_new_tokens=8", "train.lr=1e-2", "keep_checkpoints=2"])
    return cls(config, params), config


@pytest.fixture(scope="module")
def two_checkpoints(random_model_dir, tmp_path_factory):
    """A finished 2-step GRPO run with the checkpoints of both steps."""
    from coevolve.loop import run

    out = tmp_path_factory.mktemp("faults") / "run"
    run(*_grpo(random_model_dir), out, progress=False)
    return out


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _overwrite_tail(path: Path, data: bytes) -> None:
    """Replace the last bytes of a file (a safetensors file's tensor data) without changing its length."""
    raw = bytearray(path.read_bytes())
    raw[-len(data):] = data
    path.write_bytes(bytes(raw))


def _rechecksum(folder: Path) -> None:
    """Record the files' current digests, as if the damage had been there when the checkpoint was written."""
    from coevolve.store import CHECKSUMS, file_sha256

    (folder / CHECKSUMS).write_text(json.dumps({p.name: file_sha256(p) for p in sorted(folder.iterdir())
                                               if p.name != CHECKSUMS}))


def _edit_state(folder: Path, edit, rechecksum: bool = False) -> None:
    state = json.loads((folder / "state.json").read_text())
    edit(state)
    (folder / "state.json").write_text(json.dumps(state))
    if rechecksum:
        _rechecksum(folder)


NAN_BYTES = b"\x00\x00\xc0\x7f" * 4  # four float32 NaNs


DAMAGES = {
    "truncated weights": lambda folder: _truncate(folder / "solver.safetensors"),
    "missing optimizer": lambda folder: (folder / "solver.optim.safetensors").unlink(),
    "empty state.json": lambda folder: (folder / "state.json").write_bytes(b""),
    "garbage state.json": lambda folder: (folder / "state.json").write_bytes(b"\xff{garbage"),
    "truncated rng": lambda folder: _truncate(folder / "rng.safetensors"),
    # the same length: only the checksums see these
    "random bytes in the weights": lambda folder: _overwrite_tail(folder / "solver.safetensors", os.urandom(64)),
    "random bytes in the optimizer": lambda folder: _overwrite_tail(folder / "solver.optim.safetensors",
                                                                    os.urandom(64)),
    "NaN in the weights": lambda folder: _overwrite_tail(folder / "solver.safetensors", NAN_BYTES),
    "recipe state emptied": lambda folder: _edit_state(folder, lambda s: s.update(recipe={})),
    # consistent checksums (a checkpoint written that way): the finite check and the state's own check see these
    "NaN in the weights, checksummed": lambda folder: (_overwrite_tail(folder / "solver.safetensors", NAN_BYTES),
                                                       _rechecksum(folder)),
    "recipe state emptied, checksummed": lambda folder: _edit_state(folder, lambda s: s.update(recipe={}), True),
    "updates_done emptied, checksummed": lambda folder: _edit_state(
        folder, lambda s: s["recipe"].update(updates_done={}), True),
    "time_s a string, checksummed": lambda folder: _edit_state(folder, lambda s: s["recipe"].update(time_s="x"),
                                                               True),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_resume_continues_from_the_newest_intact_checkpoint(two_checkpoints, random_model_dir, tmp_path, damage,
                                                            caplog):
    from coevolve.loop import run

    out = tmp_path / "run"
    shutil.copytree(two_checkpoints, out)
    latest = out / "checkpoints" / "step_000002"
    straight = load_file(two_checkpoints / "checkpoints" / "step_000002" / "solver.safetensors")
    DAMAGES[damage](latest)
    with caplog.at_level(logging.WARNING):
        run(*_grpo(random_model_dir), out, resume=True, progress=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "step_000002" in warnings[0] and "resuming from step_000001" in warnings[0]
    rows = RunStore(out).metrics()
    assert [r["step"] for r in rows] == [1, 2]  # step 2 redone, none repeated
    assert all(r[TEXT_TOO_LONG] == r[PARSE_ERROR] == r[VOTE_OVER_BUDGET] == 0 for r in rows)  # bounds in every row
    redone = load_file(latest / "solver.safetensors")  # from step 1's checkpoint: the weights of the straight run
    assert max(float((redone[k] - straight[k]).abs().max()) for k in straight) < 1e-6
    assert (out / "checkpoints" / "damaged_step_000002").is_dir()  # set aside, not deleted


def test_a_checkpoint_from_before_checksums_still_resumes(two_checkpoints, random_model_dir, tmp_path, caplog):
    """No ``checksums.json`` (written before checkpoints carried one): the other checks only, and no warning."""
    from coevolve.loop import run
    from coevolve.store import CHECKSUMS

    out = tmp_path / "run"
    shutil.copytree(two_checkpoints, out)
    for step in (1, 2):
        (out / "checkpoints" / f"step_00000{step}" / CHECKSUMS).unlink()
    with caplog.at_level(logging.WARNING):
        run(*_grpo(random_model_dir, steps=3), out, resume=True, progress=False)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r["step"] for r in RunStore(out).metrics()] == [1, 2, 3]


def test_eval_of_a_damaged_checkpoint_is_one_error_line(two_checkpoints, tmp_path):
    from typer.testing import CliRunner

    from coevolve.cli import app

    out = tmp_path / "run"
    shutil.copytree(two_checkpoints, out)
    for damage, needle in (("truncated weights", "step_000002/solver.safetensors"),
                           ("random bytes in the weights", "does not match its checksum")):
        shutil.rmtree(out / "checkpoints" / "step_000002")
        shutil.copytree(two_checkpoints / "checkpoints" / "step_000002", out / "checkpoints" / "step_000002")
        DAMAGES[damage](out / "checkpoints" / "step_000002")
        result = CliRunner().invoke(app, ["eval", str(out), "--sets", "arith_l1", "--limit", "2"])
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert result.exit_code == 2 and len(errors) == 1 and needle in errors[0], result.output
        assert not (out / "eval").exists()


def test_no_intact_checkpoint_is_one_error_line(two_checkpoints, random_model_dir, tmp_path):
    from typer.testing import CliRunner

    from coevolve.cli import app

    out = tmp_path / "run"
    shutil.copytree(two_checkpoints, out)
    for step in (1, 2):
        _truncate(out / "checkpoints" / f"step_00000{step}" / "rng.safetensors")
    result = CliRunner().invoke(app, ["run", "--resume", str(out), "--quiet"])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code != 0 and len(errors) == 1 and "Traceback" not in result.output, result.output
    assert "step_000001/rng.safetensors" in errors[0] and "step_000002/rng.safetensors" in errors[0]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001", "step_000002"]  # kept


def test_invalid_utf8_in_run_files_stops_neither_resume_nor_report(two_checkpoints, random_model_dir, tmp_path):
    from coevolve.analytics.report import write_report
    from coevolve.loop import run

    out = tmp_path / "run"
    shutil.copytree(two_checkpoints, out)
    with open(out / "metrics.jsonl", "ab") as handle:
        handle.write(b'{"step": 2, "note": "\xff\xfe"}\n\xc3\x28 torn')
    samples = out / "samples" / "step_000001.jsonl"
    samples.write_bytes(samples.read_bytes() + b'{"completion": "\xed\xa0\x80 \xe2\x80\xa8"}\n')
    assert RunStore(out).samples(1)[-1]["completion"].endswith("\u2028")  # a row is split at newlines only
    run(*_grpo(random_model_dir, steps=3), out, resume=True, progress=False)
    assert [r["step"] for r in RunStore(out).metrics() if "solver/loss" in r] == [1, 2, 3]
    assert write_report(out, tmp_path / "report.html", embed=False).exists()


@pytest.mark.parametrize("value", ["high", {"x": 1}])
def test_a_non_numeric_evaluation_value_does_not_stop_report_or_compare(two_checkpoints, tmp_path, value):
    """An evaluation metric that was never logged as a number: the report leaves that set out of its accuracy table."""
    from coevolve.analytics.compare import compare_runs
    from coevolve.analytics.report import write_report

    out = tmp_path / "run"
    shutil.copytree(two_checkpoints, out)
    with open(out / "metrics.jsonl", "a") as handle:
        for step in (0, 2):
            handle.write(json.dumps({"step": step, "eval/arith_l1/accuracy": value,
                                     "eval/arith_l1/accuracy_lenient": value}) + "\n")
    assert "arith_l1" not in write_report(out, embed=False).read_text().split("whole run")[0]
    compare_runs([out, two_checkpoints], tmp_path / "compare")


def test_a_checkpoint_is_written_under_a_temporary_name_and_synced_before_it_appears(tmp_path, monkeypatch):
    """Every file and the folder are fsynced before the rename; the rename's folder after it."""
    import torch

    from coevolve import store

    synced, events = [], []
    monkeypatch.setattr(store, "fsync_path", lambda path: synced.append(Path(path)))
    real_replace = os.replace
    monkeypatch.setattr(store.os, "replace", lambda a, b: (events.append((list(synced), Path(a), Path(b))),
                                                           real_replace(a, b)))
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    final = RunStore(tmp_path).save_checkpoint(1, {"solver": model}, {"solver": optimizer}, {"x": 1})
    [(synced_before, tmp, target)] = events
    assert target == final and tmp.name.startswith(".step_000001.")
    assert {p.name for p in synced_before} == {"solver.safetensors", "solver.optim.safetensors", "rng.safetensors",
                                                "state.json", "checksums.json", tmp.name}
    assert synced[-1] == tmp_path / "checkpoints"
