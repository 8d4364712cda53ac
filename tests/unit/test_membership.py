"""Membership inference scores and ROC metrics against hand-computed values, HF's loss and a pairwise AUC."""

from __future__ import annotations

import itertools
import math
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score, roc_curve
from transformers import LlamaConfig, LlamaForCausalLM

from eval.logprobs import next_token_stats, token_log_probs
from eval.membership import (
    ATTACKS,
    attack_metrics,
    dc_pdd_score,
    gradient_norm,
    membership_rows,
    membership_scores,
    membership_summary,
    min_k_count,
    recall_prefix,
    recall_window,
    token_frequencies,
    tpr_at_fpr,
    zlib_bytes,
)


def tiny_llama(seed: int = 0, vocab: int = 64) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab,
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
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def random_docs(n: int, length: int, seed: int, vocab: int = 64) -> list[SimpleNamespace]:
    generator = torch.Generator().manual_seed(seed)
    return [
        SimpleNamespace(id=f"d{seed}-{i}", token_ids=torch.randint(2, vocab, (length,), generator=generator).tolist())
        for i in range(n)
    ]


# ---------------------------------------------------------------- per-document scores


def test_scores_match_hand_computation():
    log_probs = [-1.0, -2.0, -3.0, -4.0, -0.5]
    text = "abc abc abc"
    row = membership_scores(log_probs, text, min_k=0.4, reference_log_probs=[-2.0] * 5)
    # loss = (1 + 2 + 3 + 4 + 0.5) / 5 = 2.1 nats; Min-40% of 5 tokens = the 2 lowest: (-4 + -3) / 2 = -3.5.
    assert row["loss"] == pytest.approx(2.1, abs=1e-12)
    assert row["score_loss"] == pytest.approx(-2.1, abs=1e-12)
    assert row["zlib_bytes"] == len(zlib.compress(b"abc abc abc"))
    assert row["score_zlib"] == pytest.approx(-2.1 / row["zlib_bytes"], abs=1e-12)
    assert row["min_k_mean_log_prob"] == pytest.approx(-3.5, abs=1e-12)
    assert row["score_min_k"] == pytest.approx(-3.5, abs=1e-12)
    # reference loss 2.0; the target finds the text harder (2.1): score 2.0 - 2.1 = -0.1 (leans non-member).
    assert row["reference_loss"] == pytest.approx(2.0, abs=1e-12)
    assert row["score_reference"] == pytest.approx(-0.1, abs=1e-12)
    assert row["n_scored"] == 5
    assert "score_reference" not in membership_scores(log_probs, text)


def test_zlib_length_is_of_the_utf8_text():
    # 3 characters, 6 UTF-8 bytes: the compressed length is of the bytes (a header makes zlib output >= 8 bytes).
    assert zlib_bytes("äöü") == len(zlib.compress("äöü".encode("utf-8")))
    assert zlib_bytes("a" * 1000) < zlib_bytes("".join(chr(97 + (i * 7919) % 26) for i in range(1000)))


@pytest.mark.parametrize(
    "n,k,expected", [(5, 0.2, 1), (5, 0.4, 2), (100, 0.29, 29), (3, 0.2, 1), (10, 1.0, 10), (127, 0.2, 25)]
)
def test_min_k_count(n, k, expected):
    assert min_k_count(n, k) == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(log_probs=[], text="x"),
        dict(log_probs=[0.5], text="x"),
        dict(log_probs=[-1.0], text="x", min_k=0.0),
        dict(log_probs=[-1.0], text="x", min_k=1.5),
        dict(log_probs=[-1.0, -2.0], text="x", reference_log_probs=[-1.0]),
    ],
)
def test_bad_score_input(kwargs):
    with pytest.raises(ValueError):
        membership_scores(**kwargs)


