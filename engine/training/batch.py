"""What the training loop reads of a micro-batch, and how rows become one.

The engine knows no batch type of the callers': it reads a batch through `TrainingBatch` (the ids, the positions,
and a sub-batch of some rows for a pipeline's chunks) and gets one from the loss's `Collate` (the loss reads the
rest of the batch, so it says how its rows are stacked; the application's is data.batch.Batch.stack). Rows given as
mappings of (T,) tensors, as the engine's own tests and benchmarks give them, are stacked by `stack_rows`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import torch


class TrainingBatch(Protocol):
    """A micro-batch as engine.training.train reads it.

    input_ids: (B, T) int64 on the training device (None only for a loss that feeds the model itself).
    position_ids: (B, T) int64 or None (the model's default positions).
    select(rows): the sub-batch of `rows` (indices into dim 0).
    """

    @property
    def input_ids(self) -> torch.Tensor | None: ...

    @property
    def position_ids(self) -> torch.Tensor | None: ...

    def select(self, rows: torch.Tensor) -> TrainingBatch: ...


# (rows, indices (B,) into them, optimizer step, device) -> the micro-batch of those rows on the device
Collate = Callable[[Sequence[Any], torch.Tensor, int, torch.device], TrainingBatch]


@dataclass(frozen=True)
class StackedRows(Mapping[str, torch.Tensor]):
    """Rows given as mappings of (T,) tensors, stacked: each key (B, ...), plus "example_index" (B,) and "step"
    (0-d), read by key; a TrainingBatch."""

    fields: Mapping[str, torch.Tensor]

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    @property
    def input_ids(self) -> torch.Tensor | None:
        return self.fields.get("input_ids")

    @property
    def position_ids(self) -> torch.Tensor | None:
        return self.fields.get("position_ids")

    def select(self, rows: torch.Tensor) -> StackedRows:
        """The sub-batch of `rows`; 0-d entries (the step) are kept."""
        n = len(self.fields["example_index"])
        return StackedRows(
            {k: v[rows.to(v.device)] if v.dim() and v.shape[0] == n else v for k, v in self.fields.items()}
        )


def stack_rows(
    examples: Sequence[Mapping[str, torch.Tensor]], indices: torch.Tensor, step: int, device: torch.device
) -> StackedRows:
    """One micro-batch of mapping rows: the rows' tensors stacked to (B, ...) on `device`, plus "example_index" (B,)
    and "step" (0-d), so a loss function can draw per-step randomness that a resumed run reproduces."""
    keys = examples[0].keys()
    fields = {key: torch.stack([examples[i][key] for i in indices.tolist()]).to(device) for key in keys}
    fields["example_index"] = indices.clone()
    fields["step"] = torch.tensor(step)
    return StackedRows(fields)
