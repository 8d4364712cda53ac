"""The paired and clustered statistics of a comparison's report, computed again from its per-target rows
(targets.jsonl) with scipy and statsmodels directly, not with eval/: the checks that what summary.json and report.md
say follows from the rows anyone can download.

`check_one_seed(folder)` checks a run folder (summary.json's buckets and bucket_tests); `check_seeds(folder)` a
--seeds folder (the combined summary's pooled exact match and bucket_tests). Intervals are the percentile bootstrap
that the report names: scipy.stats.bootstrap over targets, `--bootstrap` resamples, generator seeded 0.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import binomtest, bootstrap, fisher_exact, permutation_test
from statsmodels.stats.contingency_tables import mcnemar

STANDARD = "standard"
EXACT, ROUGE = "exact_match", "rouge_l"


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def bootstrap_ci(values: list[float], n_resamples: int) -> list[float] | None:
    """The 95% percentile bootstrap of the mean (the constant sample's single value: scipy declines a degenerate
    sample, and every resample of it has that mean)."""
    if not n_resamples:
        return None
    data = np.asarray(values, dtype=float)
    if np.all(data == data[0]):
        return [float(data[0])] * 2
    ci = bootstrap(
        (data,), np.mean, n_resamples=n_resamples, method="percentile", rng=np.random.default_rng(0)
    ).confidence_interval
    return [float(ci.low), float(ci.high)]


def clopper_pearson(k: int, n: int) -> list[float]:
    ci = binomtest(k, n).proportion_ci(0.95, method="exact")
    return [float(ci.low), float(ci.high)]


def sign_flip(differences: list[int]) -> float:
    """Two-sided sign-flip p of |sum| over the targets with a nonzero difference (the others flip to themselves):
    scipy's exact enumeration up to 2^18 assignments, else 200,000 random ones (compared with a tolerance)."""
    nonzero = np.array([d for d in differences if d], dtype=float)
    if nonzero.size == 0:
        return 1.0
    result = permutation_test(
        (nonzero,),
        lambda x, axis: np.abs(np.sum(x, axis=axis)),
        permutation_type="samples",
        n_resamples=np.inf if nonzero.size <= 18 else 200_000,
        alternative="greater",
        vectorized=True,
        rng=np.random.default_rng(0),
    )
    return float(result.pvalue)


def _approx(actual: Any, expected: Any) -> None:
    if expected is None:
        assert actual is None
    else:
        assert actual == pytest.approx(expected, rel=1e-9, abs=1e-12)


def _by_model(rows: list[dict[str, Any]]) -> dict[str, dict[tuple[str, int], dict[str, Any]]]:
    """{model: {(target, seed): row}}."""
    out: dict[str, dict[tuple[str, int], dict[str, Any]]] = defaultdict(dict)
    for row in rows:
        out[row["model"]][row["id"], row["seed"]] = row
    return out


def check_one_seed(folder: Path) -> int:
    """Recompute one run's per-bucket exact-match intervals and its tests against the standard model (McNemar,
    Fisher, paired bootstrap of the exact-match and RougeL differences) from OUT/targets.jsonl; returns the number
    of (model, bucket) entries checked."""
    summary = json.loads((folder / "summary.json").read_text())
    rows = read_rows(folder / "targets.jsonl")
    n_resamples = summary["config"]["extraction"]["bootstrap"]
    models = _by_model(rows)
    assert set(models) == set(summary["buckets"])
    for label, table in summary["buckets"].items():
        for entry in table["extraction"]:
            members = [r for r in models[label].values() if r["copies"] == entry["repeats"]]
            k = sum(r[EXACT] for r in members)
            assert (entry["n"], entry["exact_match_k"]) == (len(members), k)
            _approx(entry["exact_match_ci"], clopper_pearson(k, len(members)))
    checked = 0
    reference = models[STANDARD]
    for label, tests in summary["bucket_tests"]["models"].items():
        for entry in tests:
            keys = sorted(key for key, r in reference.items() if r["copies"] == entry["repeats"])
            a = np.array([reference[key][EXACT] for key in keys], dtype=bool)
            b = np.array([models[label][key][EXACT] for key in keys], dtype=bool)
            table = [[int(np.sum(a & b)), int(np.sum(a & ~b))], [int(np.sum(~a & b)), int(np.sum(~a & ~b))]]
            assert (entry["reference_only"], entry["model_only"]) == (table[0][1], table[1][0])
            _approx(entry["mcnemar_p"], float(mcnemar(table, exact=True).pvalue))
            _approx(entry["sign_flip_p"], entry["mcnemar_p"])
            ka, kb = int(a.sum()), int(b.sum())
            fisher = fisher_exact([[ka, len(a) - ka], [kb, len(b) - kb]]).pvalue
            _approx(entry["fisher_p"], float(fisher))
            for metric in (EXACT, ROUGE):
                d = [float(models[label][key][metric]) - float(reference[key][metric]) for key in keys]
                _approx(entry[f"{metric}_difference"], float(np.mean(d)))
                _approx(entry[f"{metric}_difference_ci"], bootstrap_ci(d, n_resamples))
            checked += 1
    return checked


