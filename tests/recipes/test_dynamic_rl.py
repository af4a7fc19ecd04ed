"""The dynamic_rl recipe: one step by hand with canned completions, routing of advantages, frozen generator, a step on
a random model, and a short run through the training loop."""

from __future__ import annotations

import json
from collections import defaultdict

import helpers
import pytest
import torch
from helpers import read_generations, records

from coevolve.formats import Generation
from coevolve.recipes import resolve
from coevolve.recipes.dynamic_rl import Z0, DynamicRL, parse_paper_question
from coevolve.rollout import Completion
from coevolve.rollout.hf import encode_prompt
from coevolve.tasks.math import INSTRUCTION


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Models this small gain nothing from a second thread and lose much of their speed when the cores are busy."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class CannedEngine:
    """A rollout engine that answers each prompt with its scripted completions, in order (cycling)."""

    def __init__(self, tokenizer, script: dict[str, list[str]]):
        self.tokenizer, self.script, self.served = tokenizer, script, defaultdict(int)

    def generate(self, prompts, params, seed):
        out = []
        for prompt in prompts:
            texts = self.script[prompt]
            text = texts[self.served[prompt] % len(texts)]
            self.served[prompt] += 1
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            out.append(Completion(prompt, encode_prompt(self.tokenizer, prompt), ids, text, [0.0] * len(ids), "eos"))
        return out


def make_recipe(model_dir, *sets: str) -> DynamicRL:
    recipe = helpers.make_recipe("dynamic_rl", model_dir, *sets)
    assert isinstance(recipe, DynamicRL)
    return recipe


def roles_of(recipe: DynamicRL, samples) -> list[str]:
    """The role each update sample was trained as: a question's prompt is z_0, a solution's is its question's."""
    z0 = encode_prompt(recipe.policy.tokenizer, recipe.z0)
    return ["generator" if s.prompt_ids == z0 else "solver" for s in samples]


def spy_updates(recipe: DynamicRL) -> list:
    """Record the samples of every policy update (the update itself still runs)."""
    batches, update = [], recipe.trainer.update

    def spy(samples):
        batches.append(list(samples))
        return update(samples)

    recipe.trainer.update = spy
    return batches


# Three arithmetic questions x four answers, plus one malformed output ("Q:7" has no operation):
#   q0 1+2    answers 3 3 3 4      l = 3, r = 3, p = 3/4 -> R_q = 1;     R_s = [1 1 1 0]
#   q1 1+2*3  answers 7 7 7 7      l = 7, r = 4, p = 1   -> R_q = 0;     R_s = [1 1 1 1]
#   q2 5-2    answers 3 2 NONE 9   l = 3 (first of three singletons), r = 1, p = 1/4 -> R_q = 1/3; R_s = [1 0 0 0]
#   q3 malformed: not solved, filtered, p = 0 -> R_q = 0, label NONE
ARITH_SCRIPT = {
    "W:\n": ["Q:1+2", "Q:1+2*3", "Q:5-2", "Q:7"],
    "Q:1+2=?\n": ["S:1+2=3\nA:3", "S:1+2=3\nA:3", "S:1+2=3\nA:3", "S:1+2=4\nA:4"],
    "Q:1+2*3=?\n": ["S:2*3=6;1+6=7\nA:7"],
    "Q:5-2=?\n": ["A:3", "A:2", "S:5-2=", "A:9"],
}
# S_q on characters: S(q0,q1) = 3/3 ("1+2" is a prefix of "1+2*3"), S(q0,q2) = S(q1,q2) = 1/3 (last of "1+2" vs "5-2"),
# the empty q3 resembles nothing:  R_dq = [1/(1+1+1/3), 1/(1+1+1/3), 1/(1+1/3+1/3), 1] = [3/7, 3/7, 3/5, 1]
# labels 3, 7, 3, NONE:            R_da = [1/2, 1, 1/2, 1]
# q3 is malformed, so it takes the minimum over q0-q2 of each diversity term (our reading): R_dq 3/7, R_da 1/2.
R_Q, R_DQ, R_DA = [1.0, 0.0, 1 / 3, 0.0], [3 / 7, 3 / 7, 3 / 5, 3 / 7], [0.5, 1.0, 0.5, 0.5]
# Z(R_q):  mean 1/3, centred [2/3, -1/3, 0, -1/3], unbiased std sqrt((6/9)/3) = 0.471405
#          -> [1.414214, -0.707107, 0, -0.707107]
# Z(R_dq): three values a = 3/7 and one b = 3/5, d = b - a: centred [-d/4, -d/4, 3d/4, -d/4], unbiased std d/2
#          -> [-1/2, -1/2, 3/2, -1/2]
# Z(R_da): three 1/2 and one 1 (q1), same shape -> [-1/2, 3/2, -1/2, -1/2]
# A_q = 1e-3 Z(R_q) + 0.1 Z(R_dq) + 1 Z(R_da): the malformed q3 now has the lowest question advantage
A_Q = [0.001414 - 0.05 - 0.5, -0.000707 - 0.05 + 1.5, 0.15 - 0.5,
       -0.000707 - 0.05 - 0.5]  # = [-0.548586, 1.449293, -0.35, -0.550707]
