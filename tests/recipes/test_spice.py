"""The spice recipe: Challenger parsing per task form, one step on canned outputs against hand-computed rewards and
Dr.GRPO advantages, a step on a random model, the CLI, and SIGKILL-and-resume."""

from __future__ import annotations

import json
import math
import signal
from dataclasses import replace

import helpers
import pytest
from helpers import read_generations, records
from run_checks import assert_same_training, run_killed, train_rows
from typer.testing import CliRunner

from coevolve.cli import app
from coevolve.config import ConfigError
from coevolve.formats import Generation
from coevolve.recipes import resolve
from coevolve.recipes.spice import Task, parse_task, read_arith_task, read_chat_task
from coevolve.rollout import Completion


def completion(text: str) -> Completion:
    return Completion("", [], [], text, finish_reason="stop")


MCQ = ("<question>Which is prime?\nA) 4\nB) 6\nC) 7\nD) 9</question>\n<answer>C</answer>")


def test_parse_task_reads_the_last_question_and_its_answer():
    assert parse_task("<think><question>no</question><answer>1</answer></think>"
                      "<question>What is 2+3?</question> so <answer> 5 </answer>") == ("What is 2+3?", "5")
    assert parse_task("<question>Q1</question><answer>1</answer><question>Q2?</question>") == ("Q2?", None)
    assert parse_task("<question> </question><answer>3</answer>") == (None, "3")
    assert parse_task("no tags") == (None, None)


def test_read_chat_task_per_form():
    assert read_chat_task(completion(MCQ), "chat", "mcq") == Generation(MCQ[10:MCQ.index("</question>")], "C")
    assert read_chat_task(completion(MCQ.replace("D) 9", "")), "chat", "mcq").question is None  # three options
    assert read_chat_task(completion(MCQ.replace(">C<", ">E<")), "chat", "mcq").question is None  # no such option
    free = "<question>What is 2^10?</question><answer>1024</answer>"
    assert read_chat_task(completion(free), "chat", "free_form") == Generation("What is 2^10?", "1024")
    assert read_chat_task(completion(free.replace("1024", "\\frac{1")), "chat", "free_form").question is None
    assert read_chat_task(completion(free.replace("1024", "x" * 201)), "chat", "free_form").question is None


def test_read_arith_task_writes_the_sheet_in():
    task = read_arith_task(completion("Q:a*b-c\nA:-14"), "compact", "a=3,b=-4,c=2")
    assert task == Generation("3*(-4)-2", "-14")  # the Reasoner needs no sheet
    assert read_arith_task(completion("Q:a+z\nA:3"), "compact", "a=3").question is None  # z is not on the sheet
    assert read_arith_task(completion("Q:a+a\nA:six"), "compact", "a=3").question is None


def test_mcq_is_free_form_only_in_the_arithmetic_world():
    with pytest.raises(ConfigError, match="params.mcq_share"):
        resolve("spice", preset="small", sets=["params.mcq_share=0.5"])


def make_recipe(model_dir, *sets):
    recipe = helpers.make_recipe(
        "spice", model_dir, "params.documents_per_step=3", "params.challenger_samples=4",
        "params.reasoner_samples=4", "rollout.max_new_tokens=6", "params.challenger_max_tokens=6", "train.lr=1e-2",
        *sets, preset="small")
    # The random model writes neither tasks nor answers: read two outputs in three as the task "1+2" with key "3",
    # and an answer as "3" or "4" by the parity of its characters' code sum, so Reasoner groups have variance.
    read_generations(recipe, lambda output, style, document, form: (Generation("1+2", "3")
                                                                    if sum(map(ord, output.text)) % 3
                                                                    else Generation(None)))
    recipe.task.parse_answer = lambda text, style: str(3 + sum(map(ord, text)) % 2)
    return recipe