def test_rows_from_a_model_match_hf_loss_and_are_batch_independent():
    model = tiny_llama()
    docs = random_docs(3, 12, seed=1) + random_docs(2, 7, seed=2)  # two lengths: padding inside a batch
    decode = lambda ids: " ".join(map(str, ids))  # noqa: E731
    rows = membership_rows(model, docs, decode=decode, pad_token_id=1, batch_size=5, member=True)
    single = membership_rows(model, docs, decode=decode, pad_token_id=1, batch_size=1)
    same_model_as_reference = membership_rows(model, docs, decode=decode, pad_token_id=1, reference_model=model)
    for doc, row, one, ref in zip(docs, rows, single, same_model_as_reference):
        ids = torch.tensor([doc.token_ids])
        with torch.no_grad():
            hf_loss = float(model(input_ids=ids, labels=ids).loss)  # mean cross-entropy of tokens 1..T-1
        # float32 logits, float64 log-softmax here vs float32 in HF: agree to ~1e-6 nats.
        assert row["loss"] == pytest.approx(hf_loss, abs=1e-5)
        assert row["n_scored"] == len(doc.token_ids) - 1
        assert row["member"] is True and row["id"] == doc.id
        assert row["zlib_bytes"] == zlib_bytes(decode(doc.token_ids[1:]))
        # right padding inside a batch does not change a causal model's scores (float32 matmul order: 1e-5)
        for key in ("score_loss", "score_zlib", "score_min_k"):
            assert row[key] == pytest.approx(one[key], abs=1e-5)
        assert ref["score_reference"] == pytest.approx(0.0, abs=1e-12)


def test_token_log_probs_are_log_softmax_of_the_true_tokens():
    model = tiny_llama()
    seq = [0, 5, 9, 3, 3, 7]
    lp = token_log_probs(model, [seq], pad_token_id=1)[0]
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=torch.tensor([seq])).logits[0].double(), dim=-1)  # (T, V)
    expected = [math.log(float(probs[j, seq[j + 1]])) for j in range(len(seq) - 1)]
    assert lp.shape == (len(seq) - 1,)
    assert lp.tolist() == pytest.approx(expected, abs=1e-6)


# ---------------------------------------------------------------- ROC metrics


def pairwise_auc(members, nonmembers):
    """Mann-Whitney: P(member score > non-member score) + 0.5 P(tie), by brute force over all pairs."""
    pairs = list(itertools.product(members, nonmembers))
    return sum(1.0 if m > n else 0.5 if m == n else 0.0 for m, n in pairs) / len(pairs)


def test_auc_equals_pairwise_probability():
    rng = np.random.default_rng(0)
    members = np.round(rng.normal(0.5, 1, 40), 1)  # rounded: ties between members and non-members happen
    nonmembers = np.round(rng.normal(0.0, 1, 50), 1)
    metrics = attack_metrics(members, nonmembers)
    assert metrics["auc"] == pytest.approx(pairwise_auc(members, nonmembers), abs=1e-12)
    assert metrics["n_members"] == 40 and metrics["n_nonmembers"] == 50
    assert metrics["fpr_resolution"] == pytest.approx(1 / 50)
    assert metrics["roc"]["fpr"][0] == 0 and metrics["roc"]["tpr"][-1] == 1


def test_tpr_at_fpr_by_hand():
    # Members 0.9, 0.6, 0.4; non-members 0.8, 0.5, 0.3, 0.2. Lowering the threshold visits
    # (0, 0) -> 0.9: (0, 1/3) -> 0.8: (1/4, 1/3) -> 0.6: (1/4, 2/3) -> 0.5: (2/4, 2/3) -> 0.4: (2/4, 1) -> ... (1, 1).
    metrics = attack_metrics([0.9, 0.6, 0.4], [0.8, 0.5, 0.3, 0.2], target_fprs=(0.0, 0.01, 0.25, 0.3, 0.5, 1.0))
    tpr = metrics["tpr_at_fpr"]
    assert tpr["0"] == pytest.approx(1 / 3)  # no false positive allowed: only the 0.9 member
    assert tpr["0.01"] == pytest.approx(1 / 3)  # horizontal segment from (0, 1/3) to (1/4, 1/3)
    assert tpr["0.25"] == pytest.approx(2 / 3)  # at a vertex: the top of the vertical step
    assert tpr["0.3"] == pytest.approx(2 / 3)
    assert tpr["0.5"] == pytest.approx(1.0)
    assert tpr["1"] == pytest.approx(1.0)
    assert metrics["auc"] == pytest.approx(pairwise_auc([0.9, 0.6, 0.4], [0.8, 0.5, 0.3, 0.2]))  # 9/12


