"""What the application hands the data floor to build a run's training rows: the goldfish mask as a function of a
piece's targets (data.rows.RowMask) and the background stream's settings (data.background.BackgroundSpec).

The rows themselves (packing, insertion schedule, streams, exposure counts) are built in data/; the trainer's
settings (engine.training.train.TrainConfig) are read there as they are (data.background.Reading).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from data.background import BackgroundSpec
from data.rows import RowMask
from goldfish.app.caches import dataset_cache
from goldfish.app.config import DataSpec, MaskSpec


def row_mask(mask: MaskSpec, special_token_ids: Sequence[int]) -> RowMask:
    """The goldfish mask of packed rows. The hashed strategies decide target j from the h targets ending at j, the
    static one from j mod k, so a slice of a document needs the h - 1 targets before it (or those back to a multiple
    of k). The random strategy is drawn per row and step by the loss (make_step_loss): rows carry none."""
    if mask.strategy is None or mask.strategy == "random":
        return RowMask(label=mask.label)
    special = list(special_token_ids)

    def drop(targets: torch.Tensor) -> torch.Tensor:
        return mask.dropped(targets.unsqueeze(0), special)[0]

    def lookback(start: int) -> int:
        return start % mask.k if mask.strategy == "static" else min(start, mask.h - 1)

    return RowMask(drop, lookback, mask.label)


def background_spec(spec: DataSpec) -> BackgroundSpec:
    """The background stream's settings of a --background run's data options (its tokenized corpus cached in the
    dataset cache, goldfish.app.caches)."""
    if spec.background is None:
        raise ValueError("the run has no --background corpus")
    return BackgroundSpec(
        source=spec.background,
        seq_len=spec.seq_len,
        repeats=tuple(spec.repeats),
        data_seed=spec.seed,
        val_tokens=spec.val_tokens,
        insert_window=spec.insert_window,
        text_field=spec.background_text_field,
        split=spec.split,
        streaming=spec.background_streaming,
        workers=spec.tokenize_workers,
        cache_dir=dataset_cache(spec.cache_dir),
    )
