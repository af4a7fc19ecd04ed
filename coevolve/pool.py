"""A persistent problem pool: OpenSIR's P_t (Algorithm 1; paper §2.1).

The pool starts from seed problems, only grows (P_t = P_{t-1} ∪ Q_valid, no de-duplication, no
eviction), hands out reference problems uniformly at random with replacement, and round-trips
through a JSON-able dict so a recipe's ``state_dict`` saves it with each checkpoint. Each entry keeps
its concept list (for the concept-diversity reward, Eq. 10) and the step that added it (0 = seed).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PoolEntry:
    """One problem of the pool: its text, its concepts and the step that added it."""

    text: str
    concepts: tuple[str, ...] = ()
    step: int = 0


class ProblemPool:
    """An append-only list of problems with uniform sampling and JSON-able state."""

    def __init__(self, seeds: Sequence[str] = (), concepts: Sequence[Sequence[str]] | None = None):
        self._entries: list[PoolEntry] = []
        self._concepts: set[str] = set()
        self.add(seeds, step=0, concepts=concepts)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def entries(self) -> Sequence[PoolEntry]:
        """Every entry, oldest first."""
        return tuple(self._entries)

    @property
    def texts(self) -> list[str]:
        """Every problem text, oldest first."""
        return [e.text for e in self._entries]

    @property
    def concepts(self) -> frozenset[str]:
        """C_{P_t}: the union of the concepts of every problem in the pool (Eq. 10)."""
        return frozenset(self._concepts)

    def add(self, texts: Sequence[str], step: int, concepts: Sequence[Sequence[str]] | None = None) -> None:
        """Append problems (with their concept lists, if given) added at ``step``."""
        if concepts is not None and len(concepts) != len(texts):
            raise ValueError(f"{len(texts)} problems but {len(concepts)} concept lists")
        for i, text in enumerate(texts):
            entry = PoolEntry(text, tuple(concepts[i]) if concepts is not None else (), step)
            self._entries.append(entry)
            self._concepts.update(entry.concepts)

    def sample(self, rng: random.Random, k: int) -> list[str]:
        """``k`` reference problems drawn uniformly and independently (with replacement)."""
        if not self._entries:
            raise ValueError("cannot sample from an empty pool")
        return [e.text for e in rng.choices(self._entries, k=k)]

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: the entries in order."""
        return {"entries": [{"text": e.text, "concepts": list(e.concepts), "step": e.step} for e in self._entries]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the pool's contents with what :meth:`state_dict` returned."""
        self._entries, self._concepts = [], set()
        for item in state["entries"]:
            concepts = item.get("concepts", [])
            if not isinstance(item["text"], str) or not all(isinstance(c, str) for c in concepts):
                raise TypeError("a pool entry's text and concepts must be strings")
            self.add([item["text"]], step=int(item["step"]), concepts=[concepts])
