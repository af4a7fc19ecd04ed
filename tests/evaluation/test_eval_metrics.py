"""pass@k, avg@k and accuracy against hand-computed values."""

from math import comb

import pytest

from coevolve.evaluation.metrics import accuracy, avg_at_k, default_ks, mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),  # c / n
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (5, 2, 4, 1.0),  # n - c < k: some draw of 4 must hit a correct sample
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (10, 0, 5, 0.0),
        (10, 10, 1, 1.0),
        (16, 4, 16, 1.0),
    ],
)
def test_pass_at_k_hand_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_binomial_form_and_stays_stable_for_large_n() -> None:
    for n in (1, 7, 32):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - comb(n - c, k) / comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    # 1 - C(197,100)/C(200,100) = 1 - (100*99*98)/(200*199*198)
    assert pass_at_k(200, 3, 100) == pytest.approx(1 - (100 * 99 * 98) / (200 * 199 * 198), abs=1e-12)
    assert 0.0 < pass_at_k(10_000, 1, 1) == pytest.approx(1e-4)


@pytest.mark.parametrize(("n", "c", "k"), [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_pass_at_k_rejects_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_avg_and_mean_pass_at_k() -> None:
    correct = [[True, True, True, False], [False] * 4, [True, False, False, False]]
    assert avg_at_k(correct) == pytest.approx((0.75 + 0.0 + 0.25) / 3)
    assert mean_pass_at_k(correct, 1) == pytest.approx(avg_at_k(correct))  # pass@1 equals avg@k
    # pass@2 per question: 1 (only one wrong sample), 0, 1 - C(3,2)/C(4,2) = 0.5
    assert mean_pass_at_k(correct, 2) == pytest.approx((1.0 + 0.0 + 0.5) / 3)
    assert mean_pass_at_k(correct, 4) == pytest.approx(2 / 3)


def test_avg_at_k_weighs_every_question_equally_whatever_its_number_of_samples() -> None:
    # 1 of 1 correct, 0 of 3, 1 of 4: per question (1 + 0 + 0.25) / 3 = 0.4166667; pooled over the 8 samples it
    # would be 2 / 8 = 0.25
    correct = [[True], [False, False, False], [False, True, False, False]]
    assert avg_at_k(correct) == pytest.approx(1.25 / 3, abs=1e-12)
    # 2 of 2 and 1 of 6: per question (1 + 1/6) / 2 = 0.5833333; pooled, 3 / 8 = 0.375
    assert avg_at_k([[True, True], [True] + [False] * 5]) == pytest.approx(7 / 12, abs=1e-12)
    with pytest.raises(ValueError):
        avg_at_k([[True], []])


def test_accuracy_and_default_ks() -> None:
    assert accuracy([True, False, False, True, True]) == pytest.approx(0.6)
    with pytest.raises(ValueError):
        accuracy([])
    assert default_ks(1) == [1]
    assert default_ks(6) == [1, 2, 4, 6]
    assert default_ks(16) == [1, 2, 4, 8, 16]
