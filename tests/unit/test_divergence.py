"""Divergence analysis by hand, and the goldfish effect it measures (paper Fig. 4) on a tiny trained model."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eval.decoding import greedy_decode
from eval.divergence import divergence_row, divergence_summary, first_divergence, suffix_dropped_flags
from goldfish.loss import goldfish_loss
from goldfish.masks import causal_targets, drop_mask


@pytest.mark.parametrize(
    "generated,reference,expected",
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([9, 2, 3], [1, 2, 3], 0),
        ([1, 2, 9], [1, 2, 3], 2),
        ([1, 2], [1, 2, 3], 2),  # stopped short: diverges where it stops
        ([1, 2, 3, 4], [1, 2, 3], None),  # ids past the reference are ignored
    ],
)
def test_first_divergence(generated, reference, expected):
    assert first_divergence(generated, reference) == expected


def test_first_divergence_rejects_empty_reference():
    with pytest.raises(ValueError, match="reference is empty"):
        first_divergence([1], [])


def test_suffix_dropped_flags_alignment():
    # Document of 8 tokens t0..t7, targets j = t(j+1). Suffix = t5, t6, t7 (P = 5): targets 4, 5, 6.
    dropped_targets = [False, False, False, False, True, False, True]  # (T - 1,) = 7 targets
    assert suffix_dropped_flags(dropped_targets, prefix_len=5, suffix_len=3) == [True, False, True]
    # causal_targets' (T,) layout with the ignored last target gives the same answer
    assert suffix_dropped_flags(torch.tensor(dropped_targets + [False]), 5, 3) == [True, False, True]
    with pytest.raises(ValueError, match="whole document"):
        suffix_dropped_flags(dropped_targets[:5], 5, 3)
    with pytest.raises(ValueError, match="prefix_len"):
        suffix_dropped_flags(dropped_targets, 0, 3)


def test_summary_by_hand():
    rows = [
        divergence_row([5, 6, 0, 0], [5, 6, 7, 8], [False, True, True, False]),  # diverges at 2: dropped
        divergence_row([0, 6, 7, 8], [5, 6, 7, 8], [False, False, False, True]),  # at 0: kept
        divergence_row([5, 6, 7, 8], [5, 6, 7, 8], [True, False, False, False]),  # never
        divergence_row([5, 0, 7, 8], [5, 6, 7, 8], [False, True, False, False]),  # at 1: dropped
    ]
    assert [r["first_divergence"] for r in rows] == [2, 0, None, 1]
    assert [r["diverged_on_dropped"] for r in rows] == [True, False, None, True]
    summary = divergence_summary(rows)
    assert summary["n_docs"] == 4 and summary["n_diverged"] == 3 and summary["n_on_dropped"] == 2
    assert summary["share_on_dropped"] == pytest.approx(2 / 3)
    # drop rates of the three diverged documents: 2/4, 1/4, 1/4 -> chance share (0.5 + 0.25 + 0.25) / 3 = 1/3
    assert summary["share_expected_by_chance"] == pytest.approx(1 / 3)
    assert summary["mean_first_divergence"] == pytest.approx(1.0)
    assert summary["first_divergence_histogram"] == {0: 1, 1: 1, 2: 1}
    # without flags: positions only
    plain = divergence_summary([divergence_row([1, 0], [1, 2])])
    assert plain["n_diverged"] == 1 and "share_on_dropped" not in plain
    with pytest.raises(ValueError, match="dropped flags"):
        divergence_row([1], [1, 2], [True])


def test_goldfish_model_diverges_on_dropped_tokens():
    """A tiny model trained with a hashed k=4 goldfish mask on random sequences predicts kept targets and guesses
    dropped ones, so greedy continuations leave the text at dropped positions far above the chance rate (~1/4)."""
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(1)
    docs = torch.randint(2, 64, (8, 40), generator=generator)  # (B, T)
    targets = causal_targets(docs)
    dropped = drop_mask(targets, "hashed", 4, 13)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(60):
        optimizer.zero_grad()
        goldfish_loss(model(input_ids=docs).logits, targets, dropped).loss.backward()
        optimizer.step()
    prefix_len, suffix_len = 20, 20
    generated = greedy_decode(model, docs[:, :prefix_len].tolist(), suffix_len, pad_token_id=1)
    rows = [
        divergence_row(gen, doc[prefix_len:].tolist(), suffix_dropped_flags(mask, prefix_len, suffix_len))
        for gen, doc, mask in zip(generated, docs, dropped)
    ]
    summary = divergence_summary(rows)
    assert summary["n_diverged"] >= 6  # goldfish: (almost) nothing is reproduced verbatim
    assert 0.1 < summary["share_expected_by_chance"] < 0.4  # the suffixes' drop rates, about 1/k
    assert summary["share_on_dropped"] >= 0.8  # measured: 8 of 8 (seeded)