def test_step_rewards_and_dr_grpo_by_hand(random_model_dir):
    recipe = make_recipe(random_model_dir)
    batches = []
    update = recipe.trainer.update
    recipe.trainer.update = lambda samples: batches.append(samples) or update(samples)
    out = recipe.step(1)
    rows = records(out)
    gens = [r for r in rows if r["role"] == "generator"]
    sols = [r for r in rows if r["role"] == "solver"]
    valid = [g for g in gens if g["valid"]]
    assert len(gens) == 12 and 0 < len(valid) < 12 and len(sols) == 4 * len(valid)
    assert len(batches) == 1 and len(batches[0]) == 12 + 4 * len(valid)  # one update on both roles
    for g in gens:
        scores = [s["reward"] for s in sols if s["question_id"] == g["question_id"]]
        if not g["valid"]:
            assert g["reward"] == -0.1 and not scores
            continue
        assert scores == [float(s["answer"] == "3") for s in sols if s["question_id"] == g["question_id"]]
        p = sum(scores) / 4
        assert g["solve_rate"] == p and g["reward"] == pytest.approx(math.exp(-(p * (1 - p) - 0.25) ** 2 / 0.02))
        advantages = [s["advantage"] for s in sols if s["question_id"] == g["question_id"]]
        assert advantages == pytest.approx([s - p for s in scores])  # Dr.GRPO: mean-centred, not std-scaled
    for d in range(3):  # the Challenger's group: the four outputs for one document
        group = gens[4 * d:4 * d + 4]
        assert len({g["document"] for g in group}) == 1
        m = sum(g["reward"] for g in group) / 4
        assert [g["advantage"] for g in group] == pytest.approx([g["reward"] - m for g in group])
    m = out.metrics
    assert m["questions/valid_rate"] == len(valid) / 12 and m["spice/mcq_share"] == 0.0
    assert m["spice/pass_rate_mean"] == pytest.approx(sum(g["solve_rate"] for g in valid) / len(valid))
    assert m["spice/document_coverage"] == len({g["document"] for g in valid}) / len(recipe.documents)
    assert "policy/loss" in m and "time/update_s" in m
    assert all(s["oracle"] is not None for s in sols)  # analytics from the arithmetic checker


def test_step_on_a_random_model(random_model_dir):
    out = helpers.make_recipe("spice", random_model_dir, "params.documents_per_step=2",
                              "params.challenger_samples=2", "params.reasoner_samples=2",
                              "rollout.max_new_tokens=6", "params.challenger_max_tokens=6", preset="small").step(1)
    gens = [r for r in records(out) if r["role"] == "generator"]
    assert len(gens) == 4 and all(not g["valid"] and g["reward"] == -0.1 for g in gens)
    assert out.metrics["questions/valid_rate"] == 0.0 and out.metrics["generator/advantage_abs_mean"] == 0.0


def test_task_forms_follow_the_share(random_model_dir):
    recipe = make_recipe(random_model_dir)
    recipe.params = recipe.params.model_copy(update={"mcq_share": 0.5})
    forms = recipe.task_forms(400, 7)
    assert forms == recipe.task_forms(400, 7) and 150 < forms.count("mcq") < 250
    mcq = Task("d", "k", 0, "mcq", completion(""), "Which?", "C")
    assert recipe.agrees(mcq, "C") and not recipe.agrees(mcq, "B") and not recipe.agrees(mcq, None)


def test_cli_run_and_resume(tmp_path, random_model_dir):
    out = tmp_path / "run"
    base = ["run", "spice", "--preset", "small", "--out", str(out), "--quiet", "--set", f"model={random_model_dir}",
            "--set", "eval_sets=[]", "--set", "params.documents_per_step=2", "--set", "params.challenger_samples=2",
            "--set", "params.reasoner_samples=2", "--set", "rollout.max_new_tokens=6",
            "--set", "params.challenger_max_tokens=6"]
    runner = CliRunner()
    assert runner.invoke(app, base + ["--set", "steps=2"]).exit_code == 0
    assert runner.invoke(app, ["run", "spice", "--resume", str(out), "--quiet", "--set", "steps=3"]).exit_code == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and all("spice/document_coverage" in r for r in rows)
    samples = [json.loads(line) for line in (out / "samples" / "step_000003.jsonl").read_text().splitlines()]
    assert len([s for s in samples if s["role"] == "generator"]) == 4


