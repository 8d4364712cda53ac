"""Deterministic choice of training and held-out documents, tokenized to a fixed length."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from data.chat import check_chat_template, render_conversation
from data.dedup import (
    AUDIT_NGRAM,
    KIND_RANK,
    Candidate,
    DedupConfig,
    best_links,
    cluster_roots,
    find_duplicate_links,
    ngram_containment,
)
from data.documents import Document
from data.encoding import encode_bounded
from data.errors import DataError

# Documents are tokenized in batches (fast tokenizers parallelise a batch); a batch holds at least
# this many, so a run that needs few documents does not tokenize the whole corpus.
_MIN_BATCH = 64

TOO_SHORT_SCOPE = (
    "documents examined in seeded shuffled order until enough long-enough ones were found; "
    "documents never examined were not tokenized and are not counted"
)
TOO_SHORT_SCOPE_ALL = "all documents examined (deduplication examines every document before any is placed)"


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
    repeat_of: str | None = None  # set on a training repeat: the id of the training document it duplicates
    # Whole-document selection only (select_documents(whole_documents=...)): every id of the document, bos first;
    # token_ids is then its extraction window (the first ids, at most whole_documents of them).
    full_ids: list[int] | None = None
    # Truncated selection: the ids the whole text has (bos counted), so len(token_ids) < n_tokens when it was cut.
    n_tokens: int | None = None
    # A conversation (data.chat): token_ids is the whole rendered conversation and replies the [start, end) token
    # span of each assistant reply, what training puts the loss on.
    replies: tuple[tuple[int, int], ...] | None = None
    # An extraction unit of one reply (data.chat.reply_units): the prompt's length in token_ids (the reply follows)
    # and the conversation it comes from.
    reply_start: int | None = None
    conversation_id: str | None = None


@dataclass
class DocumentSplit:
    """The outcome of `select_documents`.

    n_candidates: documents given. n_examined: documents tokenized and judged (in shuffled order,
    until enough were found; equals n_candidates when selection had to look at all of them).
    too_short: ids of examined documents with fewer than seq_len tokens (counting the bos token).
    train / heldout: one document per duplicate cluster (n_train and n_heldout of them).
    repeats: with duplicates="repeat", the extra copies of training documents, kept for training as counted
        repeats (each has repeat_of set); empty otherwise. `training_documents` = train + repeats.
    removed: one record per duplicate taken out of the selection: {"id", "twin" (the selected document of its
        cluster), "kind" ("exact-text" | "same-window" | "near"), "similarity", "matched" (the document it was
        found to duplicate; usually the twin, another member of the cluster otherwise), "side" ("train" |
        "heldout": where its cluster went), "action" ("dropped" | "repeat")}, in examination order.
    dedup: the deduplication settings used. heldout_train_overlap: audit of the result, the largest fraction
        of a held-out window's word 8-grams found in training windows, and which document (None without
        held-out documents).
    """

    train: list[TokenizedDocument]
    heldout: list[TokenizedDocument]
    n_candidates: int
    too_short: list[str]
    seq_len: int
    seed: int
    n_examined: int
    repeats: list[TokenizedDocument] = field(default_factory=list)
    removed: list[dict[str, Any]] = field(default_factory=list)
    dedup: DedupConfig = field(default_factory=lambda: DedupConfig(mode="off"))
    heldout_train_overlap: dict[str, Any] | None = None
    whole_documents: int | None = None  # the extraction window of whole-document selection; None: truncated
    too_long: list[str] = field(default_factory=list)  # whole-document selection with max_len: ids skipped as longer
    # training documents only from the first train_within of the shuffled order, held-out ones after (select_documents)
    train_within: int | None = None
    conversations: bool = False
    # How the run's own tokenizer was trained, when select_fitting_tokenizer trained it (TokenizerFit.record())
    tokenizer_fit: dict[str, Any] | None = None

    @property
    def cut(self) -> list[TokenizedDocument]:
        """The selected documents (training, their repeats and held-out) cut to their first seq_len tokens: longer
        than seq_len, so training and extraction see only their beginning (truncated selection only)."""
        docs = self.training_documents + self.heldout
        return [d for d in docs if d.full_ids is None and d.n_tokens is not None and d.n_tokens > len(d.token_ids)]

    @property
    def tokens_cut(self) -> int:
        """Tokens of the selected documents beyond their first seq_len: never trained on nor extracted."""
        return sum(d.n_tokens - len(d.token_ids) for d in self.cut if d.n_tokens is not None)

    @property
    def training_documents(self) -> list[TokenizedDocument]:
        """What training runs over: the training documents, then their counted repeats (if any)."""
        return self.train + self.repeats

    def manifest(self) -> dict[str, Any]:
        """A JSON-able record of what was selected, for every run's outputs."""

        def entries(docs: list[TokenizedDocument]) -> list[dict[str, Any]]:
            return [
                {"id": d.id, "sha256": d.sha256, "n_chars": len(d.text)}
                | ({"n_tokens": len(d.full_ids)} if d.full_ids is not None else {})
                for d in docs
            ]

        return {
            "seq_len": self.seq_len,
            "seed": self.seed,
            "n_candidates": self.n_candidates,
            "n_examined": self.n_examined,
            "n_train": len(self.train),
            "n_heldout": len(self.heldout),
            "n_too_short": len(self.too_short),
            "too_short": list(self.too_short),
            "too_short_scope": TOO_SHORT_SCOPE if self.dedup.mode == "off" else TOO_SHORT_SCOPE_ALL,
            "train": entries(self.train),
            "heldout": entries(self.heldout),
            "dedup": self.dedup.record(),
            "n_removed": sum(r["action"] == "dropped" for r in self.removed),
            "n_repeats": len(self.repeats),
            "removed_by_kind": {kind: sum(r["kind"] == kind for r in self.removed) for kind in KIND_RANK},
            "removed": [dict(r) for r in self.removed],
            "repeats": [{**e, "repeat_of": d.repeat_of} for e, d in zip(entries(self.repeats), self.repeats)],
            "heldout_train_overlap": self.heldout_train_overlap,
            "whole_documents": self.whole_documents,
            "n_too_long": len(self.too_long),
            "too_long": list(self.too_long),
            "n_cut": len(self.cut),
            "tokens_cut": self.tokens_cut,
            "train_within": self.train_within,
            "tokenizer_fit": self.tokenizer_fit,
        }


