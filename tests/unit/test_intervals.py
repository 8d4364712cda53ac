"""Intervals (eval.intervals) against scipy run directly (bootstrap, binomtest, fisher_exact), hand values and
sklearn's AUC and ROC."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import bootstrap
from sklearn.metrics import roc_auc_score

from eval.intervals import (
    auc_interval,
    binomial_interval,
    fisher_exact_p,
    mean_interval,
    pairwise_auc,
    tpr_at_fpr_interval,
)
from eval.roc import roc_points, tpr_at_fpr, tpr_at_fpr_of_scores


def test_pairwise_auc_equals_sklearn_with_ties():
    rng = np.random.default_rng(3)
    members, nonmembers = rng.integers(0, 5, 17).astype(float), rng.integers(0, 4, 11).astype(float)  # many ties
    labels = [1] * 17 + [0] * 11
    assert pairwise_auc(members, nonmembers) == pytest.approx(
        roc_auc_score(labels, np.concatenate([members, nonmembers])), abs=1e-12
    )


def test_auc_interval_is_seeded_contains_the_estimate_and_resamples_each_class():
    rng = np.random.default_rng(0)
    members, nonmembers = rng.normal(0.5, 1, 40), rng.normal(0, 1, 30)
    low, high = auc_interval(members, nonmembers, n_resamples=500)
    assert auc_interval(members, nonmembers, n_resamples=500) == [low, high]  # seeded
    assert low < pairwise_auc(members, nonmembers) < high
    # the same as scipy's own percentile bootstrap of the two samples with the same generator
    direct = bootstrap(
        (members, nonmembers),
        lambda m, n, axis=-1: pairwise_auc(m, n, axis),
        n_resamples=500,
        method="percentile",
        paired=False,
        rng=np.random.default_rng(0),
    ).confidence_interval
    assert [low, high] == pytest.approx([direct.low, direct.high], abs=1e-12)
    # a class of one document is held fixed (scipy cannot resample it), and a perfect split stays at 1
    assert auc_interval([5.0], nonmembers, n_resamples=100)[1] == 1.0
    assert auc_interval([5.0, 6.0], [1.0, 2.0], n_resamples=100) == [1.0, 1.0]


def test_mean_interval():
    values = [1, 0, 0, 1, 1, 0, 1, 1]
    low, high = mean_interval(values, n_resamples=400)
    direct = bootstrap(
        (np.array(values, float),), np.mean, n_resamples=400, method="percentile", rng=np.random.default_rng(0)
    ).confidence_interval
    assert [low, high] == pytest.approx([direct.low, direct.high], abs=1e-12)
    assert low < np.mean(values) < high
    assert mean_interval([0.0, 0.0, 0.0]) == [0.0, 0.0] and mean_interval([]) is None
    with pytest.raises(ValueError, match="--bootstrap"):
        mean_interval(values, n_resamples=0)


def test_binomial_interval_is_clopper_pearson():
    """The exact interval against hand values, against scipy's binomtest and against its beta-quantile form."""
    from scipy.stats import beta, binomtest

    assert binomial_interval(0, 32) == pytest.approx([0.0, 0.1089], abs=1e-4)  # 1 - 0.025 ** (1 / 32)
    assert binomial_interval(2, 2) == pytest.approx([0.158, 1.0], abs=1e-3)  # 0.025 ** (1 / 2)
    assert binomial_interval(0, 2) == pytest.approx([0.0, 0.842], abs=1e-3)
    for k, n, confidence in [(3, 32, 0.95), (16, 32, 0.9), (31, 32, 0.99), (1, 1, 0.95)]:
        ci = binomtest(k, n).proportion_ci(confidence, method="exact")
        low, high = binomial_interval(k, n, confidence)
        assert [low, high] == pytest.approx([ci.low, ci.high], abs=1e-12)
        a = 1 - confidence
        expected_low = beta.ppf(a / 2, k, n - k + 1) if k > 0 else 0.0
        expected_high = beta.ppf(1 - a / 2, k + 1, n - k) if k < n else 1.0
        assert [low, high] == pytest.approx([expected_low, expected_high], abs=1e-9)
        assert low <= k / n <= high
    assert binomial_interval(0, 0) is None
    for bad in [(3, 2), (-1, 4), (1.5, 4)]:
        with pytest.raises(ValueError, match="count|cannot exceed"):
            binomial_interval(*bad)


def test_fisher_exact_p():
    from scipy.stats import fisher_exact

    assert fisher_exact_p(2, 2, 0, 2) == pytest.approx(1 / 3)  # the 2/2 against 0/2
    assert fisher_exact_p(0, 32, 0, 32) == 1.0
    assert fisher_exact_p(10, 32, 0, 32) < 0.001
    assert fisher_exact_p(7, 20, 3, 25) == pytest.approx(fisher_exact([[7, 13], [3, 22]]).pvalue, abs=1e-12)
    assert fisher_exact_p(7, 20, 3, 25) == pytest.approx(fisher_exact_p(3, 25, 7, 20), abs=1e-12)  # symmetric
    with pytest.raises(ValueError, match="cannot exceed"):
        fisher_exact_p(3, 2, 0, 2)


def test_roc_points_equal_sklearn_with_ties():
    from sklearn.metrics import roc_curve

    rng = np.random.default_rng(5)
    for _ in range(20):
        members, nonmembers = rng.integers(0, 6, 13).astype(float), rng.integers(0, 5, 9).astype(float)
        fpr, tpr = roc_points(members, nonmembers)
        labels = np.r_[np.ones(13), np.zeros(9)]
        sk_fpr, sk_tpr, _ = roc_curve(labels, np.r_[members, nonmembers], drop_intermediate=False)
        assert fpr == pytest.approx(sk_fpr) and tpr == pytest.approx(sk_tpr)
        for target in (0.0, 0.01, 0.1, 0.3, 1.0):
            assert tpr_at_fpr_of_scores(members, nonmembers, target) == tpr_at_fpr(sk_fpr, sk_tpr, target)


def test_tpr_at_fpr_interval_against_scipy():
    rng = np.random.default_rng(1)
    members, nonmembers = rng.normal(1.0, 1, 40), rng.normal(0, 1, 50)
    for target in (0.01, 0.1):
        low, high = tpr_at_fpr_interval(members, nonmembers, target, n_resamples=400)
        assert tpr_at_fpr_interval(members, nonmembers, target, n_resamples=400) == [low, high]  # seeded
        direct = bootstrap(
            (members, nonmembers),
            lambda m, n: tpr_at_fpr_of_scores(m, n, target),
            n_resamples=400,
            method="percentile",
            paired=False,
            vectorized=False,
            rng=np.random.default_rng(0),
        ).confidence_interval
        assert [low, high] == pytest.approx([direct.low, direct.high], abs=1e-12)
        assert low <= tpr_at_fpr_of_scores(members, nonmembers, target) <= high and low < high
    # separated classes: every resample separates them too
    assert tpr_at_fpr_interval([5.0, 6.0, 7.0], [1.0, 2.0], 0.01, n_resamples=100) == [1.0, 1.0]
    assert tpr_at_fpr_interval([5.0], [1.0, 2.0, 6.0], 0.5, n_resamples=100)[1] == 1.0  # one member held fixed
    assert tpr_at_fpr_interval([], [1.0], n_resamples=10) is None
    with pytest.raises(ValueError, match="--bootstrap"):
        tpr_at_fpr_interval(members, nonmembers, n_resamples=0)
