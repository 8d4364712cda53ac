"""report.md and plots of `goldfish compare --seeds`, rendered from its typed result (goldfish.app.seeds_result):
per model and bucket the exact match pooled over target-seed pairs and each seed's, RougeL, the paired tests against
the standard model, the validation loss over seeds, the matched controls seed by seed, the bucket plot and the k
sweep. A summary written before the pooled cluster statistics and the paired tests renders with what it has, and the
report says what it lacks."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from data.atomic import json_safe, write_text_atomic
from eval.metrics import EXACT_MATCH, ROUGE_L
from goldfish.app.matched import render_matched_seeds
from goldfish.app.report_buckets import (
    BUCKETS_FILE,
    K_SWEEP_FILE,
    BucketPoint,
    KSweep,
    draw_buckets,
    draw_k_sweep,
    paired_table,
    sweep_series,
)
from goldfish.app.report_format import figure_link as _figure
from goldfish.app.report_format import fmt as _fmt
from goldfish.app.report_format import fmt_ci as _fmt_ci
from goldfish.app.report_format import fmt_interval as _fmt_interval
from goldfish.app.report_format import md_table as _table
from goldfish.app.seeds_result import PooledExtraction, SeedCorpus, SeedsResult, SeedValidation


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _pooled(pooled: PooledExtraction) -> str:
    """ "24/64 = 0.375 [0.266, 0.484]": the target-seed pairs extracted, the pooled rate and its cluster bootstrap
    interval over targets (eval.paired.clustered_extraction). An older summary's: its interval over pairs, marked."""
    cell = f"{pooled.k}/{pooled.n} = {_fmt_ci(pooled.pooled_rate, pooled.cluster_ci)}"
    if pooled.rate is None and pooled.pair_interval:
        cell += f" (pairs {_fmt_interval(pooled.pair_interval)})"
    return cell


def _older_pooled_note(result: SeedsResult) -> list[str]:
    """What a summary written before the cluster statistics lacks, said once under the combination paragraph."""
    pooled = [b.pooled for m in result.combined.values() for b in m.buckets or [] if b.pooled is not None]
    if not any(p.rate is None for p in pooled) and result.bucket_tests is not None:
        return []
    return [
        "This summary was written before the pooled cluster statistics and the paired tests over seeds: it has no "
        "cluster bootstrap interval, no exact bounds (n/a) and no tests against the standard model; the pooled rate "
        'is k/n, and its interval in brackets after "pairs" is the Clopper-Pearson interval over target-seed pairs '
        "the summary holds, which treats the pairs as independent (they are not: a target's seeds are correlated)."
    ]


def _seed_roles(result: SeedsResult) -> list[str]:
    """Which seeds are confirmatory and which were used to choose the settings (--tuning-seeds), when any were named."""
    tuning = result.tuning_seeds
    if not tuning:
        return []
    confirmatory = result.confirmatory_seeds_run
    exploratory = result.exploratory_seeds_run
    return [
        f"Confirmatory seeds (played no part in choosing the settings): {', '.join(map(str, confirmatory)) or 'none'}; "
        f"seeds used in tuning: {', '.join(map(str, tuning))}"
        + (f", of which this run includes {', '.join(map(str, exploratory))}." if exploratory else " (none ran here).")
    ]