# A_s (unbiased std within each question): q0 mean 3/4, std 1/2 -> [.5 .5 .5 -1.5]; q1 zero variance -> 0;
# q2 mean 1/4, std 1/2 -> [1.5 -.5 -.5 -.5]
A_S = [[0.5, 0.5, 0.5, -1.5], [0.0] * 4, [1.5, -0.5, -0.5, -0.5]]


@pytest.fixture
def canned_arith(random_model_dir):
    recipe = make_recipe(random_model_dir, "params.n=4", "params.m=4")
    engine = CannedEngine(recipe.policy.tokenizer, ARITH_SCRIPT)
    recipe.engine = lambda policy: engine
    return recipe


def test_one_step_by_hand(canned_arith):
    batches = spy_updates(canned_arith)
    out = canned_arith.step(1)
    gens = [r for r in records(out) if r["role"] == "generator"]
    sols = [r for r in records(out) if r["role"] == "solver"]
    assert len(gens) == 4 and len(sols) == 12
    assert [g["question"] for g in gens] == ["1+2", "1+2*3", "5-2", None]
    assert [g["valid"] for g in gens] == [True, True, True, False]
    assert [g["filtered"] for g in gens] == [[], [], [], ["malformed"]]
    assert [g["label"] for g in gens] == ["3", "7", "3", None]
    assert [g["support"] for g in gens] == [3, 4, 1, 0]
    assert [g["solve_rate"] for g in gens] == [0.75, 1.0, 0.25, None]
    for term, want in (("R_q", R_Q), ("R_dq", R_DQ), ("R_da", R_DA)):
        assert [g["reward_terms"][term] for g in gens] == pytest.approx(want)
    assert [g["advantage"] for g in gens] == pytest.approx(A_Q, abs=1e-5)
    assert min(range(4), key=lambda i: gens[i]["advantage"]) == 3  # the output with no question ranks last
    assert [g["reward"] for g in gens] == pytest.approx(
        [1e-3 * q + 0.1 * dq + da for q, dq, da in zip(R_Q, R_DQ, R_DA)])
    assert [s["answer"] for s in sols] == ["3", "3", "3", "4", "7", "7", "7", "7", "3", "2", None, "9"]
    assert [s["reward"] for s in sols] == [1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0]
    assert [s["advantage"] for s in sols] == pytest.approx(sum(A_S, []), abs=1e-5)
    assert {s["label_source"] for s in sols} == {"majority"} and {s["phase"] for s in sols} == {"solve"}
    assert [s["question_id"] for s in sols[:4]] == ["s1-q0"] * 4 and gens[0]["question_id"] == "s1-q0"
    # the oracle is recorded for analytics (labels 3, 7, 3 are right) and never used as a reward
    assert [g["oracle"]["label_correct"] for g in gens[:3]] == [True, True, True] and gens[3]["oracle"] is None
    assert [s["oracle"]["correct"] for s in sols[8:]] == [True, False, None, False]
    # one update of the single policy; Eq. 14's two means: A_q scaled by 16/4, A_s by 16/12 in the pooled batch
    assert len(batches) == 1
    assert roles_of(canned_arith, batches[0]) == ["generator"] * 4 + ["solver"] * 12
    assert [s.advantage for s in batches[0][:4]] == pytest.approx([4 * a for a in A_Q], abs=1e-4)
    assert [s.advantage for s in batches[0][4:]] == pytest.approx([4 / 3 * a for a in sum(A_S, [])], abs=1e-4)
    # question advantages go on the question tokens (the z_0 completion), solution advantages on solution tokens
    z0_ids = encode_prompt(canned_arith.policy.tokenizer, "W:\n")
    assert all(s.prompt_ids == z0_ids for s in batches[0][:4])
    assert all(s.prompt_ids != z0_ids for s in batches[0][4:])
    m = out.metrics
    assert m["reward/R_q"] == pytest.approx(1 / 3) and m["reward/R_da"] == pytest.approx(0.625)
    assert m["reward/R_s"] == pytest.approx(8 / 12) and m["solver/reward_mean"] == pytest.approx(8 / 12)
    assert m["generator/reward_mean"] == pytest.approx(sum(g["reward"] for g in gens) / 4)
    assert m["questions/valid_rate"] == 0.75 and m["questions/filtered_rate"] == 0.25
    assert m["questions/solve_rate_mean"] == pytest.approx(2 / 3)
    assert m["questions/all_agree_rate"] == pytest.approx(1 / 3)
    assert m["questions/unique_label_ratio"] == pytest.approx(0.75)  # classes 3, 7, NONE among 4 labels
    assert m["solver/none_rate"] == pytest.approx(1 / 12)
    assert m["generator/advantage_abs_mean"] == pytest.approx(sum(abs(a) for a in A_Q) / 4, abs=1e-5)
    assert m["solver/advantage_abs_mean"] == pytest.approx(sum(abs(a) for a in sum(A_S, [])) / 12, abs=1e-5)
    assert m["policy/optimizer_steps"] == 1  # paper's step: one whole-batch AdamW step
    assert m["tokens/generator"] == sum(g["tokens"] for g in gens)
    assert m["tokens/solver"] == sum(s["tokens"] for s in sols)
    assert {"time/generate_s", "time/solve_s", "time/reward_s", "time/update_s", "policy/loss"} <= set(m)


