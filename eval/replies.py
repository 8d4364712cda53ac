"""Statistics of a conversation set's replies: exact match and kept/dropped accuracy with intervals that treat the
conversation, not the reply, as the unit (replies of one conversation share a prompt and a model's state of
memorizing it, so they are not independent samples).

Used for `goldfish eval` and `goldfish compare` on conversations (data.chat): each reply is one extraction row
(eval.extraction), tagged with the conversation it comes from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from eval.intervals import BOOTSTRAP_SEED, DEFAULT_RESAMPLES, binomial_interval
from eval.metrics import EXACT_MATCH, TF_DROPPED_ACCURACY, TF_KEPT_ACCURACY

REPLY_METRICS = (EXACT_MATCH, TF_KEPT_ACCURACY, TF_DROPPED_ACCURACY)


def cluster_mean_interval(
    values: Sequence[float | None],
    clusters: Sequence[str],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = BOOTSTRAP_SEED,
) -> list[float] | None:
    """[low, high] percentile interval of the mean of `values` from a bootstrap that resamples whole clusters with
    replacement (the mean of every value in the drawn clusters: a ratio estimator, as for clustered proportions).
    None values are left out; None when none is left or n_resamples is 0."""
    if len(values) != len(clusters):
        raise ValueError(f"got {len(values)} values but {len(clusters)} cluster labels; pass one label per value")
    present = [(float(v), c) for v, c in zip(values, clusters) if v is not None]
    if not present or n_resamples == 0:
        return None
    names = sorted({c for _, c in present})
    index = {name: i for i, name in enumerate(names)}
    sums = np.zeros(len(names))
    counts = np.zeros(len(names))
    for value, cluster in present:
        sums[index[cluster]] += value
        counts[index[cluster]] += 1
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(names), size=(n_resamples, len(names)))  # (R, C) clusters drawn per resample
    means = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return [float(low), float(high)]


def reply_statistics(
    rows: Sequence[Mapping[str, Any]], conversation_of: Mapping[str, str], *, n_resamples: int = DEFAULT_RESAMPLES
) -> dict[str, Any]:
    """Per metric of REPLY_METRICS: the mean over replies and its cluster-bootstrap interval over conversations;
    for exact match also k of n and the exact (Clopper-Pearson) interval, which is valid as stated only when each
    conversation gives one reply (n_replies == n_conversations), and is labelled so.

    rows: extraction rows (with "id" and the metrics); conversation_of: reply id -> conversation id."""
    clusters = [conversation_of.get(str(r["id"]), str(r["id"])) for r in rows]
    out: dict[str, Any] = {"n_replies": len(rows), "n_conversations": len(set(clusters))}
    for name in REPLY_METRICS:
        values = [None if r.get(name) is None else float(r[name]) for r in rows]
        present = [v for v in values if v is not None]
        out[name] = {
            "mean": float(np.mean(present)) if present else None,
            "cluster_ci": cluster_mean_interval(values, clusters, n_resamples=n_resamples),
        }
    k = sum(bool(r.get(EXACT_MATCH)) for r in rows)
    out[EXACT_MATCH] |= {
        "k": k,
        "n": len(rows),
        "exact_ci": binomial_interval(k, len(rows)),
        "exact_ci_valid": out["n_replies"] == out["n_conversations"],
    }
    out["what"] = (
        "cluster_ci: 95% percentile bootstrap resampling conversations (replies of one conversation are not "
        "independent); exact_ci: Clopper-Pearson over replies, valid as stated only with one reply per conversation"
    )
    return out