def _difference(v: SeedValidation) -> str:
    """The validation loss difference to the standard model over seeds, with each seed's ("" for the standard)."""
    if v.difference_per_seed is None:
        return ""
    ci = v.difference_ci
    return (
        f"{v.difference_to_standard:+.4f}"
        + (f" [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "")
        + " (per seed "
        + ", ".join(
            f"{d:+.4f} = {100 * r:+.2f}%" for d, r in zip(v.difference_per_seed, v.relative_difference_per_seed or [])
        )
        + ")"
    )


def render_seeds_markdown(result: SeedsResult, figures: Sequence[str]) -> str:
    """report.md of a several-seed comparison. figures: names of the PNGs written."""
    config: Any = result.config
    assignment = result.buckets
    lines = [
        "# goldfish compare over seeds",
        "",
        f"Model `{config['model']}`, seeds {', '.join(map(str, result.seeds))} (each: the model's initialisation, the "
        "data order and the insertion positions); every seed's own report is in its folder "
        f"({', '.join(f'`{f}/report.md`' for f in result.folders.values())}).",
        f"Targets per bucket: {', '.join(f'{b}: {n}' for b, n in assignment.n_per_bucket.items())} "
        f"({assignment.assignment}).",
        f"Combination: {result.combination}. The seeds repeat the same targets, so the target is the unit: "
        "exact match counts every target-seed pair (k/n = pooled rate) with the 95% bootstrap over targets (a "
        "target's seeds drawn together; zero-wide where every target has the same rate, e.g. none extracted) and "
        "conservative exact bounds (Clopper-Pearson over targets: the lower bound of those extracted under every "
        "seed, the upper bound of those extracted under some seed). Against the standard model the test is the "
        "exact sign-flip permutation test over targets of each target's exact-match difference summed over seeds "
        "(the exact McNemar test with one seed), and the differences (this model minus standard) have the 95% "
        "bootstrap over targets, the same targets drawn for both models.",
        *_older_pooled_note(result),
        *_seed_roles(result),
        "",
        *(f"**Warning:** {w}." for w in result.warnings),
    ]
    tests = result.bucket_tests.models if result.bucket_tests is not None else {}
    for label, model in result.combined.items():
        if not model.buckets:
            continue
        rows = [
            [
                str(b.repeats),
                str(b.n_targets),
                _pooled(b.pooled) if b.pooled is not None else "n/a",
                _fmt_interval(b.pooled.exact_bounds) if b.pooled is not None and b.pooled.rate is not None else "n/a",
                ", ".join(_fmt(v) for v in b.per_seed[EXACT_MATCH]),
                _fmt_ci(b.means.get(ROUGE_L), b.intervals.get(ROUGE_L)),
                ", ".join(_fmt(v) for v in b.per_seed[ROUGE_L]),
            ]
            for b in model.buckets
        ]
        lines += [f"**{label}**", ""]
        lines += _table(
            [
                "copies",
                "targets",
                "exact match, pooled [cluster bootstrap]",
                "exact bounds",
                "per seed",
                "RougeL",
                "per seed",
            ],
            rows,
        )
        lines += paired_table(tests.get(label), paired="sign-flip p", seeds=True)
    validation_rows = [
        [label, _fmt_ci(v.loss, v.loss_ci), ", ".join(_fmt(x) for x in v.per_seed), _difference(v)]
        for label, model in result.combined.items()
        if (v := model.validation) is not None
    ]
    if validation_rows:
        lines += ["Validation loss (held-out background; intervals: 95% t interval over seeds):", ""]
        lines += _table(["model", "mean over seeds", "per seed", "difference to standard"], validation_rows)
        lines += _corpus_note(result.corpus_per_seed)
    lines += render_matched_seeds(result.matched_controls_per_seed)
    lines += _figure(BUCKETS_FILE, "extraction by repetitions, mean over seeds with intervals", figures)
    lines += _figure(
        K_SWEEP_FILE, "exact match at the top bucket and validation loss against k, mean over seeds", figures
    )
    return "\n".join(lines)


def _corpus_note(per_seed: dict[str, SeedCorpus] | None) -> list[str]:
    """The sentence under the combined validation table: per seed, the targets' share of the tokens trained and the
    validation candidates left out as twins of the background (data.background.validation_documents)."""
    if not per_seed:
        return []
    shares = ", ".join(_pct(entry.target_share) for entry in per_seed.values())
    removed = "; ".join(
        f"{entry.validation_removed_copies.get('exact_text')} exact and "
        f"{entry.validation_removed_copies.get('near')} near"
        for entry in per_seed.values()
    )
    return [
        "",
        f"Target copies are {shares} of the tokens trained (per seed). Validation candidates with a twin elsewhere in "
        f"the background, left out of validation and of the stream so that no validation row has a trained copy, "
        f"per seed: {removed}.",
    ]


def _bucket_points(result: SeedsResult) -> dict[str, list[BucketPoint]]:
    """label -> its buckets over seeds as the plots draw them, for the models with buckets."""
    return {
        label: [BucketPoint.of_seeds(b) for b in model.buckets]
        for label, model in result.combined.items()
        if model.buckets
    }


def seeds_k_sweep_series(result: SeedsResult) -> KSweep | None:
    """The k sweep of a several-seed result: per k the top bucket's pooled exact match (cluster bootstrap and exact
    bounds) and the validation loss (mean over seeds, its t interval over seeds)."""
    tables = _bucket_points(result)
    if not tables:
        return None
    validation = {
        label: (v.loss, v.loss_ci) if (v := result.combined[label].validation) is not None else (None, None)
        for label in tables
    }
    return sweep_series(result.config.get("masks") or [], tables, validation)  # type: ignore[arg-type]


def write_seeds_report(result: SeedsResult, out_dir: Path) -> list[str]:
    """OUT/summary.json, OUT/report.md, OUT/buckets.png and OUT/k_sweep.png of a several-seed comparison; returns
    the PNG names."""
    figures = []
    tables = _bucket_points(result)
    if tables:
        draw_buckets(tables, out_dir / BUCKETS_FILE, title=f"seeds {', '.join(map(str, result.seeds))}")
        figures.append(BUCKETS_FILE)
    series = seeds_k_sweep_series(result)
    if series is not None:
        draw_k_sweep(series, out_dir / K_SWEEP_FILE)
        figures.append(K_SWEEP_FILE)
    write_text_atomic(out_dir / "report.md", render_seeds_markdown(result, figures))
    summary = result.to_json()
    write_text_atomic(out_dir / "summary.json", json.dumps(json_safe(summary), indent=2, default=str, allow_nan=False))
    return figures
