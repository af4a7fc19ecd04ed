"""Padding a batch of token-id lists into tensors: what the sampler (:mod:`coevolve.rollout`) and the trainer
(:mod:`coevolve.rl.trainer`) both feed a model."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists to one tensor; returns (input_ids, attention_mask)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq):] = 1
    return ids, mask


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that start at 0 on each row's first real token (left padding gets position 0)."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)
