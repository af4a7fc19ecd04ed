"""The opensir recipe: records of both roles, hand-checked scores and selection, frozen teacher, pool persistence."""

from __future__ import annotations

import json

import helpers
import numpy as np
import pytest
import torch
from helpers import read_generations, records

from coevolve.formats import Generation
from coevolve.loop import run
from coevolve.pool import ProblemPool
from coevolve.recipes.opensir import STUDENT_WORLDS, Candidate, OpenSIR  # importing the module registers it
from coevolve.rewards.novelty import expression_concepts
from coevolve.rollout import Completion
from coevolve.rollout.hf import encode_prompt

CHARS = "0123456789+-*()"


def fake_embed(texts):
    """A deterministic stand-in encoder: normalised character counts."""
    rows = np.array([[t.count(ch) for ch in CHARS] + [1.0] for t in texts], dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def make_recipe(model_dir, *sets):
    recipe = helpers.make_recipe("opensir", model_dir, "params.batch_size=16", "params.group_size=4",
                                 "rollout.max_new_tokens=12", "train.lr=1e-2", *sets)
    recipe.embed_texts = fake_embed
    return recipe, recipe.config


def always_valid(output: Completion, style: str, rules: str = "paper") -> Generation:
    """Reads any completion of the random model as a valid problem (it never writes one)."""
    question = f"{len(output.text) % 7}+{len(output.text) % 5}"
    return Generation(question, concepts=expression_concepts(question), format_score=1.0)


def test_step_on_random_model_writes_both_roles(random_model_dir):
    recipe, _ = make_recipe(random_model_dir)
    read_generations(recipe, always_valid)
    out = recipe.step(1)
    gens = [r for r in records(out) if r["role"] == "generator"]
    sols = [r for r in records(out) if r["role"] == "solver"]
    assert len(gens) == 16 and len(sols) == 2 * 4  # k*G teacher outputs; B/(2G) problems x G solutions
    for r in gens:
        assert r["valid"] and r["question"] and r["reference"] == "1+1" and r["label_source"] == "majority"
        assert set(r["reward_terms"]) == {"sol", "len", "div", "fmt"} and 0.0 <= r["solve_rate"] <= 1.0
        assert r["reward"] == pytest.approx(r["reward_terms"]["sol"] + r["reward_terms"]["len"]
                                            + r["reward_terms"]["div"] + 0.1 * r["reward_terms"]["fmt"])
        assert r["oracle"]["answer"] == str(sum(map(int, r["question"].split("+"))))  # analytics only
    assert sum(r["selected"] for r in gens) == 2 * 4 and sum(r["student_selected"] for r in gens) == 2
    for r in sols:
        assert {"answer", "label", "label_source", "solve_rate", "reward", "advantage", "oracle"} <= set(r)
        assert r["label_source"] == "majority" and r["phase"] == "solve"
        assert r["question_id"] in {g["question_id"] for g in gens if g["student_selected"]}
    m = out.metrics
    assert m["pool/size"] == 17 and m["questions/valid_rate"] == 1.0
    assert {"generator/reward_mean", "solver/reward_mean", "reward/sol", "reward/len", "reward/div", "reward/fmt",
            "policy/loss", "time/generate_s", "time/solve_s", "time/update_s"} <= set(m)
    assert set(recipe.trainers()) == {"policy"}


# --- a stubbed engine with canned completions: scores and selection by hand --------------------------------------

TEACHER = ["Q:2+3", "Q:4*5", "xx", "Q:2+3",  # group 0
           "Q:12-3", "Q:12-3", "Q:12-3", "Q:12-3",  # group 1: identical outputs, zero variance
           "bad", "bad", "bad", "bad",  # group 2: all invalid
           "Q:(1+2)*3", "Q:2+3", "Q:12-3", "nope"]  # group 3
SOLUTIONS = {"2+3": ["A:5", "A:5", "A:5", "A:4"], "4*5": ["A:20", "A:20", "A:21", "S:?"],
             "12-3": ["A:9"] * 4, "(1+2)*3": ["A:9", "A:9", "A:8", "A:7"]}
# G = 4, [s_min, s_max] = [0.5, 0.9], edge 1/G: sol(s) = 1 - 0.75 |s - 0.7| / 0.2; l_base = l_cap = 4 tokens;
# diversity = Eq. 10 against the seed "1+1" (form:n+n, ops:+, digits:1); format 1 (weight 0.1).
NOVELTY = {
    "2+3": 0.8125 + 3 / 4 + 0 + 0.1,  # s = 3/4; "A:d" = 3 tokens; no new concept
    "4*5": 0.25 + 3.75 / 4 + 2 / 3 + 0.1,  # s = 2/4; tokens 4,4,4,3; form:n*n and ops:* new
    "12-3": 0.0 + 3 / 4 + 1.0 + 0.1,  # s = 1 (too easy); all three concepts new
    "(1+2)*3": 0.25 + 3 / 4 + 2 / 3 + 0.1,  # s = 2/4; form and ops new
}


class StubEngine:
    """Answers each prompt with ``respond(prompt, i, n)``: i its position in the call, n how often it came before."""

    def __init__(self, tokenizer, respond):
        self.tokenizer = tokenizer
        self.respond = respond

    def generate(self, prompts, params, seed):
        out, seen = [], {}
        for i, prompt in enumerate(prompts):
            text = self.respond(prompt, i, seen.get(prompt, 0))
            seen[prompt] = seen.get(prompt, 0) + 1
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Completion(prompt, encode_prompt(self.tokenizer, prompt), ids, text, [-1.0] * len(ids), "eos"))
        return out


