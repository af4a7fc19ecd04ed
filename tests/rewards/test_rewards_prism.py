"""R-Zero's and Prism's reward pieces against hand-computed values (spec prism.md §4.3-§4.8, §12.4 Tier A)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from coevolve.embeddings import ClusterSpace
from coevolve.rewards import coverage
from coevolve.rewards.coverage import CoverageCounts, prism_reward, rarity_bonus, reference_questions, zpd_gate
from coevolve.rewards.uncertainty import (
    bleu_distance_matrix,
    in_band,
    pool_filter_reasons,
    repetition_penalty,
    rzero_reward,
    uncertainty_reward,
)

E = math.exp(-1.0)


@pytest.mark.parametrize("p, expected", [(0.5, 1.0), (0.7, 0.6), (0.1, 0.2), (0.0, 0.0), (1.0, 0.0), (0.25, 0.5)])
def test_uncertainty_reward(p, expected):
    assert uncertainty_reward(p) == pytest.approx(expected)


def test_uncertainty_reward_rejects_out_of_range():
    with pytest.raises(ValueError):
        uncertainty_reward(1.5)


def test_bleu_distances_by_hand():
    d = bleu_distance_matrix(["3+5", "3+4", "3+4", ""], tokenize="char")
    assert np.allclose(d, d.T) and np.allclose(np.diag(d), 0.0)
    # characters 3,+,5 vs 3,+,4: p1 = 2/3, p2 = 1/2, p3 = 0 -> floor 0.1/1; effective order 3
    assert d[0, 1] == pytest.approx(1 - (2 / 3 * 1 / 2 * 0.1) ** (1 / 3))
    assert d[1, 2] == pytest.approx(0.0)
    assert d[3, 0] == d[3, 1] == 1.0  # an invalid output (empty) is far from everything


def test_repetition_penalty_three_identical_one_unrelated():
    words = ["what is the sum of two and three apples"] * 3 + ["find the area of a circle with radius five"]
    assert repetition_penalty(words).tolist() == pytest.approx([0.75, 0.75, 0.75, 0.25])
    chars = ["3+4*5"] * 3 + ["(12-7)*9"]
    assert repetition_penalty(chars, tokenize="char").tolist() == pytest.approx([0.75, 0.75, 0.75, 0.25])
    assert repetition_penalty(chars, tokenize="char", weight=2.0)[0] == pytest.approx(1.5)
    # two empty (invalid) outputs never cluster together
    assert repetition_penalty(["", "", "1+2"], tokenize="char").tolist() == pytest.approx([1 / 3] * 3)
    assert repetition_penalty(["1+2"]).tolist() == [1.0] and repetition_penalty([]).size == 0


def test_rzero_reward_paper_and_code_forms():
    assert rzero_reward(0.5, 0.25) == pytest.approx(0.75)
    assert rzero_reward(0.9, 0.5) == 0.0  # max(0, 0.2 - 0.5)
    assert rzero_reward(None, 0.5) == 0.0
    assert rzero_reward(0.3, 0.25, "code") == pytest.approx(0.05)  # min(0.3, 0.7) - 0.25
    assert rzero_reward(None, 0.5, "code") == pytest.approx(-1.5)


def test_band_and_pool_filters():
    assert in_band(9 / 10, 0.5, 0.9) and in_band(0.5, 0.5, 0.9)
    assert not in_band(0.9 + 1e-7, 0.5, 0.9) and not in_band(0.49, 0.5, 0.9)
    assert pool_filter_reasons("What is 2+3?", "5") == []
    assert pool_filter_reasons("What is 2+3?", None) == ["no_answer"]
    assert pool_filter_reasons("What is 2+3?", "None") == ["no_answer"]
    assert pool_filter_reasons("Prove that 7 is prime.", "7") == ["proof"]
    assert pool_filter_reasons("Show that x=1 and put it in a box", "1") == ["proof", "box"]
    assert pool_filter_reasons("Is 4 even?", "\\text{yes}") == ["text_answer"]
    # R-Zero's code lower-cases before its box / text checks; its only proof rule is "证明"
    assert pool_filter_reasons("Put the result in a BOX.", "1") == ["box"]
    assert pool_filter_reasons("Is 4 even?", "\\TEXT{yes}") == ["text_answer"]
    assert pool_filter_reasons("Prove that 7 is prime.", "7", english_proofs=False) == []
    assert pool_filter_reasons("证明 7 是质数", "7", english_proofs=False) == ["proof"]


@pytest.mark.parametrize("p, expected", [
    (0.5, 0.375), (0.6, 0.625), (0.625, 0.6875), (0.7, 0.875), (0.75, 1.0), (0.8, 0.875), (0.875, 0.6875),
    (0.9, 0.625), (9 / 10, 0.625), (0.49, 0.0), (0.91, 0.0), (0.0, 0.0), (1.0, 0.0)])
def test_zpd_gate_table(p, expected):
    assert zpd_gate(p) == pytest.approx(expected)


def test_worked_ema_and_rarity_example():
    n = CoverageCounts(4, gamma=0.99, alpha=1.0)
    assert n.rarity([0, 1, 2, 3]) == pytest.approx([0.3679] * 4, abs=1e-4)
    n.update([0, 0, 1])
    assert n.counts == pytest.approx([1.01, 1.00, 0.99, 0.99])
    assert n.counts.mean() == pytest.approx(0.9975)
    assert n.rarity([0, 1, 2, 3]) == pytest.approx([0.3633, 0.3670, 0.3707, 0.3707], abs=1e-4)


def test_rarity_is_scale_invariant_and_guarded():
    counts = np.array([1.0, 2.0, 3.0, 0.5])
    assert rarity_bonus(counts * 37.0, [0, 1, 2, 3]) == pytest.approx(rarity_bonus(counts, [0, 1, 2, 3]))
    assert rarity_bonus(counts, [1]) == pytest.approx([math.exp(-2.0 / 1.625)])
    assert rarity_bonus(np.zeros(3), [0]) == pytest.approx([1.0])  # n_bar guarded at 1e-8


def test_ema_closed_form_and_empty_batch():
    gamma, alpha = 0.9, 2.0
    n = CoverageCounts(3, gamma=gamma, alpha=alpha)
    batches = [[0, 0, 2], [], [1], [0, 1, 1, 1]]
    for ids in batches:
        n.update(ids)
    applied = [b for b in batches if b]  # the empty batch neither decays nor counts
    s = len(applied)
    for k in range(3):
        expected = gamma ** s * alpha + (1 - gamma) * sum(gamma ** (s - j) * b.count(k)
                                                         for j, b in enumerate(applied, start=1))
        assert n.counts[k] == pytest.approx(expected)
    assert n.updates == 3


def test_counts_round_trip_through_json():
    n = CoverageCounts(5, gamma=0.95)
    n.update([1, 1, 4])
    restored = CoverageCounts(5, gamma=0.95)
    restored.load_state_dict(json.loads(json.dumps(n.state_dict())))
    assert restored.counts.tolist() == n.counts.tolist() and restored.updates == 1
    with pytest.raises(ValueError):
        CoverageCounts(4).load_state_dict(n.state_dict())


@pytest.mark.parametrize("p, d, expected", [
    (0.7, E, 2.484), (0.75, E, 2.839), (0.75, 1.0, 6.0), (0.5, 1.0, 2.25), (0.95, 1.0, 0.0), (0.3, 1.0, 0.0)])
def test_prism_reward_values(p, d, expected):
    assert prism_reward(p, d, lam=5.0) == pytest.approx(expected, abs=1e-3)


def test_prism_reward_format_penalty_and_gate_override():
    assert prism_reward(None, 1.0, lam=5.0) == -1.0
    assert prism_reward(0.6, 0.5, lam=2.0, gate=1.0) == pytest.approx(2.0)  # band indicator instead of zpd
    assert prism_reward(0.75, 0.9, lam=0.0) == pytest.approx(1.0)  # no rarity bonus


def test_cluster_assignment_by_cosine():
    space = ClusterSpace(np.eye(3, dtype=np.float32), seed=0, encoder="hand", corpus_sha256="x", n_corpus=3)
    ids = space.assign(np.array([[0.1, 0.9, 0.0], [5.0, 1.0, 1.0], [0.0, 0.2, 0.3], [1.0, 1.0, 0.0]]))
    assert ids.tolist() == [1, 0, 2, 0]  # ties go to the lowest index


def test_math_reference_corpus_drops_math500_by_text():
    texts, info = reference_questions("math_minus_math500")
    assert info["math_test"] == 5000 and info["math500"] == 500
    assert info["overlap_by_text"] == 500 and len(texts) == info["n"] == 4500


def test_cluster_space_is_built_once_per_corpus(tmp_path, monkeypatch):
    texts = [f"{a}+{b}" for a in range(6) for b in range(6)]
    monkeypatch.setattr(coverage, "reference_questions", lambda corpus, **_: (texts, {"corpus": corpus}))
    calls = []

    def fake_embed(batch, path=None):
        calls.append(len(batch))
        rows = np.array([[int(t[0]), int(t[2]), 1.0] for t in batch], dtype=np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    monkeypatch.setattr(coverage, "embed", fake_embed)
    space, folder = coverage.cluster_space_for("arith", 4, root=tmp_path)
    again, folder_again = coverage.cluster_space_for("arith", 4, root=tmp_path)
    assert calls == [36] and folder == folder_again and folder.name.startswith("arith-k4-seed42-")
    assert np.array_equal(space.centroids, again.centroids) and again.info == {"corpus": "arith"}
    assert np.allclose(np.linalg.norm(again.centroids, axis=1), 1.0)
