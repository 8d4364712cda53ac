"""Bootstrap confidence intervals over documents: how much an AUC or a mean would move with other documents.

With 32 or 100 documents an AUC of 0.62 against 0.55 means little without an interval. Each interval here is a
95% percentile bootstrap (Efron & Tibshirani 1993, ch. 13) computed with ``scipy.stats.bootstrap`` (method
"percentile"): the documents are resampled with replacement ``n_resamples`` times (1,000 by default) from a
seeded generator, the statistic is recomputed on every resample, and the interval is the 2.5th and 97.5th
percentile of those values. For an AUC, members and non-members are resampled separately (scipy resamples each of
several samples independently when ``paired=False``), so every resample keeps both classes and their sizes.

A percentile interval need not contain the estimate in a pathological case (a heavily skewed statistic); on the
means and AUCs here it does, and tests check it. The TPR at a low FPR is such a statistic: with 32 non-members
the curve has a vertex every 1/32 in FPR, so TPR at 1% FPR rests on the few highest-scoring non-members and its
bootstrap distribution is lumpy; read its interval as a rough range.

Counts get exact intervals and tests instead of a bootstrap: a fraction of k successes in n (documents extracted
verbatim) gets the Clopper-Pearson interval (`binomial_interval`), which never undercovers and stays meaningful at
k = 0 or k = n, where a bootstrap collapses to a single point; two such fractions are compared with Fisher's exact
test (`fisher_exact_p`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.stats import binomtest, bootstrap, fisher_exact

from eval.config import DEFAULT_RESAMPLES
from eval.roc import tpr_at_fpr_of_scores

DEFAULT_CONFIDENCE = 0.95
BOOTSTRAP_SEED = 0


def _check(n_resamples: int) -> None:
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(
            f"the bootstrap needs a positive number of resamples (e.g. --bootstrap 1000), got {n_resamples!r}"
        )


def pairwise_auc(member_scores: np.ndarray, nonmember_scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """AUC as the Mann-Whitney probability P(member score > non-member score) + 0.5 P(equal), along ``axis``.

    member_scores (..., M) and nonmember_scores (..., N) with equal leading (batch) shapes; returns (...,). Equal to
    sklearn's ``roc_auc_score`` on the concatenated scores (ties count half in both), vectorised over the leading
    axes so that scipy can pass a batch of resamples at once.
    """
    m = np.moveaxis(np.asarray(member_scores, dtype=np.float64), axis, -1)[..., :, None]  # (..., M, 1)
    n = np.moveaxis(np.asarray(nonmember_scores, dtype=np.float64), axis, -1)[..., None, :]  # (..., 1, N)
    return (m > n).mean(axis=(-2, -1)) + 0.5 * (m == n).mean(axis=(-2, -1))


def _interval(result: object) -> list[float]:
    ci = result.confidence_interval  # type: ignore[attr-defined]
    return [float(ci.low), float(ci.high)]


def auc_interval(
    member_scores: Sequence[float],
    nonmember_scores: Sequence[float],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> list[float]:
    """[low, high] of the percentile bootstrap interval of the AUC, members and non-members resampled separately.

    Scores are oriented higher = member. Each resample batch holds at most ~4e6 member/non-member comparisons, so
    memory stays small for a thousand documents of each kind.
    """
    _check(n_resamples)
    members, nonmembers = np.asarray(member_scores, float), np.asarray(nonmember_scores, float)
    if members.size == 0 or nonmembers.size == 0:
        raise ValueError("an AUC interval needs members and non-members")
    batch = max(1, int(4e6 // max(1, members.size * nonmembers.size)))
    options = dict(
        n_resamples=n_resamples,
        batch=batch,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    if members.size == 1 and nonmembers.size == 1:  # nothing to resample: every resample is the same pair
        auc = float(pairwise_auc(members, nonmembers))
        return [auc, auc]
    # A class of one document resamples to itself: scipy needs two observations per sample, so hold it fixed.
    if members.size == 1:
        result = bootstrap(
            (nonmembers,),
            lambda n, axis=-1: pairwise_auc(np.broadcast_to(members, n.shape[:-1] + (1,)), n, axis),
            **options,
        )
    elif nonmembers.size == 1:
        result = bootstrap(
            (members,),
            lambda m, axis=-1: pairwise_auc(m, np.broadcast_to(nonmembers, m.shape[:-1] + (1,)), axis),
            **options,
        )
    else:
        result = bootstrap((members, nonmembers), pairwise_auc, paired=False, **options)
    return _interval(result)


def mean_interval(
    values: Sequence[float],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> list[float] | None:
    """[low, high] of the percentile bootstrap interval of the mean of ``values`` (one per document); None for no
    values. Booleans count as 0/1 (exact match: the interval of the fraction of documents extracted)."""
    _check(n_resamples)
    data = np.asarray([float(v) for v in values], dtype=np.float64)
    if data.size == 0:
        return None
    if np.all(data == data[0]):  # every resample has the same mean; scipy would warn about a degenerate sample
        return [float(data[0]), float(data[0])]
    result = bootstrap(
        (data,),
        np.mean,
        n_resamples=n_resamples,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return _interval(result)


def _check_count(k: int, n: int) -> None:
    for name, value in (("k", k), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"a count must be an int >= 0, got {name} = {value!r}")
    if k > n:
        raise ValueError(f"k = {k} successes cannot exceed n = {n} trials")


def binomial_interval(k: int, n: int, confidence: float = DEFAULT_CONFIDENCE) -> list[float] | None:
    """[low, high] of the exact (Clopper-Pearson 1934) interval of the success probability behind k successes in n
    trials, e.g. k of n documents extracted verbatim; None for n = 0.

    The bounds are the beta quantiles B(a/2; k, n-k+1) and B(1-a/2; k+1, n-k) with a = 1 - confidence (0 when k = 0,
    1 when k = n), computed by ``scipy.stats.binomtest(k, n).proportion_ci(confidence, method="exact")``. At 95%,
    0 of 32 gives [0, 0.109] and 2 of 2 gives [0.158, 1].
    """
    _check_count(k, n)
    if n == 0:
        return None
    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="exact")
    return [float(ci.low), float(ci.high)]


def fisher_exact_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p-value of Fisher's exact test that k1 successes of n1 and k2 of n2 come from one success
    probability (the 2x2 table [[k1, n1 - k1], [k2, n2 - k2]], ``scipy.stats.fisher_exact``): the probability, given
    the margins, of a table at most as likely as the observed one. 2 of 2 against 0 of 2 gives p = 1/3.
    """
    _check_count(k1, n1)
    _check_count(k2, n2)
    result = fisher_exact([[int(k1), int(n1 - k1)], [int(k2), int(n2 - k2)]], alternative="two-sided")
    return float(result.pvalue)