def test_tpr_at_fpr_interpolates_along_a_tie():
    # One member and one of two non-members tie at 0.5: the curve goes diagonally from (0, 0) to (1/2, 1).
    metrics = attack_metrics([0.5], [0.5, 0.1], target_fprs=(0.01, 0.001, 0.25))
    assert metrics["tpr_at_fpr"]["0.01"] == pytest.approx(0.02)
    assert metrics["tpr_at_fpr"]["0.001"] == pytest.approx(0.002)
    assert metrics["tpr_at_fpr"]["0.25"] == pytest.approx(0.5)


def test_tpr_at_fpr_equals_numpy_interp_without_ties():
    # With distinct scores the curve's FPRs are non-decreasing with vertical steps; np.interp on the vertices where
    # FPR strictly increases (keeping the top of each step) is an independent implementation of the same rule.
    rng = np.random.default_rng(1)
    members, nonmembers = rng.normal(1, 1, 300), rng.normal(0, 1, 700)
    labels = np.r_[np.ones(300), np.zeros(700)]
    fpr, tpr, _ = roc_curve(labels, np.r_[members, nonmembers], drop_intermediate=False)
    tops = np.r_[np.flatnonzero(np.diff(fpr) > 0), len(fpr) - 1]  # last vertex of each FPR value
    bottoms = np.r_[0, np.flatnonzero(np.diff(fpr) > 0) + 1]  # first vertex of each FPR value
    for target in (0.0005, 0.001, 0.0123, 0.01, 0.1, 0.5):
        # between two FPR values the segment runs from the top of the left step to the bottom of the right one
        right = int(np.searchsorted(fpr[bottoms], target, side="right"))
        if right < len(bottoms) and fpr[tops[right - 1]] != target:
            x0, y0 = fpr[tops[right - 1]], tpr[tops[right - 1]]
            x1, y1 = fpr[bottoms[right]], tpr[bottoms[right]]
            expected = float(np.interp(target, [x0, x1], [y0, y1]))
        else:
            expected = float(tpr[tops[right - 1]])
        assert tpr_at_fpr(fpr, tpr, target) == pytest.approx(expected, abs=1e-12)


def test_attack_metrics_bad_input():
    with pytest.raises(ValueError, match="members and non-members"):
        attack_metrics([], [0.1])
    with pytest.raises(ValueError, match="finite"):
        attack_metrics([float("nan")], [0.1])
    with pytest.raises(ValueError, match="target FPR"):
        tpr_at_fpr(np.array([0.0, 1.0]), np.array([0.0, 1.0]), 1.5)


