"""Batching token-id rows (padding, longest-first decoding) and running a model for inference, shared by greedy
extraction, generation attacks and log-prob scoring."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence, TypeVar

import torch

T = TypeVar("T")


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's (first) parameters: where its inputs must go."""
    return next(model.parameters()).device


@contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[None]:
    """Inference on `model`: eval mode (no dropout) and no gradients inside, its training mode restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


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


def prefix_aligned(
    docs: list[list[int]], prefix_lens: list[int], pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """(input_ids, mask, position_ids), each (B, W), and each row's first column: rows left-padded so that every
    prefix (the first prefix_lens[i] tokens of docs[i]) ends at column max(prefix_lens) - 1, the rest of each
    document after it, right-padded. Position ids count real tokens (0 at each row's first)."""
    lp = max(prefix_lens)
    width = lp + max(len(d) - p for d, p in zip(docs, prefix_lens))
    input_ids = torch.full((len(docs), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(docs), width), dtype=torch.long)
    starts = [lp - p for p in prefix_lens]
    for i, (d, start) in enumerate(zip(docs, starts)):
        input_ids[i, start : start + len(d)] = torch.tensor(d, dtype=torch.long)
        mask[i, start : start + len(d)] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    return input_ids, mask, (mask.cumsum(dim=-1) - 1).clamp(min=0), starts


def left_pad(
    rows: Sequence[Sequence[int]], pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded (input_ids, attention_mask, position_ids), each (B, L) on `device` with L = the longest row.

    Position ids count real tokens only (0 at each row's first real token), which is what an unpadded run of that
    row uses; padded slots get 0 and are masked out anyway. (HF generate derives the same ids from the mask.)
    """
    input_ids, mask, position_ids, _ = prefix_aligned(
        [list(r) for r in rows], [len(r) for r in rows], pad_token_id, device
    )
    return input_ids, mask, position_ids


def decode_longest_first(
    prefixes: Sequence[Sequence[int]], batch_size: int, decode_batch: Callable[[list[list[int]]], Sequence[T]]
) -> list[T]:
    """Run ``decode_batch`` on batches of ``prefixes`` and return its outputs in the input order.

    Prefixes go longest first, so similar lengths share a batch (less padding) and the biggest batch runs first
    (an out-of-memory error shows up at once). ``decode_batch`` maps a list of prefixes (as lists of ints) to one
    result per prefix (an id list, or a richer record).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(prefixes)), key=lambda i: len(prefixes[i]), reverse=True)
    results: list[T] = [None] * len(prefixes)  # type: ignore[list-item]  # every slot is filled below
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        for i, ids in zip(idx, decode_batch([[int(t) for t in prefixes[i]] for i in idx])):
            results[i] = ids
    return results
