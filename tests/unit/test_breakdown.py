"""Breakdowns of per-document rows by repeat count and by prefix length."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eval.breakdown import extract_by_prefix_length, group_means, tag_rows
from eval.extraction import ExtractionConfig, extract


def test_group_means_by_hand():
    rows = [
        {"id": "a", "exact_match": True, "rouge_l": 1.0},
        {"id": "b", "exact_match": False, "rouge_l": 0.5},
        {"id": "c", "exact_match": False, "rouge_l": 0.2},
        {"id": "d", "exact_match": True, "rouge_l": None},
    ]
    tagged = tag_rows(rows, "repeats", {"a": 4, "b": 4, "c": 1}, default=1)
    assert [r["repeats"] for r in tagged] == [4, 4, 1, 1]
    assert "repeats" not in rows[0]  # copies, the input rows are untouched
    table = group_means(tagged, "repeats", ["exact_match", "rouge_l"])
    assert table == [
        {"repeats": 1, "n_docs": 2, "exact_match": 0.5, "rouge_l": pytest.approx(0.2)},  # d's None is left out
        {"repeats": 4, "n_docs": 2, "exact_match": 0.5, "rouge_l": pytest.approx(0.75)},
    ]
    with pytest.raises(ValueError, match="no 'repeats' field"):
        group_means(rows, "repeats", ["exact_match"])


def test_extract_by_prefix_length_equals_separate_extractions():
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(0)
    docs = [
        SimpleNamespace(id=f"d{i}", token_ids=torch.randint(2, 32, (n,), generator=generator).tolist())
        for i, n in enumerate([20, 20, 16])
    ]
    decode = lambda ids: " ".join(f"w{t}" for t in ids)  # noqa: E731
    rows = extract_by_prefix_length(model, docs, [4, 8, 12], suffix_len=6, decode=decode, pad_token_id=1)
    # P = 12 needs 18 tokens: the 16-token document is skipped there (and only there)
    assert [(r["prefix_len"], r["id"]) for r in rows] == [
        (4, "d0"),
        (4, "d1"),
        (4, "d2"),
        (8, "d0"),
        (8, "d1"),
        (8, "d2"),
        (12, "d0"),
        (12, "d1"),
    ]
    for p in (4, 8, 12):
        alone, _ = extract(
            model, docs, ExtractionConfig(suffix_len=6, prefix_len=p), decode=decode, pad_token_id=1, progress=False
        )
        assert [r["generated_ids"] for r in rows if r["prefix_len"] == p] == [r["generated_ids"] for r in alone]
    table = group_means(rows, "prefix_len", ["match_fraction"])
    assert [(t["prefix_len"], t["n_docs"]) for t in table] == [(4, 3), (8, 3), (12, 2)]
