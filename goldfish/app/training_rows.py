"""Training rows and the step loss: one masked example per document copy (conversations padded, loss on the
replies), the random mask's per-step draws, the goldfish loss hook the engine calls, and the check that a mask
drops something."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

import data
from conventions import IGNORE_INDEX
from data.batch import Batch, Row
from data.chat import assistant_flags
from data.rows import piece_ids
from engine import LossFn, StepLoss, TokenLossFn
from goldfish.app.config import DataSpec, MaskSpec
from goldfish.app.data_settings import row_mask
from goldfish.app.prepare import Prepared, pad_token_id
from goldfish.loss import goldfish_loss_from_token_losses
from goldfish.masks import causal_targets, drop_mask


def make_examples(
    documents: Sequence[data.TokenizedDocument],
    mask: MaskSpec,
    special_token_ids: Sequence[int],
    repeats: dict[str, int] | None = None,
    chat_row: ChatRow | None = None,
) -> list[Row]:
    """Training rows (data.batch.Row): input ids, next-token targets and the goldfish drop mask, all (T,); one per
    document, or `repeats[id]` copies of it. A conversation's row has targets on its replies only (conversation_row),
    padded to `chat_row`'s length when given. Hashed and static masks are functions of the tokens, so every copy
    drops the same positions (the point of the hashed mask).

    For the `random` strategy the stored mask is only the first epoch's draw (for counting); the loss redraws it
    every step and for every copy, since a per-occurrence Bernoulli mask must differ each time a sequence is seen.
    """
    if chat_row is None and any(d.replies is not None for d in documents):
        raise ValueError("conversations have different lengths: pass chat_row (e.g. chat_row_of(prepared)) to pad them")
    examples = []
    for document in documents:
        input_ids = torch.tensor(document.token_ids, dtype=torch.long)
        targets = causal_targets(input_ids.unsqueeze(0))
        trained = None if document.replies is None else reply_targets(document)  # (1, T) bool
        copies = 1 if repeats is None else repeats[str(document.id)]
        for _ in range(copies):
            index = len(examples)
            dropped = (
                mask.dropped(targets, special_token_ids)
                if mask.strategy != "random"
                else _random_draw(mask, targets, special_token_ids, step=0, example_index=index)
            )
            if trained is None:
                examples.append(Row(input_ids=input_ids, targets=targets[0], dropped=dropped[0]))
            else:
                examples.append(conversation_row(input_ids, targets[0], dropped[0], trained[0], chat_row))
    return examples


def chat_row_of(prepared: Prepared) -> ChatRow:
    """The row conversations are padded to for training: the selection's longest conversation (--seq-len), padded
    with the tokenizer's pad id (its EOS when it has none)."""
    return ChatRow(prepared.split.seq_len, pad_token_id(prepared.tokenizer))


def reply_targets(document: data.TokenizedDocument) -> torch.Tensor:
    """(1, T) bool: the targets of a conversation's positions that are reply tokens (position j predicts token j+1),
    what the loss covers."""
    flags = torch.tensor(assistant_flags(len(document.token_ids), document.replies or ()), dtype=torch.bool)
    trained = torch.zeros(1, len(flags), dtype=torch.bool)
    trained[0, :-1] = flags[1:]
    return trained


def conversation_row(
    input_ids: torch.Tensor, targets: torch.Tensor, dropped: torch.Tensor, trained: torch.Tensor, row: ChatRow | None
) -> Row:
    """One conversation's training row, (T,) each: the loss on the replies only (other targets IGNORE_INDEX), the
    goldfish mask as drawn over the whole conversation's true targets (its hash reads the prompt too) kept on the
    replies only, right-padded to `row.length` (padding attends only to earlier tokens in a causal model, and the
    real tokens never attend to it)."""
    targets = torch.where(trained, targets, torch.full_like(targets, IGNORE_INDEX))
    dropped = dropped & trained
    if row is None or row.length == len(input_ids):
        return Row(input_ids=input_ids, targets=targets, dropped=dropped)
    extra = row.length - len(input_ids)
    return Row(
        input_ids=torch.nn.functional.pad(input_ids, (0, extra), value=row.pad_id),
        targets=torch.nn.functional.pad(targets, (0, extra), value=IGNORE_INDEX),
        dropped=torch.nn.functional.pad(dropped, (0, extra), value=False),
    )


