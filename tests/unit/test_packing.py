"""Whole documents packed into rows: every token trained once, attention within documents, per-document masks."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from tiny_runs import tiny_run

from conventions import IGNORE_INDEX
from data.documents import Document
from data.packing import BackgroundPieces, InsertionSchedule, PackedLayout
from data.rows import NO_MASK, PackedRows, pack_documents, piece_ids
from data.selection import assign_buckets, select_documents
from engine.core.vocab_parallel import causal_lm_token_losses
from goldfish.app.config import DataSpec, MaskSpec
from goldfish.app.data_settings import row_mask
from goldfish.app.models import build_tiny_model
from goldfish.masks import causal_targets, drop_mask

EOS, PAD, BOS = 1, 2, 0
SPECIAL = [BOS, EOS, PAD]


def _pieces(lengths: list[int], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[BOS] + [rng.randrange(3, 300) for _ in range(n - 2)] + [EOS] for n in lengths]


def _rows(pieces: list[list[int]], seq_len: int, mask: MaskSpec) -> PackedRows:
    layout = PackedLayout([len(p) for p in pieces], seq_len)
    return PackedRows(layout, lambda i: pieces[i], row_mask(mask, SPECIAL), PAD)


def test_layout_places_every_token_once() -> None:
    lengths = [5, 17, 1, 40, 3, 9]
    layout = PackedLayout(lengths, 8)
    assert layout.n_rows == -(-sum(lengths) // 8)
    seen = {p: [] for p in range(len(lengths))}
    for row in range(layout.n_rows):
        at = 0
        for segment in layout.segments(row):
            assert segment.at == at  # segments tile the row from its start
            at += segment.end - segment.start
            seen[segment.piece].extend(range(segment.start, segment.end))
        assert at == (8 if row < layout.n_rows - 1 else sum(lengths) - 8 * row)
    assert all(seen[p] == list(range(n)) for p, n in enumerate(lengths))
    first, last = layout.rows_of(3)
    assert first == (5 + 17 + 1) // 8 and last == (5 + 17 + 1 + 40 - 1) // 8


def test_rows_train_every_target_once() -> None:
    pieces = _pieces([30, 7, 64, 2, 19])
    rows = _rows(pieces, 16, MaskSpec(None))
    got = [int(t) for r in rows for t in r.targets if t != IGNORE_INDEX]
    want = [t for p in pieces for t in p[1:]]  # every token but a document's first is a target, its EOS included
    assert got == want
    for row in rows:  # a document's last token (EOS) predicts nothing of the next document
        eos_positions = (row.input_ids == EOS).nonzero().flatten()
        assert all(int(row.targets[j]) == IGNORE_INDEX for j in eos_positions)


@pytest.mark.parametrize("name", ["micro-llama", "tiny-gpt2"])
def test_packed_rows_equal_each_document_alone(name: str) -> None:
    """Position ids restarting per document make the attention block-causal: each token's loss in a packed row equals
    its loss when the document (or its part in the row) runs alone."""
    model = build_tiny_model(
        name, vocab_size=300, max_positions=64, seed=0, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD
    ).eval()
    pieces = _pieces([11, 5, 23, 9, 40, 3])
    rows = _rows(pieces, 32, MaskSpec(None))
    batch = {key: torch.stack([getattr(r, key) for r in rows]) for key in ("input_ids", "targets", "position_ids")}
    with torch.no_grad():
        packed = causal_lm_token_losses(model, batch["input_ids"], batch["targets"], position_ids=batch["position_ids"])
        for row in range(len(rows)):
            for segment in rows.layout.segments(row):
                ids = torch.tensor([pieces[segment.piece][segment.start : segment.end]])
                targets = batch["targets"][row : row + 1, segment.at : segment.at + ids.shape[1]]
                alone = causal_lm_token_losses(model, ids, targets)
                # float32 attention over different key counts: reductions in another order, a few ulps of logits
                torch.testing.assert_close(
                    packed[row : row + 1, segment.at : segment.at + ids.shape[1]], alone, rtol=1e-5, atol=1e-5
                )
        plain = causal_lm_token_losses(model, batch["input_ids"], batch["targets"])
    assert (plain - packed).abs().max() > 1e-3  # without the restarts the documents would see each other


@pytest.mark.parametrize("strategy", ["hashed", "hashed-reference", "static"])
def test_document_drops_the_same_targets_wherever_it_lands(strategy: str) -> None:
    mask = MaskSpec(strategy, 3, 5)
    target = _pieces([45], seed=1)[0]
    alone = drop_mask(causal_targets(torch.tensor([target])), strategy, 3, 5, special_token_ids=SPECIAL)[0]
    assert alone.any()
    for before in ([], [4], [9, 13], [20, 3, 2], [31]):  # different offsets, different rows, split over rows
        pieces = _pieces(before, seed=len(before)) + [target] + _pieces([7])
        rows = _rows(pieces, 16, mask)
        got = []
        index = len(before)
        for row in range(len(rows)):
            built = rows[row]
            for segment in rows.layout.segments(row):
                if segment.piece == index:
                    got.extend(built.dropped[segment.at : segment.at + segment.end - segment.start].tolist())
        assert got == alone.tolist(), before


def test_segment_mask_equals_whole_document_mask() -> None:
    piece = _pieces([200], seed=3)[0]
    for strategy in ("hashed", "static", "hashed-reference"):
        mask = row_mask(MaskSpec(strategy, 4, 13), SPECIAL)
        whole = mask.dropped(piece, 0, len(piece))
        alone = drop_mask(causal_targets(torch.tensor([piece])), strategy, 4, 13, special_token_ids=SPECIAL)[0]
        assert whole.tolist() == alone.tolist()
        for start, end in ((0, 5), (3, 40), (12, 13), (13, 200), (150, 200)):
            assert mask.dropped(piece, start, end).tolist() == whole[start:end].tolist()


def test_pack_documents_repeats_documents_at_different_offsets() -> None:
    class Doc:
        def __init__(self, ids):
            self.full_ids = ids

    docs = [Doc(p[:-1]) for p in _pieces([20, 33, 9])]
    rows, order = pack_documents(docs, [1, 3, 2], 16, NO_MASK, eos_id=EOS, pad_id=PAD, seed=5)
    assert sorted(order) == [0, 1, 1, 1, 2, 2]
    assert len(rows) == -(-(21 + 3 * 34 + 2 * 10) // 16)
    assert piece_ids([0, 5, 6], EOS) == [0, 5, 6, EOS]


def test_whole_document_selection_keeps_every_token() -> None:
    from data.tokenizer import train_bpe_tokenizer

    texts = [("word%d " % i) * (10 + 15 * i) for i in range(8)]
    docs = [Document(id=str(i), text=t, source="test") for i, t in enumerate(texts)]
    tokenizer = train_bpe_tokenizer(texts, vocab_size=400)
    split = select_documents(docs, tokenizer, n_train=3, n_heldout=2, seq_len=20, dedup=None, whole_documents=64)
    for doc in split.train + split.heldout:
        ids = tokenizer(doc.text, add_special_tokens=False)["input_ids"]
        assert doc.full_ids == [tokenizer.bos_token_id] + ids
        assert doc.token_ids == doc.full_ids[:64]
    assert split.manifest()["whole_documents"] == 64


def test_extraction_window_is_at_most_the_trained_context() -> None:
    assert DataSpec(pack=True, seq_len=128).extraction_window == 128
    assert DataSpec(pack=True, seq_len=4096, extract_len=2048).extraction_window == 2048
    with pytest.raises(ValueError, match="--extract-len"):
        DataSpec(pack=True, extract_len=1)


def test_insertion_schedule_places_each_copy() -> None:
    background = np.arange(50)
    schedule = InsertionSchedule.draw(background, [1, 4, 0, 16], seed=3)
    codes = schedule.codes()
    assert len(codes) == 50 + 21
    assert list(codes[codes >= 0]) == list(range(50))  # the background keeps its order
    copies = np.bincount(-(codes[codes < 0] + 1), minlength=4)
    assert copies.tolist() == [1, 4, 0, 16]
    again = InsertionSchedule.draw(background, [1, 4, 0, 16], seed=3)
    assert again.fingerprint() == schedule.fingerprint()
    assert InsertionSchedule.draw(background, [1, 4, 0, 16], seed=4).fingerprint() != schedule.fingerprint()


def test_insertions_are_spread_one_per_gap_while_gaps_last() -> None:
    """Copies share a gap (arrive back to back) only when there are more copies than gaps, and then evenly."""
    spread = InsertionSchedule.draw(np.arange(1000), [1, 4, 16, 64] * 8, seed=0)
    assert spread.most_in_a_row == 1 and len(np.unique(spread.gaps)) == 8 * 85
    # the copies are not packed at the start: they cover the stream roughly uniformly
    assert abs(np.median(spread.gaps) - 500) < 100
    crowded = InsertionSchedule.draw(np.arange(9), [7, 14], seed=1)  # 21 copies, 10 gaps
    assert np.bincount(crowded.gaps, minlength=10).tolist().count(3) == 1 and crowded.most_in_a_row == 3
    assert sorted(np.bincount(crowded.gaps, minlength=10).tolist()) == [2] * 9 + [3]
    within = InsertionSchedule.draw(np.arange(1000), [3] * 10, seed=2, within=100)
    assert within.gaps.max() <= 100


def test_background_pieces_cut_long_documents() -> None:
    pieces = BackgroundPieces.cut(np.array([2, 0, 1]), np.array([5, 1, 10]), max_tokens=4)
    assert pieces.document.tolist() == [2, 2, 2, 0, 0, 1]
    assert pieces.start.tolist() == [0, 4, 8, 0, 4, 0]
    assert pieces.length.tolist() == [4, 4, 2, 4, 1, 1]
    assert pieces.last.tolist() == [False, False, True, False, True, True]
    with pytest.raises(Exception, match="max_tokens"):
        BackgroundPieces.cut(np.array([0]), np.array([3]), max_tokens=0)


def test_buckets_are_balanced_and_random_from_the_seed() -> None:
    first = assign_buckets(10, (1, 4, 16), seed=0)
    assert sorted(first) == [1, 1, 1, 1, 4, 4, 4, 16, 16, 16]
    assert assign_buckets(10, (1, 4, 16), seed=0) == first
    draws = {tuple(assign_buckets(10, (1, 4, 16), seed=s)) for s in range(20)}
    assert len(draws) > 15  # not the round-robin order
    assert DataSpec(repeats=(0, 1, 4), n_heldout=3).train_buckets == (1, 4)
    with pytest.raises(ValueError, match="--n-heldout"):
        DataSpec(repeats=(0, 1), n_heldout=0)
    with pytest.raises(ValueError, match="at least one >= 1"):
        DataSpec(repeats=(0,))


def test_train_pack_trains_every_token_of_long_documents(tmp_path) -> None:
    """`goldfish train --data long.jsonl --pack --seq-len 128 --epochs 1`: the tokens trained (standard loss: every
    target counts) are every token of every training document but its first, its EOS included."""
    import json
    from pydoc_data.topics import topics

    from goldfish.app.cli import main

    long = tmp_path / "long.jsonl"
    texts = sorted((t for t in topics.values() if 2000 < len(t) < 6000), key=len)[:5]
    long.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--out",
                str(out),
                *tiny_run(
                    data=long,
                    pack=True,
                    seq_len=128,
                    epochs=1,
                    strategy="standard",
                    n_train=3,
                    n_heldout=1,
                    batch_size=4,
                    vocab_size=400,
                    threads=None,
                ),
            ]
        )
        == 0
    )
    trained = sum(json.loads(line)["n_tokens"] for line in (out / "metrics.jsonl").read_text().splitlines())
    documents = json.loads((out / "run.json").read_text())["documents"]["train"]
    assert trained == sum(d["n_tokens"] for d in documents)  # n_tokens counts bos + text; targets: text + EOS
    assert all(d["n_tokens"] > 128 for d in documents)  # longer than a row: nothing cut off
