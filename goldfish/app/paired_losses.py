"""The utility side of a comparison: a model's loss on the same held-out units as the standard model's (rows or
documents), with its interval and the paired difference to the standard model (compare's `heldout_loss` and
`validation` entries)."""

from __future__ import annotations

from typing import Any

from eval.intervals import mean_interval
from goldfish.app.config import MaskSpec


def paired_losses(losses: list[float], standard: list[float] | None, label: str, n_resamples: int) -> dict[str, Any]:
    """The interval of a model's per-unit losses (rows or documents), and, beside the standard model's losses on the
    same units in the same order (not for the standard model itself), the mean paired difference with its interval
    and its size relative to the standard model's mean loss. Intervals: bootstrap, None for n_resamples 0."""
    entry: dict[str, Any] = {"loss_ci": mean_interval(losses, n_resamples=n_resamples) if n_resamples else None}
    if standard is not None and label != MaskSpec(strategy=None).label:
        differences = [a - b for a, b in zip(losses, standard)]
        difference = sum(differences) / len(differences)
        entry |= {
            "difference_to_standard": difference,
            "difference_ci": mean_interval(differences, n_resamples=n_resamples) if n_resamples else None,
            "relative_difference": difference / (sum(standard) / len(standard)),
        }
    return entry