def assign_buckets(n_documents: int, buckets: Sequence[int], seed: int) -> list[int]:
    """The bucket of each of `n_documents` documents (e.g. how many times each is repeated): every bucket gets
    n // len(buckets) documents and the first n % len(buckets) buckets one more, placed at random from `seed`, so no
    property of the documents' order (their length, their source) goes with the bucket."""
    if not buckets:
        raise DataError("assign_buckets needs at least one bucket")
    balanced = [buckets[i % len(buckets)] for i in range(n_documents)]
    random.Random(f"buckets-{seed}").shuffle(balanced)
    return balanced


def check_document_count(n_documents: int, n_train: int, n_heldout: int) -> None:
    """Refuse at once a source with fewer documents than n_train + n_heldout, before a tokenizer is trained on it or
    a document tokenized (one 50 MB document took minutes and gigabytes of tokenizing before this was found)."""
    if n_documents < n_train + n_heldout:
        raise DataError(
            f"not enough documents: the source holds {n_documents}, but n_train + n_heldout = {n_train} + "
            f"{n_heldout} = {n_train + n_heldout} are needed. Fix: lower --n-train/--n-heldout, or give more "
            "documents (a .txt file is one document: give a folder of .txt files, or a .jsonl file with one "
            "document per line)"
        )


