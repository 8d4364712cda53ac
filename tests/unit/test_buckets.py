"""Per-bucket tables (eval.buckets) on small hand-made rows; their intervals against scipy and sklearn directly."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest, bootstrap
from sklearn.metrics import roc_auc_score, roc_curve

from eval.buckets import bucket_extraction, bucket_membership, compare_buckets
from eval.roc import tpr_at_fpr


def extraction_row(doc: str, repeats: int, exact: bool, rouge: float, **extra: float) -> dict:
    return {"id": doc, "repeats": repeats, "exact_match": exact, "rouge_l": rouge, **extra}


def test_bucket_extraction_counts_means_and_intervals():
    rows = [
        extraction_row("a", 16, True, 1.0, match_fraction=1.0, suffix_logprob_mean=-0.1),
        extraction_row("b", 0, False, 0.2, match_fraction=0.1, suffix_logprob_mean=-4.0),
        extraction_row("c", 16, True, 1.0, match_fraction=1.0, suffix_logprob_mean=-0.2),
        extraction_row("d", 16, False, 0.5, match_fraction=0.25, suffix_logprob_mean=-2.0),
        extraction_row("e", 0, False, 0.1, match_fraction=0.0, suffix_logprob_mean=-5.0),
        extraction_row("f", 1, False, 0.3, match_fraction=0.2, suffix_logprob_mean=None),
        extraction_row("g", 16, False, 0.4, match_fraction=0.5, suffix_logprob_mean=-3.0),
    ]
    table = bucket_extraction(rows, "repeats", n_resamples=300)
    assert [e["repeats"] for e in table] == [0, 1, 16]  # sorted by bucket
    top = table[2]
    assert top["n"] == 4 and top["exact_match_k"] == 2 and top["exact_match"] == 0.5
    ci = binomtest(2, 4).proportion_ci(0.95, method="exact")
    assert top["exact_match_ci"] == pytest.approx([ci.low, ci.high], abs=1e-12)
    assert table[0]["exact_match_ci"] == pytest.approx([0.0, 0.842], abs=1e-3)  # 0 of 2
    assert top["rouge_l"] == pytest.approx((1.0 + 1.0 + 0.5 + 0.4) / 4)
    assert top["suffix_logprob_mean"] == pytest.approx((-0.1 - 0.2 - 2.0 - 3.0) / 4)
    for name, values in (("rouge_l", [1.0, 1.0, 0.5, 0.4]), ("match_fraction", [1.0, 1.0, 0.25, 0.5])):
        direct = bootstrap(
            (np.array(values),), np.mean, n_resamples=300, method="percentile", rng=np.random.default_rng(0)
        ).confidence_interval
        assert top[f"{name}_ci"] == pytest.approx([direct.low, direct.high], abs=1e-12)
        assert top[f"{name}_ci"][0] <= top[name] <= top[f"{name}_ci"][1]
    # a bucket whose only row lacks a measure has no entry for it; a constant bucket a zero-width interval
    assert "suffix_logprob_mean" not in table[1] and table[1]["rouge_l_ci"] == [0.3, 0.3]
    # no bootstrap: the means stay, the intervals are None; the exact interval needs no resampling
    plain = bucket_extraction(rows, n_resamples=0)
    assert plain[2]["rouge_l_ci"] is None and plain[2]["exact_match_ci"] == top["exact_match_ci"]
    # a 90% interval is narrower
    narrow = bucket_extraction(rows, n_resamples=300, confidence=0.9)[2]["exact_match_ci"]
    assert top["exact_match_ci"][0] < narrow[0] and narrow[1] < top["exact_match_ci"][1]
    with pytest.raises(ValueError, match="no 'repeats' field"):
        bucket_extraction([{"id": "x", "exact_match": True}], n_resamples=10)
    with pytest.raises(ValueError, match="n_resamples"):
        bucket_extraction(rows, n_resamples=-1)


def membership_row(doc: str, **scores: float) -> dict:
    return {"id": doc, **{f"score_{attack}": value for attack, value in scores.items()}}


def test_bucket_membership_against_sklearn():
    rng = np.random.default_rng(0)
    # bucket 4: 12 members shifted up; bucket 64: 12 members shifted further; 15 bucket-0 non-members
    bucket_of, members = {}, []
    for bucket, shift in ((4, 0.5), (64, 2.0)):
        for i in range(12):
            doc = f"t{bucket}-{i}"
            bucket_of[doc] = bucket
            members.append(membership_row(doc, loss=float(rng.normal(shift, 1)), zlib=float(rng.normal(0, 1))))
    nonmembers = []
    for i in range(15):
        doc = f"t0-{i}"
        bucket_of[doc] = 0
        nonmembers.append(membership_row(doc, loss=float(rng.normal(0, 1)), zlib=float(rng.normal(0, 1))))
    members.append(membership_row("background", loss=9.0, zlib=9.0))  # not a target: left out
    members.append(nonmembers[0])  # a bucket-0 row among the members: left out too
    members[0].pop("score_zlib")  # zlib scored on 11 of bucket 4's members only

    table = bucket_membership(members, nonmembers, bucket_of, n_resamples=200, target_fpr=0.1)
    assert [e["repeats"] for e in table] == [4, 64]
    assert all(e["n_members"] == 12 and e["n_nonmembers"] == 15 and e["target_fpr"] == 0.1 for e in table)
    for entry in table:
        rows = [r for r in members if bucket_of.get(r["id"]) == entry["repeats"]]
        assert set(entry["attacks"]) == {"loss", "zlib"}
        for attack, result in entry["attacks"].items():
            m = [r[f"score_{attack}"] for r in rows if f"score_{attack}" in r]
            n = [r[f"score_{attack}"] for r in nonmembers]
            labels, scores = [1] * len(m) + [0] * len(n), m + n
            assert result["n_members"] == len(m) and result["n_nonmembers"] == 15
            assert result["auc"] == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
            fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
            assert result["tpr_at_fpr"] == pytest.approx(tpr_at_fpr(fpr, tpr, 0.1), abs=1e-12)
            for name in ("auc", "tpr_at_fpr"):
                low, high = result[f"{name}_ci"]
                assert low <= result[name] <= high
    assert table[0]["attacks"]["zlib"]["n_members"] == 11
    # the better separated bucket scores higher, and its AUC interval is the scipy bootstrap of the AUC
    loss_top = table[1]["attacks"]["loss"]
    assert loss_top["auc"] > table[0]["attacks"]["loss"]["auc"]
    m = np.array([r["score_loss"] for r in members if bucket_of.get(r["id"]) == 64])
    n = np.array([r["score_loss"] for r in nonmembers])
    direct = bootstrap(
        (m, n),
        lambda a, b, axis=-1: (
            (a[..., :, None] > b[..., None, :]).mean((-2, -1))
            + 0.5 * (a[..., :, None] == b[..., None, :]).mean((-2, -1))
        ),
        n_resamples=200,
        method="percentile",
        paired=False,
        rng=np.random.default_rng(0),
    ).confidence_interval
    assert loss_top["auc_ci"] == pytest.approx([direct.low, direct.high], abs=1e-12)

    only_loss = bucket_membership(members, nonmembers, bucket_of, attacks=["loss"], n_resamples=0)
    assert set(only_loss[0]["attacks"]) == {"loss"} and only_loss[0]["attacks"]["loss"]["auc_ci"] is None
    with pytest.raises(ValueError, match="unknown attack"):
        bucket_membership(members, nonmembers, bucket_of, attacks=["lossy"], n_resamples=0)
    with pytest.raises(ValueError, match="non-member rows"):
        bucket_membership(members, [], bucket_of, n_resamples=0)


def test_compare_buckets_fisher():
    a = [extraction_row(f"a{i}", 512, True, 1.0) for i in range(2)] + [
        extraction_row(f"b{i}", 1, i == 0, 0.5) for i in range(4)
    ]
    b = [extraction_row(f"a{i}", 512, False, 0.1) for i in range(2)] + [
        extraction_row(f"c{i}", 32, False, 0.1) for i in range(3)
    ]
    table = compare_buckets(a, b)
    assert [e["repeats"] for e in table] == [1, 32, 512]
    top = table[2]
    assert (top["a_n"], top["a_exact_match_k"], top["b_n"], top["b_exact_match_k"]) == (2, 2, 2, 0)
    assert top["a_exact_match"] == 1.0 and top["b_exact_match"] == 0.0
    assert top["fisher_p"] == pytest.approx(1 / 3)  # 2/2 against 0/2: not significant
    # a bucket only one model has: counts on its side, no test
    assert table[0]["b_n"] == 0 and table[0]["b_exact_match"] is None and table[0]["fisher_p"] is None
    assert table[0]["a_exact_match_k"] == 1 and table[1]["a_n"] == 0