def compact_script(prompt: str, i: int, n: int) -> str:
    """TEACHER in order for "E:..W:" prompts; each question's SOLUTIONS for "Q:<question>=?" prompts."""
    return TEACHER[i] if prompt.endswith("W:\n") else SOLUTIONS[prompt[2:-3]][n % 4]


def roles_of(samples, tokenizer) -> list[str]:
    """The role each update sample was trained as, by its prompt (as compact_script tells them apart)."""
    return ["generator" if tokenizer.decode(s.prompt_ids).endswith("W:\n") else "solver" for s in samples]


def stubbed(model_dir, *sets, respond=compact_script, run_update=True):
    recipe, _ = make_recipe(model_dir, "params.diversity=concepts", "params.l_base=4", "params.l_cap=4", *sets)
    engine = StubEngine(recipe.policy.tokenizer, respond)
    recipe.engine = lambda policy: engine
    updates = []
    update = recipe.trainer.update
    recipe.trainer.update = lambda samples: (updates.append(list(samples)), update(samples) if run_update else {})[1]
    return recipe, updates


def test_novelty_and_selection_by_hand(random_model_dir):
    recipe, updates = stubbed(random_model_dir)
    out = recipe.step(1)
    gens = [r for r in records(out) if r["role"] == "generator"]
    expected = [NOVELTY.get(t[2:], 0.0) for t in TEACHER]  # invalid outputs score 0
    assert [r["reward"] for r in gens] == pytest.approx(expected)
    by_group = np.array(expected).reshape(4, 4)
    assert np.var(by_group, axis=1) == pytest.approx([0.594795, 0.0, 0.0, 0.585029], abs=1e-6)
    assert {r["question_id"][:5] for r in gens if r["selected"]} == {"s1-g0", "s1-g3"}  # top-2 by variance
    # student: the two highest novelty scores, 4*5 (1.954) then 12-3 (1.85; the first of five copies)
    assert [r["question_id"] for r in gens if r["student_selected"]] == ["s1-g0-1", "s1-g1-0"]
    sols = [r for r in records(out) if r["role"] == "solver"]
    assert [r["reward"] for r in sols] == pytest.approx([1.1, 1.1, 0.1, 0.0] + [1.1] * 4)  # Eq. 6
    assert [r["label"] for r in sols] == ["20"] * 4 + ["9"] * 4
    assert [r["advantage"] for r in sols[4:]] == [0.0] * 4  # all agree: no signal
    g0 = by_group[0]
    a0 = (g0 - g0.mean()) / (g0.std(ddof=1) + 1e-4)
    assert [r["advantage"] for r in gens[:4]] == pytest.approx(a0)
    assert [r["advantage"] for r in gens[4:8]] == [None] * 4
    (samples,) = updates
    assert roles_of(samples, recipe.policy.tokenizer) == ["generator"] * 8 + ["solver"] * 8
    assert [s.advantage for s in samples[:4]] == pytest.approx(a0)
    assert len(recipe.pool) == 1 + 10  # the seed and every valid problem, solve rate regardless
    assert out.metrics["questions/valid_rate"] == pytest.approx(10 / 16)
    assert out.metrics["opensir/in_window"] == 5  # three "2+3" at 3/4, "4*5" and "(1+2)*3" at 2/4
    assert out.metrics["pool/concepts"] == len(recipe.pool.concepts)
    assert out.metrics["generator/advantage_abs_mean"] == pytest.approx(sum(abs(s.advantage) for s in samples[:8]) / 8)
    assert out.metrics["solver/advantage_abs_mean"] == pytest.approx(sum(abs(s.advantage) for s in samples[8:]) / 8)


