"""Deterministic choice of training and held-out documents, tokenized to a fixed length."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from data.documents import Document
from data.errors import DataError

# Documents are tokenized in batches (fast tokenizers parallelise a batch); a batch holds at least
# this many, so a run that needs few documents does not tokenize the whole corpus.
_MIN_BATCH = 64

TOO_SHORT_SCOPE = (
    "documents examined in seeded shuffled order until enough long-enough ones were found; "
    "documents never examined were not tokenized and are not counted"
)


@dataclass
class TokenizedDocument:
    """A selected document.

    text: the original, untruncated text. token_ids: exactly seq_len ids, starting with the
    tokenizer's bos id when it has one, then the first ids of the text. sha256: hex SHA-256 of the
    original text encoded as UTF-8 (identifies the content in run records).
    """

    id: str
    text: str
    token_ids: list[int]
    sha256: str


@dataclass
class DocumentSplit:
    """The outcome of `select_documents`.

    n_candidates: documents given. n_examined: documents tokenized and judged (in shuffled order,
    until enough were found; equals n_candidates when selection had to look at all of them).
    too_short: ids of examined documents with fewer than seq_len tokens (counting the bos token).
    """

    train: list[TokenizedDocument]
    heldout: list[TokenizedDocument]
    n_candidates: int
    too_short: list[str]
    seq_len: int
    seed: int
    n_examined: int

    def manifest(self) -> dict[str, Any]:
        """A JSON-able record of what was selected, for every run's outputs."""

        def entries(docs: list[TokenizedDocument]) -> list[dict[str, Any]]:
            return [{"id": d.id, "sha256": d.sha256, "n_chars": len(d.text)} for d in docs]

        return {
            "seq_len": self.seq_len,
            "seed": self.seed,
            "n_candidates": self.n_candidates,
            "n_examined": self.n_examined,
            "n_train": len(self.train),
            "n_heldout": len(self.heldout),
            "n_too_short": len(self.too_short),
            "too_short": list(self.too_short),
            "too_short_scope": TOO_SHORT_SCOPE,
            "train": entries(self.train),
            "heldout": entries(self.heldout),
        }


def select_documents(
    documents: Sequence[Document],
    tokenizer: Any,
    *,
    n_train: int,
    n_heldout: int,
    seq_len: int,
    seed: int = 0,
) -> DocumentSplit:
    """Choose n_train training and n_heldout held-out documents, each truncated to seq_len tokens.

    The documents are put in an order shuffled by `random.Random(seed)` and examined one by one:
    each is tokenized (no special tokens; the tokenizer's bos id, if any, is put in front), one with
    fewer than seq_len ids is skipped and listed in `too_short`, the others are kept until
    n_train + n_heldout are found. The first n_train kept are the training set, the next n_heldout
    the held-out set (disjoint). The same documents, tokenizer and seed give the same split; the
    training set does not depend on n_heldout.

    tokenizer: a Hugging Face tokenizer (called on a list of strings, returns "input_ids").
    Raises DataError for bad sizes, duplicate ids, or too few long-enough documents.
    """
    for name, value, minimum in (("n_train", n_train, 1), ("n_heldout", n_heldout, 0), ("seq_len", seq_len, 2)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise DataError(f"{name} must be an integer, got {value!r}")
        if value < minimum:
            raise DataError(f"{name} must be >= {minimum}, got {value}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise DataError(f"seed must be an integer, got {seed!r}")
    seen: set[str] = set()
    duplicate = next((doc.id for doc in documents if doc.id in seen or seen.add(doc.id)), None)
    if duplicate is not None:
        raise DataError(f"document id {duplicate!r} occurs more than once. Fix: give every document a unique id.")

    bos_id = getattr(tokenizer, "bos_token_id", None)
    n_text_ids = seq_len - (1 if bos_id is not None else 0)  # ids taken from the text itself
    needed = n_train + n_heldout
    order = list(range(len(documents)))
    random.Random(seed).shuffle(order)

    kept: list[TokenizedDocument] = []
    too_short: list[str] = []
    n_examined = 0
    while len(kept) < needed and n_examined < len(order):
        batch = [documents[i] for i in order[n_examined : n_examined + max(_MIN_BATCH, 2 * (needed - len(kept)))]]
        # verbose=False: texts longer than model_max_length are fine, we truncate below.
        encoded = tokenizer([doc.text for doc in batch], add_special_tokens=False, verbose=False)["input_ids"]
        for doc, text_ids in zip(batch, encoded):
            n_examined += 1
            if len(text_ids) < n_text_ids:
                too_short.append(doc.id)
                continue
            token_ids = ([bos_id] if bos_id is not None else []) + list(text_ids[:n_text_ids])
            kept.append(TokenizedDocument(id=doc.id, text=doc.text, token_ids=token_ids,
                                          sha256=hashlib.sha256(doc.text.encode("utf-8")).hexdigest()))
            if len(kept) == needed:
                break

    if len(kept) < needed:
        raise DataError(
            f"not enough documents of at least {seq_len} tokens: {len(kept)} available "
            f"({len(documents)} documents, {len(too_short)} too short), but n_train + n_heldout = "
            f"{n_train} + {n_heldout} = {needed} are needed. Fix: lower --n-train/--n-heldout or "
            "--seq-len, or give more (or longer) documents."
        )
    return DocumentSplit(
        train=kept[:n_train],
        heldout=kept[n_train:],
        n_candidates=len(documents),
        too_short=too_short,
        seq_len=seq_len,
        seed=seed,
        n_examined=n_examined,
    )