def test_attacks_separate_memorized_documents():
    """End to end: a tiny model overfit on 4 sequences gives them a far lower loss than 4 unseen ones; every attack
    (with the untrained copy as reference) then ranks all members above all non-members (AUC 1)."""
    reference = tiny_llama(seed=3)
    model = tiny_llama(seed=3)
    members, nonmembers = random_docs(4, 24, seed=10), random_docs(4, 24, seed=11)
    batch = torch.tensor([d.token_ids for d in members])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(60):
        optimizer.zero_grad()
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
    decode = lambda ids: " ".join(map(str, ids))  # noqa: E731
    prefix, prefix_ids = recall_prefix(nonmembers, 1)
    frequencies = token_frequencies([d.token_ids for d in members + nonmembers], 64)
    options = dict(
        decode=decode, pad_token_id=1, reference_model=reference, recall_prefix_ids=prefix, frequencies=frequencies
    )
    rows_in = membership_rows(model, members, member=True, **options)
    rows_out = membership_rows(model, nonmembers, member=False, **options)
    rows_out[0].pop("score_recall")  # the prefix document is not scored by ReCaLL
    assert prefix_ids == [nonmembers[0].id]
    assert max(r["loss"] for r in rows_in) < 0.5 < min(r["loss"] for r in rows_out)
    summary = membership_summary(rows_in, rows_out, min_k=0.2, n_resamples=200)
    assert set(summary["attacks"]) == set(ATTACKS)
    for attack, metrics in summary["attacks"].items():
        key = f"score_{attack}"
        scored = [r for r in rows_in + rows_out if key in r]
        labels = [r["member"] for r in scored]
        assert metrics["auc"] == pytest.approx(roc_auc_score(labels, [r[key] for r in scored]), abs=1e-12), attack
        low, high = metrics["auc_ci"]
        assert low <= metrics["auc"] <= high, attack
    assert summary["attacks"]["recall"]["n_nonmembers"] == 3
    # an overfit model: the loss-based attacks, Min-K%++ and the gradient norm rank every member first
    for attack in ("loss", "zlib", "min_k", "reference", "min_k_pp", "grad_norm"):
        assert summary["attacks"][attack]["auc"] == 1.0, attack
        assert summary["attacks"][attack]["tpr_at_fpr"]["0.01"] == 1.0, attack
    # Without a reference model the reference attack is left out.
    plain = membership_summary([{k: v for k, v in r.items() if k != "score_reference"} for r in rows_in], rows_out)
    assert "reference" not in plain["attacks"]


# ---------------------------------------------------------------- the attacks of mimir's successors, by hand


def test_min_k_pp_by_hand():
    # z = (lp - mu) / sigma: (-1 - -2) / 1 = 1, (-3 - -2) / 0.5 = -2, (-2 - -1) / 2 = -0.5, sigma 0 -> 0
    z = membership_scores(
        [-1.0, -3.0, -2.0, -0.5],
        "t",
        min_k=0.5,
        mean_log_probs=[-2.0, -2.0, -1.0, -0.5],
        std_log_probs=[1.0, 0.5, 2.0, 0.0],
    )["score_min_k_pp"]
    assert z == pytest.approx((-2.0 + -0.5) / 2, abs=1e-12)  # the 2 lowest of (1, -2, -0.5, 0)


def test_next_token_stats_are_the_mean_and_std_of_log_p():
    model = tiny_llama()
    seq = random_docs(1, 9, seed=4)[0].token_ids
    ((lp, mu, sigma),) = next_token_stats(model, [seq], pad_token_id=1)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([seq])).logits[0, :-1].double(), -1).numpy()
    for t in range(len(seq) - 1):
        p = np.exp(logp[t])
        mean = float(np.sum(p * logp[t]))
        assert mu[t].item() == pytest.approx(mean, abs=1e-9)
        assert sigma[t].item() == pytest.approx(math.sqrt(np.sum(p * (logp[t] - mean) ** 2)), abs=1e-9)
        assert lp[t].item() == pytest.approx(logp[t][seq[t + 1]], abs=1e-9)


def test_recall_by_hand():
    # LL(x) = mean(-1, -3) = -2 over the first 2 tokens; LL(x | P) = mean(-2, -4) = -3: ratio 1.5
    row = membership_scores([-1.0, -3.0, -5.0], "t", conditional_log_probs=[-2.0, -4.0])
    assert row["score_recall"] == pytest.approx(1.5, abs=1e-12)
    assert row["recall_loss"] == pytest.approx(3.0, abs=1e-12) and row["recall_n_scored"] == 2