def tpr_at_fpr_interval(
    member_scores: Sequence[float],
    nonmember_scores: Sequence[float],
    target_fpr: float = 0.01,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    *,
    seed: int = BOOTSTRAP_SEED,
) -> list[float] | None:
    """[low, high] of the percentile bootstrap interval of the TPR at ``target_fpr`` (eval.roc.tpr_at_fpr, the
    definition eval.membership reports), members and non-members resampled separately as in `auc_interval`; None
    when either class is empty. Scores are oriented higher = member.
    """
    _check(n_resamples)
    members, nonmembers = np.asarray(member_scores, float), np.asarray(nonmember_scores, float)
    if members.size == 0 or nonmembers.size == 0:
        return None
    if not 0 <= target_fpr <= 1:
        raise ValueError(f"target FPR must be in [0, 1], got {target_fpr}")
    options = dict(
        n_resamples=n_resamples,
        confidence_level=confidence,
        method="percentile",
        vectorized=False,  # one ROC per resample; eval.roc reads one in tens of microseconds
        rng=np.random.default_rng(seed),
    )
    if members.size == 1 and nonmembers.size == 1:  # nothing to resample
        value = tpr_at_fpr_of_scores(members, nonmembers, target_fpr)
        return [value, value]
    # As in auc_interval: a class of one document is held fixed (scipy needs two observations to resample).
    if members.size == 1:
        result = bootstrap((nonmembers,), lambda n: tpr_at_fpr_of_scores(members, n, target_fpr), **options)
    elif nonmembers.size == 1:
        result = bootstrap((members,), lambda m: tpr_at_fpr_of_scores(m, nonmembers, target_fpr), **options)
    else:
        result = bootstrap(
            (members, nonmembers), lambda m, n: tpr_at_fpr_of_scores(m, n, target_fpr), paired=False, **options
        )
    return _interval(result)
