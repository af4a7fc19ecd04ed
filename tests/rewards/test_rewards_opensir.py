"""OpenSIR's reward pieces against hand-computed values from the spec (shared/spec/opensir.md §4) and the pool."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from coevolve.pool import ProblemPool
from coevolve.rewards.difficulty import triangular_solvability
from coevolve.rewards.format import length_score, parse_teacher_output, student_format_score
from coevolve.rewards.novelty import (
    PoolEmbeddings,
    concept_novelty,
    expression_concepts,
    group_variance,
    min_distance_diversity,
    novelty_score,
    top_indices,
    top_k_mean_diversity,
)

# --- solvability (Eq. 2): the §4.2 table -------------------------------------------------------------------------

@pytest.mark.parametrize("edge, expected", [
    ("inv_group", {0.375: 0.0, 0.5: 0.125, 0.625: 0.671875, 0.75: 0.78125, 0.875: 0.234375, 1.0: 0.0}),
    ("inv_levels", {0.375: 0.0, 0.5: 0.25, 0.625: 0.71875, 0.75: 0.8125, 0.875: 0.34375, 1.0: 0.0}),
])
def test_triangular_solvability_table(edge, expected):
    for s, value in expected.items():
        assert triangular_solvability(s, 0.5, 0.9, group_size=8, edge=edge) == pytest.approx(value)


def test_triangular_solvability_low_threshold_ablation():
    # spec §4.2: with s_min = 0.1, s_mid = 0.5: 0.125->0.18, 0.25->0.45, 0.375->0.73, 0.5->1.0, symmetric
    got = [triangular_solvability(i / 8, 0.1, 0.9, group_size=8) for i in range(1, 8)]
    assert got == pytest.approx([0.18, 0.45, 0.73, 1.0, 0.73, 0.45, 0.18], abs=0.005)
    assert got[0] == pytest.approx(1 - 0.875 * 0.375 / 0.4)


# --- length (Eq. 3) and novelty (Eq. 5) --------------------------------------------------------------------------

def test_length_score():
    assert length_score(350) == pytest.approx(0.35)
    assert length_score(1500) == pytest.approx(1.0)  # l_cap = l_base = 1000
    assert length_score(1500, l_cap=None) == pytest.approx(1.5)
    assert length_score(1500, l_base=1000, l_cap=1200) == pytest.approx(1.2)
    assert length_score(0) == 0.0
    assert length_score(16, l_base=64, l_cap=64) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        length_score(10, l_base=0)


def test_novelty_worked_example():
    # spec §4.6: s = 6/8, mean length 350, min distance 0.22, valid format
    sol = triangular_solvability(0.75, 0.5, 0.9, group_size=8)
    assert novelty_score(sol, length_score(350), 0.22, 1.0) == pytest.approx(1.45125)
    assert novelty_score(sol, length_score(350), 0.22, 1.0, w_div=0.0, w_len=0.0) == pytest.approx(0.88125)


# --- diversity (Eq. 4, the code's top-5 mean, Eq. 10) ------------------------------------------------------------

def _unit(deg: float) -> np.ndarray:
    return np.array([math.cos(math.radians(deg)), math.sin(math.radians(deg))])


def test_min_distance_diversity_known_vectors():
    pool = np.stack([_unit(0), _unit(90)])
    candidates = np.stack([_unit(45), _unit(180), _unit(0)])
    got = min_distance_diversity(candidates, pool)
    assert got == pytest.approx([1 - math.sqrt(0.5), 1.0, 0.0])
    assert min_distance_diversity(np.zeros((0, 2)), pool).shape == (0,)
    with pytest.raises(ValueError):
        min_distance_diversity(candidates, np.zeros((0, 2)))


# Pool e1, e2, -e3 and three candidates whose cosines to it are exact: (0.6, 0.8, 0), (0, 0, 1), (0, 0.28, -0.96).
NOVELTY_POOL = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, -1.0]])
NOVELTY_CANDIDATES = np.array([[0.6, 0.8, 0.0], [0.0, 0.0, 1.0], [0.0, 0.28, -0.96]])
# distances 1 - cos: c1 (0.4, 0.2, 1), c2 (1, 1, 2), c3 (1, 0.72, 0.04); the nearest member's: 0.2, 1, 0.04. The mean
# distance would be 0.5333, 1.3333, 0.5867 (and rank c3 above c1), the farthest member's 1, 2, 1.
NEAREST = [0.2, 1.0, 0.04]


def test_min_distance_diversity_is_the_distance_to_the_nearest_pool_member():
    got = min_distance_diversity(NOVELTY_CANDIDATES, NOVELTY_POOL)
    np.testing.assert_allclose(got, NEAREST, atol=1e-12)
    assert got[0] > got[2]  # c1's nearest member is farther than c3's (by the mean distance, c3 is the more novel)
    # the pool's order does not matter, and a candidate in the pool scores 0
    np.testing.assert_allclose(min_distance_diversity(NOVELTY_CANDIDATES, NOVELTY_POOL[::-1]), NEAREST, atol=1e-12)
    assert min_distance_diversity(NOVELTY_POOL[1:2], NOVELTY_POOL) == pytest.approx([0.0], abs=1e-12)


def test_top_k_mean_diversity_known_vectors():
    pool = np.stack([_unit(0), _unit(60), _unit(180)])
    candidates = np.stack([_unit(0), _unit(90)])
    # c1: batch {cos 90 = 0}, pool {1, 0.5, -1}: top-2 {1, 0.5} -> m = 0.75 -> 0.125
    # c2: batch {0}, pool {0, cos 30, 0}: top-2 {0.866, 0} -> (1 - 0.433) / 2
    assert top_k_mean_diversity(candidates, pool, k=2) == pytest.approx([0.125, (1 - math.sqrt(3) / 4) / 2])
    # k larger than the 4 neighbours: mean of all (self excluded): c1 -> (0 + 1 + 0.5 - 1) / 4 = 0.125 -> 0.4375
    assert top_k_mean_diversity(candidates, pool, k=5)[0] == pytest.approx(0.4375)
    # a duplicate in the batch scores 0 even far from the pool
    twins = np.stack([_unit(90), _unit(90)])
    assert top_k_mean_diversity(twins, np.stack([_unit(270)]), k=1) == pytest.approx([0.0, 0.0])


def test_concept_novelty():
    pool = {"addition", "fractions"}
    assert concept_novelty(["addition", "modular arithmetic", "primes"], pool) == pytest.approx(2 / 3)
    assert concept_novelty(["addition"], pool) == 0.0
    assert concept_novelty(["geometry"], pool) == pytest.approx(1 / 3)
    assert concept_novelty([], pool) == 0.0


def test_expression_concepts():
    assert expression_concepts("(3+4)*12") == ("form:(n+n)*n", "ops:*+", "digits:2")
    assert expression_concepts("1 + 1") == ("form:n+n", "ops:+", "digits:1")


# --- selection (Algorithm 1, lines 15-16) ------------------------------------------------------------------------

def test_group_variance_and_top_indices():
    assert group_variance([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.1875)  # population variance
    assert group_variance([1.0, 0.5, 0.0, 0.0], [True, True, False, False]) == pytest.approx(0.0625)
    assert group_variance([0.0, 0.0], [False, False]) == -1.0  # the code: a group without valid outputs
    assert top_indices([0.2, 0.5, 0.5, 0.1], 2) == [1, 2]  # ties: the earlier index first
    assert top_indices([0.2, 0.5], 5) == [1, 0]
    assert top_indices([], 3) == []


# --- format scores (§2.3, §5.1) ----------------------------------------------------------------------------------

GOOD = ("<think>uses a product</think><problem>What is 12 times 13?</problem>"
        "<concepts>Multiplication, place value</concepts>")


def test_teacher_output_paper_rules():
    out = parse_teacher_output(GOOD)
    assert out.valid and out.format_score == 1.0
    assert out.problem == "What is 12 times 13?" and out.concepts == ("multiplication", "place value")
    assert parse_teacher_output("<question>2+2?</question><concepts>a</concepts>").valid  # §2.3.1's tag
    assert not parse_teacher_output("<problem>2+2?</problem><concepts>a, b, c, d</concepts>").valid
    assert not parse_teacher_output("<problem>2+2?</problem>").valid
    assert not parse_teacher_output("<problem> </problem><concepts>a</concepts>").valid
    assert parse_teacher_output("no tags at all").format_score == 0.0


def test_teacher_output_code_rules():
    out = parse_teacher_output(GOOD, "code")
    assert out.valid and out.concepts == ("multiplication", "place value")  # both have >= 10 characters
    assert out.format_score == 1.0
    no_think = parse_teacher_output(GOOD.split("</think>")[1], "code")
    assert no_think.valid and no_think.format_score == 0.0  # the code's format reward also needs <think>
    short = parse_teacher_output("<problem>2+2=?</problem><concepts>integer arithmetic</concepts>", "code")
    assert not short.valid  # problem under 10 characters
    dropped = parse_teacher_output("<problem>What is 12 + 30?</problem><concepts>sums, integer addition</concepts>",
                                   "code")
    assert dropped.valid and dropped.concepts == ("integer addition",)
    assert not parse_teacher_output("<problem>What is 12 + 30?</problem><concepts>sums</concepts>", "code").valid
    assert not parse_teacher_output("<question>What is 12 + 30?</question><concepts>integer addition</concepts>",
                                    "code").valid
    assert not parse_teacher_output("<problem>What is 12 + 30?</problem><concepts>integer\naddition</concepts>",
                                    "code").valid


def test_student_format_score():
    assert student_format_score("so the answer is \\boxed{5}") == 1.0
    assert student_format_score("the answer is 5") == 0.0
    assert student_format_score("x\nTherefore, the final answer is: $\\boxed{5}$", "phrase") == 1.0
    assert student_format_score("Therefore, the final answer is: \\boxed{5}", "phrase") == 1.0
    assert student_format_score("\\boxed{5}", "phrase") == 0.0


# --- the pool ----------------------------------------------------------------------------------------------------

def test_pool_grows_samples_and_round_trips():
    pool = ProblemPool(["What is 1+1?"])
    pool.add(["2+3", "4*5"], step=1, concepts=[["addition"], ["multiplication", "products"]])
    pool.add(["2+3"], step=2)  # no de-duplication
    assert len(pool) == 4 and pool.texts == ["What is 1+1?", "2+3", "4*5", "2+3"]
    assert pool.concepts == {"addition", "multiplication", "products"}
    draws = pool.sample(random.Random(0), 200)
    assert set(draws) == set(pool.texts) and len(draws) == 200
    assert pool.sample(random.Random(1), 5) == pool.sample(random.Random(1), 5)

    restored = ProblemPool()
    restored.load_state_dict(json.loads(json.dumps(pool.state_dict())))
    assert restored.entries == pool.entries and restored.concepts == pool.concepts
    assert restored.sample(random.Random(3), 7) == pool.sample(random.Random(3), 7)
    with pytest.raises(ValueError):
        ProblemPool().sample(random.Random(0), 1)
    with pytest.raises(ValueError):
        pool.add(["a", "b"], step=3, concepts=[["x"]])


def test_pool_embeddings_are_cached_and_rebuilt_by_step():
    calls: list[list[str]] = []

    def fake_embed(texts):
        calls.append(list(texts))
        return np.array([[len(t), 1.0] for t in texts], dtype=np.float32)

    pool = ProblemPool(["1+1"])
    cache = PoolEmbeddings(fake_embed)
    assert cache.matrix(pool).shape == (1, 2) and calls == [["1+1"]]
    new = fake_embed(["2+3", "10*10"])
    pool.add(["2+3", "10*10"], step=1)
    cache.append(new)
    assert cache.matrix(pool).shape == (3, 2) and len(calls) == 2  # nothing embedded twice
    before = cache.matrix(pool)
    cache.clear()
    calls.clear()
    assert np.array_equal(cache.matrix(pool), before)
    assert calls == [["1+1"], ["2+3", "10*10"]]  # one call per step that added problems, as first embedded


def test_a_pool_state_of_the_wrong_type_is_refused():
    """A saved pool whose problems are not text raises (a damaged checkpoint), and the pool is left loadable."""
    pool = ProblemPool(["seed problem"])
    for bad in ({"entries": [{"text": 17, "step": 0}]}, {"entries": [{"text": "x", "step": 0, "concepts": [3]}]},
                {"entries": "nope"}):
        with pytest.raises((TypeError, KeyError, ValueError, AttributeError)):  # what the loop reads as damage
            pool.load_state_dict(bad)
    pool.load_state_dict({"entries": [{"text": "a problem", "step": 2, "concepts": ["sums"]}]})
    assert len(pool) == 1
