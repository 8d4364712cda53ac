"""An HF-style data collator that applies a goldfish mask to ``labels`` (for HF ``Trainer`` users)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from conventions import IGNORE_INDEX
from goldfish.masks import drop_mask
from goldfish.strategies import Strategy

# Per-token masks of the loss region under the names TRL's SFT tokenization gives them (1 = in the loss): the
# assistant's tokens of a conversation, the completion of a prompt-completion pair.
_REGION_KEYS = ("assistant_masks", "completion_mask")
_KNOWN_KEYS = {"input_ids", "attention_mask", "labels", *_REGION_KEYS}


class GoldfishCollator:
    """Right-pad a list of features and set goldfish-dropped labels to -100.

    HF causal LMs shift labels internally: ``labels[:, j + 1]`` is predicted at position ``j``. The mask is
    computed on the true next tokens ``causal_targets(input_ids, attention_mask)`` (so the hash reads every
    preceding token, a prompt the loss leaves out included), and ``labels[:, 1:]`` is set to -100 where it is
    dropped. ``labels[:, 0]`` is never a target.

    Conversations and prompt-completion pairs: give ``labels`` with -100 outside the assistant's tokens, or (as
    TRL's SFT tokenization writes them) ``assistant_masks`` or ``completion_mask`` (1 = in the loss): labels are then
    -100 outside that region. Either way the loss covers the region only, and the mask is the one drawn over the
    whole sequence, restricted to the region.

    Args:
        pad_token_id: id written into padded ``input_ids`` positions (their labels are -100).
        strategy: a goldfish strategy (see ``goldfish.masks.STRATEGIES``) or None for the standard loss.
        k, h, special_token_ids: as in :func:`goldfish.masks.drop_mask`.
        seed: seed of the ``random`` strategy. Call number n of this collator uses ``seed + n`` so
            successive batches get fresh random masks; note that DataLoader worker processes each hold
            their own copy (and counter). The hashed and static strategies need no seed.
    """

    def __init__(
        self,
        pad_token_id: int,
        strategy: Strategy | None,
        k: int = 4,
        h: int = 13,
        *,
        special_token_ids: Iterable[int] = (),
        seed: int = 0,
    ) -> None:
        if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int):
            raise ValueError(f"pad_token_id must be an int token id, got {pad_token_id!r}")
        self.pad_token_id = pad_token_id
        self.strategy = strategy
        self.k = k
        self.h = h
        self.special_token_ids = tuple(int(t) for t in special_token_ids)
        self.seed = seed
        self._calls = 0
        if strategy is not None:  # fail at construction, not at the first batch
            drop_mask(torch.zeros(1, 1, dtype=torch.long), strategy, k, h)

    def __call__(self, features: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """features: dicts with "input_ids" (list or 1-D tensor), optional "labels" and "attention_mask".

        Returns (B, T) long tensors ``input_ids``, ``attention_mask``, ``labels`` with T the longest length.
        Without "labels", labels are the input ids (padding -100).

        A dict, not goldfish's own batch type (data.batch.Batch): HF's ``Trainer`` and TRL feed the collator's
        output to ``model(**batch)``, so the keys are an external contract kept as they name them.
        """
        if len(features) == 0:
            raise ValueError("GoldfishCollator got an empty batch; pass at least one feature")
        rows = [self._row(i, feature) for i, feature in enumerate(features)]
        length = max(len(ids) for ids, _, _ in rows)
        batch = len(rows)
        input_ids = torch.full((batch, length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((batch, length), dtype=torch.long)
        labels = torch.full((batch, length), IGNORE_INDEX, dtype=torch.long)
        for i, (ids, mask, row_labels) in enumerate(rows):
            n = len(ids)
            input_ids[i, :n] = ids
            attention_mask[i, :n] = mask
            labels[i, :n] = row_labels

        if self.strategy is not None:
            # (B, T): targets[:, j] = input_ids[:, j + 1], the true next token (padding: IGNORE_INDEX)
            targets = torch.full_like(labels, IGNORE_INDEX)
            targets[:, :-1] = torch.where(attention_mask[:, 1:].bool(), input_ids[:, 1:], IGNORE_INDEX)
            dropped = drop_mask(
                targets,
                self.strategy,
                self.k,
                self.h,
                special_token_ids=self.special_token_ids,
                seed=self.seed + self._calls,
            )
            labels[:, 1:][dropped[:, :-1]] = IGNORE_INDEX
        self._calls += 1
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

    @staticmethod
    def _row(index: int, feature: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One feature -> (ids, attention mask, labels), each a 1-D long tensor of the same length."""
        unknown = set(feature) - _KNOWN_KEYS
        if unknown:
            raise ValueError(
                f"feature {index} has unexpected keys {sorted(unknown)}; keep only input_ids, attention_mask and "
                "labels (e.g. dataset.remove_columns or Trainer's remove_unused_columns=True)"
            )
        if "input_ids" not in feature:
            raise ValueError(f"feature {index} has no 'input_ids'")
        ids = _as_ids(feature["input_ids"], index, "input_ids")
        mask = _as_ids(feature.get("attention_mask", [1] * len(ids)), index, "attention_mask")
        if "labels" in feature:
            labels = _as_ids(feature["labels"], index, "labels")
        else:
            labels = torch.where(mask.bool(), ids, torch.full_like(ids, IGNORE_INDEX))
        for key in _REGION_KEYS:
            if key in feature:
                region = _as_ids(feature[key], index, key)
                if len(region) != len(ids):
                    raise ValueError(f"feature {index}: {key} ({len(region)}) and input_ids ({len(ids)}) differ")
                labels = torch.where(region.bool(), labels, torch.full_like(labels, IGNORE_INDEX))
        if not (len(mask) == len(labels) == len(ids)):
            raise ValueError(
                f"feature {index}: input_ids ({len(ids)}), attention_mask ({len(mask)}) and labels ({len(labels)}) "
                "must have the same length"
            )
        return ids, mask, labels


def _as_ids(values: Any, index: int, key: str) -> torch.Tensor:
    if isinstance(values, (list, tuple)) and len(values) == 0:
        return torch.zeros(0, dtype=torch.long)  # as_tensor([]) would be float32
    tensor = torch.as_tensor(values)
    if tensor.dim() != 1 or tensor.dtype == torch.bool or tensor.is_floating_point() or tensor.is_complex():
        raise ValueError(
            f"feature {index} {key!r} must be a 1-D sequence of integers, got shape {tuple(tensor.shape)} "
            f"and dtype {tensor.dtype}"
        )
    return tensor.to(torch.long)
