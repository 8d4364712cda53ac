"""Bootstrap intervals (eval.intervals) against scipy's bootstrap run directly and against sklearn's AUC."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import bootstrap
from sklearn.metrics import roc_auc_score

from eval.intervals import auc_interval, mean_interval, pairwise_auc


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