SPICE_RUN = ["run", "spice", "--preset", "small", "--quiet", "--set", "steps=3", "--set", "eval_every=0",
             "--set", "eval_sets=[]", "--set", "params.documents_per_step=2", "--set", "params.challenger_samples=4",
             "--set", "params.reasoner_samples=2", "--set", "train.lr=1e-3"]


def test_killed_mid_step_resumes_as_the_uninterrupted_run(tmp_path, small_tiny_arith):
    model = small_tiny_arith[1]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    done = CliRunner().invoke(app, [*SPICE_RUN, "--set", f"model={model}", "--out", str(whole)])
    assert done.exit_code == 0, done.output
    assert any(r["questions/valid_rate"] > 0 for r in train_rows(whole))  # the test build writes tasks
    proc = run_killed("after_samples", [*SPICE_RUN, "--set", f"model={model}", "--out", str(killed)])
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    resumed = CliRunner().invoke(app, ["run", "--resume", str(killed), "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert [r["step"] for r in train_rows(killed)] == [1, 2, 3]
    assert_same_training(whole, killed, model, ("policy/loss", "policy/grad_norm"))
    # the covered-document set is restored: the coverage series matches
    assert ([r["spice/document_coverage"] for r in train_rows(killed)]
            == [r["spice/document_coverage"] for r in train_rows(whole)])


def test_multiple_choice_step_in_the_chat_world(tmp_path, random_model_dir, monkeypatch):
    import coevolve.recipes.spice as spice

    doc = tmp_path / "corpus.txt"
    doc.write_text("Seven is a prime number.\n\nNine is three squared.\n")
    recipe = helpers.make_recipe("spice", random_model_dir, "task=math", f"params.document_source={doc}",
                                 "params.document_min_tokens=1", "params.mcq_share=1.0",
                                 "params.documents_per_step=2", "params.challenger_samples=2",
                                 "params.reasoner_samples=4", "rollout.max_new_tokens=6",
                                 "params.challenger_max_tokens=6")
    prompts = []
    prompt = recipe.generator_format.prompt
    recipe.generator_format = replace(recipe.generator_format,
                                      prompt=lambda style, **inputs: prompts.append(inputs) or prompt(style, **inputs))
    read_generations(recipe, lambda output, style, document, form: Generation(f"Which? {document[:5]}", "C"))
    letters = iter("CBCC" "BBBB" "CCCC" "CBBB")  # the Reasoner's letters, task by task
    monkeypatch.setattr(spice, "extract_answer", lambda text, kind, n: next(letters))
    out = recipe.step(1)
    assert [p["form"] for p in prompts] == ["mcq", "mcq"]
    rows = records(out)
    gens = [r for r in rows if r["role"] == "generator"]
    assert [g["solve_rate"] for g in gens] == [0.75, 0.0, 1.0, 0.25]
    assert [g["reward"] for g in gens] == pytest.approx([math.exp(-0.0625 ** 2 / 0.02), math.exp(-3.125),
                                                         math.exp(-3.125), math.exp(-0.0625 ** 2 / 0.02)])
    sols = [r for r in rows if r["role"] == "solver"]
    assert all(s["prompt"].rstrip().endswith(spice.MCQ_INSTRUCTION.strip()) or spice.MCQ_INSTRUCTION.strip()
               in s["prompt"] for s in sols)
    assert not any("prime number" in s["prompt"] for s in sols)  # the Reasoner never sees the document
    assert out.metrics["spice/mcq_share"] == 1.0 and out.metrics["spice/valid_rate_mcq"] == 1.0
