"""Two models scored on the same targets: paired tests and intervals, with the target as the unit when several seeds
repeat the same targets.

A comparison trains every model on the same targets, so its results are pairs (target i: the reference model's
result, the other model's). Under several seeds the same targets come back once per seed: a target's results are
correlated across seeds (it is easy or hard to memorize whatever the seed), so the target, not the target-seed
pair, is the independent unit (the cluster). Everything here resamples or permutes targets:

* `mcnemar_exact_p` (one seed): the exact McNemar test of extracted/not, a two-sided exact binomial test on the
  discordant targets; equal to ``statsmodels.stats.contingency_tables.mcnemar(table, exact=True).pvalue``.
* `sign_flip_p` (any number of seeds): the exact sign-flip permutation test on each target's summed difference
  across seeds (see its docstring for why); with one seed it is the exact McNemar test.
* the paired difference of a rate or a mean (model minus reference): the mean over targets of each target's
  difference averaged over seeds, with the percentile bootstrap over targets (eval.intervals.mean_interval: both
  models drawn with the same targets, a target's seeds drawn together);
* the pooled exact-match rate of one model (`clustered_extraction`): extracted target-seed pairs over all pairs,
  its interval the bootstrap over targets of each target's rate over seeds (a cluster bootstrap; with every seed
  evaluating every target the pooled rate is the mean of those rates), and conservative exact bounds that, unlike
  any bootstrap, are not zero-wide when nothing (or everything) was extracted.

Targets enter every bootstrap in the order of their ids, so an interval is a function of the per-target rows
(goldfish.app.targets writes them), not of the order they were evaluated in, and anyone can draw it again from them.

Fisher's exact test and Clopper-Pearson intervals over target-seed pairs treat the pairs as independent; they are
not used here (eval.buckets keeps them for one model's counts under one seed, where the targets are independent).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.stats import binom

from eval.intervals import DEFAULT_CONFIDENCE, binomial_interval, mean_interval
from eval.metrics import EXACT_MATCH, INTERVAL_METRICS, ROUGE_L

# Per-target measures whose paired difference gets an interval (exact match as 0/1): the headline pair.
PAIRED_METRICS = INTERVAL_METRICS
# What each key of a `paired_buckets` entry means (summary.json carries it beside the entries).
PAIRED_KEYS = {
    "n_targets": "targets of the bucket both models were scored on (under every seed)",
    "n_seeds": "seeds; each target is scored once per seed",
    "reference_k": "target-seed pairs the reference model extracts exactly",
    "model_k": "target-seed pairs the model extracts exactly",
    "reference_only": "target-seed pairs the reference model extracts and the model does not (discordant)",
    "model_only": "target-seed pairs the model extracts and the reference model does not (discordant)",
    "mcnemar_p": "one seed: two-sided exact McNemar test of extracted/not on the same targets (exact binomial on "
    "the discordant targets); None with several seeds (target-seed pairs are not independent)",
    "sign_flip_p": "two-sided exact sign-flip permutation test over targets of each target's summed exact-match "
    "difference across seeds (targets are the clusters); equal to mcnemar_p with one seed",
    f"{EXACT_MATCH}_difference": "model minus reference: the mean over targets of each target's exact-match "
    "difference averaged over seeds",
    f"{ROUGE_L}_difference": "model minus reference: the mean over targets of each target's RougeL difference "
    "averaged over seeds",
    "<metric>_difference_ci": "95% percentile bootstrap interval over targets (the same targets drawn for both "
    "models, a target's seeds together; 1 seed: the paired bootstrap over targets)",
}
CLUSTERED_KEYS = {
    "k": "extracted target-seed pairs",
    "n": "target-seed pairs (targets x seeds)",
    "rate": "k / n, the pooled exact-match rate (= the mean over targets of each target's rate over seeds)",
    "cluster_ci": "95% percentile bootstrap over targets of each target's rate over seeds (targets are the "
    "clusters; zero-wide when every target has the same rate, e.g. none extracted)",
    "targets_every_seed": "targets extracted under every seed",
    "targets_some_seed": "targets extracted under at least one seed",
    "exact_bounds": "conservative exact 95% interval of the pooled rate: the Clopper-Pearson lower bound of "
    "targets_every_seed and upper bound of targets_some_seed over the targets (each side at 97.5%; valid whatever "
    "the correlation between seeds; with one seed the Clopper-Pearson interval)",
}


def mcnemar_exact_p(reference_only: int, model_only: int) -> float:
    """Two-sided p of the exact McNemar test from the two discordant counts (targets extracted by one model only):
    under no difference each discordant target is the reference's or the model's with probability 1/2, so
    p = min(1, 2 P(X <= min(b, c))) for X ~ Binomial(b + c, 1/2); 1 when there is no discordant target.
    5 against 0 gives 2/32 = 0.0625; 4 against 0 gives 0.125."""
    for name, value in (("reference_only", reference_only), ("model_only", model_only)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"a discordant count must be an int >= 0, got {name} = {value!r}")
    n = int(reference_only) + int(model_only)
    if n == 0:
        return 1.0
    return float(min(1.0, 2.0 * binom.cdf(min(reference_only, model_only), n, 0.5)))


def sign_flip_p(differences: Sequence[int]) -> float:
    """Two-sided p of the exact sign-flip permutation test of integer per-target differences (e.g. a target's
    exact-match count over seeds, model minus reference: -S..S).

    Why this test: under no difference between the models, the two models' results on one target (all its seeds
    together, as the seeds pair the models: same initialisation, order and insertion positions) are exchangeable,
    so each target's difference is as likely to carry either sign, independently of the other targets; the targets
    are the units, so no correlation between a target's seeds can inflate it. The statistic is |sum of the
    differences|; its null distribution over all 2^m sign assignments of the m nonzero differences is computed
    exactly (a convolution over the integer sums, not a Monte Carlo sample). With one seed the differences are -1, 0
    and 1 and the test is the exact McNemar test. [2, 2, 1] gives 1/4 (only all + and all - reach |sum| 5); [1, -1]
    gives 1.
    """
    values = []
    for d in differences:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise ValueError(f"sign_flip_p takes integer differences (e.g. counts over seeds), got {d!r}")
        if d:
            values.append(abs(int(d)))
    observed = abs(sum(int(d) for d in differences))
    total = sum(values)
    probabilities = np.zeros(2 * total + 1)  # (2T + 1,) P(sum = s) at index s + T
    probabilities[total] = 1.0
    for value in values:
        flipped = np.zeros_like(probabilities)
        flipped[:-value] += 0.5 * probabilities[value:]  # this target's difference negative
        flipped[value:] += 0.5 * probabilities[:-value]  # positive
        probabilities = flipped
    sums = np.arange(-total, total + 1)
    return float(min(1.0, probabilities[np.abs(sums) >= observed].sum()))


def cluster_exact_bounds(
    every_seed: int, some_seed: int, n_targets: int, confidence: float = DEFAULT_CONFIDENCE
) -> list[float] | None:
    """[low, high]: a conservative exact interval of a pooled rate over targets and seeds, from the targets extracted
    under every seed (`every_seed`) and under some seed (`some_seed`) of `n_targets`.

    A target's rate over seeds lies between "extracted under every seed" and "under some seed", so the mean rate lies
    between their expected shares; the Clopper-Pearson lower bound of the first and upper bound of the second (the
    targets are independent draws of the pool) each miss with probability at most (1 - confidence) / 2, whatever the
    correlation between seeds. With one seed both counts are k and this is the Clopper-Pearson interval of k in n.
    0 of 32 targets gives [0, 0.109]; None for no targets."""
    if not 0 <= every_seed <= some_seed <= n_targets:
        raise ValueError(f"need 0 <= every_seed <= some_seed <= n_targets, got {every_seed}, {some_seed}, {n_targets}")
    if n_targets == 0:
        return None
    low = binomial_interval(every_seed, n_targets, confidence)
    high = binomial_interval(some_seed, n_targets, confidence)
    return [low[0], high[1]]


def _by_target(
    rows_by_seed: Mapping[int, Sequence[Mapping[str, Any]]], key: str
) -> tuple[dict[str, Any], dict[str, dict[int, Mapping[str, Any]]]]:
    """({target id: its bucket}, {target id: {seed: its row}}), checking that every seed holds every target in the
    same bucket (the data seed fixes them; a missing target would silently shrink the sample)."""
    if not rows_by_seed:
        raise ValueError("need the rows of at least one seed")
    bucket_of: dict[str, Any] = {}
    rows: dict[str, dict[int, Mapping[str, Any]]] = {}
    for seed, seed_rows in rows_by_seed.items():
        for row in seed_rows:
            target = str(row["id"])
            if key not in row:
                raise ValueError(f"row of target {target!r} has no {key!r} field to group by")
            if bucket_of.setdefault(target, row[key]) != row[key]:
                raise ValueError(
                    f"target {target!r} is in bucket {bucket_of[target]} and {row[key]} (seed {seed}): every seed "
                    "and model must share the bucket assignment"
                )
            if seed in rows.setdefault(target, {}):
                raise ValueError(f"target {target!r} has two rows under seed {seed}")
            rows[target][seed] = row
    missing = [(t, s) for t in rows for s in rows_by_seed if s not in rows[t]]
    if missing:
        raise ValueError(f"targets without a row under some seed (target, seed): {missing[:3]}")
    return bucket_of, rows


def _buckets(bucket_of: Mapping[str, Any]) -> list[Any]:
    return sorted(set(bucket_of.values()), key=lambda value: (value is None, value))


def _interval(values: Sequence[float], n_resamples: int, confidence: float) -> list[float] | None:
    return mean_interval(values, n_resamples=n_resamples, confidence=confidence) if n_resamples and values else None


def clustered_extraction(
    rows_by_seed: Mapping[int, Sequence[Mapping[str, Any]]],
    key: str = "repeats",
    *,
    n_resamples: int,
    confidence: float = DEFAULT_CONFIDENCE,
) -> list[dict[str, Any]]:
    """One model's exact match pooled over seeds, one entry per bucket (``row[key]``), sorted: {key, "n_targets",
    "n_seeds", and the CLUSTERED_KEYS: "k", "n", "rate", "cluster_ci", "targets_every_seed", "targets_some_seed",
    "exact_bounds"}. rows_by_seed: {seed: extraction rows (``id``, ``key``, exact_match)}, every seed holding every
    target in the same bucket. n_resamples 0: cluster_ci None."""
    bucket_of, rows = _by_target(rows_by_seed, key)
    n_seeds = len(rows_by_seed)
    table = []
    for bucket in _buckets(bucket_of):
        targets = sorted(t for t, b in bucket_of.items() if b == bucket)  # id order: the bootstrap's input order
        counts = [sum(bool(r[EXACT_MATCH]) for r in rows[t].values()) for t in targets]
        n_targets = len(counts)
        every, some = sum(c == n_seeds for c in counts), sum(c > 0 for c in counts)
        table.append(
            {
                key: bucket,
                "n_targets": n_targets,
                "n_seeds": n_seeds,
                "k": sum(counts),
                "n": n_targets * n_seeds,
                "rate": sum(counts) / (n_targets * n_seeds),
                "cluster_ci": _interval([c / n_seeds for c in counts], n_resamples, confidence),
                "targets_every_seed": every,
                "targets_some_seed": some,
                "exact_bounds": cluster_exact_bounds(every, some, n_targets, confidence),
            }
        )
    return table


def paired_buckets(
    reference_by_seed: Mapping[int, Sequence[Mapping[str, Any]]],
    model_by_seed: Mapping[int, Sequence[Mapping[str, Any]]],
    key: str = "repeats",
    *,
    n_resamples: int,
    confidence: float = DEFAULT_CONFIDENCE,
) -> list[dict[str, Any]]:
    """A model against a reference model on the same targets, one entry per bucket (``row[key]``), sorted; the
    entry's keys are PAIRED_KEYS': {key, "n_targets", "n_seeds", "reference_k", "model_k", "reference_only",
    "model_only", "mcnemar_p" (one seed; else None), "sign_flip_p", and per metric of PAIRED_METRICS that both models'
    rows carry: "<metric>_difference" (model minus reference) and "<metric>_difference_ci" (None for n_resamples 0)}.

    {seed: extraction rows} per model, the same seeds, every seed holding every target in the same bucket for both.
    """
    if set(reference_by_seed) != set(model_by_seed):
        raise ValueError(f"the models ran different seeds: {sorted(reference_by_seed)} and {sorted(model_by_seed)}")
    ref_bucket, reference = _by_target(reference_by_seed, key)
    model_bucket, model = _by_target(model_by_seed, key)
    if ref_bucket != model_bucket:
        differ = sorted(set(ref_bucket.items()) ^ set(model_bucket.items()))[:3]
        raise ValueError(f"the models were scored on other targets or buckets, e.g. {differ}")
    seeds = sorted(reference_by_seed)
    table = []
    for bucket in _buckets(ref_bucket):
        targets = sorted(t for t, b in ref_bucket.items() if b == bucket)  # id order: the bootstrap's input order
        pairs = [(bool(reference[t][s][EXACT_MATCH]), bool(model[t][s][EXACT_MATCH])) for t in targets for s in seeds]
        reference_only = sum(a and not b for a, b in pairs)
        model_only = sum(b and not a for a, b in pairs)
        # each target's exact-match count over seeds, model minus reference: the unit of the clustered test
        counts = [
            sum(int(bool(model[t][s][EXACT_MATCH])) - int(bool(reference[t][s][EXACT_MATCH])) for s in seeds)
            for t in targets
        ]
        entry: dict[str, Any] = {
            key: bucket,
            "n_targets": len(targets),
            "n_seeds": len(seeds),
            "reference_k": sum(a for a, _ in pairs),
            "model_k": sum(b for _, b in pairs),
            "reference_only": reference_only,
            "model_only": model_only,
            "mcnemar_p": mcnemar_exact_p(reference_only, model_only) if len(seeds) == 1 else None,
            "sign_flip_p": sign_flip_p(counts),
        }
        for metric in PAIRED_METRICS:
            differences = [_target_difference(reference[t], model[t], metric) for t in targets]
            present = [d for d in differences if d is not None]
            if not present:
                continue
            entry[f"{metric}_difference"] = sum(present) / len(present)
            entry[f"{metric}_difference_ci"] = _interval(present, n_resamples, confidence)
        table.append(entry)
    return table


def _target_difference(
    reference: Mapping[int, Mapping[str, Any]], model: Mapping[int, Mapping[str, Any]], metric: str
) -> float | None:
    """One target's mean over seeds of (model - reference) for `metric`, over the seeds where both carry it."""
    pairs = [
        (float(reference[s][metric]), float(model[s][metric]))
        for s in reference
        if reference[s].get(metric) is not None and model[s].get(metric) is not None
    ]
    return sum(b - a for a, b in pairs) / len(pairs) if pairs else None
