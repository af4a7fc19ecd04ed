"""Reward terms as small pure functions on plain values and lists, unit-tested against the specs' worked values.

One module per kind of term: ``difficulty`` (shapes of the solve rate: Dynamic RL's tent, OpenSIR's triangular
solvability), ``similarity`` (Dynamic RL's token-overlap question diversity and answer diversity), ``filters``
(Dynamic RL's rule-based question filters), and the other recipes' terms beside them. Import from the submodules.
"""
