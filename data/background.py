"""Targets at controlled repetitions inside a background corpus: the stream of a `--background` run.

The background (data.corpus: tokenized once, memory-mapped) is trained on but not measured. Its documents are
put in an order drawn from the seed; a held-out slice of them (--val-tokens) is the validation set; background
documents whose normalized text equals a target's (train or held-out), or that contain at least half of a target's
word shingles (a near copy: edited, or inside a longer document), are removed. The training documents (targets)
are assigned to the non-zero `--repeats` buckets at random from the data seed and inserted that many times each at
gaps of that order drawn from the seed and spread over it (only within the part of the stream a --max-steps run
trains; background documents are cut into pieces of at most --seq-len tokens, so a copy can land inside a long
document); held-out targets (bucket 0) are never inserted (data.packing.InsertionSchedule). The stream is packed
into rows (data.rows) read in order, one optimizer step after the other: `exposures` then says exactly how many
copies of each target the run trains on.

The application hands in the settings (`BackgroundSpec`), the loss mask as a function (data.rows.RowMask) and how
the trainer reads the rows (`Reading`). Imports nothing of the other project packages.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from data.batch import Row
from data.corpus import TokenizedCorpus, load_raw_corpus, open_stream, stream_corpus, text_key, tokenize_corpus
from data.dedup import CONTAINMENT_SAMPLE, CONTAINMENT_THRESHOLD, SHINGLE_WORDS, sampled_shingles
from data.errors import DataError
from data.packing import BackgroundPieces, InsertionSchedule, PackedLayout
from data.rows import NO_MASK, PackedRows, RowMask, piece_ids
from data.selection import TokenizedDocument, assign_buckets

MIN_PIECE_TOKENS = 16  # background pieces are never cut shorter (each cut costs the piece's last target)
STREAM_MARGIN = 1.1  # a streamed background reads 10% more than the rows need: copies of targets are removed


@dataclass(frozen=True)
class BackgroundSpec:
    """The settings a background stream is built from (the application fills them from its data options).

    source: the background corpus (--background). repeats: the --repeats buckets (0: the held-out targets);
    data_seed assigns the training targets to them. val_tokens: held-out background tokens, the validation set.
    insert_window: insert each target's first `extraction_window` tokens (what is measured), not the whole document.
    text_field, split: where the background's text is. streaming: read only the stream's first tokens (`stream_budget`).
    workers: processes tokenizing it. cache_dir: where tokenized corpora are cached (None: not cached).
    """

    source: str
    seq_len: int
    repeats: tuple[int, ...]
    data_seed: int
    val_tokens: int
    insert_window: bool = False
    text_field: str = "text"
    split: str = "train"
    streaming: bool = False
    workers: int = 1
    cache_dir: Path | None = None

    @property
    def train_buckets(self) -> tuple[int, ...]:
        """The buckets of training targets: `repeats` without 0 (the held-out bucket)."""
        return tuple(r for r in self.repeats if r > 0)


class Reading(Protocol):
    """How the trainer reads a stream's rows (engine.training.train.TrainConfig is one): in stream order,
    `batch_size` rows an optimizer step, `epochs` passes, stopped after `max_steps` steps (0: every epoch); `seed`
    draws the background order and the insertion schedule."""

    batch_size: int
    epochs: int
    max_steps: int
    seed: int


def steps_per_epoch(n_rows: int, batch_size: int) -> int:
    """Optimizer steps of one pass over `n_rows` rows (the last step may be short): the engine's count
    (engine.training.train.steps_per_epoch; tests/e2e/test_background.py checks they agree)."""
    return -(-n_rows // batch_size)


def total_steps(n_rows: int, train: Reading) -> int:
    """Optimizer steps of a run over `n_rows` rows: every epoch, or train.max_steps when that is fewer (the engine's
    engine.training.train.total_steps_of)."""
    total = train.epochs * steps_per_epoch(n_rows, train.batch_size)
    return min(total, train.max_steps) if train.max_steps else total


def stream_budget(spec: BackgroundSpec, train: Reading) -> int:
    """Background tokens a --background-streaming run reads: its --max-steps x --batch-size rows of --seq-len tokens
    (an upper bound: target copies fill part of them) plus --val-tokens, with STREAM_MARGIN."""
    return int(STREAM_MARGIN * (train.max_steps * train.batch_size * spec.seq_len + spec.val_tokens)) + 1


def load_background(
    spec: BackgroundSpec,
    tokenizer: Any,
    *,
    token_budget: int | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> TokenizedCorpus:
    """The tokenized background corpus of `spec` (tokenized on the first call, read from the cache after). With
    spec.streaming, only the stream's first `token_budget` tokens (see `stream_budget`)."""
    if spec.streaming:
        if token_budget is None:
            raise ValueError("a streamed background needs its token budget (stream_budget)")
        corpus = stream_corpus(
            spec.source,
            tokenizer,
            token_budget,
            text_field=spec.text_field,
            split=spec.split,
            cache_dir=spec.cache_dir,
            progress=progress,
        )
        ended = " (the stream ended first)" if corpus.n_tokens < token_budget else ""
        log(
            f"background: {len(corpus)} documents, {corpus.n_tokens} tokens streamed from {spec.source!r} "
            f"(budget {token_budget}){ended}"
        )
        return corpus
    corpus = tokenize_corpus(
        spec.source,
        tokenizer,
        text_field=spec.text_field,
        split=spec.split,
        workers=spec.workers,
        cache_dir=spec.cache_dir,
        progress=progress,
    )
    log(f"background: {len(corpus)} documents, {corpus.n_tokens} tokens from {spec.source!r}")
    return corpus