def select_documents(
    documents: Sequence[Document],
    tokenizer: Any,
    *,
    n_train: int,
    n_heldout: int,
    seq_len: int,
    seed: int = 0,
    dedup: DedupConfig | None = None,
    whole_documents: int | None = None,
    max_len: int | None = None,
    train_within: int | None = None,
) -> DocumentSplit:
    """Choose n_train training and n_heldout held-out documents, each truncated to seq_len tokens.

    whole_documents: None for the above. An int W selects whole documents instead: seq_len is then the least
    number of tokens a document needs, each selected document keeps all its ids in `full_ids` (bos first), and
    `token_ids` is its extraction window, its first min(W, length) ids (deduplication compares these windows).
    max_len (whole documents only): documents with more ids are skipped and listed in `too_long`.

    The documents are put in an order shuffled by `random.Random(seed)` and examined one by one:
    each is tokenized (no special tokens; the tokenizer's bos id, if any, is put in front), one with
    fewer than seq_len ids is skipped and listed in `too_short`. The first n_train long-enough documents
    are the training set, the next n_heldout the held-out set (disjoint). The same documents, tokenizer,
    seed and dedup settings give the same split; the training set does not depend on n_heldout.

    dedup (default: `DedupConfig()`, mode "near"): with mode "off", documents are examined only until
    enough are found. Otherwise every document is tokenized first, duplicates are linked
    (`data.dedup.find_duplicate_links`) and clustered, and the walk in shuffled order places whole
    clusters: a cluster's first long-enough member takes the next training (then held-out) place, its
    other members follow it to that side and are dropped (recorded in `removed`) or, for a training
    cluster with duplicates="repeat", kept in `repeats`. So no cluster has members on both sides.

    train_within (None: no bound): the training documents come from the first `train_within` documents of the
    shuffled order (`shuffled_order`) and the held-out ones from after them; a long-enough cluster starting inside
    that prefix beyond the n_train training places is unused. `select_fitting_tokenizer` sets it: a tokenizer
    trained on those first documents has seen no held-out one.

    tokenizer: a Hugging Face tokenizer (called on a list of strings, returns "input_ids"; `decode` is
    used for near-duplicate detection). Raises DataError for bad sizes or settings, duplicate ids, or too
    few long-enough (distinct) documents.
    """
    dedup = _checked_settings(documents, n_train, n_heldout, seq_len, seed, whole_documents, dedup)
    if _are_conversations(documents):
        check_chat_template(tokenizer)
    if train_within is not None and (isinstance(train_within, bool) or not isinstance(train_within, int)):
        raise DataError(f"train_within must be an integer or None, got {train_within!r}")
    order = shuffled_order(len(documents), seed)
    split = _select(
        documents, order, seed, tokenizer, n_train, n_heldout, seq_len, dedup, whole_documents, max_len, train_within
    )
    check_enough(split, len(documents), n_train, n_heldout, max_len)
    return split