def test_solve_rate_over_the_group_or_the_parsed_answers(random_model_dir):
    """The real labeller: "4*5" gets A:20, A:20, A:21 and an unparsed answer: 2/4 of the group, 2/3 of the parsed."""
    for denominator, rate in (("group", 0.5), ("parsed", 2 / 3)):
        recipe, _ = make_recipe(random_model_dir, f"params.solve_rate_denominator={denominator}")
        c = Candidate(0, 0, None, Generation("4*5", format_score=1.0))
        recipe.label(c, [Completion("Q:4*5=?\n", [1], [5], text, [-1.0]) for text in SOLUTIONS["4*5"]])
        assert c.vote.label == "20" and c.solve_rate == pytest.approx(rate)


@pytest.mark.parametrize("sets, roles", [
    (["frozen_generator=true"], ["solver"] * 8),
    (["params.train_roles=student"], ["solver"] * 8),
    (["params.train_roles=teacher"], ["generator"] * 8),
])
def test_trained_roles(random_model_dir, sets, roles):
    recipe, updates = stubbed(random_model_dir, *sets)
    teacher_before = {k: v.clone() for k, v in recipe.teacher.model.state_dict().items()}
    recipe.step(1)
    assert roles_of(updates[0], recipe.policy.tokenizer) == roles
    teacher_after = recipe.teacher.model.state_dict()
    frozen = all(torch.equal(teacher_before[k], teacher_after[k]) for k in teacher_before)
    assert frozen == (roles[0] == "solver")  # student-only: the teacher stays at its initial weights
    assert (recipe.teacher is recipe.policy) == (roles[0] == "generator")


def test_min_pool_diversity_of_a_step_is_the_nearest_pool_members_distance(random_model_dir):
    """Eq. 4 through the recipe: each valid problem's diversity is 1 - cos to its nearest problem of P_{t-1}."""
    recipe, _ = make_recipe(random_model_dir, "params.diversity=min_pool")
    # pool e1, e2, -e3; distances 1 - cos of c0 (0.4, 0.2, 1), c1 (1, 1, 2), c2 (1, 0.72, 0.04): nearest 0.2, 1, 0.04
    # (the mean distance would be 0.533, 1.333, 0.587; the farthest member's 1, 2, 1)
    vectors = {"p0": [1, 0, 0], "p1": [0, 1, 0], "p2": [0, 0, -1],
               "c0": [0.6, 0.8, 0], "c1": [0, 0, 1], "c2": [0, 0.28, -0.96]}
    recipe.embed_texts = lambda texts: np.array([vectors[t] for t in texts], dtype=np.float32)
    recipe.pool = ProblemPool(["p0", "p1", "p2"])
    recipe.pool_embeddings.clear()
    div, embedded = recipe.diversity([Generation(f"c{i}", concepts=[], format_score=1.0) for i in range(3)])
    np.testing.assert_allclose(div, [0.2, 1.0, 0.04], atol=1e-6)
    np.testing.assert_array_equal(embedded, np.array([vectors[f"c{i}"] for i in range(3)], dtype=np.float32))