def background_sample(spec: BackgroundSpec, max_chars: int = 2_000_000) -> list[str]:
    """The first documents of the background, up to `max_chars` characters (to train a tiny model's tokenizer)."""
    if spec.streaming:
        rows = open_stream(spec.source, split=spec.split)
        field = spec.text_field
    else:
        rows = load_raw_corpus(spec.source, text_field=spec.text_field, split=spec.split, cache_dir=spec.cache_dir)
        field = "text"
    texts, size = [], 0
    for row in rows:
        if size >= max_chars:
            break
        text = row.get(field, row.get("text")) or ""
        texts.append(text[: max_chars - size])
        size += len(texts[-1])
    return texts


class _Rows(Sequence[Row]):
    """The first `n` rows of packed rows."""

    def __init__(self, rows: PackedRows, n: int) -> None:
        self.rows, self.n = rows, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> Row:  # type: ignore[override]
        if not 0 <= index < self.n:
            raise IndexError(index)
        return self.rows[index]


class CorpusStream(PackedRows):
    """The training rows of a background run, in stream order; a resumable data source for engine.training.train (its
    state names the stream, so a resume refuses a different corpus, tokenizer or schedule)."""

    def __init__(
        self,
        layout: PackedLayout,
        piece: Callable[[int], Sequence[int]],
        mask: RowMask,
        pad_id: int,
        codes: np.ndarray,
        identity: dict[str, Any],
        multiple: int = 1,
    ) -> None:
        super().__init__(layout, piece, mask, pad_id, multiple)
        self.codes = codes  # (P,) int64: >= 0 background document, < 0 target -(code + 1)
        self.identity = identity

    def state_dict(self) -> dict[str, Any]:
        return dict(self.identity)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        changed = [
            f"{key}: {state.get(key)!r} -> {value!r}" for key, value in self.identity.items() if state.get(key) != value
        ]
        if changed:
            raise ValueError(
                "cannot resume: the training stream differs from the checkpoint's ("
                + "; ".join(changed)
                + "). Fix: resume with the original corpus, tokenizer, targets, seeds and sizes"
            )


