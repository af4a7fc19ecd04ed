"""Label-free rewards that do not collapse, for TTRL's setting (N votes per unlabeled question, no ground truth).

EVOL-RL (Zhou et al. 2025, arXiv:2509.15194, §3; code YujunZhou/EVOL-RL,
``verl/verl/workers/reward_manager/semantic_novelty.py``): majority-anchored selection plus a semantic-novelty
reward over the group's responses.

- :func:`after_think`: the text compared by meaning (after ``</think>`` if present; line 548).
- :func:`evol_rl_rewards`: the reward of each of the N vote samples from their embeddings, which samples are valid
  and which agree with the majority (``_compute_novelty_rewards`` line 596, ``_compute_similarity_based_rewards``
  line 731).

RESTRAIN (Yu et al. 2025, arXiv:2510.02172, §3; no code released): credit over all answers by vote share,
negative rollout penalization and prompt-level weighting.

- :func:`gaussian`: g(f) = exp(-(f - k)^2 / (2 sigma^2)), the paper's shaping function.
- :func:`pseudo_label_weights`: w_j = g(f_j) / sum_l g(f_l), f_j = c_j / n (§3.1, pseudo-label weighting).
- :func:`restrain_advantages`: A_i = u_x * sum_j w_j * Ã_ij over the candidate labels a_j (§3.1-3.3, the RESTRAIN
  loss), with Ã_ij = A_ij, or A_ij - delta (rewards zeroed) when M(x) = max_j c_j < kappa (§3.2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from coevolve.grading.guard import parses_model_text

THINK_END = "</think>"


@parses_model_text(invalid="")
def after_think(text: str) -> str:
    """EVOL-RL's text for the embedding: what follows the first ``</think>`` (stripped), else the whole response
    (``semantic_novelty.py`` ``_extract_after_think`` line 548, called at line 640). Model text: an over-long or
    non-string text gives "" (counted in ``bounds/text_too_long``)."""
    _, sep, tail = text.partition(THINK_END)
    return tail.strip() if sep else text


def evol_rl_novelty(embeddings: np.ndarray, majority: Sequence[bool]) -> np.ndarray:
    """EVOL-RL's raw novelty of each valid sample (``semantic_novelty.py`` lines 757-835): with S the cosine
    similarity of L2-normalised rows clipped to [0, 1],

        u_i = 1 - (0.5 * mean_{j in G(i), j != i} S_ij + 0.5 * max_{j != i} S_ij)

    where G(i) is i's group (majority-agreeing or not; S clipped at line 775, u_i at line 834); a sample alone in its
    group takes the mean over all others. ``embeddings``: (n, d) rows of the valid samples only (n >= 2)."""
    x = np.asarray(embeddings, dtype=np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-8)
    sim = np.clip(x @ x.T, 0.0, 1.0)
    group = np.asarray(majority, dtype=bool)
    n = len(group)
    novelty = np.zeros(n)
    for i in range(n):
        others = np.arange(n) != i
        same = others & (group == group[i])
        mean_sim = sim[i, same].mean() if same.any() else sim[i, others].mean()
        novelty[i] = 1.0 - (0.5 * mean_sim + 0.5 * sim[i, others].max())
    return novelty


def _group_rewards(novelty: np.ndarray, low: float) -> np.ndarray:
    """One group's rewards in [low, low + 0.5] by min-max novelty (lines 910-974): a lone member gets low + 0.5
    (1.0 in the majority group, line 927; -0.5 in the minority, line 974); all equal novelty: the midpoint low + 0.25
    (0.75, line 924; -0.75, line 971)."""
    if len(novelty) == 1:
        return np.array([low + 0.5])
    spread = novelty.max() - novelty.min()
    if spread <= 0:
        return np.full(len(novelty), low + 0.25)
    return low + 0.5 * (novelty - novelty.min()) / spread


def evol_rl_rewards(embeddings: np.ndarray, valid: Sequence[bool], majority: Sequence[bool]) -> tuple[np.ndarray,
                                                                                                         np.ndarray]:
    """EVOL-RL's rewards of N vote samples and their raw novelty (NaN where not computed).

    ``embeddings``: (N, d), one row per sample (rows of invalid samples are ignored); ``valid``: the sample has a
    parseable answer (the code: a ``\\boxed{}`` holding a digit); ``majority``: it agrees with the majority answer.

    - invalid samples: -1, outside the novelty computation (line 685);
    - fewer than 2 valid samples: every sample -1 (line 712: the code leaves the valid ones at -1 too);
    - else majority samples: 0.5 + 0.5 * ũ in [0.5, 1], others: -1 + 0.5 * ũ in [-1, -0.5], ũ the novelty min-max
      normalised within the group; a lone group member: 1.0 (majority) / -0.5 (minority); equal novelty: 0.75 / -0.75.
    """
    valid_mask = np.asarray(valid, dtype=bool)
    agree = np.asarray(majority, dtype=bool) & valid_mask
    n = len(valid_mask)
    novelty = np.full(n, np.nan)
    rewards = np.full(n, -1.0)
    index = np.flatnonzero(valid_mask)
    if len(index) < 2:
        return rewards, novelty
    novelty[index] = evol_rl_novelty(np.asarray(embeddings)[index], agree[index])
    for in_majority, low in ((True, 0.5), (False, -1.0)):
        members = index[agree[index] == in_majority]
        if len(members):
            rewards[members] = _group_rewards(novelty[members], low)
    return rewards, novelty


def gaussian(f: np.ndarray | float, k: float, sigma: float) -> np.ndarray:
    """RESTRAIN's shaping function g(f) = exp(-(f - k)^2 / (2 sigma^2)), a Gaussian centred at k with bandwidth
    sigma (§3.1; its maximum 1 at f = k)."""
    return np.exp(-((np.asarray(f, dtype=np.float64) - k) ** 2) / (2.0 * sigma ** 2))


def pseudo_label_weights(counts: Sequence[int], n: int, k: float, sigma: float) -> np.ndarray:
    """RESTRAIN §3.1: w_j = g(f_j) / sum_l g(f_l) with f_j = c_j / n, the vote share of the j-th distinct answer."""
    g = gaussian(np.asarray(counts, dtype=np.float64) / n, k, sigma)
    return g / g.sum()


def restrain_advantages(candidate: Sequence[int], counts: Sequence[int], n: int, *, k: float, sigma: float,
                        kappa: int, delta: float, prompt_weight: float,
                        group_advantages: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray, bool]:
    """RESTRAIN's per-sample advantage of one question's trained samples, A_i = u_x * sum_j w_j * Ã_ij.

    ``candidate[i]``: the index j of trained sample i's answer among the distinct answers (-1: unparseable, it
    matches no candidate); ``counts[j]`` = c_j over the n vote samples; ``prompt_weight`` = u_x;
    ``group_advantages``: GRPO's advantage of one reward column over the trained samples.
    For each candidate label a_j: r_ij = 1[y_i = a_j], A_ij = group_advantages(r_.j). When M(x) = max_j c_j < kappa,
    r̃_ij = 0 (so A_ij = 0) and Ã_ij = A_ij - delta (§3.2). Returns (A, w, penalised); no candidate: A = 0.
    """
    if not len(counts):
        return np.zeros(len(candidate)), np.zeros(0), False
    weights = pseudo_label_weights(counts, n, k, sigma)
    penalised = max(counts) < kappa
    own = np.asarray(candidate)
    advantage = np.zeros(len(own))
    for j, w in enumerate(weights):
        rewards = (own == j).astype(np.float64) * (0.0 if penalised else 1.0)
        advantage += w * (np.asarray(group_advantages(rewards), dtype=np.float64) - (delta if penalised else 0.0))
    return prompt_weight * advantage, weights, penalised


def weight_entropy(weights: np.ndarray) -> float:
    """Shannon entropy (nats) of one question's pseudo-label weights; 0 for a single candidate."""
    w = np.asarray(weights, dtype=np.float64)
    w = w[w > 0]
    return float(-(w * np.log(w)).sum()) if len(w) else 0.0
