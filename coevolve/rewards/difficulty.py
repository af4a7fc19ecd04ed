"""Difficulty shapes: rewards as a function of a question's solve rate p (the share of samples agreeing with a label).

- :func:`tent_reward`: Dynamic RL's question reward R_q (Eq. 8), a tent on p(q) = r(q)/m peaking at 1 when p = tau.
- :func:`triangular_solvability`: OpenSIR's score_sol (Eq. 2), a triangle on [s_min, s_max] peaking at 1 at the
  midpoint, zero outside the range.
"""

from __future__ import annotations

from typing import Literal

_TOLERANCE = 1e-9  # solve rates are ratios like 7/8 held as floats; the window ends are inclusive


def _check_unit(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")


def tent_reward(p: float, tau: float) -> float:
    """Dynamic RL's R_q (Eq. 8): p / tau for p <= tau, (1 - p) / (1 - tau) above; 1 at p = tau, 0 at p = 0 and 1.

    Edge guards (not in the paper): tau = 0 gives 1 - p, tau = 1 gives p.
    """
    _check_unit("p", p)
    _check_unit("tau", tau)
    if tau == 0.0:
        return 1.0 - p
    if p <= tau:
        return p / tau
    return (1.0 - p) / (1.0 - tau)


def solvability_edge(s_min: float, s_max: float, group_size: int,
                     edge: Literal["inv_group", "inv_levels"] = "inv_group") -> float:
    """The value the OpenSIR triangle falls to at s_min and s_max.

    ``inv_group`` (paper, Eq. 2's slope (1 - 1/G) / (s_mid - s_min)): 1/G. ``inv_levels`` (released code): 1 over the
    number of attainable solve rates i/G, i = 1..G, inside [s_min, s_max] (OpenSIR Eq. 2; the released code differs).
    """
    if group_size < 1:
        raise ValueError(f"group_size must be positive, got {group_size}")
    if edge == "inv_group":
        return 1.0 / group_size
    if edge == "inv_levels":
        levels = sum(s_min - _TOLERANCE <= i / group_size <= s_max + _TOLERANCE for i in range(1, group_size + 1))
        return 1.0 / max(levels, 1)
    raise ValueError(f"edge must be 'inv_group' or 'inv_levels', got {edge!r}")


def triangular_solvability(p: float, s_min: float = 0.5, s_max: float = 0.9, *, group_size: int,
                           edge: Literal["inv_group", "inv_levels"] = "inv_group") -> float:
    """OpenSIR's score_sol (Eq. 2): 1 - (1 - y_edge) * |p - s_mid| / (s_mid - s_min) on [s_min, s_max], else 0.

    s_mid = (s_min + s_max) / 2; y_edge is :func:`solvability_edge` (1/G in the paper). The window is inclusive.
    """
    _check_unit("p", p)
    _check_unit("s_min", s_min)
    _check_unit("s_max", s_max)
    if not s_min < s_max:
        raise ValueError(f"s_min must be below s_max, got [{s_min}, {s_max}]")
    if not s_min - _TOLERANCE <= p <= s_max + _TOLERANCE:
        return 0.0
    s_mid = (s_min + s_max) / 2.0
    y_edge = solvability_edge(s_min, s_max, group_size, edge)
    return 1.0 - (1.0 - y_edge) * abs(p - s_mid) / (s_mid - s_min)
