"""Training rows and the batches stacked from them: what flows from data/ to the loss.

A `Row` is one training sequence of T positions; a `Batch` is B rows stacked for one micro-batch, with the rows'
indices into the run's rows and the optimizer step (so a loss can draw per-step randomness a resumed run
reproduces). engine.training.train reads a batch through its own protocol (input_ids, position_ids, select); the
goldfish loss reads the targets and the drop mask. Document boundaries inside a packed row are where position_ids
restart at 0 (data/rows.py). Imports nothing of the other project packages (torch only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class Row:
    """One training row, each field (T,).

    input_ids: int64 token ids (the pad id after a stream's or a conversation's last token).
    targets: int64 next-token targets, conventions.IGNORE_INDEX where a position has no target.
    dropped: bool, True where the goldfish mask drops the target (None: no mask drawn).
    position_ids: int64, restarting at 0 where each document of a packed row begins (None: 0..T-1).
    """

    input_ids: torch.Tensor
    targets: torch.Tensor
    dropped: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None


@dataclass(frozen=True)
class Batch:
    """B rows stacked for one micro-batch; every (B, T) field is on the training device.

    input_ids: (B, T) int64. targets: (B, T) int64, IGNORE_INDEX where no target.
    dropped: (B, T) bool or None. position_ids: (B, T) int64 or None (document boundaries: where they restart).
    example_index: (B,) int64 on the CPU, each row's index into the run's rows.
    step: the 0-based optimizer step the batch is read in.
    """

    input_ids: torch.Tensor
    targets: torch.Tensor
    example_index: torch.Tensor
    step: int
    dropped: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None

    @classmethod
    def stack(cls, rows: Sequence[Row], indices: torch.Tensor, step: int, device: torch.device) -> Batch:
        """The batch of rows[i] for i in `indices` (B,), read in optimizer step `step`, on `device`."""
        chosen = [rows[i] for i in indices.tolist()]

        def stacked(name: str) -> torch.Tensor | None:
            values = [getattr(row, name) for row in chosen]
            return None if values[0] is None else torch.stack(values).to(device)

        return cls(
            input_ids=stacked("input_ids"),
            targets=stacked("targets"),
            example_index=indices.clone(),
            step=step,
            dropped=stacked("dropped"),
            position_ids=stacked("position_ids"),
        )

    def select(self, rows: torch.Tensor) -> Batch:
        """The sub-batch of `rows` (indices into dim 0), e.g. a pipeline's micro-batch chunk."""

        def pick(value: torch.Tensor | None) -> torch.Tensor | None:
            return None if value is None else value[rows.to(value.device)]

        return replace(
            self,
            input_ids=pick(self.input_ids),
            targets=pick(self.targets),
            example_index=pick(self.example_index),
            dropped=pick(self.dropped),
            position_ids=pick(self.position_ids),
        )
