"""Dynamic RL's reward terms and OpenSIR's triangular solvability against the specs' hand-computed values."""

from __future__ import annotations

from fractions import Fraction

import pytest

from coevolve.grading.vote import majority_vote
from coevolve.rewards.difficulty import solvability_edge, tent_reward, triangular_solvability
from coevolve.rewards.filters import filter_reasons, is_multi_part, is_proof, leaks_solution
from coevolve.rewards.similarity import answer_diversity, malformed_floor, question_diversity, token_overlap
from coevolve.rl.advantages import decomposed_advantages

# --- tent (Eq. 8) ---------------------------------------------------------------------------------------------------

# dynamic_rl spec §4.5, m = 16, tau = 3/4: r/16 <= 3/4 gives (r/16)/(3/4) = r/12; above, (1 - r/16)/(1/4) = (16 - r)/4.
TENT_TABLE = {0: 0, 1: Fraction(1, 12), 2: Fraction(1, 6), 3: Fraction(1, 4), 4: Fraction(1, 3), 6: Fraction(1, 2),
              8: Fraction(2, 3), 9: Fraction(3, 4), 10: Fraction(5, 6), 11: Fraction(11, 12), 12: 1,
              13: Fraction(3, 4), 14: Fraction(1, 2), 15: Fraction(1, 4), 16: 0}


@pytest.mark.parametrize("r", sorted(TENT_TABLE))
def test_tent_table(r):
    assert tent_reward(r / 16, 0.75) == pytest.approx(float(TENT_TABLE[r]), abs=1e-12)


def test_tent_edges_and_other_peaks():
    assert tent_reward(0.5, 0.5) == 1.0 and tent_reward(0.25, 0.5) == 0.5 and tent_reward(0.75, 0.5) == 0.5
    assert tent_reward(0.3, 0.0) == pytest.approx(0.7)  # tau = 0 guard: 1 - p
    assert tent_reward(0.0, 0.0) == 1.0
    assert tent_reward(0.3, 1.0) == pytest.approx(0.3)  # tau = 1: p
    assert tent_reward(1.0, 1.0) == 1.0
    with pytest.raises(ValueError):
        tent_reward(1.2, 0.75)
    with pytest.raises(ValueError):
        tent_reward(0.5, -0.1)


# --- triangular solvability (OpenSIR Eq. 2) -------------------------------------------------------------------------

# opensir spec §4.2, G = 8, [0.5, 0.9], s_mid = 0.7.
#   paper (edge 1/8):  kappa = (1 - 1/8)/0.2 = 4.375;  0.5 -> 1 - 4.375*0.2 = 0.125;
#                      0.625 -> 1 - 4.375*0.075 = 0.671875
#                      0.75 -> 1 - 4.375*0.05 = 0.78125;  0.875 -> 1 - 4.375*0.175 = 0.234375;  1.0 and <= 0.375 -> 0
#   code (edge 1/4, the four levels 4/8..7/8 in range): 1 - 0.75*|s - 0.7|/0.2:
#                      0.5 -> 0.25;  0.625 -> 0.71875;  0.75 -> 0.8125;  0.875 -> 0.34375
SOLVABILITY = [(0.0, 0, 0), (0.125, 0, 0), (0.375, 0, 0), (0.5, 0.125, 0.25), (0.625, 0.671875, 0.71875),
               (0.75, 0.78125, 0.8125), (0.875, 0.234375, 0.34375), (1.0, 0, 0)]


@pytest.mark.parametrize("s, paper, code", SOLVABILITY)
def test_triangular_solvability_table(s, paper, code):
    assert triangular_solvability(s, 0.5, 0.9, group_size=8) == pytest.approx(paper, abs=1e-12)
    assert triangular_solvability(s, 0.5, 0.9, group_size=8, edge="inv_levels") == pytest.approx(code, abs=1e-12)


