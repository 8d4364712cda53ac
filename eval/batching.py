"""Padding token-id rows into batches, shared by greedy extraction, generation attacks and log-prob scoring."""

from __future__ import annotations

from typing import Sequence

import torch


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's (first) parameters: where its inputs must go."""
    return next(model.parameters()).device


def pad_batch(rows: Sequence[Sequence[int]], pad_token_id: int, *, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), each (B, L) int64 on CPU with L = the longest row.

    side="left" puts the padding before each row (generation: every row ends at the last column);
    side="right" after it (scoring: causal attention means trailing padding does not change a row's logits).
    """
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        input_ids[i, span] = torch.tensor(list(row), dtype=torch.long)
        mask[i, span] = 1
    return input_ids, mask
