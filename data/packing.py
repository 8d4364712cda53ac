"""Packing whole documents into fixed-length rows, and the stream of a corpus with targets inserted into it.

A *stream* is a sequence of pieces (documents), each a list of token ids that ends with the tokenizer's EOS; the
pieces are laid end to end and cut into rows of `seq_len` tokens, so every token of every piece is in exactly one
row (the last row is padded). Only the pieces' lengths are held here (two int64 arrays, 16 bytes per piece); the
tokens are read when a row is built, so a stream of any size costs no more memory than its piece table.

`InsertionSchedule` places target documents into a background stream a chosen number of times each, at positions
drawn from a seed and spread over the stream (no two copies share a gap while there are gaps enough): the run record
can then state how often each target was seen. `BackgroundPieces` cuts long background documents into pieces, so
that copies can land inside them too: a stream of a few long files still offers a gap every few hundred tokens.

Imports nothing of the other project packages (numpy only).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from data.errors import DataError


@dataclass(frozen=True)
class Segment:
    """The part of one piece that lies in one row: tokens [start, end) of piece `piece`, at row position `at`."""

    piece: int
    start: int
    end: int
    at: int


class PackedLayout:
    """Pieces of the given lengths laid end to end and cut into rows of `seq_len` tokens.

    lengths: (P,) token count of each piece, in stream order (each >= 1).
    """

    def __init__(self, lengths: Sequence[int] | np.ndarray, seq_len: int) -> None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
            raise DataError(f"seq_len must be an integer >= 2, got {seq_len!r}")
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.ndim != 1 or len(lengths) == 0:
            raise DataError("a packed stream needs at least one document")
        if (lengths < 1).any():
            raise DataError(f"piece {int(np.argmin(lengths))} is empty: every document needs at least one token")
        self.seq_len = seq_len
        self.offsets = np.zeros(len(lengths) + 1, dtype=np.int64)  # (P + 1,) first token of each piece, then total
        np.cumsum(lengths, out=self.offsets[1:])

    @property
    def n_pieces(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def n_rows(self) -> int:
        return -(-self.n_tokens // self.seq_len)

    def segments(self, row: int) -> list[Segment]:
        """The pieces in row `row` (0-based), in order. The last row may be shorter than seq_len (to be padded)."""
        if not 0 <= row < self.n_rows:
            raise IndexError(f"row {row} out of range: the stream has {self.n_rows} rows")
        first, last = row * self.seq_len, min((row + 1) * self.seq_len, self.n_tokens)
        piece = int(np.searchsorted(self.offsets, first, side="right")) - 1
        out = []
        position = first
        while position < last:
            piece_start, piece_end = int(self.offsets[piece]), int(self.offsets[piece + 1])
            end = min(piece_end, last)
            out.append(Segment(piece=piece, start=position - piece_start, end=end - piece_start, at=position - first))
            position = end
            piece += 1
        return out

    def rows_of(self, piece: int) -> tuple[int, int]:
        """(first row, last row) holding tokens of `piece`."""
        return int(self.offsets[piece]) // self.seq_len, (int(self.offsets[piece + 1]) - 1) // self.seq_len


@dataclass(frozen=True)
class InsertionSchedule:
    """Where target copies go in a stream of background pieces.

    The stream is: background pieces in `background_order`, with copy i of the targets placed just before
    background position `gaps[i]` (a gap index in [0, n_background]: n_background means after the last piece);
    copies sharing a gap keep the order of `targets`. `targets[i]` is the target index of copy i.

    Built by `InsertionSchedule.draw`; `codes()` gives the stream as one int64 per piece: >= 0 a background
    document index, < 0 the target -(code + 1).
    """

    background_order: np.ndarray  # (B,) int64 background document indices in stream order
    gaps: np.ndarray  # (C,) int64, sorted
    targets: np.ndarray  # (C,) int64

    @staticmethod
    def draw(
        background_order: np.ndarray, copies: Sequence[int], seed: int, within: int | None = None
    ) -> InsertionSchedule:
        """Insert target t `copies[t]` times among the first `within` + 1 gaps (default: all; e.g. the part of the
        stream a run bounded by --max-steps trains), spread from the seed: with C copies and G gaps, every gap
        gets C // G copies and C % G gaps drawn without replacement one more, so copies share a gap (arrive
        back to back) only when there are more copies than gaps, and then at most ceil(C / G) in a row. The
        copies' targets are shuffled, so the copies of one target do not cluster either."""
        copies = [int(c) for c in copies]
        if any(c < 0 for c in copies):
            raise DataError(f"target copies must be >= 0, got {copies}")
        targets = np.repeat(np.arange(len(copies), dtype=np.int64), copies)
        generator = np.random.default_rng([seed, 7_919])
        targets = generator.permutation(targets)
        last = len(background_order) if within is None else max(0, min(within, len(background_order)))
        n_gaps = last + 1
        every, extra = divmod(len(targets), n_gaps)
        gaps = np.concatenate(
            [
                np.repeat(np.arange(n_gaps, dtype=np.int64), every),
                generator.choice(n_gaps, size=extra, replace=False).astype(np.int64),
            ]
        )
        return InsertionSchedule(np.asarray(background_order, dtype=np.int64), np.sort(gaps), targets)

    @property
    def most_in_a_row(self) -> int:
        """The most copies that share one gap: copies that follow each other with no background between them."""
        return int(np.bincount(self.gaps).max()) if len(self.gaps) else 0

    def codes(self) -> np.ndarray:
        """(B + C,) int64: the stream's pieces, background index (>= 0) or -(target + 1)."""
        n_background, n_copies = len(self.background_order), len(self.targets)
        out = np.empty(n_background + n_copies, dtype=np.int64)
        # copy i lands at stream index gaps[i] + i (i copies before it, all in earlier or the same gap)
        copy_at = self.gaps + np.arange(n_copies, dtype=np.int64)
        is_copy = np.zeros(len(out), dtype=bool)
        is_copy[copy_at] = True
        out[copy_at] = -(self.targets + 1)
        out[~is_copy] = self.background_order
        return out

    def fingerprint(self) -> str:
        """SHA-256 of the schedule: equal fingerprints mean the same stream of pieces."""
        digest = hashlib.sha256()
        for array in (self.background_order, self.gaps, self.targets):
            digest.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
            digest.update(b"|")
        return digest.hexdigest()