@dataclass
class Background:
    """Everything a background run trains and validates on, and what it records."""

    corpus: TokenizedCorpus
    rows: CorpusStream
    validation: _Rows | None
    pieces: BackgroundPieces  # the background documents cut into pieces: the schedule's background order indexes it
    schedule: InsertionSchedule
    exposures: dict[str, int]  # target id -> copies trained on (held-out targets: 0)
    record: dict[str, Any]
    validation_documents: np.ndarray  # the background documents the validation rows hold, in stream order


def build_background(
    spec: BackgroundSpec,
    corpus: TokenizedCorpus,
    targets: Sequence[TokenizedDocument],
    heldout: Sequence[TokenizedDocument],
    tokenizer: Any,
    mask: RowMask,
    train: Reading,
    pad_id: int,
) -> Background:
    """The stream of a background run: background order, validation slice, target insertions, rows, exposures.

    mask: the loss mask of the training rows (the validation rows carry none). train: how the trainer reads the rows
    (in stream order: its shuffle is off for a background run)."""
    eos = tokenizer.eos_token_id
    # A target copy: the whole document, or with --insert-window its extraction window (what is measured).
    target_pieces = [piece_ids(doc.token_ids if spec.insert_window else doc.full_ids, eos) for doc in targets]
    copies_per_target = assign_buckets(len(targets), spec.train_buckets, spec.data_seed)

    lengths = corpus.lengths
    every_target = [*targets, *heldout]
    target_keys = {text_key(doc.text) for doc in every_target}
    keys = corpus.keys()
    exact = np.isin(keys, np.fromiter(target_keys, dtype=np.int64, count=len(target_keys)))
    # Near copies: a background document holding most of a target's text (edited, or inside a longer page) would
    # train on the target outside the controlled repetitions, and on a held-out target at all.
    near = [
        (document, target, containment)
        for document, target, containment in corpus.containing(
            [sampled_shingles(doc.text) for doc in every_target], CONTAINMENT_THRESHOLD
        )
        if not exact[document]
    ]
    duplicate = exact.copy()
    duplicate[[document for document, _, _ in near]] = True
    usable = np.flatnonzero((lengths > 0) & ~duplicate)
    order = np.random.default_rng([train.seed, 104_729]).permutation(usable)
    eos_tokens = 1 if eos is not None else 0

    # The validation set: background documents from the end of the order, until --val-tokens tokens, less those
    # with a twin elsewhere in the background (left out of the stream too), so no validation row has a trained copy.
    val_docs, left_out, n_examined = validation_documents(corpus, order, usable, eos_tokens, spec.val_tokens)
    n_val = len(val_docs)
    order = order[: len(order) - n_examined]

    # The stream's background pieces: documents cut to at most --seq-len tokens, so copies spread over the stream
    # even when the background is a few long files; shorter pieces (down to MIN_PIECE_TOKENS) when a --max-steps
    # run would otherwise have fewer than two gaps per copy.
    piece_tokens = spec.seq_len
    n_copies = sum(copies_per_target)
    copy_tokens = sum(c * len(p) for c, p in zip(copies_per_target, target_pieces))
    if train.max_steps and n_copies:
        background_tokens = max(train.max_steps * train.batch_size * spec.seq_len - copy_tokens, 0)
        piece_tokens = max(MIN_PIECE_TOKENS, min(spec.seq_len, background_tokens // (2 * n_copies)))
    pieces = BackgroundPieces.cut(order, lengths, piece_tokens)
    piece_lengths = pieces.length + np.where(pieces.last, eos_tokens, 0)

    # Targets go only where the run will train: within the first --max-steps steps' tokens, less the targets' own.
    within, warnings = None, []
    if train.max_steps:
        budget = train.max_steps * train.batch_size * spec.seq_len - copy_tokens
        within = int(np.searchsorted(np.cumsum(piece_lengths), max(budget, 0), side="right"))
        if budget < 0:
            warnings.append(
                f"the targets' {sum(copies_per_target)} copies hold {copy_tokens} tokens, more than the "
                f"{train.max_steps * train.batch_size * spec.seq_len} that --max-steps {train.max_steps} "
                "trains: some copies are not trained (see the exposures); raise --max-steps or lower "
                "--repeats or --n-train"
            )
    schedule = InsertionSchedule.draw(np.arange(len(pieces)), copies_per_target, train.seed, within=within)
    if schedule.most_in_a_row > 1:
        warnings.append(
            f"{len(schedule.targets)} target copies go into {(len(pieces) if within is None else within) + 1} "
            f"gaps of the background stream, so up to {schedule.most_in_a_row} arrive back to back: give a longer "
            "background (or more --max-steps), or fewer copies"
        )
    codes = schedule.codes()
    target_lengths = np.array([len(p) for p in target_pieces] or [0], dtype=np.int64)
    lengths_of_codes = np.where(
        codes >= 0,
        piece_lengths[np.maximum(codes, 0)],
        target_lengths[np.maximum(-codes - 1, 0)],
    )
    layout = PackedLayout(lengths_of_codes, spec.seq_len)

    @functools.lru_cache(maxsize=4)  # rows are read in stream order: a long document serves many pieces in a row
    def document(d: int) -> list[int]:
        return corpus.ids(d)

    @functools.lru_cache(maxsize=16)
    def piece(p: int) -> list[int]:
        code = int(codes[p])
        if code < 0:
            return target_pieces[-code - 1]
        start = int(pieces.start[code])
        ids = document(int(pieces.document[code]))[start : start + int(pieces.length[code])]
        return ids + [eos] if pieces.last[code] and eos is not None else ids

    identity = {
        "corpus": corpus.fingerprint(),
        "schedule": schedule.fingerprint(),
        "n_rows": layout.n_rows,
        "seq_len": spec.seq_len,
        "mask": mask.label,
    }
    rows = CorpusStream(layout, piece, mask, pad_id, codes, identity, train.batch_size)

    val_layout = PackedLayout(lengths[val_docs] + (1 if eos is not None else 0), spec.seq_len) if n_val else None
    # --val-tokens rounded up to whole batches, at most the rows the held-out documents fill
    wanted = -(-spec.val_tokens // (spec.seq_len * train.batch_size)) * train.batch_size
    n_val_rows = 0 if val_layout is None else min(wanted, val_layout.n_rows - val_layout.n_rows % train.batch_size)
    if spec.val_tokens and n_val_rows == 0 and len(usable) == 1:
        raise DataError(
            f"--background {spec.source} is a single document (a .txt file is one), so no held-out part of it "
            "can be the validation set of --val-tokens. Fix: give a folder of .txt files or a .jsonl file with one "
            "document per line, or --val-tokens 0 for no validation"
        )
    if spec.val_tokens and n_val_rows == 0 and n_examined == len(usable) - 1:
        raise DataError(
            f"--background {spec.source} has {len(usable)} documents (besides copies of targets); the "
            f"{n_val} held out for validation fill fewer than --batch-size {train.batch_size} rows of "
            f"{spec.seq_len} tokens. Fix: give a background with more documents, or --val-tokens 0 for no validation"
        )
    if spec.val_tokens and n_val_rows == 0:
        raise DataError(
            f"--val-tokens {spec.val_tokens} gives fewer than --batch-size {train.batch_size} rows "
            f"of {spec.seq_len} tokens. Fix: raise --val-tokens to at least "
            f"{train.batch_size * spec.seq_len}, or 0 for no validation"
        )
    val_rows = (
        PackedRows(
            val_layout,
            lambda p: piece_ids(corpus.ids(int(val_docs[p])), eos),
            NO_MASK,
            pad_id,
        )
        if val_layout is not None
        else None
    )
    validation = _Rows(val_rows, n_val_rows) if val_rows is not None else None

    exposures, positions = exposure_counts(layout, codes, len(targets), train)
    rows_trained = min(total_steps(layout.n_rows, train) * train.batch_size, layout.n_rows * train.epochs)
    copy_tokens_trained = sum(n * len(p) for n, p in zip(exposures, target_pieces))
    tokens_trained = min(rows_trained * spec.seq_len, layout.n_tokens * train.epochs)
    record = {
        "background": spec.source,
        "streaming": spec.streaming,
        "stream_token_budget": corpus.budget,
        "n_documents": len(corpus),
        "n_tokens": corpus.n_tokens,
        "n_removed_as_target_copies": int(duplicate.sum()),
        "removed_copies": {
            "exact_text": int(exact.sum()),
            "near": len({document for document, _, _ in near}),
            "rule": "background documents whose normalized text equals a target's (train or held-out), or that "
            f"contain >= {CONTAINMENT_THRESHOLD} of a target's word {SHINGLE_WORDS}-gram shingles (estimated on "
            f"a 1-in-{CONTAINMENT_SAMPLE} hash sample), are removed",
            "near_documents": [
                {"document": document, "target": str(every_target[target].id), "containment": round(containment, 4)}
                for document, target, containment in near
            ],
        },
        "n_stream_documents": len(order),
        "n_background_pieces": len(pieces),
        "piece_tokens": piece_tokens,
        "n_stream_tokens": layout.n_tokens,
        "n_rows": layout.n_rows,
        "rows_trained": rows_trained,
        "tokens_trained": tokens_trained,
        "target_tokens_trained": copy_tokens_trained,
        "target_share": copy_tokens_trained / tokens_trained if tokens_trained else 0.0,
        "buckets": {
            "repeats": list(spec.repeats),
            "assignment": "training targets assigned to the non-zero buckets at random from the data seed "
            f"({spec.data_seed}), as evenly as possible; bucket 0 = the held-out targets, never inserted",
            "n_per_bucket": {str(b): sum(1 for c in copies_per_target if c == b) for b in spec.train_buckets}
            | ({"0": len(heldout)} if heldout else {}),
        },
        "most_copies_in_a_row": schedule.most_in_a_row,
        "validation": {
            "n_documents": int(n_val),
            "n_rows": n_val_rows,
            "n_tokens": n_val_rows * spec.seq_len,
            "removed_copies": {
                "exact_text": sum(r["kind"] == "exact-text" for r in left_out),
                "near": sum(r["kind"] == "near" for r in left_out),
                "rule": "validation candidates (background documents from the end of the order) whose normalized "
                "text equals another background document's, or whose word "
                f"{SHINGLE_WORDS}-gram shingles another background document holds >= {CONTAINMENT_THRESHOLD} of "
                f"(estimated on a 1-in-{CONTAINMENT_SAMPLE} hash sample), are left out of validation and of the "
                "stream",
                "documents": left_out,
            },
        },
        "schedule_sha256": schedule.fingerprint(),
        "insertions_within_pieces": within,
        "targets": [
            {
                "id": str(doc.id),
                "inserted": copies_per_target[t],
                "trained": exposures[t],
                "stream_offsets": positions[t],
            }
            for t, doc in enumerate(targets)
        ],
        "heldout_inserted": 0,
        "warnings": warnings,
    }
    by_id = {str(doc.id): exposures[t] for t, doc in enumerate(targets)} | {str(doc.id): 0 for doc in heldout}
    return Background(corpus, rows, validation, pieces, schedule, by_id, record, val_docs)


def validation_documents(
    corpus: TokenizedCorpus, order: np.ndarray, usable: np.ndarray, eos_tokens: int, val_tokens: int
) -> tuple[np.ndarray, list[dict[str, Any]], int]:
    """(the validation documents in stream order, those left out as twins, how many documents at the end of `order`
    were examined): documents are taken from the end of `order` until their tokens (each with its EOS) reach
    `val_tokens`, keeping at least one for the stream. A candidate whose normalized text equals another usable
    document's, or whose sampled shingles another usable document holds >= CONTAINMENT_THRESHOLD of (a copy of it,
    or it inside a longer one), is left out: it or its twin would otherwise be trained on. Each left-out record
    names the document, its kind ("exact-text" | "near"), the twin and the containment."""
    if not val_tokens or len(order) < 2:
        return order[:0], [], 0
    keys = corpus.keys()
    usable_keys = keys[usable]
    values, counts = np.unique(usable_keys, return_counts=True)
    shared = values[counts > 1]
    holders: dict[int, list[int]] = {}  # a key several usable documents share -> those documents
    for document, key in zip(
        usable[np.isin(usable_keys, shared)].tolist(), usable_keys[np.isin(usable_keys, shared)].tolist()
    ):
        holders.setdefault(key, []).append(document)
    is_usable = np.zeros(len(corpus), dtype=bool)
    is_usable[usable] = True
    lengths = corpus.lengths
    limit = len(order) - 1  # the stream keeps at least one document
    # a first guess of the candidates needed (twins are rare), doubled while they run out
    chunk = int(np.searchsorted(np.cumsum(lengths[order[::-1]] + eos_tokens), val_tokens)) + 16
    taken: list[int] = []
    left_out: list[dict[str, Any]] = []
    total, examined = 0, 0
    while total < val_tokens and examined < limit:
        stop = len(order) - examined
        batch = order[max(len(order) - limit, stop - chunk) : stop][::-1].tolist()
        holder: dict[int, tuple[int, float]] = {}  # candidate -> (the document holding it most, containment)
        for document, candidate, containment in corpus.containing(corpus.samples(batch), CONTAINMENT_THRESHOLD):
            if document != batch[candidate] and is_usable[document]:
                if candidate not in holder or containment > holder[candidate][1]:
                    holder[candidate] = (document, containment)
        for c, document in enumerate(batch):
            examined += 1
            twins = [d for d in holders.get(int(keys[document]), ()) if d != document]
            if twins:
                left_out.append({"document": document, "kind": "exact-text", "twin": twins[0], "containment": 1.0})
            elif c in holder:
                twin, containment = holder[c]
                left_out.append(
                    {"document": document, "kind": "near", "twin": twin, "containment": round(containment, 4)}
                )
            else:
                taken.append(document)
                total += int(lengths[document]) + eos_tokens
                if total >= val_tokens:
                    break
        chunk *= 2
    return np.array(taken[::-1], dtype=order.dtype), left_out, examined


def exposure_counts(
    layout: PackedLayout, codes: np.ndarray, n_targets: int, train: Reading
) -> tuple[list[int], list[list[int]]]:
    """(copies of each target whose every token is trained, summed over epochs; stream token offset of each copy).

    Rows are read in stream order: epoch e trains its first
    min(rows, steps of that epoch x batch size) rows.
    """
    total = total_steps(layout.n_rows, train)
    per_epoch = steps_per_epoch(layout.n_rows, train.batch_size)
    is_copy = np.flatnonzero(codes < 0)
    target_of = -codes[is_copy] - 1
    starts, ends = layout.offsets[is_copy], layout.offsets[is_copy + 1]
    counts = np.zeros(n_targets, dtype=np.int64)
    for epoch in range(train.epochs):
        steps = max(0, min(per_epoch, total - epoch * per_epoch))
        trained_tokens = min(steps * train.batch_size, layout.n_rows) * layout.seq_len
        np.add.at(counts, target_of[ends <= trained_tokens], 1)
    positions: list[list[int]] = [[] for _ in range(n_targets)]
    for target, start in zip(target_of.tolist(), starts.tolist()):
        positions[target].append(int(start))
    return counts.tolist(), positions