def test_ablation_switches_and_pooled_loss(random_model_dir):
    recipe = make_recipe(random_model_dir, "params.n=4", "params.m=4", "params.question_diversity=false",
                         "params.answer_diversity=false", "params.loss_terms=pooled")
    engine = CannedEngine(recipe.policy.tokenizer, ARITH_SCRIPT)
    recipe.engine = lambda policy: engine
    batches = spy_updates(recipe)
    gens = [r for r in records(recipe.step(1)) if r["role"] == "generator"]
    # only R_q is left: A_q = 1e-3 Z(R_q); the diversity rewards are still computed and logged
    assert [g["advantage"] for g in gens] == pytest.approx([1e-3 * z for z in (1.414214, -0.707107, 0, -0.707107)],
                                                           abs=1e-8)
    assert [g["reward_terms"]["R_dq"] for g in gens] == pytest.approx(R_DQ)
    assert [s.advantage for s in batches[0][:4]] == pytest.approx([g["advantage"] for g in gens])  # pooled: unscaled


def test_frozen_generator_trains_only_solutions(random_model_dir):
    recipe = make_recipe(random_model_dir, "params.n=4", "params.m=4", "frozen_generator=true")
    engine = CannedEngine(recipe.policy.tokenizer, ARITH_SCRIPT)
    recipe.engine = lambda policy: engine
    batches = spy_updates(recipe)
    out = recipe.step(1)
    assert set(roles_of(recipe, batches[0])) == {"solver"} and len(batches[0]) == 12
    assert [s.advantage for s in batches[0]] == pytest.approx(sum(A_S, []), abs=1e-5)  # one role: no rescaling
    assert len([r for r in records(out) if r["role"] == "generator"]) == 4  # still generated, rewarded and logged


def test_math_task_uses_the_paper_prompt_and_filters(random_model_dir):
    recipe = make_recipe(random_model_dir, "task=math", "params.n=3", "params.m=2")
    assert recipe.z0 == Z0 and recipe.question_sampling.stop == ("Solution:",)
    assert recipe.question_sampling.max_new_tokens == recipe.params.question_max_tokens
    script = {
        Z0: ["Question: What is 2+3?\nSolution:", "Sure!\nQuestion: Prove that 7 is prime.\nSolution:", "Hello"],
        f"What is 2+3?\n{INSTRUCTION}": ["It is \\boxed{5}.", "\\boxed{5}"],
        f"Prove that 7 is prime.\n{INSTRUCTION}": ["\\boxed{1}", "\\boxed{2}"],
    }
    engine = CannedEngine(recipe.policy.tokenizer, script)
    recipe.engine = lambda policy: engine
    out = recipe.step(1)
    gens = [r for r in records(out) if r["role"] == "generator"]
    assert [g["question"] for g in gens] == ["What is 2+3?", "Prove that 7 is prime.", None]
    assert [g["filtered"] for g in gens] == [[], ["proof"], ["malformed"]]
    # filtered: R_q = 0 and R_s = 0 (the proof question's p(q) = 1/2 would give R_q = 2/3); diversity terms stay
    assert [g["reward_terms"]["R_q"] for g in gens] == [0.0, 0.0, 0.0]  # q0: p = 1 -> 0
    assert [g["reward_terms"]["R_da"] for g in gens] == [1.0, 1.0, 1.0]  # labels 5, 1, NONE
    sols = [r for r in records(out) if r["role"] == "solver"]
    assert [s["reward"] for s in sols] == [1.0, 1.0, 0.0, 0.0] and [s["advantage"] for s in sols] == [0, 0, 0, 0]
    assert out.metrics["questions/filter_proof"] == pytest.approx(1 / 3)