def test_recall_window_fits_the_context():
    assert recall_window(10, 20, None) == (20, 10)
    assert recall_window(10, 20, 40) == (20, 10)  # fits: everything
    assert recall_window(10, 20, 24) == (14, 10)  # the prefix gives way first
    assert recall_window(96, 96, 96) == (48, 48)  # a document as long as the context: half and half


def test_recall_rows_use_the_prefix():
    model = tiny_llama()
    docs = random_docs(3, 10, seed=5)
    prefix, used = recall_prefix(docs, 1)
    assert prefix == docs[0].token_ids and used == [docs[0].id]
    decode = lambda ids: " ".join(map(str, ids))  # noqa: E731
    rows = membership_rows(model, docs[1:], decode=decode, pad_token_id=1, recall_prefix_ids=prefix, grad_norm=False)
    for doc, row in zip(docs[1:], rows):
        joined = token_log_probs(model, [prefix + doc.token_ids], pad_token_id=1)[0].numpy()
        plain = token_log_probs(model, [doc.token_ids], pad_token_id=1)[0].numpy()
        cond = joined[len(prefix) :]  # the document's tokens 1.. with the prefix in front
        assert row["score_recall"] == pytest.approx(cond.mean() / plain.mean(), rel=1e-6)  # float32 batch padding
    with pytest.raises(ValueError, match="--n-heldout"):
        recall_prefix(docs[:1], 1)


def test_dc_pdd_by_hand():
    """The published DC-PDD (Zhang et al. 2024's code and mimir): alpha_t = p_t * log(1 / f(x_t)) over first
    occurrences, capped at a = 0.01, averaged. The figures are worked out by hand, not by the function."""
    frequencies = token_frequencies([[0, 0, 1, 2]], 4)  # counts 2, 1, 1, 0 -> (c + 1) / (4 + 4)
    assert frequencies.tolist() == [3 / 8, 2 / 8, 2 / 8, 1 / 8]
    lp = [math.log(0.5), math.log(0.001), math.log(0.9)]
    # ids 3, 1, 3: first occurrences of 3 (position 0) and 1 (position 1); the second 3 (p = 0.9) is not counted.
    # alpha_0 = 0.5 * log(8) = 1.03972077 -> capped at 0.01; alpha_1 = 0.001 * log(4) = 0.00138629 (under the cap)
    assert dc_pdd_score(lp, [3, 1, 3], frequencies) == pytest.approx(0.0056931472, abs=1e-10)
    assert dc_pdd_score(lp, [3, 1, 3], frequencies, cap=10.0) == pytest.approx(0.5205535326, abs=1e-10)
    row = membership_scores(lp, "t", token_ids=[3, 1, 3], frequencies=frequencies)
    assert row["score_dc_pdd"] == pytest.approx(0.0056931472, abs=1e-10)
    # p_t <= 1 and f <= 1, so no term of the published form is negative: the score is >= 0 for any document
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 4, size=50)
    assert dc_pdd_score(np.log(rng.uniform(1e-6, 1, size=50)), ids, frequencies, cap=np.inf) >= 0


def test_grad_norm_matches_backward():
    model = tiny_llama()
    seq = random_docs(1, 12, seed=6)[0].token_ids
    for p in model.parameters():
        p.requires_grad_(False)  # frozen weights (a merged LoRA model) still give the full gradient
    norm = gradient_norm(model, seq)
    assert all(not p.requires_grad for p in model.parameters())  # flags restored
    for p in model.parameters():
        p.requires_grad_(True)
    ids = torch.tensor([seq])
    model.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()  # HF: mean cross-entropy of tokens 1..T-1
    expected = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters()))
    assert norm == pytest.approx(expected, rel=1e-5)  # float32 gradients summed in another order
    row = membership_scores([-1.0], "t", grad_norm=norm)
    assert row["score_grad_norm"] == -norm and row["grad_norm"] == norm
