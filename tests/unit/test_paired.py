"""Paired and clustered statistics (eval.paired) on hand-computed cases, and against statsmodels and brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import binomtest, bootstrap
from statsmodels.stats.contingency_tables import mcnemar

from eval.paired import (
    cluster_exact_bounds,
    clustered_extraction,
    mcnemar_exact_p,
    paired_buckets,
    sign_flip_p,
)
from eval.seeds import seed_mean_interval


def test_mcnemar_hand_cases_and_statsmodels():
    assert mcnemar_exact_p(5, 0) == pytest.approx(2 / 32)  # every one of 5 discordant targets on one side
    assert mcnemar_exact_p(4, 0) == pytest.approx(2 / 16)  # seed 1 of the corpus study: 4/32 vs 0/32
    assert mcnemar_exact_p(1, 5) == pytest.approx(2 * (1 + 6) / 64)
    assert mcnemar_exact_p(0, 0) == 1.0 and mcnemar_exact_p(3, 3) == 1.0
    rng = np.random.default_rng(0)
    for b, c in [(20, 0), (0, 1), (7, 2), *rng.integers(0, 40, size=(30, 2)).tolist()]:
        table = [[11, b], [c, 9]]  # the concordant cells play no part
        assert mcnemar_exact_p(b, c) == pytest.approx(mcnemar(table, exact=True).pvalue, rel=1e-12, abs=1e-300)
    with pytest.raises(ValueError):
        mcnemar_exact_p(-1, 2)


def test_sign_flip_hand_cases():
    assert sign_flip_p([2, 2, 1]) == pytest.approx(1 / 4)  # only all + and all - reach |sum| 5 of 8 assignments
    assert sign_flip_p([2, 1]) == pytest.approx(1 / 2)  # ++ and -- reach |sum| 3
    assert sign_flip_p([1, -1]) == 1.0 and sign_flip_p([0, 0]) == 1.0 and sign_flip_p([]) == 1.0
    assert sign_flip_p([-3, 0, 0]) == pytest.approx(1.0)  # one nonzero target: either sign reaches 3
    with pytest.raises(ValueError):
        sign_flip_p([0.5])


def test_sign_flip_with_one_seed_is_mcnemar_and_matches_brute_force():
    # one seed: differences -1/0/1, the test is the exact McNemar test on the discordant targets
    for b, c in [(4, 0), (1, 5), (3, 3), (10, 2)]:
        assert sign_flip_p([1] * c + [-1] * b + [0] * 7) == pytest.approx(mcnemar_exact_p(b, c), rel=1e-12)
    rng = np.random.default_rng(1)
    for _ in range(20):
        d = rng.integers(-3, 4, size=int(rng.integers(1, 11))).tolist()
        sums = [abs(sum(s * x for s, x in zip(signs, d))) for signs in itertools.product((-1, 1), repeat=len(d))]
        brute = sum(v >= abs(sum(d)) for v in sums) / len(sums)
        assert sign_flip_p(d) == pytest.approx(brute, rel=1e-12)


def test_cluster_exact_bounds():
    ci = binomtest(0, 32).proportion_ci(0.95, method="exact")
    assert cluster_exact_bounds(0, 0, 32) == pytest.approx([0.0, ci.high])  # 0.109, not zero-wide
    # one seed: every_seed == some_seed == k and the bounds are the Clopper-Pearson interval
    ci = binomtest(20, 32).proportion_ci(0.95, method="exact")
    assert cluster_exact_bounds(20, 20, 32) == pytest.approx([ci.low, ci.high])
    low, high = cluster_exact_bounds(4, 20, 32)
    assert low == pytest.approx(binomtest(4, 32).proportion_ci(0.95, method="exact").low)
    assert high == pytest.approx(binomtest(20, 32).proportion_ci(0.95, method="exact").high)
    assert cluster_exact_bounds(0, 0, 0) is None
    with pytest.raises(ValueError):
        cluster_exact_bounds(3, 2, 5)


def _rows(results: dict[str, tuple[int, bool, float]]) -> list[dict]:
    return [
        {"id": t, "repeats": bucket, "exact_match": exact, "rouge_l": rouge}
        for t, (bucket, exact, rouge) in results.items()
    ]


# Two seeds, bucket 4 with targets a, b, c and bucket 0 with d: (bucket, extracted, RougeL) per target.
STANDARD = {
    0: _rows({"a": (4, True, 1.0), "b": (4, True, 1.0), "c": (4, False, 0.5), "d": (0, False, 0.1)}),
    1: _rows({"a": (4, True, 1.0), "b": (4, False, 0.6), "c": (4, False, 0.4), "d": (0, False, 0.2)}),
}
GOLDFISH = {
    0: _rows({"a": (4, False, 0.7), "b": (4, False, 0.5), "c": (4, False, 0.5), "d": (0, False, 0.1)}),
    1: _rows({"a": (4, False, 0.8), "b": (4, True, 1.0), "c": (4, False, 0.3), "d": (0, False, 0.2)}),
}


def test_clustered_extraction_by_hand():
    table = clustered_extraction(STANDARD, n_resamples=200)
    held, top = table
    assert (held["repeats"], held["k"], held["n"], held["rate"]) == (0, 0, 2, 0.0)
    assert held["cluster_ci"] == [0.0, 0.0]  # the bootstrap of one zero rate: zero-wide ...
    assert held["exact_bounds"][0] == 0 and held["exact_bounds"][1] == pytest.approx(0.975)  # ... the bounds not
    assert (top["n_targets"], top["n_seeds"], top["k"], top["n"]) == (3, 2, 3, 6) and top["rate"] == 0.5
    assert (top["targets_every_seed"], top["targets_some_seed"]) == (1, 2)  # a under both, b under one
    per_target = np.array([1.0, 0.5, 0.0])  # the cluster bootstrap resamples the targets' rates over seeds
    direct = bootstrap(
        (per_target,), np.mean, n_resamples=200, method="percentile", rng=np.random.default_rng(0)
    ).confidence_interval
    assert top["cluster_ci"] == pytest.approx([direct.low, direct.high], abs=1e-12)
    assert clustered_extraction(STANDARD, n_resamples=0)[1]["cluster_ci"] is None


def test_paired_buckets_by_hand():
    held, top = paired_buckets(STANDARD, GOLDFISH, n_resamples=200)
    assert (top["reference_k"], top["model_k"], top["reference_only"], top["model_only"]) == (3, 1, 3, 1)
    assert top["mcnemar_p"] is None  # two seeds: target-seed pairs are not independent
    # per target, goldfish minus standard summed over seeds: a -2, b 0, c 0 -> one nonzero target, p = 1
    assert top["sign_flip_p"] == 1.0
    assert top["exact_match_difference"] == pytest.approx((-1 + 0 + 0) / 3)
    rouge = [((0.7 - 1.0) + (0.8 - 1.0)) / 2, ((0.5 - 1.0) + (1.0 - 0.6)) / 2, ((0.5 - 0.5) + (0.3 - 0.4)) / 2]
    assert top["rouge_l_difference"] == pytest.approx(sum(rouge) / 3)
    direct = bootstrap(
        (np.array(rouge),), np.mean, n_resamples=200, method="percentile", rng=np.random.default_rng(0)
    ).confidence_interval
    assert top["rouge_l_difference_ci"] == pytest.approx([direct.low, direct.high], abs=1e-12)
    assert held["exact_match_difference"] == 0 and held["exact_match_difference_ci"] == [0.0, 0.0]
    # one seed: McNemar, equal to the sign-flip test
    one = paired_buckets({0: STANDARD[0]}, {0: GOLDFISH[0]}, n_resamples=0)[1]
    assert (one["reference_only"], one["model_only"]) == (2, 0)
    assert one["mcnemar_p"] == pytest.approx(0.5) and one["sign_flip_p"] == pytest.approx(0.5)
    assert one["exact_match_difference_ci"] is None


def test_paired_buckets_refuses_unpaired_rows():
    with pytest.raises(ValueError, match="other targets"):
        paired_buckets({0: STANDARD[0]}, {0: GOLDFISH[0][:3]}, n_resamples=0)
    with pytest.raises(ValueError, match="different seeds"):
        paired_buckets(STANDARD, {0: GOLDFISH[0]}, n_resamples=0)
    with pytest.raises(ValueError, match="under some seed"):
        clustered_extraction({0: STANDARD[0], 1: STANDARD[1][:3]}, n_resamples=0)


def test_seed_mean_interval():
    assert seed_mean_interval([5.0, 5.2]) == pytest.approx([5.1 - 12.7062047 * 0.1, 5.1 + 12.7062047 * 0.1])
    assert seed_mean_interval([5.0]) is None