@dataclass(frozen=True)
class ChatRow:
    """The fixed length conversations are padded to for training (a batch stacks rows) and the id they pad with."""

    length: int
    pad_id: int


def _random_draw(
    mask: MaskSpec, targets: torch.Tensor, special_token_ids: Sequence[int], *, step: int, example_index: int
) -> torch.Tensor:
    """A fresh Bernoulli(1/k) mask for one (1, T) row, seeded by (mask seed, step, example): reproducible on resume,
    different on every occurrence of the sequence, and independent of which rank holds the row."""
    seed = (mask.seed * 1_000_003 + step) * 1_000_003 + example_index
    return drop_mask(targets, "random", mask.k, mask.h, special_token_ids=special_token_ids, seed=seed)


def make_step_loss(mask: MaskSpec, special_token_ids: Sequence[int]) -> TokenLossFn:
    """The engine's loss hook: goldfish loss on kept targets, plus all-token and dropped-token losses for logging.
    A TokenLossFn: the mask is drawn from the batch's own ids on whichever rank computes the loss (a pipeline's last
    stage included), so the dropped positions equal one process's."""

    def dropped_of(batch: Batch) -> torch.Tensor:
        if mask.strategy != "random":
            return batch.dropped
        step = batch.step
        return torch.cat(
            [
                _random_draw(
                    mask,
                    batch.targets[row : row + 1].cpu(),
                    special_token_ids,
                    step=step,
                    example_index=int(index),
                )
                for row, index in enumerate(batch.example_index)
            ]
        ).to(batch.dropped.device)

    def reduce(token_ce: torch.Tensor, batch: Batch) -> StepLoss:
        # token_ce: per-token losses (B, T) float32 from the hidden states; full-vocabulary logits are never built
        # (vocabulary-parallel over the tensor-parallel ranks when the lm_head is split)
        result = goldfish_loss_from_token_losses(token_ce, batch.targets, dropped_of(batch))
        extras = {
            "all_loss": (float(result.all_loss) * result.n_all, result.n_all),
            "dropped_loss": (
                float(result.dropped_loss) * result.n_dropped if result.n_dropped else 0.0,
                result.n_dropped,
            ),
        }
        return StepLoss(loss_sum=result.loss_sum, n_tokens=result.n_kept, extras=extras)

    return TokenLossFn(targets=lambda batch: batch.targets, reduce=reduce, collate=Batch.stack)


def validation_loss_fn(prepared: Prepared) -> LossFn:
    """The validation loss: the standard next-token loss over every target (no goldfish mask), for every model."""
    return make_step_loss(MaskSpec(strategy=None), prepared.special_token_ids)


def check_mask_drops(mask: MaskSpec, n_dropped: int, spec: DataSpec) -> None:
    """Refuse (ValueError) a goldfish run whose mask drops no target of its training documents: it would train as
    the standard loss while labelled goldfish. The random strategy is drawn per step, so it is not checked here."""
    if mask.strategy is None or mask.strategy == "random" or n_dropped:
        return
    window = f" --h {mask.h}" if mask.strategy.startswith("hashed") else ""
    raise ValueError(
        f"the {mask.label} mask drops no target of the training documents (--k {mask.k}{window}, --seq-len "
        f"{spec.seq_len}): the run would train as the standard loss. Fix: a smaller --k or --h, longer documents, "
        "or --strategy standard for an unmasked run"
    )


def target_drops(mask: MaskSpec, prepared: Prepared) -> int:
    """Targets the mask drops in the training documents as a background run trains them (whole, with EOS)."""
    eos = prepared.tokenizer.eos_token_id
    return sum(
        int(row_mask(mask, prepared.special_token_ids).dropped(piece, 0, len(piece)).sum())
        for piece in (piece_ids(d.full_ids, eos) for d in prepared.split.train)
    )