def test_triangular_solvability_peak_and_wide_window():
    assert triangular_solvability(0.7, 0.5, 0.9, group_size=8) == pytest.approx(1.0)
    # s_min = 0.1 ablation (spec §4.2): s_mid = 0.5, kappa = 0.875/0.4; 0.25 -> 1 - 2.1875*0.25 = 0.453125 (~0.45),
    # 0.375 -> 1 - 2.1875*0.125 = 0.7265625 (~0.73), 0.125 -> 1 - 2.1875*0.375 = 0.1796875 (~0.18)
    assert triangular_solvability(0.25, 0.1, 0.9, group_size=8) == pytest.approx(0.453125)
    assert triangular_solvability(0.375, 0.1, 0.9, group_size=8) == pytest.approx(0.7265625)
    assert triangular_solvability(0.125, 0.1, 0.9, group_size=8) == pytest.approx(0.1796875)
    assert triangular_solvability(0.5, 0.1, 0.9, group_size=8) == pytest.approx(1.0)
    assert solvability_edge(0.5, 0.9, 8, "inv_levels") == 0.25
    with pytest.raises(ValueError):
        triangular_solvability(0.5, 0.9, 0.5, group_size=8)
    with pytest.raises(ValueError):
        solvability_edge(0.5, 0.9, 8, "other")


# --- S_q and R_dq (Eq. 10, 11) ---------------------------------------------------------------------------------------

def test_token_overlap_is_positional_over_the_shorter_length():
    assert token_overlap([1, 2, 3, 4], [1, 2, 5, 6, 7]) == 0.5  # positions 0, 1 of 4
    assert token_overlap([1, 2, 3, 4], [1, 9, 3]) == pytest.approx(2 / 3)  # positions 0, 2 of 3
    assert token_overlap([1, 2, 3], [1, 2, 3, 4, 5]) == 1.0  # a strict prefix counts as identical
    assert token_overlap([0, 1, 2, 3], [1, 2, 3]) == 0.0  # one inserted token shifts every position
    assert token_overlap([3, 2, 1], [1, 2, 3]) == pytest.approx(1 / 3)  # not a bag of tokens
    assert token_overlap([], [1, 2]) == 0.0
    assert token_overlap([5, 6], [5, 6]) == 1.0


def test_question_diversity_worked_example():
    # spec §4.9: S(q1,q2) = 1/2, S(q1,q3) = 2/3, S(q2,q3) = 1/3, q4 shares nothing; the sum includes S(q,q) = 1:
    # R_dq = [1/(1+1/2+2/3), 1/(1+1/2+1/3), 1/(1+2/3+1/3), 1/1] = [6/13, 6/11, 1/2, 1]
    r = question_diversity([[1, 2, 3, 4], [1, 2, 5, 6, 7], [1, 9, 3], [8, 8, 8, 8]])
    assert r == pytest.approx([6 / 13, 6 / 11, 0.5, 1.0])
    assert r == pytest.approx([0.4615, 0.5455, 0.5, 1.0], abs=1e-4)


def test_question_diversity_bounds_duplicates_and_empty():
    assert question_diversity([[1, 2]] * 4) == pytest.approx([0.25] * 4)  # K identical: the lower bound 1/K
    assert question_diversity([[1], [2], [3]]) == [1.0, 1.0, 1.0]  # nothing alike: the upper bound 1
    assert question_diversity([[], [], [1]]) == [1.0, 1.0, 1.0]  # empty questions resemble nothing but themselves
    assert question_diversity([]) == []


# --- R_da (Eq. 12) --------------------------------------------------------------------------------------------------

def test_answer_diversity_counts_equivalent_labels():
    # spec §4.9: labels 2, 5, 2, x -> q1 and q3 share "2": [1/2, 1, 1/2, 1]
    assert answer_diversity(["2", "5", "2", "x"], equivalent=None) == [0.5, 1.0, 0.5, 1.0]
    # exact-value equivalence of the vote's fast path: 0.5 = 1/2 = \frac{1}{2}; missing labels form one class
    assert answer_diversity(["0.5", "1/2", "\\frac{1}{2}", None, None, "3"], equivalent=None) == pytest.approx(
        [1 / 3, 1 / 3, 1 / 3, 0.5, 0.5, 1.0])
    # a custom S_a for pairs the fast path cannot decide
    assert answer_diversity(["x+1", "1+x", "y"], equivalent=lambda a, b: {a, b} == {"x+1", "1+x"}) == [0.5, 0.5, 1.0]


