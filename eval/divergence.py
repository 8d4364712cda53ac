"""Divergence analysis: where does a model's continuation first leave the true text, and was that token one the
goldfish mask hid in training?

The goldfish paper (Hans et al. 2024, Fig. 4) shows that a goldfish model's greedy continuation tends to diverge
from the training text exactly at a position whose token was dropped from the loss: the model was never taught
that token in that context, so it guesses. If divergence were unrelated to the mask, the share of first
divergences on dropped positions would equal the drop rate (about 1/k).

Alignment: a document's targets are its tokens shifted by one (target j = token j + 1, predicted at position j).
Suffix token i of a document whose suffix starts at token index P is target P + i - 1, so its dropped flag is
``dropped_targets[P + i - 1]`` (see ``suffix_dropped_flags``).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


def first_divergence(generated: Sequence[int], reference: Sequence[int]) -> int | None:
    """Index of the first position where ``generated`` differs from ``reference``, or None if it reproduces it.

    Positions past the end of ``generated`` count as differing (a short generation diverges where it stops);
    ids past the end of ``reference`` are ignored.
    """
    if len(reference) == 0:
        raise ValueError("reference is empty; divergence needs at least one reference id")
    for i, r in enumerate(reference):
        if i >= len(generated) or int(generated[i]) != int(r):
            return i
    return None


def suffix_dropped_flags(
    dropped_targets: Sequence[bool] | torch.Tensor, prefix_len: int, suffix_len: int
) -> list[bool]:
    """Dropped flags of the suffix tokens, from the dropped flags of a document's targets: (T - 1,), or (T,) as
    goldfish's ``causal_targets`` lays them out (its last target is the ignore index, never dropped).

    prefix_len: P, the index of the first suffix token in the document (>= 1: the first token is never a target).
    Returns ``suffix_len`` flags; flag i says whether suffix token i (= target P + i - 1) was dropped.
    """
    flags = [
        bool(x)
        for x in (
            dropped_targets.reshape(-1).tolist() if isinstance(dropped_targets, torch.Tensor) else dropped_targets
        )
    ]
    if prefix_len < 1:
        raise ValueError(f"prefix_len must be >= 1 (the first token is never a target), got {prefix_len}")
    if prefix_len - 1 + suffix_len > len(flags):
        raise ValueError(
            f"dropped flags cover {len(flags)} targets but the suffix needs targets "
            f"{prefix_len - 1}..{prefix_len + suffix_len - 2}: pass the flags of the whole document"
        )
    return flags[prefix_len - 1 : prefix_len - 1 + suffix_len]


def divergence_row(
    generated: Sequence[int], reference: Sequence[int], suffix_dropped: Sequence[bool] | None = None
) -> dict[str, Any]:
    """Per-document divergence: ``first_divergence`` (index or None), and when the suffix's dropped flags are given,
    ``diverged_on_dropped`` (None when it never diverged) and ``suffix_drop_rate`` (share of dropped suffix tokens)."""
    index = first_divergence(generated, reference)
    row: dict[str, Any] = {"first_divergence": index}
    if suffix_dropped is not None:
        if len(suffix_dropped) != len(reference):
            raise ValueError(f"{len(suffix_dropped)} dropped flags for a suffix of {len(reference)} tokens")
        row["diverged_on_dropped"] = None if index is None else bool(suffix_dropped[index])
        row["suffix_drop_rate"] = sum(bool(x) for x in suffix_dropped) / len(suffix_dropped)
    return row


def divergence_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate ``divergence_row`` results.

    Returns n_docs, n_diverged, mean first-divergence index over diverged documents, a histogram of first
    divergence positions ({index: count}), and, when rows carry dropped flags: ``share_on_dropped`` (first
    divergences that fall on a dropped token / diverged documents) and ``share_expected_by_chance``: the mean
    ``suffix_drop_rate`` of the diverged documents, i.e. the share expected if the divergence position were
    independent of the mask.
    """
    diverged = [r for r in rows if r["first_divergence"] is not None]
    histogram: dict[int, int] = {}
    for r in diverged:
        histogram[r["first_divergence"]] = histogram.get(r["first_divergence"], 0) + 1
    summary: dict[str, Any] = {
        "n_docs": len(rows),
        "n_diverged": len(diverged),
        "mean_first_divergence": (sum(r["first_divergence"] for r in diverged) / len(diverged)) if diverged else None,
        "first_divergence_histogram": dict(sorted(histogram.items())),
    }
    if rows and all("diverged_on_dropped" in r for r in rows):
        on_dropped = sum(bool(r["diverged_on_dropped"]) for r in diverged)
        summary["n_on_dropped"] = on_dropped
        summary["share_on_dropped"] = on_dropped / len(diverged) if diverged else None
        summary["share_expected_by_chance"] = (
            sum(r["suffix_drop_rate"] for r in diverged) / len(diverged) if diverged else None
        )
    return summary
