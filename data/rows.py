"""Packed training rows: whole documents laid end to end, with a loss mask computed per document.

A row is a data.batch.Row of (T,) tensors, stacked into a data.batch.Batch for the loss:

    input_ids      token ids, the pad id after the stream's last token
    targets        the next token of the same document; IGNORE_INDEX at a document's last token (its EOS: nothing
                   of the next document is ever predicted from it) and on padding
    position_ids   restart at 0 where each document's part in the row begins, so the model's attention is
                   block-causal within the row (transformers builds a packed-sequence mask from restarting
                   position ids when no attention mask is given) and a part is computed exactly as if alone
    dropped        the loss mask of the document's own targets: a function of the document's tokens only, so a
                   document drops the same targets wherever it lands in a row, in every repetition

Every token of every document but its first is a target exactly once per pass: where a document continues in the
next row, the last position of the row predicts the first token of the continuation.

The mask is handed in by the application as a `RowMask` (the goldfish mask as a function of a piece's targets):
this module knows no mask strategy. Imports nothing of the other project packages (torch only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from conventions import IGNORE_INDEX
from data.batch import Row
from data.packing import PackedLayout, Segment


def _no_lookback(start: int) -> int:
    return 0


@dataclass(frozen=True)
class RowMask:
    """The loss mask packed rows carry, handed in by the application.

    drop: (T,) int64 targets of a piece's positions, in order (IGNORE_INDEX after its last token) -> (T,) bool, True
        where the target is dropped from the loss; None drops nothing (the standard loss, or a mask the loss draws
        per step itself).
    lookback: start -> the targets before position `start` that decide the drops from `start` on: the drops of
        positions [start, end) are drop(targets[start - lookback(start) : end]) with the first lookback(start) cut
        off, exactly those of the whole piece, at O(end - start + lookback) whatever the piece's length.
    label: names the mask in a stream's identity (a resume refuses a stream built with another mask).
    """

    drop: Callable[[torch.Tensor], torch.Tensor] | None = None
    lookback: Callable[[int], int] = _no_lookback
    label: str = "standard"

    def dropped(self, piece: Sequence[int], start: int, end: int) -> torch.Tensor:
        """(end - start,) bool: the drops of a piece's targets at positions [start, end), as on the whole piece."""
        if self.drop is None:
            return torch.zeros(end - start, dtype=torch.bool)
        context = self.lookback(start)
        targets = torch.tensor(piece_targets(piece, start - context, end), dtype=torch.long)
        return self.drop(targets)[context:]


NO_MASK = RowMask()


def piece_ids(full_ids: Sequence[int], eos_id: int | None) -> list[int]:
    """A document as a stream piece: its ids (bos first, as selected) and the EOS that separates it from the next."""
    return list(full_ids) + ([eos_id] if eos_id is not None else [])


def piece_targets(piece: Sequence[int], start: int, end: int) -> list[int]:
    """The targets of a piece's positions [start, end): the next token, IGNORE_INDEX after its last."""
    targets = list(piece[start + 1 : end + 1])
    return targets + [IGNORE_INDEX] if end == len(piece) else targets


class PackedRows(Sequence[Row]):
    """The rows of a packed stream, built when asked for (engine.training.train reads only this rank's rows of each
    step).

    layout: the pieces' lengths cut into rows. piece: piece index -> its token ids (ending with EOS).
    mask: the loss mask (NO_MASK: nothing dropped). pad_id: fills the last row.
    multiple: rows of padding only (no targets: they change no loss or gradient) are added up to a multiple of it,
        e.g. the batch size, so that every step's rows split evenly over the ranks.
    """

    def __init__(
        self,
        layout: PackedLayout,
        piece: Callable[[int], Sequence[int]],
        mask: RowMask,
        pad_id: int,
        multiple: int = 1,
    ) -> None:
        self.layout, self.piece, self.mask, self.pad_id = layout, piece, mask, pad_id
        self.n_rows = -(-layout.n_rows // multiple) * multiple

    def __len__(self) -> int:
        return self.n_rows

    def __getitem__(self, row: int) -> Row:  # type: ignore[override]
        if isinstance(row, slice):
            raise TypeError("PackedRows takes one row index at a time")
        if row < 0:
            row += len(self)
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} out of range: there are {len(self)} rows")
        return self.build(self.layout.segments(row) if row < self.layout.n_rows else [])

    def build(self, segments: Sequence[Segment]) -> Row:
        """One row from its segments."""
        length = self.layout.seq_len
        input_ids = torch.full((length,), self.pad_id, dtype=torch.long)
        targets = torch.full((length,), IGNORE_INDEX, dtype=torch.long)
        position_ids = torch.zeros(length, dtype=torch.long)
        dropped = torch.zeros(length, dtype=torch.bool)
        used = 0
        for segment in segments:
            ids = self.piece(segment.piece)
            span = slice(segment.at, segment.at + segment.end - segment.start)
            input_ids[span] = torch.tensor(ids[segment.start : segment.end], dtype=torch.long)
            targets[span] = torch.tensor(piece_targets(ids, segment.start, segment.end), dtype=torch.long)
            position_ids[span] = torch.arange(segment.end - segment.start)
            dropped[span] = self.mask.dropped(ids, segment.start, segment.end)
            used = span.stop
        position_ids[used:] = torch.arange(length - used)  # padding: a sequence of its own, never a target
        return Row(input_ids=input_ids, targets=targets, dropped=dropped, position_ids=position_ids)


def stream_order(copies: Sequence[int], seed: int) -> list[int]:
    """The pieces of an in-memory packed run: document d `copies[d]` times, in an order shuffled by `seed` (so the
    copies of a document land at different offsets and in different rows)."""
    order = [d for d, n in enumerate(copies) for _ in range(n)]
    generator = torch.Generator().manual_seed(seed * 1_000_003 + 17)
    return [order[i] for i in torch.randperm(len(order), generator=generator).tolist()]


def pack_documents(
    documents: Sequence[Any],
    copies: Sequence[int],
    seq_len: int,
    mask: RowMask,
    *,
    eos_id: int | None,
    pad_id: int,
    seed: int,
    multiple: int = 1,
) -> tuple[PackedRows, list[int]]:
    """Rows of whole documents (data.TokenizedDocument with full_ids), document d repeated copies[d] times, padded
    with empty rows to a multiple of `multiple`.

    Returns the rows and the stream's pieces as document indices (piece p is document order[p])."""
    pieces = [piece_ids(doc.full_ids, eos_id) for doc in documents]
    order = stream_order(copies, seed)
    layout = PackedLayout([len(pieces[d]) for d in order], seq_len)
    return PackedRows(layout, lambda p: pieces[order[p]], mask, pad_id, multiple), order