def test_answer_collapse_gives_the_lower_bound():
    # App. A.2: 31 of 32 labels "0" -> R_da = 1/31 for those, 1 for the odd one
    r = answer_diversity(["0"] * 31 + ["7"], equivalent=None)
    assert r[:31] == pytest.approx([1 / 31] * 31) and r[31] == 1.0


# --- the worked example of spec §4.9, end to end through the shared pieces -------------------------------------------

def test_worked_example_advantages():
    answers = [["2", "2", "2", "2"], ["5", "5", "5", "7"], ["2", "3", None, "4"], ["x", "x", "y", "y"]]
    votes = [majority_vote(a, equivalent=None) for a in answers]
    assert [v.label for v in votes] == ["2", "5", "2", "x"]  # q3: first maximiser among 2, 3, 4; NONE never wins
    assert [v.support for v in votes] == [4, 3, 1, 2]
    filtered = [False, False, False, True]  # q4 asks for a proof
    r_q = [0.0 if f else tent_reward(v.p, 0.75) for v, f in zip(votes, filtered)]
    assert r_q == pytest.approx([0.0, 1.0, 1 / 3, 0.0])
    r_dq = question_diversity([[1, 2, 3, 4], [1, 2, 5, 6, 7], [1, 9, 3], [8, 8, 8, 8]])
    r_da = answer_diversity([v.label for v in votes], equivalent=None)
    assert r_da == [0.5, 1.0, 0.5, 1.0]
    # Z(R_q): mean 1/3, centred [-1/3, 2/3, 0, -1/3], unbiased var (6/9)/3 = 2/9, std 0.471405
    #   -> [-0.7071, 1.4142, 0, -0.7071]
    # Z(R_dq) = [-0.6577, -0.3236, -0.5046, 1.4859];
    # Z(R_da): mean 3/4, std sqrt(0.25/3) -> [-0.866, 0.866, -0.866, 0.866]
    # A_q = 1e-3 Z(R_q) + 0.1 Z(R_dq) + Z(R_da)
    weights = {"R_q": 1e-3, "R_dq": 0.1, "R_da": 1.0}
    terms = {"R_q": r_q, "R_dq": r_dq, "R_da": r_da}
    a_q = decomposed_advantages(terms, weights, [0] * 4)
    assert a_q == pytest.approx([-0.9325, 0.8351, -0.9165, 1.0139], abs=1e-4)
    assert decomposed_advantages(terms, weights, [0] * 4, unbiased=False) == pytest.approx(
        [-1.0768, 0.9643, -1.0583, 1.1708], abs=1e-4)  # population std (spec §4.9)
    # A_s: R_s = agreement with l(q), zeroed for the filtered q4; z-scored within each question's 4 solutions
    r_s = [[0.0] * 4 if f else [float(x) for x in v.agree] for v, f in zip(votes, filtered)]
    a_s = decomposed_advantages({"R_s": sum(r_s, [])}, {"R_s": 1.0}, [i for i in range(4) for _ in range(4)])
    assert a_s == pytest.approx([0, 0, 0, 0, 0.5, 0.5, 0.5, -1.5, 1.5, -0.5, -0.5, -0.5, 0, 0, 0, 0], abs=1e-5)


def test_question_and_solution_advantages_by_hand():
    # A_q over three questions: Z(R_q) = [-1, 1, 0]; Z(R_dq) = [-0.8729, -0.2182, 1.0911] (mean 0.5667, std 0.3055);
    # Z(R_da) = [1.1547, -0.5774, -0.5774]; A_q = 1e-3 Z(R_q) + 0.1 Z(R_dq) + Z(R_da); reversing R_dq moves its term.
    base = {"R_q": [0.0, 1.0, 0.5], "R_dq": [0.3, 0.5, 0.9], "R_da": [1.0, 0.5, 0.5]}
    weights = {"R_q": 1e-3, "R_dq": 0.1, "R_da": 1.0}
    assert decomposed_advantages(base, weights, [0, 0, 0]) == pytest.approx([1.06641, -0.59817, -0.46824], abs=1e-4)
    assert decomposed_advantages({**base, "R_dq": [0.9, 0.5, 0.3]}, weights, [0, 0, 0]) == pytest.approx(
        [1.26281, -0.59817, -0.66464], abs=1e-4)
    # A_s within each question's solutions: [1, 0, 1] -> (r - 2/3) / 0.5774, [1, 0, 0] -> (r - 1/3) / 0.5774
    a_s = decomposed_advantages({"R_s": [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]}, {"R_s": 1.0}, [0, 0, 0, 1, 1, 1])
    assert a_s == pytest.approx([0.57735, -1.1547, 0.57735, 1.1547, -0.57735, -0.57735], abs=1e-4)