def test_pool_persists_through_state_dict(random_model_dir):
    recipe, _ = stubbed(random_model_dir, "params.diversity=min_pool")
    recipe.step(1)
    state = json.loads(json.dumps(recipe.state_dict()))
    restored, _ = stubbed(random_model_dir, "params.diversity=min_pool")
    restored.load_state_dict(state)
    assert restored.pool.entries == recipe.pool.entries
    a, b = recipe.step(2), restored.step(2)  # embeddings of P_1 rebuilt from the restored texts
    assert [r.get("reference") for r in records(a)] == [r.get("reference") for r in records(b)]
    assert [r["reward"] for r in records(a)] == [r["reward"] for r in records(b)]


def test_run_resume_restores_the_pool(tmp_path, random_model_dir):
    def recipe_for(steps):
        recipe, config = make_recipe(random_model_dir, f"steps={steps}", "params.batch_size=8", "params.group_size=2",
                                     "rollout.max_new_tokens=8")
        read_generations(recipe, always_valid)
        return recipe, config

    straight, config = recipe_for(2)
    run(straight, config, tmp_path / "straight", progress=False)

    first, config = recipe_for(1)
    run(first, config, tmp_path / "resumed", progress=False)
    second, config = recipe_for(2)
    run(second, config, tmp_path / "resumed", resume=True, progress=False)
    assert len(second.pool) == len(straight.pool) == 1 + 2 * 8  # k * G = 4 * 2 valid problems per step
    assert second.pool.entries == straight.pool.entries

    def step2(root):
        return [json.loads(line) for line in (root / "samples" / "step_000002.jsonl").read_text().splitlines()]

    for x, y in zip(step2(tmp_path / "straight"), step2(tmp_path / "resumed")):
        assert x.get("reference") == y.get("reference")
        assert x["completion"] == y["completion"] and x["reward"] == pytest.approx(y["reward"])


def test_chat_prompts_parsing_and_formats(random_model_dir):
    """The chat path: Fig. 21/22 prompts, <problem>/<concepts> parsing, the boxed-phrase format (Eq. 6)."""
    good = "<think>sums</think><problem>What is 2+3?</problem><concepts>addition, integers</concepts>"
    solutions = ["Therefore, the final answer is: $\\boxed{5}$"] * 3 + ["maybe \\boxed{4}"]

    def respond(prompt, i, n):
        if "<concepts>...</concepts>" in prompt:
            assert "You are given a math problem: What is 1+1?" in prompt
            return good if i % 4 else "no tags"
        assert prompt.endswith("What is 2+3?") and "Therefore, the final answer is" in prompt
        return solutions[n % 4]

    recipe, updates = stubbed(random_model_dir, "params.student_format=phrase", respond=respond, run_update=False)
    recipe.policy.prompt_style = "chat"  # as a chat model on a chat task would be read (recipe.style follows)
    recipe.generator_format, recipe.student = OpenSIR.formats["chat"], STUDENT_WORLDS["chat"]
    recipe.pool = ProblemPool([STUDENT_WORLDS["chat"].seed])
    out = recipe.step(1)
    gens = [r for r in records(out) if r["role"] == "generator"]
    assert [r["valid"] for r in gens] == [False, True, True, True] * 4
    assert gens[1]["concepts"] == ["addition", "integers"] and gens[1]["solve_rate"] == 0.75
    # sol(3/4) = 0.8125 with G = 4; solutions longer than l_cap = 4 tokens; 2 of 3 concept slots new; format 1
    assert gens[1]["reward_terms"] == pytest.approx({"sol": 0.8125, "len": 1.0, "div": 2 / 3, "fmt": 1.0})
    sols = [r for r in records(out) if r["role"] == "solver"]
    assert [r["reward"] for r in sols[:4]] == pytest.approx([1.1, 1.1, 1.1, 0.0])  # the last lacks the phrase
    assert [r["answer"] for r in sols[:4]] == ["5", "5", "5", "4"] and sols[0]["label"] == "5"
    assert len(updates[0]) == 2 * 4 + 2 * 4
    assert recipe.pool.texts[1:] == ["What is 2+3?"] * 12 and recipe.pool.concepts == {"addition", "integers"}