def test_parse_paper_question():
    def completion(text: str, finish: str = "stop") -> Completion:
        return Completion("z0", [], [], text, [], finish)

    assert parse_paper_question(completion("Question: What is 1+1?\nSolution:")) == Generation("What is 1+1?")
    assert parse_paper_question(completion("Intro\nQuestion:  Find x if 2x=4. ", "eos")).question == "Find x if 2x=4."
    for malformed in (completion("Question: What is", "length"),  # cut before "Solution:"
                      completion("What is 1+1?\nSolution:"),  # no "Question:"
                      completion("Question: \nSolution:")):  # empty
        assert parse_paper_question(malformed) == Generation(None) and not parse_paper_question(malformed).valid


def test_step_on_a_random_model(random_model_dir):
    recipe = make_recipe(random_model_dir, "params.n=3", "params.m=2", "params.question_max_tokens=8",
                         "rollout.max_new_tokens=8")
    # a random model writes no parsable question: give each output a question so the solver role runs too
    read_generations(recipe, lambda output, style: Generation(f"{len(output.token_ids)}+{output.text.count('1')}"))
    batches = spy_updates(recipe)
    out = recipe.step(1)
    gens = [r for r in records(out) if r["role"] == "generator"]
    sols = [r for r in records(out) if r["role"] == "solver"]
    assert len(gens) == 3 and len(sols) == 6
    fields = {"step", "iteration", "role", "phase", "prompt", "completion", "question", "question_id", "valid",
              "answer",
              "label", "label_source", "solve_rate", "reward", "reward_terms", "advantage", "tokens", "oracle"}
    assert all(fields <= set(r) for r in records(out))
    assert all(set(g["reward_terms"]) == {"R_q", "R_dq", "R_da"} for g in gens)
    assert all(set(s["reward_terms"]) == {"R_s"} for s in sols)
    roles = roles_of(recipe, batches[0])
    generator_samples = [s for s, role in zip(batches[0], roles) if role == "generator"]
    assert [s.advantage for s in generator_samples] == pytest.approx([3 * g["advantage"] for g in gens])  # 9/3
    assert [s.advantage for s, role in zip(batches[0], roles) if role == "solver"] == pytest.approx(
        [1.5 * s["advantage"] for s in sols])  # 9/6
    assert out.metrics["policy/optimizer_steps"] == 1


def test_presets_resolve():
    for preset in ("small", "paper"):
        config, params, _ = resolve("dynamic_rl", preset=preset)
        assert config.recipe == "dynamic_rl"
    config, params, _ = resolve("dynamic_rl", preset="paper")
    assert (params.n, params.m, params.tau, params.lambda_q, params.lambda_dq, params.lambda_da, params.lambda_s) == (
        32, 16, 0.75, 1e-3, 0.1, 1.0, 1.0)
    assert config.task == "math" and config.train.lr == 1e-6 and config.rollout.max_new_tokens == 3072
    assert params.question_max_tokens == 1024
    config, params, _ = resolve("dynamic_rl", preset="small")
    assert config.model == "tiny-arith" and config.task == "arith"


def test_run_through_the_loop(random_model_dir, tmp_path):
    from coevolve.loop import run

    config, params, cls = resolve("dynamic_rl", sets=[
        f"model={random_model_dir}", "steps=2", "params.n=3", "params.m=2", "params.question_max_tokens=8",
        "rollout.max_new_tokens=8", "eval_sets=[arith_l1]", "eval_limit=2", "eval_max_new_tokens=4"])
    summary = run(cls(config, params), config, tmp_path / "run", progress=False)
    assert summary["steps"] == 2 and summary["recipe"] == "dynamic_rl"
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "generator/reward_mean" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    samples = [json.loads(line)
               for line in (tmp_path / "run" / "samples" / "step_000002.jsonl").read_text().splitlines()]
    assert sum(r["role"] == "generator" for r in samples) == 3
    assert (tmp_path / "run" / "checkpoints" / "step_000002").is_dir()
