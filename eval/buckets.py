"""Results per duplication bucket, each with its interval: the Hubble-style memorization table.

Targets are drawn at random into buckets by how many times they are inserted into training (0 = drawn from the same
pool but never inserted). Per bucket, with n targets each:

* extraction (`bucket_extraction`): exact match as k of n with its exact Clopper-Pearson interval
  (eval.intervals.binomial_interval), and the means of RougeL, the token match fraction (Pythia's memorization score
  on a 32/32 split) and the suffix's normalised log-likelihood, each with a percentile bootstrap interval over the
  bucket's targets (eval.intervals.mean_interval);
* membership inference (`bucket_membership`): each attack's AUC and TPR at a low FPR with the bucket's targets as
  members and the bucket-0 targets as non-members (IID: the same pool, split at random), with bootstrap intervals;
* two models compared bucket by bucket (`compare_buckets`): Fisher's exact test of their exact-match counts.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from eval.intervals import (
    DEFAULT_CONFIDENCE,
    auc_interval,
    binomial_interval,
    fisher_exact_p,
    mean_interval,
    pairwise_auc,
    tpr_at_fpr_interval,
)
from eval.membership import ATTACKS
from eval.metrics import (
    AUC,
    AUC_CI,
    EXACT_MATCH,
    MATCH_FRACTION,
    ROUGE_L,
    SUFFIX_LOGPROB_MEAN,
    TPR_AT_FPR,
    TPR_AT_FPR_CI,
    interval_key,
)
from eval.roc import tpr_at_fpr_of_scores

# Per-document extraction measures whose bucket mean gets a bootstrap interval (when the rows carry them).
BUCKET_MEANS = (ROUGE_L, MATCH_FRACTION, SUFFIX_LOGPROB_MEAN)
# The key of a bucket's count of targets extracted exactly (beside EXACT_MATCH, their share).
EXACT_MATCH_K = f"{EXACT_MATCH}_k"


def _sort_key(value: Any) -> tuple[bool, Any]:
    return (value is None, value)


def _groups(rows: Sequence[Mapping[str, Any]], key: str) -> dict[Any, list[Mapping[str, Any]]]:
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for i, row in enumerate(rows):
        if key not in row:
            raise ValueError(
                f"row {i} (id {row.get('id')!r}) has no {key!r} field to group by; tag the rows first "
                "(eval.breakdown.tag_rows)"
            )
        groups.setdefault(row[key], []).append(row)
    return groups


def _check_resamples(n_resamples: int) -> None:
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 0:
        raise ValueError(f"n_resamples must be a number of resamples >= 0 (0: no bootstrap), got {n_resamples!r}")


def bucket_extraction(
    rows: Sequence[Mapping[str, Any]],
    key: str = "repeats",
    *,
    n_resamples: int,
    confidence: float = DEFAULT_CONFIDENCE,
) -> list[dict[str, Any]]:
    """One entry per distinct ``row[key]`` of extraction rows (eval.extraction.extract, tagged with
    eval.breakdown.tag_rows), sorted by that value (None last):

    {key: value, "n": targets in the bucket, "exact_match": k / n, "exact_match_k": k, "exact_match_ci": the
    Clopper-Pearson interval of k in n at ``confidence``, and for each of rouge_l, match_fraction and
    suffix_logprob_mean that some row of the bucket carries: "<name>": the mean over the rows that have it and
    "<name>_ci": its percentile bootstrap interval over those rows (None for n_resamples 0)}.
    """
    _check_resamples(n_resamples)
    groups = _groups(rows, key)
    table = []
    for value in sorted(groups, key=_sort_key):
        members = groups[value]
        n, k = len(members), sum(bool(r[EXACT_MATCH]) for r in members)
        entry: dict[str, Any] = {
            key: value,
            "n": n,
            EXACT_MATCH: k / n,
            EXACT_MATCH_K: k,
            interval_key(EXACT_MATCH): binomial_interval(k, n, confidence),
        }
        for name in BUCKET_MEANS:
            values = [float(r[name]) for r in members if r.get(name) is not None]
            if not values:
                continue
            entry[name] = sum(values) / len(values)
            entry[interval_key(name)] = (
                mean_interval(values, n_resamples=n_resamples, confidence=confidence) if n_resamples else None
            )
        table.append(entry)
    return table


def bucket_membership(
    member_rows: Sequence[Mapping[str, Any]],
    nonmember_rows: Sequence[Mapping[str, Any]],
    bucket_of: Mapping[str, Any],
    *,
    attacks: Sequence[str] | None = None,
    target_fpr: float = 0.01,
    n_resamples: int,
    confidence: float = DEFAULT_CONFIDENCE,
    key: str = "repeats",
) -> list[dict[str, Any]]:
    """Membership inference per bucket: the members are the member rows of one bucket, the non-members always the
    same ``nonmember_rows`` (the bucket-0 targets: drawn from the same pool, never trained on).

    Rows are eval.membership.membership_rows rows (``id`` and ``score_<attack>``, higher = member).
    ``bucket_of`` maps a document id (str) to its bucket; member rows whose id it lacks (background documents) or
    that are also non-member rows (bucket 0 itself) are left out. ``attacks``: None = every attack of
    eval.membership.ATTACKS that some member and some non-member row scores.

    Returns one entry per bucket value of the remaining member rows, sorted: {key: value, "n_members",
    "n_nonmembers", "target_fpr", "attacks": {attack: {"auc" (Mann-Whitney, equal to sklearn's roc_auc_score),
    "auc_ci", "tpr_at_fpr" (eval.roc.tpr_at_fpr at ``target_fpr``), "tpr_at_fpr_ci" (percentile bootstrap
    intervals at ``confidence``, members and non-members resampled separately; None for n_resamples 0),
    "n_members", "n_nonmembers" (the rows that carry this attack's score)}}}. An attack that the bucket's members
    or the non-members lack is left out of that bucket.
    """
    _check_resamples(n_resamples)
    if not nonmember_rows:
        raise ValueError("membership per bucket needs non-member rows (the bucket-0 targets, never trained on)")
    nonmember_ids = {str(r["id"]) for r in nonmember_rows}
    names = list(ATTACKS) if attacks is None else list(attacks)
    unknown = [a for a in names if a not in ATTACKS]
    if unknown:
        raise ValueError(f"unknown attack(s) {unknown}; known attacks: {', '.join(ATTACKS)}")
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for row in member_rows:
        doc = str(row["id"])
        if doc in bucket_of and doc not in nonmember_ids:
            groups.setdefault(bucket_of[doc], []).append(row)
    table = []
    for value in sorted(groups, key=_sort_key):
        members = groups[value]
        results: dict[str, dict[str, Any]] = {}
        for attack in names:
            score = f"score_{attack}"
            m = [float(r[score]) for r in members if score in r]
            n = [float(r[score]) for r in nonmember_rows if score in r]
            if not m or not n:
                continue
            results[attack] = {
                AUC: float(pairwise_auc(m, n)),
                AUC_CI: auc_interval(m, n, n_resamples=n_resamples, confidence=confidence) if n_resamples else None,
                TPR_AT_FPR: tpr_at_fpr_of_scores(m, n, target_fpr),
                TPR_AT_FPR_CI: (
                    tpr_at_fpr_interval(m, n, target_fpr, n_resamples, confidence) if n_resamples else None
                ),
                "n_members": len(m),
                "n_nonmembers": len(n),
            }
        table.append(
            {
                key: value,
                "n_members": len(members),
                "n_nonmembers": len(nonmember_rows),
                "target_fpr": target_fpr,
                "attacks": results,
            }
        )
    return table


def compare_buckets(
    a_rows: Sequence[Mapping[str, Any]], b_rows: Sequence[Mapping[str, Any]], key: str = "repeats"
) -> list[dict[str, Any]]:
    """Exact match of two models bucket by bucket (extraction rows tagged with ``key``; e.g. standard against
    goldfish on the same targets), one entry per bucket value of either, sorted: {key: value, "a_n",
    "a_exact_match_k", "a_exact_match", "b_n", "b_exact_match_k", "b_exact_match", "fisher_p": the two-sided Fisher
    exact p of the two counts (eval.intervals.fisher_exact_p; None when a model has no row in the bucket)}.
    """
    a_groups, b_groups = _groups(a_rows, key), _groups(b_rows, key)
    table = []
    for value in sorted(set(a_groups) | set(b_groups), key=_sort_key):
        entry: dict[str, Any] = {key: value}
        counts = []
        for side, groups in (("a", a_groups), ("b", b_groups)):
            members = groups.get(value, [])
            n, k = len(members), sum(bool(r[EXACT_MATCH]) for r in members)
            entry.update({f"{side}_n": n, f"{side}_{EXACT_MATCH_K}": k, f"{side}_{EXACT_MATCH}": k / n if n else None})
            counts.append((k, n))
        (ka, na), (kb, nb) = counts
        entry["fisher_p"] = fisher_exact_p(ka, na, kb, nb) if na and nb else None
        table.append(entry)
    return table
