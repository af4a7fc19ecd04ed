"""PasoDoble's proposer reward pieces (arXiv:2511.11881 §3.3): Jaccard-history diversity, the gated
difficulty reward and the code's answer-leak check.

- Diversity (§3.3): r_div(q) = 1 - |{h in H : Jaccard(Tok(q), Tok(h)) > tau_sim}| / |H| over the last |H| questions;
  1 for an empty history; two empty token sets count as similar (Jaccard 1).
- Reward (§3.3): r_p = (offset - p) + w * r_div if p > tau_low and r_div passes the gate (paper: r_div >= tau_div;
  code: r_div > tau_div), else 0.
- Leak check (released code only): p is set to 0 when the question or the answer is missing, the question is a substring
  of the answer, the question contains ``\\boxed``, or the answer occurs in the question (``raw``: plain substring, as
  the code; ``word``: not inside a longer word or number, so answer 2 does not leak through "12").
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Literal

LeakMode = Literal["off", "raw", "word"]
DiversityGate = Literal["ge", "gt"]


def jaccard(a: frozenset[int] | set[int], b: frozenset[int] | set[int]) -> float:
    """|a ∩ b| / |a ∪ b|; 1 for two empty sets (our convention)."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def history_diversity(tokens: frozenset[int], history: Sequence[frozenset[int]], tau_sim: float) -> float:
    """r_div: the share of history questions that are not near-duplicates (Jaccard > tau_sim) of this one."""
    if not history:
        return 1.0
    return 1.0 - sum(jaccard(tokens, h) > tau_sim for h in history) / len(history)


def proposer_reward(p: float, r_div: float, *, tau_low: float = 0.2, w: float = 0.2, tau_div: float = 0.3,
                    offset: float = 1.1, gate: DiversityGate = "ge") -> float:
    """r_p (§3.3): difficulty offset - p plus w * r_div when p > tau_low and r_div passes tau_div, else 0."""
    diverse = r_div >= tau_div if gate == "ge" else r_div > tau_div
    return (offset - p) + w * r_div if p > tau_low and diverse else 0.0


def leaks_answer(question: str | None, answer: str | None, mode: LeakMode = "raw") -> bool:
    """The released code's pre-check on (q, a*): True means the pair is invalid and its pass rate becomes 0."""
    if mode == "off":
        return not question or not answer
    if not question or not answer:
        return True
    if question in answer or "\\boxed" in question:
        return True
    if mode == "raw":
        return answer in question
    return re.search(rf"(?<![\w.]){re.escape(answer)}(?![\w.])", question) is not None


class JaccardHistory:
    """H: a FIFO of the token sets of the last ``size`` proposed questions (§3.3)."""

    def __init__(self, size: int = 100):
        self.items: deque[frozenset[int]] = deque(maxlen=size)

    def __len__(self) -> int:
        return len(self.items)

    def diversity(self, tokens: frozenset[int], tau_sim: float) -> float:
        return history_diversity(tokens, list(self.items), tau_sim)

    def push(self, tokens: Iterable[frozenset[int]]) -> None:
        self.items.extend(tokens)

    def state_dict(self) -> list[list[int]]:
        return [sorted(t) for t in self.items]

    def load_state_dict(self, state: Sequence[Sequence[int]]) -> None:
        self.items.clear()
        self.items.extend(frozenset(t) for t in state)