# --- filters ---------------------------------------------------------------------------------------------------------

TRIANGLE = ("In triangle ABC, vertex A has an angle of 163°, side BC measures 1.9 units, and vertex C has an angle of "
            "7°. Find:\n1. The area of triangle ABC.\n2. The circumradius of triangle ABC.\n3. The inradius of "
            "triangle ABC.\n4. The semiperimeter of triangle ABC.")
NO_ANSWER = "Find two integers x and y such that x^2 + y^2 = 7."


def test_rule_1_proofs():
    assert is_proof("Prove that the square root of 2 is irrational.")
    assert is_proof("Show, or prove, that n^2 >= n.")
    assert not is_proof("How much does the score improve from 70 to 84?")  # \bprove: not inside "improve"
    assert filter_reasons("Prove that 7 is prime.") == ["proof"]


def test_rule_2_multi_part():
    assert is_multi_part(TRIANGLE)  # the paper's sub-question example (an enumeration)
    assert is_multi_part("What is 2+2? What is 3+3?")
    assert is_multi_part("Find the area and the perimeter of a 3 by 4 rectangle.")
    assert is_multi_part("Compute the mean and determine the median of 1, 2, 6.")
    assert is_multi_part("Solve for x: (a) 2x = 4 (b) 3x = 9")
    assert not is_multi_part("What is the sum of 3 and 4?")
    assert not is_multi_part("A side measures 1.9 units and 2.5 units. What is the total?")  # decimals, not a list
    # Table 3's no-answer example is a single request ("x and y" is not a second one) in the narrow form; the
    # paper's literal "find ... and ..." removes it, along with harmless questions
    assert not is_multi_part(NO_ANSWER)
    assert is_multi_part(NO_ANSWER, broad=True)
    assert is_multi_part("Find the sum of 3 and 4.", broad=True)
    assert not is_multi_part("Find the sum of 3 and 4.")


def test_rule_3_leaked_solutions():
    assert leaks_solution("What is 12*7? To solve this, multiply.")
    assert leaks_solution("Compute 3+4. Answer: 7")
    assert leaks_solution("Evaluate 2^5. The final answer is \\boxed{32}")
    assert leaks_solution("Let's break down the sum 1+2+3.")
    assert not leaks_solution("What is the solution of 2x + 3 = 7?")  # case-sensitive: "solution" alone is fine
    assert filter_reasons("Prove 1+1=2. Find x and the y? Solution: 2") == ["proof", "multi_part", "leak"]
    assert filter_reasons("Solve the equation 2x + 3 = 7.") == []


def test_malformed_outputs_take_the_batch_minimum_of_a_diversity_term():
    # R_dq of [q0, empty, q1, empty]: the empty ones resemble nothing, so Eq. 10 gives them 1, the batch maximum
    raw = question_diversity([[1, 2, 3], [], [1, 2, 4], []])  # S(q0, q1) = 2/3 -> 1/(1 + 2/3) = 3/5 each
    assert raw == pytest.approx([0.6, 1.0, 0.6, 1.0])
    assert malformed_floor(raw, [False, True, False, True]) == pytest.approx([0.6, 0.6, 0.6, 0.6])
    assert malformed_floor([0.5, 1.0, 0.25], [False, False, True]) == [0.5, 1.0, 0.5]
    assert malformed_floor([1.0, 1.0], [True, True]) == [1.0, 1.0]  # nothing well-formed: unchanged
    with pytest.raises(ValueError):
        malformed_floor([1.0], [True, False])