@dataclass(frozen=True)
class BackgroundPieces:
    """Background documents cut into pieces of at most `max_tokens` tokens, in stream order (a document's pieces
    follow each other, so the stream reads it whole unless a target copy lands between two of its pieces).

    Piece i is tokens [start[i], start[i] + length[i]) of document `document[i]`; `last[i]` says whether it ends
    the document (it then gets the EOS; a piece cut off mid-document gets none, and its last token predicts
    nothing, since the token after it may be a target copy's).
    """

    document: np.ndarray  # (P,) int64
    start: np.ndarray  # (P,) int64
    length: np.ndarray  # (P,) int64
    last: np.ndarray  # (P,) bool

    @staticmethod
    def cut(order: np.ndarray, lengths: np.ndarray, max_tokens: int) -> BackgroundPieces:
        """The pieces of documents `order` (indices into `lengths`, each >= 1 token), each cut into
        ceil(length / max_tokens) pieces of max_tokens tokens, the last one shorter."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise DataError(f"background pieces need max_tokens >= 1, got {max_tokens!r}")
        order = np.asarray(order, dtype=np.int64)
        doc_lengths = np.asarray(lengths, dtype=np.int64)[order]
        n_pieces = -(-doc_lengths // max_tokens)
        document = np.repeat(order, n_pieces)
        first_piece = np.repeat(np.cumsum(n_pieces) - n_pieces, n_pieces)
        index_in_doc = np.arange(int(n_pieces.sum()), dtype=np.int64) - first_piece
        start = index_in_doc * max_tokens
        length = np.minimum(np.repeat(doc_lengths, n_pieces) - start, max_tokens)
        last = index_in_doc == np.repeat(n_pieces, n_pieces) - 1
        return BackgroundPieces(document, start, length, last)

    def __len__(self) -> int:
        return len(self.document)
