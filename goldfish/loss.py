"""The goldfish loss: next-token cross-entropy over the targets a drop mask keeps."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from conventions import IGNORE_INDEX


@dataclass
class GoldfishLoss:
    """Losses of one batch. ``loss`` and ``loss_sum`` carry the graph; the rest are for logging."""

    loss: torch.Tensor  # scalar float32: mean CE over kept, non-ignored targets (what is optimised)
    loss_sum: torch.Tensor  # scalar float32: SUM of CE over kept targets, with grad
    n_kept: int  # targets that count in the loss
    n_all: int  # non-ignored targets (kept + dropped)
    n_dropped: int  # non-ignored targets the mask dropped
    all_loss: torch.Tensor  # detached scalar: mean CE over all non-ignored targets (NaN when none)
    dropped_loss: torch.Tensor  # detached scalar: mean CE over dropped targets (NaN when none dropped)


def check_token_shapes(logits: torch.Tensor, targets: torch.Tensor, dropped: torch.Tensor | None) -> None:
    """Raise ValueError unless logits are (B, T, V), targets (B, T) and dropped (B, T) bool or None: the contract of
    every function that scores next-token predictions against (masked) targets."""
    if logits.dim() != 3:
        raise ValueError(f"logits must be (B, T, V), got shape {tuple(logits.shape)}")
    if targets.shape != logits.shape[:2]:
        raise ValueError(
            f"targets must be (B, T) = {tuple(logits.shape[:2])} like the logits, but the targets shape "
            f"is {tuple(targets.shape)}"
        )
    if dropped is not None:
        if dropped.dtype != torch.bool:
            raise ValueError(f"dropped must be a bool mask, got dtype {dropped.dtype}")
        if dropped.shape != targets.shape:
            raise ValueError(f"dropped shape {tuple(dropped.shape)} must equal targets shape {tuple(targets.shape)}")


def goldfish_loss(logits: torch.Tensor, targets: torch.Tensor, dropped: torch.Tensor | None) -> GoldfishLoss:
    """Cross-entropy over the kept targets.

    Args:
        logits: (B, T, V) any float dtype; ``logits[:, j]`` predicts ``targets[:, j]``. CE is computed in
            float32 whatever the input dtype.
        targets: (B, T) integer next-token ids, ``IGNORE_INDEX`` (-100) where there is no target.
        dropped: (B, T) bool, True where the target is excluded from the loss (see
            :func:`goldfish.masks.drop_mask`), or None for the standard loss (nothing dropped).

    Returns:
        a :class:`GoldfishLoss`. When no target is kept, ``loss`` and ``loss_sum`` are 0 (not NaN) and
        still attached to ``logits``' graph, so ``backward()`` works and yields zero gradients.
    """
    check_token_shapes(logits, targets, dropped)
    vocab = logits.shape[-1]
    token_ce = F.cross_entropy(
        logits.float().reshape(-1, vocab), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
    ).reshape(targets.shape)  # (B, T), 0 at ignored targets
    return goldfish_loss_from_token_losses(token_ce, targets, dropped)


def goldfish_loss_from_token_losses(
    token_ce: torch.Tensor, targets: torch.Tensor, dropped: torch.Tensor | None
) -> GoldfishLoss:
    """The goldfish loss from per-token cross-entropies that were computed elsewhere (e.g. by a chunked or
    vocabulary-parallel loss that never builds full logits): the same split into kept / dropped / all targets as
    :func:`goldfish_loss`.

    Args:
        token_ce: (B, T) float cross-entropy of each target (any value at ignored targets), with grad.
        targets: (B, T) integer next-token ids, ``IGNORE_INDEX`` where there is no target.
        dropped: (B, T) bool drop mask, or None.
    """
    if token_ce.shape != targets.shape:
        raise ValueError(f"token losses {tuple(token_ce.shape)} must have the targets' shape {tuple(targets.shape)}")
    if dropped is not None:
        if dropped.dtype != torch.bool:
            raise ValueError(f"dropped must be a bool mask, got dtype {dropped.dtype}")
        if dropped.shape != targets.shape:
            raise ValueError(f"dropped shape {tuple(dropped.shape)} must equal targets shape {tuple(targets.shape)}")
    token_ce = token_ce.float()
    valid = targets != IGNORE_INDEX
    dropped_valid = valid & dropped if dropped is not None else torch.zeros_like(valid)
    kept = valid & ~dropped_valid

    # torch.where passes no gradient to unselected entries, so dropped positions get exactly zero grad.
    loss_sum = torch.where(kept, token_ce, torch.zeros_like(token_ce)).sum()
    n_kept = int(kept.sum())
    n_all = int(valid.sum())
    n_dropped = int(dropped_valid.sum())
    loss = loss_sum / max(n_kept, 1)

    detached = torch.where(valid, token_ce.detach(), torch.zeros_like(token_ce))
    all_loss = _masked_mean(detached, valid, n_all)
    dropped_loss = _masked_mean(detached, dropped_valid, n_dropped)
    return GoldfishLoss(
        loss=loss,
        loss_sum=loss_sum,
        n_kept=n_kept,
        n_all=n_all,
        n_dropped=n_dropped,
        all_loss=all_loss,
        dropped_loss=dropped_loss,
    )


def _masked_mean(values: torch.Tensor, mask: torch.Tensor, count: int) -> torch.Tensor:
    """Mean of ``values`` where ``mask``; NaN (a float32 scalar) when ``count`` is 0."""
    if count == 0:
        return torch.tensor(math.nan, dtype=values.dtype, device=values.device)
    return torch.where(mask, values, torch.zeros_like(values)).sum() / count
