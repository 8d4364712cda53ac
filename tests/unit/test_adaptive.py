"""Beam search, sampling and probabilistic extraction against greedy decoding, hand computations, exhaustive sums
and the empirical frequencies of Hugging Face sampling."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eval.adaptive import (
    SamplingConfig,
    beam_extract,
    beam_search_decode,
    extraction_probability,
    log10_samples_needed,
    nucleus_log_probs,
    probabilistic_extract,
    sample_decode,
    samples_needed,
    sampling_extract,
)
from eval.decoding import greedy_decode
from eval.extraction import ExtractionConfig

PAD, EOS = 1, 2


def tiny_llama(vocab: int, seed: int = 0, init_range: float = 0.5) -> LlamaForCausalLM:
    # A large init range makes the random model's next-token distributions far from uniform and its greedy output
    # varied (with the default 0.02 it repeats one token), and EOS (id 2) shows up in its continuations.
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=EOS,
        pad_token_id=PAD,
        initializer_range=init_range,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def docs_from(sequences):
    return [SimpleNamespace(id=f"doc{i}", token_ids=list(s)) for i, s in enumerate(sequences)]


PREFIXES = [[0, 3, 4, 5, 3], [0, 4, 4], [0, 5], [0, 2, 3, 3, 3, 4], [0, 7, 6, 5, 4, 3, 2]]


# ---------------------------------------------------------------- beam search


def test_beam_width_one_is_greedy_and_ignores_eos():
    model = tiny_llama(vocab=8)
    greedy = greedy_decode(model, PREFIXES, 12, pad_token_id=PAD)
    assert any(EOS in g for g in greedy), "the test model should emit EOS mid-continuation"
    assert beam_search_decode(model, PREFIXES, 12, num_beams=1, pad_token_id=PAD, batch_size=3) == greedy


def test_beam_search_batched_equals_single():
    model = tiny_llama(vocab=8)
    batched = beam_search_decode(model, PREFIXES, 10, num_beams=4, pad_token_id=PAD, batch_size=5)
    single = [beam_search_decode(model, [p], 10, num_beams=4, pad_token_id=PAD)[0] for p in PREFIXES]
    assert batched == single
    assert all(len(b) == 10 for b in batched)
    assert batched != greedy_decode(model, PREFIXES, 10, pad_token_id=PAD), "4 beams should differ from greedy"


def test_wide_beam_finds_the_most_likely_continuation():
    """With num_beams >= V**(L-1) beam search keeps every partial continuation, so it must return the most likely
    of all V**L continuations, found here by scoring each one (vocabulary 6, length 3: 216 continuations)."""
    model = tiny_llama(vocab=6)
    prefixes = [[0, 3, 4, 5, 3], [0, 4, 4], [0, 5], [0, 2, 3, 3, 3, 4]]
    found = beam_search_decode(model, prefixes, 3, num_beams=36, pad_token_id=PAD, batch_size=4)
    for prefix, best in zip(prefixes, found):
        candidates = [list(c) for c in itertools.product(range(6), repeat=3)]
        rows, _ = probabilistic_extract(
            model,
            docs_from([prefix + c for c in candidates]),
            ExtractionConfig(suffix_len=3, batch_size=216),
            pad_token_id=PAD,
        )
        log_q = [r["log_q"] for r in rows]
        assert best == candidates[max(range(len(candidates)), key=log_q.__getitem__)]
    assert found != greedy_decode(model, prefixes, 3, pad_token_id=PAD), "the optimum should beat greedy somewhere"


def test_beam_extract_rows():
    model = tiny_llama(vocab=8)
    greedy_suffix = greedy_decode(model, [[0, 3, 4, 5]], 6, pad_token_id=PAD)[0]
    docs = docs_from([[0, 3, 4, 5] + greedy_suffix, [0, 3, 4, 5] + [3] * 6, [0, 1]])
    rows, summary = beam_extract(
        model,
        docs,
        ExtractionConfig(suffix_len=6),
        num_beams=1,
        pad_token_id=PAD,
        decode=lambda ids: " ".join(f"w{t}" for t in ids),
    )
    assert [r["id"] for r in rows] == ["doc0", "doc1"] and summary["skipped_ids"] == ["doc2"]
    assert rows[0]["exact_match"] is True and rows[0]["rouge_l"] == pytest.approx(1.0)
    assert summary["exact_match"] == pytest.approx(rows[1]["exact_match"] * 0.5 + 0.5)
    with pytest.raises(ValueError, match="num_beams"):
        beam_search_decode(model, PREFIXES, 3, num_beams=0, pad_token_id=PAD)


# ---------------------------------------------------------------- exact sampling probability


def test_nucleus_by_hand():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64))
    # top_p = 0.7: mass before each token in decreasing order is 0, 0.5, 0.8, 0.95 -> keep the first two.
    kept = nucleus_log_probs(logits, 1.0, 0.7).exp()
    assert kept.tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0], abs=1e-12)
    # top_p = 0.5 exactly: the mass before the second token is 0.5, not < 0.5 -> only the first is kept.
    assert nucleus_log_probs(logits, 1.0, 0.5).exp().tolist() == pytest.approx([1, 0, 0, 0], abs=1e-12)
    # top_p tiny: the most likely token is always kept.
    assert nucleus_log_probs(logits, 1.0, 1e-6).exp().tolist() == pytest.approx([1, 0, 0, 0], abs=1e-12)
    # temperature 2: p ∝ p^(1/2), before the nucleus cut.
    root = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64).sqrt()
    assert nucleus_log_probs(logits, 2.0).exp().tolist() == pytest.approx((root / root.sum()).tolist(), abs=1e-12)


def test_suffix_probability_is_product_of_softmax_probs():
    model = tiny_llama(vocab=5)
    prefix, suffix = [0, 3, 4], [2, 4, 3]
    ids = torch.tensor([prefix + suffix])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]  # (6, 5)
    # by hand: p(s0 | prefix) * p(s1 | prefix, s0) * p(s2 | prefix, s0, s1), softmax at temperature 1
    probs = [torch.softmax(logits[len(prefix) - 1 + i].double(), dim=-1)[t].item() for i, t in enumerate(suffix)]
    q = probs[0] * probs[1] * probs[2]
    rows, _ = probabilistic_extract(
        model, docs_from([prefix + suffix]), ExtractionConfig(suffix_len=3), pad_token_id=PAD
    )
    assert math.exp(rows[0]["log_q"]) == pytest.approx(q, rel=1e-9)
    assert rows[0]["log10_q"] == pytest.approx(math.log10(q), rel=1e-9)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.5, 0.8), (1.0, 0.5)])
def test_suffix_probabilities_sum_to_one_over_all_suffixes(temperature, top_p):
    """Exhaustive: the sampling probabilities of all 5**3 suffixes of a vocabulary-5 model sum to 1."""
    model = tiny_llama(vocab=5)
    prefix = [0, 3, 4]
    suffixes = [list(s) for s in itertools.product(range(5), repeat=3)]
    rows, _ = probabilistic_extract(
        model,
        docs_from([prefix + s for s in suffixes]),
        ExtractionConfig(suffix_len=3, batch_size=64),
        temperature=temperature,
        top_p=top_p,
        pad_token_id=PAD,
    )
    total = sum(math.exp(r["log_q"]) for r in rows)
    assert total == pytest.approx(1.0, abs=1e-9)  # float64 probabilities: rounding far below 1e-9
    if top_p < 1:
        assert any(r["log_q"] == float("-inf") for r in rows), "the nucleus should exclude some suffixes"


@pytest.mark.parametrize("temperature,top_p,vocab", [(1.0, 1.0, 5), (1.5, 0.8, 5), (2.0, 1.0, 64)])
def test_sampling_frequencies_match_exact_probabilities(temperature, top_p, vocab):
    """HF sampling (sample_decode) draws suffixes with the probabilities computed exactly from the logits.

    Vocabulary 5, suffix length 2: 25 outcomes. Vocabulary 64, length 1: checks that no top-k cut (HF's default
    top_k=50) is applied. 20,000 samples: each outcome's count is Binomial(n, q), so |freq - q| < 5 sigma with
    sigma = sqrt(q (1 - q) / n) fails by chance with probability < 1e-5 over all outcomes.
    """
    model = tiny_llama(vocab=vocab, seed=1, init_range=0.2)
    prefix, length, n = [0, 3, 4], (2 if vocab == 5 else 1), 20_000
    samples = sample_decode(
        model, prefix, length, SamplingConfig(temperature, top_p, n_samples=n, seed=7), pad_token_id=PAD
    )
    # seeded: the same seed gives the same samples, another seed others
    small = SamplingConfig(temperature, top_p, n_samples=50, seed=7)
    again = sample_decode(model, prefix, length, small, pad_token_id=PAD)
    assert sample_decode(model, prefix, length, small, pad_token_id=PAD) == again
    assert sample_decode(model, prefix, length, small, pad_token_id=PAD, seed=8) != again
    counts: dict[tuple[int, ...], int] = {}
    for s in samples:
        counts[tuple(s)] = counts.get(tuple(s), 0) + 1
    suffixes = [list(s) for s in itertools.product(range(vocab), repeat=length)]
    rows, _ = probabilistic_extract(
        model,
        docs_from([prefix + s for s in suffixes]),
        ExtractionConfig(suffix_len=length, batch_size=64),
        temperature=temperature,
        top_p=top_p,
        pad_token_id=PAD,
    )
    for s, row in zip(suffixes, rows):
        q = math.exp(row["log_q"])
        freq = counts.get(tuple(s), 0) / n
        if q == 0:
            assert freq == 0, f"sampled {s} outside the nucleus"
        else:
            assert abs(freq - q) < 5 * math.sqrt(q * (1 - q) / n) + 1e-12, (s, freq, q)
    if vocab == 64:
        ranked = sorted(range(len(rows)), key=lambda i: -rows[i]["log_q"])
        assert sum(math.exp(rows[i]["log_q"]) for i in ranked[50:]) > 0.02  # mass a top-k=50 cut would remove
        assert any(counts.get((i,), 0) for i in ranked[50:])


def test_samples_needed_by_hand_and_by_definition():
    # q = 0.5, p = 0.9: log(0.1) / log(0.5) = 3.32 -> 4 samples (1 - 0.5^4 = 0.9375 >= 0.9 > 1 - 0.5^3 = 0.875).
    assert samples_needed(math.log(0.5), 0.9) == 4
    assert samples_needed(0.0, 0.99) == 1  # q = 1
    assert samples_needed(float("-inf"), 0.5) == math.inf  # q = 0
    assert samples_needed(math.log(0.999), 0.5) == 1
    for q in (1e-6, 0.003, 0.1, 0.37, 0.9):
        for p in (0.5, 0.9, 0.99):
            n = samples_needed(math.log(q), p)
            # the smallest n with 1 - (1 - q)^n >= p
            assert 1 - (1 - q) ** n >= p > 1 - (1 - q) ** (n - 1)
            assert extraction_probability(math.log(q), int(n)) == pytest.approx(1 - (1 - q) ** n, rel=1e-9)
            assert log10_samples_needed(math.log(q), p) == pytest.approx(
                math.log10(math.log(1 - p) / math.log(1 - q)), abs=1e-9
            )
    # tiny q: n ~ -log(1-p) / q; too large for a float, its log10 still finite
    assert samples_needed(-1000.0, 0.5) == math.inf
    assert log10_samples_needed(-1000.0, 0.5) == pytest.approx((math.log(math.log(2)) + 1000) / math.log(10))
    assert samples_needed(math.log(1e-20), 0.5) == pytest.approx(math.log(2) * 1e20, rel=1e-9)
    with pytest.raises(ValueError):
        samples_needed(0.1, 0.5)
    with pytest.raises(ValueError):
        samples_needed(-1.0, 1.0)


def test_sampling_config_validation():
    for bad in (dict(temperature=0.0), dict(top_p=0.0), dict(top_p=1.5), dict(n_samples=0)):
        with pytest.raises(ValueError):
            SamplingConfig(**bad)


def test_sampling_extract_rows_and_seed_independence_of_order():
    model = tiny_llama(vocab=5, seed=1, init_range=1.0)  # peaked: the greedy suffix is likely to be sampled
    prefix = [0, 3, 4]
    likely = greedy_decode(model, [prefix], 3, pad_token_id=PAD)[0]
    unlikely = [t for t in range(5) if t != likely[0]][:1] * 3
    docs = docs_from([prefix + likely, prefix + unlikely])
    config, sampling = ExtractionConfig(suffix_len=3), SamplingConfig(n_samples=40, seed=3)
    rows, summary = sampling_extract(model, docs, config, sampling, pad_token_id=PAD, keep_samples=True)
    prob_rows, _ = probabilistic_extract(model, docs, config, pad_token_id=PAD)
    for row, prob in zip(rows, prob_rows):
        assert row["n_exact"] == sum(s == docs[int(row["id"][3:])].token_ids[3:] for s in row["samples"])
        assert row["any_exact"] == (row["n_exact"] > 0)
        assert len(row["samples"]) == 40
    assert rows[0]["n_exact"] > rows[1]["n_exact"]  # the greedy suffix is sampled more often
    assert prob_rows[0]["log_q"] > prob_rows[1]["log_q"]
    assert summary["sample_exact_rate"] == pytest.approx(sum(r["n_exact"] for r in rows) / 80)
    # per-document seeds: the same document gets the same samples whatever its position in the list
    reversed_rows, _ = sampling_extract(model, docs[::-1], config, sampling, pad_token_id=PAD, keep_samples=True)
    assert reversed_rows[1]["samples"] == rows[0]["samples"]


def test_beam_search_with_pad_id_zero_equals_any_other_pad_id():
    # transformers' beam search fails for pad id 0 without an EOS id; the pad value must not matter (masked out).
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    )
    prefixes = [[5, 6, 7], [8, 9]]
    with_zero = beam_search_decode(model, prefixes, 4, num_beams=3, pad_token_id=0, batch_size=2)
    assert with_zero == beam_search_decode(model, prefixes, 4, num_beams=3, pad_token_id=7, batch_size=2)
    assert all(len(ids) == 4 for ids in with_zero)