def select_fitting_tokenizer(
    documents: Sequence[Document],
    fit: Callable[[list[str]], Any],
    *,
    n_train: int,
    n_heldout: int,
    seq_len: int,
    seed: int = 0,
    dedup: DedupConfig | None = None,
    whole_documents: int | None = None,
    max_len: int | None = None,
) -> tuple[Any, DocumentSplit]:
    """(tokenizer, split) for a run that trains its own tokenizer: `fit(texts)` trains it, and no held-out document
    is ever among the texts it is given.

    Held-out documents are chosen after the training ones in the shuffled order, so the tokenizer is trained on the
    first W documents of that order (W = n_train at first) and the documents are selected with it under
    `train_within=W`: training documents from those W, held-out ones from after them. When the first W hold fewer
    than n_train long-enough (distinct) documents, W grows by the share found and the tokenizer is trained again.
    Besides the training documents, the W hold only documents the run does not use (too short, duplicates of a
    training document, or long-enough ones past the n_train training places). `split.tokenizer_fit` records W and
    the number of rounds; select_documents(..., train_within=W) with the tokenizer selects the same split again
    (goldfish eval does, from the run record). Arguments and errors are select_documents'.
    """
    dedup = _checked_settings(documents, n_train, n_heldout, seq_len, seed, whole_documents, dedup)
    conversations = _are_conversations(documents)
    order = shuffled_order(len(documents), seed)
    within, rounds = n_train, 0
    while True:
        rounds += 1
        tokenizer = fit([documents[i].text for i in order[:within]])
        if conversations:
            check_chat_template(tokenizer)
        split = _select(
            documents, order, seed, tokenizer, n_train, n_heldout, seq_len, dedup, whole_documents, max_len, within
        )
        found = len(split.train)
        if found >= n_train or within >= len(documents):
            break
        # grow W by the share of long-enough documents the first W held, at least by the places still empty
        within = min(len(documents), max(within + n_train - found, -(-within * n_train // max(found, 1))))
    check_enough(split, len(documents), n_train, n_heldout, max_len)
    split.tokenizer_fit = {
        "documents": within,
        "rounds": rounds,
        "rule": "trained on the first `documents` documents of the seeded order (the training documents and those "
        "the run skips before them), never on a held-out one: held-out documents come after them",
    }
    return tokenizer, split


def _checked_settings(
    documents: Sequence[Document],
    n_train: int,
    n_heldout: int,
    seq_len: int,
    seed: int,
    whole_documents: int | None,
    dedup: DedupConfig | None,
) -> DedupConfig:
    """The deduplication settings (DedupConfig() for None), after refusing bad sizes, seeds and ids (DataError)."""
    for name, value, minimum in (("n_train", n_train, 1), ("n_heldout", n_heldout, 0), ("seq_len", seq_len, 2)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise DataError(f"{name} must be an integer, got {value!r}")
        if value < minimum:
            raise DataError(f"{name} must be >= {minimum}, got {value}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise DataError(f"seed must be an integer, got {seed!r}")
    if whole_documents is not None and (
        isinstance(whole_documents, bool) or not isinstance(whole_documents, int) or whole_documents < seq_len
    ):
        raise DataError(
            f"whole_documents (the extraction window) must be an integer >= seq_len = {seq_len}, got "
            f"{whole_documents!r}. Fix: raise --extract-len"
        )
    dedup = DedupConfig() if dedup is None else dedup
    if not isinstance(dedup, DedupConfig):
        raise DataError(f"dedup must be a DedupConfig or None, got {type(dedup).__name__}")
    seen: set[str] = set()
    duplicate = next((doc.id for doc in documents if doc.id in seen or seen.add(doc.id)), None)
    if duplicate is not None:
        raise DataError(f"document id {duplicate!r} occurs more than once. Fix: give every document a unique id.")

    if whole_documents is not None and _are_conversations(documents):
        raise DataError("conversations are selected whole already; whole-document (--pack) selection is for texts")
    check_document_count(len(documents), n_train, n_heldout)
    return dedup


def shuffled_order(n_documents: int, seed: int) -> list[int]:
    """The order select_documents examines documents in: range(n_documents) shuffled by random.Random(seed)."""
    order = list(range(n_documents))
    random.Random(seed).shuffle(order)
    return order


def _select(
    documents: Sequence[Document],
    order: list[int],
    seed: int,
    tokenizer: Any,
    n_train: int,
    n_heldout: int,
    seq_len: int,
    dedup: DedupConfig,
    whole_documents: int | None,
    max_len: int | None,
    train_within: int | None,
) -> DocumentSplit:
    """select_documents' walk, without its check that enough documents were found."""
    conversations = _are_conversations(documents)
    bos_id = getattr(tokenizer, "bos_token_id", None)
    n_text_ids = seq_len - (1 if bos_id is not None else 0)  # ids taken from the text itself
    needed = n_train + n_heldout

    # Long-enough documents in examination order; with dedup on, all of them (clusters must be known first).
    kept: list[TokenizedDocument] = []
    positions: list[int] = []  # each kept document's place in the shuffled order
    too_short: list[str] = []
    too_long: list[str] = []
    n_examined = 0

    def found_enough() -> bool:  # without deduplication, examining stops once every place can be filled
        if train_within is None:
            return len(kept) >= needed
        inside = sum(p < train_within for p in positions)
        return min(inside, n_train) + min(len(positions) - inside, n_heldout) >= needed

    while (dedup.mode != "off" or not found_enough()) and n_examined < len(order):
        want = len(order) if dedup.mode != "off" else max(_MIN_BATCH, 2 * (needed - len(kept)))
        batch = [documents[i] for i in order[n_examined : n_examined + want]]
        if conversations:
            for doc in batch:
                n_examined += 1
                conversation = _conversation(doc, tokenizer, seq_len)
                if conversation is None:
                    too_long.append(doc.id)
                    continue
                kept.append(conversation)
                positions.append(n_examined - 1)
                if dedup.mode == "off" and found_enough():
                    break
            continue
        # Only the ids a document can use are kept (its first n_text_ids; whole documents up to max_len), and long
        # texts are encoded in pieces: a 50 MB document costs its count, not gigabytes of encodings.
        keep = n_text_ids if whole_documents is None else (max_len or None)
        for doc, encoded in zip(batch, encode_bounded(tokenizer, [doc.text for doc in batch], keep=keep)):
            n_examined += 1
            text_ids = encoded.ids
            if encoded.n_ids < n_text_ids:
                too_short.append(doc.id)
                continue
            if whole_documents is not None and max_len and encoded.n_ids + (bos_id is not None) > max_len:
                too_long.append(doc.id)
                continue
            full_ids = None
            if whole_documents is None:
                token_ids = ([bos_id] if bos_id is not None else []) + text_ids
            else:
                full_ids = ([bos_id] if bos_id is not None else []) + text_ids
                token_ids = full_ids[:whole_documents]
            kept.append(
                TokenizedDocument(
                    id=doc.id,
                    text=doc.text,
                    token_ids=token_ids,
                    full_ids=full_ids,
                    n_tokens=encoded.n_ids + (bos_id is not None),
                    sha256=hashlib.sha256(doc.text.encode("utf-8")).hexdigest(),
                )
            )
            positions.append(n_examined - 1)
            if dedup.mode == "off" and found_enough():
                break

    placed = _place_clusters(kept, positions, tokenizer, bos_id, n_train, needed, dedup, train_within)
    train, heldout, repeats, removed = placed
    return DocumentSplit(
        train=train,
        heldout=heldout,
        n_candidates=len(documents),
        too_short=too_short,
        seq_len=seq_len,
        seed=seed,
        n_examined=n_examined,
        repeats=repeats,
        removed=removed,
        dedup=dedup,
        heldout_train_overlap=_overlap_audit(train + repeats, heldout, tokenizer, bos_id),
        whole_documents=whole_documents,
        too_long=too_long,
        train_within=train_within,
        conversations=conversations,
    )


def check_enough(split: DocumentSplit, n_documents: int, n_train: int, n_heldout: int, max_len: int | None) -> None:
    """Refuse (DataError) a split with fewer than n_train + n_heldout documents, saying what was short and how to fix
    it."""
    found, needed, removed = len(split.train) + len(split.heldout), n_train + n_heldout, split.removed
    if found >= needed:
        return
    wanted = f"n_train + n_heldout = {n_train} + {n_heldout} = {needed} are needed"
    if split.conversations:
        distinct = f" distinct (after removing {len(removed)} with duplicate replies)" if removed else ""
        raise DataError(
            f"not enough conversations of at most {split.seq_len} tokens: {found}{distinct} available "
            f"({n_documents} conversations, {len(split.too_long)} longer), but {wanted}. Fix: lower "
            "--n-train/--n-heldout, raise --seq-len, or give more conversations."
        )
    distinct = f" distinct (after removing {len(removed)} duplicates)" if removed else ""
    raise DataError(
        f"not enough documents of at least {split.seq_len} tokens: {found}{distinct} available "
        f"({n_documents} documents, {len(split.too_short)} too short"
        + (f", {len(split.too_long)} longer than {max_len}" if split.too_long else "")
        + f"), but {wanted}. Fix: lower --n-train/--n-heldout or "
        + ("--min-doc-tokens, raise --max-doc-tokens" if split.whole_documents is not None else "--seq-len")
        + ", or give more (or longer) documents."
    )


def _window_text(tokenizer: Any, doc: TokenizedDocument, bos_id: int | None) -> str:
    """The text deduplication and the overlap audit judge: the window's text, or a conversation's replies (what
    training puts the loss on and extraction compares; a system prompt shared by every conversation is no
    duplicate)."""
    if doc.replies is not None:
        return "\n".join(
            tokenizer.decode(doc.token_ids[start:end], skip_special_tokens=True) for start, end in doc.replies
        )
    ids = doc.token_ids[1:] if bos_id is not None else doc.token_ids
    return tokenizer.decode(ids)


def _reply_ids(doc: TokenizedDocument) -> list[int]:
    return [t for start, end in doc.replies or () for t in doc.token_ids[start:end]]


def _are_conversations(documents: Sequence[Document]) -> bool:
    """True when every document is a conversation, False when none is; DataError for a mix."""
    chats = sum(doc.messages is not None for doc in documents)
    if 0 < chats < len(documents):
        raise DataError(
            f"the source mixes {chats} conversations with {len(documents) - chats} text documents. Fix: give "
            "conversations and texts as separate sources."
        )
    return chats > 0


def _conversation(doc: Document, tokenizer: Any, max_len: int) -> TokenizedDocument | None:
    """A conversation rendered and tokenized whole (data.chat), or None when it has more than max_len ids."""
    rendered = render_conversation(tokenizer, doc.messages or (), f"conversation {doc.id!r}")
    if len(rendered.ids) > max_len:
        return None
    return TokenizedDocument(
        id=doc.id,
        text=doc.text,
        token_ids=rendered.ids,
        sha256=hashlib.sha256(doc.text.encode("utf-8")).hexdigest(),
        n_tokens=len(rendered.ids),
        replies=rendered.replies,
    )


def _candidate(doc: TokenizedDocument, tokenizer: Any, bos_id: int | None, near: bool) -> Candidate:
    """A document as deduplication sees it; a conversation by its replies alone (texts and ids)."""
    if doc.replies is not None:
        replies = _window_text(tokenizer, doc, bos_id)
        return Candidate(doc.id, replies, _reply_ids(doc), replies)
    return Candidate(doc.id, doc.text, doc.token_ids, _window_text(tokenizer, doc, bos_id) if near else "")


def _place_clusters(
    kept: list[TokenizedDocument],
    positions: list[int],
    tokenizer: Any,
    bos_id: int | None,
    n_train: int,
    needed: int,
    dedup: DedupConfig,
    train_within: int | None,
) -> tuple[list[TokenizedDocument], list[TokenizedDocument], list[TokenizedDocument], list[dict[str, Any]]]:
    """(train, heldout, repeats, removed) from the long-enough documents in examination order (`positions`: their
    places in the shuffled order)."""
    if dedup.mode == "off":
        roots, reasons = list(range(len(kept))), [None] * len(kept)
    else:
        candidates = [_candidate(d, tokenizer, bos_id, dedup.mode == "near") for d in kept]
        links = find_duplicate_links(candidates, dedup)
        roots, reasons = cluster_roots(len(kept), links), best_links(len(kept), links)
    side: dict[int, str] = {}  # cluster root -> "train" | "heldout" | "unused"
    train: list[TokenizedDocument] = []
    heldout: list[TokenizedDocument] = []
    repeats: list[TokenizedDocument] = []
    removed: list[dict[str, Any]] = []
    for i, doc in enumerate(kept):
        root = roots[i]
        if root == i:  # first member of its cluster: takes the next free place of its part of the order
            trainable = train_within is None or positions[i] < train_within
            holdable = train_within is None or positions[i] >= train_within
            if trainable and len(train) < n_train:
                side[i] = "train"
                train.append(doc)
            elif holdable and len(heldout) < needed - n_train:
                side[i] = "heldout"
                heldout.append(doc)
            else:
                side[i] = "unused"
            continue
        if side[root] == "unused":  # neither it nor its twin is used by this run
            continue
        link = reasons[i]
        matched = link.b if link.a == i else link.a
        action = "repeat" if side[root] == "train" and dedup.duplicates == "repeat" else "dropped"
        removed.append(
            {
                "id": doc.id,
                "twin": kept[root].id,
                "kind": link.kind,
                "similarity": round(link.similarity, 4),
                "matched": kept[matched].id,
                "side": side[root],
                "action": action,
            }
        )
        if action == "repeat":
            repeats.append(
                TokenizedDocument(
                    id=doc.id,
                    text=doc.text,
                    token_ids=doc.token_ids,
                    sha256=doc.sha256,
                    repeat_of=kept[root].id,
                    full_ids=doc.full_ids,
                    n_tokens=doc.n_tokens,
                    replies=doc.replies,
                )
            )
    return train, heldout, repeats, removed


def _overlap_audit(
    train: list[TokenizedDocument], heldout: list[TokenizedDocument], tokenizer: Any, bos_id: int | None
) -> dict[str, Any] | None:
    """The largest fraction of a held-out window's word 8-grams that occur in training windows."""
    if not heldout:
        return None
    fractions = ngram_containment(
        [_window_text(tokenizer, d, bos_id) for d in heldout], [_window_text(tokenizer, d, bos_id) for d in train]
    )
    worst = max(range(len(heldout)), key=lambda i: fractions[i])
    return {
        "ngram_words": AUDIT_NGRAM,
        "max_fraction": round(fractions[worst], 4),
        "heldout_id": heldout[worst].id,
        "mean_fraction": round(sum(fractions) / len(fractions), 4),
        "what": "fraction of a held-out window's word 8-grams found in any training window",
    }
