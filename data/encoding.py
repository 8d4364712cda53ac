"""Tokenize many or very long texts with bounded memory, to the same ids as one call on each whole text.

A fast tokenizer's encoding keeps about 360 bytes per token besides the id (offsets, the token's string, word ids,
masks): one 50 MB document is 22.6M tokens and an 8 GB peak when encoded at once (bench/document_memory.py
measures it). Texts are therefore encoded in batches of at most `BATCH_CHARS` characters, and a text
longer than `PIECE_CHARS` in pieces cut just before a space that separates two non-space characters: where a
pre-tokenizer splits words at spaces (GPT-2's byte level, Llama 3's and SentencePiece's schemes), no token crosses
such a cut, so the pieces' ids, concatenated, are the whole text's. That is checked at every cut, not assumed: the
text around the cut (`CHECK_CHARS` on each side) is encoded joined and as two parts, and one difference makes the
text fall back to a single call on all of it (exact, at the old cost).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

BATCH_CHARS = 4_000_000  # characters per tokenizer call over several texts
PIECE_CHARS = 1_000_000  # a longer text is encoded in pieces of about this many characters
CHECK_CHARS = 2_000  # characters each side of a cut encoded joined and apart to confirm the cut is clean


@dataclass(frozen=True)
class Encoded:
    """One text's token count (no special tokens added) and its ids, all or the first `keep` of them."""

    n_ids: int
    ids: list[int]


def _encode(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    if not texts:
        return []
    # verbose=False: texts longer than model_max_length are fine here; callers cut what they keep
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]]


def space_cuts(text: str, every: int) -> list[int]:
    """Offsets at which to cut `text` into pieces of about `every` characters: each cut is just before a space with a
    non-space character on both sides. A stretch with no such space is not cut (one long piece)."""
    cuts = []
    position = every
    while position < len(text) - 1:
        found = text.find(" ", position)
        while found != -1 and found < len(text) - 1 and (text[found - 1].isspace() or text[found + 1].isspace()):
            found = text.find(" ", found + 1)
        if found == -1 or found >= len(text) - 1:
            break
        cuts.append(found)
        position = found + every
    return cuts


def _clean_cut(tokenizer: Any, text: str, cut: int) -> bool:
    left, right = text[max(0, cut - CHECK_CHARS) : cut], text[cut : cut + CHECK_CHARS]
    joined, left_ids, right_ids = _encode(tokenizer, [left + right, left, right])
    return joined == left_ids + right_ids


def clean_cuts(tokenizer: Any, text: str, piece_chars: int = PIECE_CHARS) -> list[int] | None:
    """The `space_cuts` of `text` when `tokenizer` encodes across every one of them as it encodes the two sides
    apart (checked on CHECK_CHARS each side); None when there is no cut or one is not clean (then the text must be
    encoded whole)."""
    cuts = space_cuts(text, piece_chars)
    return cuts if cuts and all(_clean_cut(tokenizer, text, cut) for cut in cuts) else None


def _encode_long(tokenizer: Any, text: str, keep: int | None, piece_chars: int) -> Encoded:
    cuts = clean_cuts(tokenizer, text, piece_chars)
    if cuts is None:
        ids = _encode(tokenizer, [text])[0]
        return Encoded(len(ids), ids if keep is None else ids[:keep])
    n_ids, kept = 0, []
    for start, end in zip([0, *cuts], [*cuts, len(text)]):
        ids = _encode(tokenizer, [text[start:end]])[0]
        n_ids += len(ids)
        if keep is None or len(kept) < keep:
            kept += ids if keep is None else ids[: keep - len(kept)]
    return Encoded(n_ids, kept)


def encode_bounded(
    tokenizer: Any,
    texts: Sequence[str],
    keep: int | None = None,
    *,
    batch_chars: int = BATCH_CHARS,
    piece_chars: int = PIECE_CHARS,
) -> Iterator[Encoded]:
    """Encode each of `texts` (no special tokens) in order, yielding its token count and its ids (the first `keep`
    of them; all when None), with memory bounded by `batch_chars` and `piece_chars` rather than the longest text.

    tokenizer: a Hugging Face tokenizer, called on a list of strings (returns "input_ids")."""
    batch: list[str] = []
    size = 0

    def flush() -> Iterator[Encoded]:
        for ids in _encode(tokenizer, batch):
            yield Encoded(len(ids), ids if keep is None else ids[:keep])
        batch.clear()

    for text in texts:
        if len(text) > piece_chars:
            yield from flush()
            size = 0
            yield _encode_long(tokenizer, text, keep, piece_chars)
            continue
        if size + len(text) > batch_chars:
            yield from flush()
            size = 0
        batch.append(text)
        size += len(text)
    yield from flush()


def training_pieces(texts: Iterable[str], piece_chars: int = PIECE_CHARS) -> Iterator[str]:
    """`texts` with each text longer than `piece_chars` cut at `space_cuts`: what a byte-level BPE trainer counts
    the same words in (its pre-tokenizer splits words at such spaces), at a fraction of the memory of a whole text."""
    for text in texts:
        if len(text) <= piece_chars:
            yield text
            continue
        cuts = space_cuts(text, piece_chars)
        for start, end in zip([0, *cuts], [*cuts, len(text)]):
            yield text[start:end]
