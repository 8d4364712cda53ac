"""Results over several training seeds: per bucket, the mean over seeds and targets with an interval that carries
both sources of variation.

A target's result under seed s is one row (its id, its bucket, a metric). The seeds change the initialisation, the
order and the insertion positions, not which targets sit in which bucket, so the rows of one target under all seeds
are averaged first (a target extracted under 2 of 3 seeds counts 2/3), and the interval is the percentile bootstrap
over targets of those per-target means: the targets are the sample (the clusters of their seeds), each target's
seed average carries the seed variation into it. Targets enter the bootstrap in id order (as in eval.paired), so the
interval follows from the per-target rows alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scipy.stats import t as student_t

from eval.intervals import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, mean_interval


def combine_seeds(
    rows_by_seed: Mapping[int, Sequence[Mapping[str, Any]]],
    metrics: Sequence[str],
    key: str = "repeats",
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
) -> list[dict[str, Any]]:
    """One entry per bucket (value of ``row[key]``), sorted: {key, "n_targets", "n_seeds", and per metric: its
    mean over seeds and targets, "<metric>_ci" (bootstrap over targets of their seed means; None when
    n_resamples is 0) and "<metric>_per_seed" (the bucket's mean under each seed, in seed order)}.

    Every seed must hold the same targets in the same buckets (the data seed fixes them); a target missing under
    a seed, or placed in another bucket, is an error rather than a silently smaller sample. Booleans count as 0/1.
    """
    if not rows_by_seed:
        raise ValueError("combine_seeds needs the rows of at least one seed")
    seeds = sorted(rows_by_seed)
    placement: dict[str, Any] = {}
    values: dict[str, dict[str, list[float]]] = {}  # target -> metric -> one value per seed
    for seed in seeds:
        seen = set()
        for row in rows_by_seed[seed]:
            target = str(row["id"])
            if placement.setdefault(target, row[key]) != row[key]:
                raise ValueError(
                    f"target {target!r} is in bucket {placement[target]} under one seed and {row[key]} under seed "
                    f"{seed}: seeds must share the bucket assignment (the same --data-seed)"
                )
            seen.add(target)
            for metric in metrics:
                if row.get(metric) is not None:
                    values.setdefault(target, {}).setdefault(metric, []).append(float(row[metric]))
        missing = set(placement) - seen
        if missing:
            raise ValueError(
                f"seed {seed} has no rows for targets {sorted(missing)[:3]}: every seed must evaluate them"
            )
    table = []
    for bucket in sorted(set(placement.values())):
        targets = sorted(t for t, b in placement.items() if b == bucket)  # id order: the bootstrap's input order
        entry: dict[str, Any] = {key: bucket, "n_targets": len(targets), "n_seeds": len(seeds)}
        for metric in metrics:
            per_target = [sum(v) / len(v) for t in targets if (v := values.get(t, {}).get(metric))]
            entry[metric] = sum(per_target) / len(per_target) if per_target else None
            entry[f"{metric}_ci"] = mean_interval(per_target, n_resamples=n_resamples) if n_resamples else None
            entry[f"{metric}_per_seed"] = [_bucket_mean(rows_by_seed[seed], key, bucket, metric) for seed in seeds]
        table.append(entry)
    return table


def _bucket_mean(rows: Sequence[Mapping[str, Any]], key: str, bucket: Any, metric: str) -> float | None:
    present = [float(r[metric]) for r in rows if r[key] == bucket and r.get(metric) is not None]
    return sum(present) / len(present) if present else None


def seed_mean_interval(values: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> list[float] | None:
    """[low, high]: the Student t interval of the mean of one number per seed (e.g. a model's final validation loss),
    mean +- t(1 - a/2; S - 1) * sd / sqrt(S) with a = 1 - confidence; None for fewer than 2 seeds. The seeds are
    the independent units here (each retrains the model); with 2 seeds t is 12.7 and the interval is wide, as it
    should be. 5.0 and 5.2 give [3.83, 6.37]."""
    if len(values) < 2:
        return None
    n = len(values)
    mean = sum(values) / n
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    half = float(student_t.ppf(1 - (1 - confidence) / 2, n - 1)) * sd / n**0.5
    return [mean - half, mean + half]