def check_seeds(folder: Path) -> int:
    """Recompute a --seeds run's pooled exact match per model and bucket (count, cluster bootstrap over targets,
    exact bounds) and its clustered tests against the standard model (sign-flip p over targets, cluster bootstrap of
    the differences) from OUT/targets.jsonl, grouping by assigned bucket; returns the entries checked."""
    summary = json.loads((folder / "summary.json").read_text())
    rows = read_rows(folder / "targets.jsonl")
    n_resamples = summary["config"]["extraction"]["bootstrap"]
    seeds = summary["seeds"]
    assert sorted({r["seed"] for r in rows}) == sorted(seeds)
    models = _by_model(rows)

    def per_target(label: str, bucket: int, metric: str) -> dict[str, list[float]]:
        values: dict[str, list[float]] = defaultdict(list)
        for (target, _), row in models[label].items():
            if row["bucket"] == bucket:
                values[target].append(float(row[metric]))
        assert all(len(v) == len(seeds) for v in values.values())
        return dict(sorted(values.items()))

    checked = 0
    for label, entry in summary["combined"].items():
        for bucket in entry.get("buckets") or []:
            pooled = bucket["exact_match_pooled"]
            counts = [sum(v) for v in per_target(label, bucket["repeats"], EXACT).values()]
            n_targets = len(counts)
            assert (pooled["k"], pooled["n"]) == (sum(counts), n_targets * len(seeds))
            _approx(pooled["rate"], sum(counts) / (n_targets * len(seeds)))
            _approx(pooled["cluster_ci"], bootstrap_ci([c / len(seeds) for c in counts], n_resamples))
            _approx(bucket["exact_match_ci"], pooled["cluster_ci"])  # the mean over seeds: the same clusters
            every, some = sum(c == len(seeds) for c in counts), sum(c > 0 for c in counts)
            _approx(pooled["exact_bounds"], [clopper_pearson(every, n_targets)[0], clopper_pearson(some, n_targets)[1]])
            checked += 1
    for label, tests in summary["bucket_tests"]["models"].items():
        for entry in tests:
            for metric in (EXACT, ROUGE):
                a, b = per_target(STANDARD, entry["repeats"], metric), per_target(label, entry["repeats"], metric)
                assert list(a) == list(b)
                d = [(sum(b[t]) - sum(a[t])) / len(seeds) for t in a]
                _approx(entry[f"{metric}_difference"], float(np.mean(d)))
                _approx(entry[f"{metric}_difference_ci"], bootstrap_ci(d, n_resamples))
                if metric == EXACT:
                    p = sign_flip([int(sum(b[t]) - sum(a[t])) for t in a])
                    exact = sum(1 for t in a if sum(b[t]) != sum(a[t])) <= 18
                    assert entry["sign_flip_p"] == pytest.approx(p, rel=1e-9 if exact else 0.05, abs=1e-12)
                    assert entry["mcnemar_p"] is None if len(seeds) > 1 else entry["mcnemar_p"] == entry["sign_flip_p"]
            checked += 1
    return checked
