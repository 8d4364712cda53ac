"""The combined summary of `goldfish compare --seeds`: one comparison per seed (goldfish.app.compare.compare_seeds
runs them) combined per model and repetition bucket: each target's mean over seeds, then the mean over targets with
its interval (eval.seeds.combine_seeds), each seed's value, and the validation loss per seed."""

from __future__ import annotations

from typing import Any, Mapping

from eval.breakdown import tag_rows
from eval.metrics import EXACT_MATCH, INTERVAL_METRICS, MATCH_FRACTION
from eval.paired import CLUSTERED_KEYS
from eval.seeds import combine_seeds, seed_mean_interval
from goldfish.app.buckets import seed_bucket_statistics, seed_tests_section
from goldfish.app.compare_result import CompareResult
from goldfish.app.config import CompareSpec, MaskSpec
from goldfish.app.seeds_result import COMBINATION, BucketAssignment, CombinedModel, SeedCorpus, SeedsResult
from goldfish.app.targets import BucketComparison

SEED_METRICS = (*INTERVAL_METRICS, MATCH_FRACTION)


def combine_seed_runs(
    spec: CompareSpec, comparisons: Mapping[int, BucketComparison], summaries: dict[int, CompareResult]
) -> SeedsResult:
    """The combination of several seeds' comparisons (see `compare_seeds`); its timings_s is left empty."""
    first = comparisons[spec.seeds[0]]
    split = first.prepared.split
    # Targets are grouped by the bucket they were assigned to; a seed whose run trained a copy fewer (e.g. cut by
    # --max-steps) is reported, not silently regrouped.
    assigned = spec.data.repeats_by_id(split.train) | {str(d.id): 0 for d in split.heldout}
    warnings = []
    for seed, comparison in comparisons.items():
        if comparison.repeats is not None:
            off = [i for i, n in comparison.repeats.items() if n != assigned[i]]
            if off:
                warnings.append(f"seed {seed}: {len(off)} targets trained on other counts than their bucket's")
    # models every seed trained (the loss-matched control is the standard or the goldfish model, whichever ended lower,
    # so its label can differ between seeds: it is reported per seed, not combined)
    in_every = [
        label for label in summaries[spec.seeds[0]].headlines if all(label in s.headlines for s in summaries.values())
    ]
    per_seed_only = sorted({label for s in summaries.values() for label in s.headlines} - set(in_every))
    if per_seed_only:
        warnings.append(
            f"{', '.join(per_seed_only)} ran under some seeds only: reported per seed (their folders), not combined"
        )
    labels = [label for label in (list(first.target_rows) or in_every) if label in in_every]
    standard = MaskSpec(strategy=None).label
    with_rows = [label for label in labels if all(label in c.target_rows for c in comparisons.values())]
    pooled_tables, tests = seed_bucket_statistics(
        {label: {seed: c.target_rows[label] for seed, c in comparisons.items()} for label in with_rows},
        assigned,
        standard,
        n_resamples=spec.extraction.bootstrap,
    )
    pooled = {label: {e["repeats"]: e for e in table} for label, table in pooled_tables.items()}
    combined: dict[str, CombinedModel] = {}
    for label in labels:
        entry: dict[str, Any] = {}
        if all(label in c.target_rows for c in comparisons.values()):
            entry["buckets"] = combine_seeds(
                {seed: tag_rows(c.target_rows[label], "repeats", assigned) for seed, c in comparisons.items()},
                SEED_METRICS,
                n_resamples=spec.extraction.bootstrap,
            )
            for bucket in entry["buckets"]:  # every target-seed pair counted, the targets as clusters
                bucket[f"{EXACT_MATCH}_pooled"] = pooled[label][bucket["repeats"]]
        validation = [summaries[seed].headlines[label].get("validation") for seed in spec.seeds]
        if all(v is not None for v in validation):
            losses = [v["loss"] for v in validation]
            entry["validation"] = {
                "loss": sum(losses) / len(losses),
                "loss_ci": seed_mean_interval(losses),
                "per_seed": losses,
            }
            differences = [v.get("difference_to_standard") for v in validation]
            if all(d is not None for d in differences):
                entry["validation"] |= {
                    "difference_to_standard": sum(differences) / len(differences),
                    "difference_ci": seed_mean_interval(differences),
                    "difference_per_seed": differences,
                    "relative_difference_per_seed": [v["relative_difference"] for v in validation],
                }
        combined[label] = CombinedModel.from_json(entry)
    exploratory = [seed for seed in spec.seeds if seed in spec.tuning_seeds]
    if exploratory:
        warnings.append(
            f"seed(s) {','.join(map(str, exploratory))} were used to choose these settings (--tuning-seeds): "
            "exploratory, not confirmatory evidence; confirm with seeds that played no part in tuning"
        )
    return SeedsResult(
        seeds=list(spec.seeds),
        matched_controls_per_seed={
            str(seed): summaries[seed].matched_controls  # type: ignore[misc]
            for seed in spec.seeds
            if summaries[seed].matched_controls is not None
        },
        tuning_seeds=list(spec.tuning_seeds),
        exploratory_seeds_run=exploratory,
        confirmatory_seeds_run=[seed for seed in spec.seeds if seed not in spec.tuning_seeds],
        folders={str(seed): f"seed-{seed}" for seed in spec.seeds},
        combined=combined,
        per_seed={str(seed): summaries[seed].headlines for seed in spec.seeds},
        combination=COMBINATION,
        pooled_what=CLUSTERED_KEYS,
        bucket_tests=seed_tests_section(tests, standard),
        buckets=BucketAssignment("by --data-seed, the same under every seed", _bucket_sizes(assigned)),
        config=summaries[spec.seeds[0]].config | {"seeds": list(spec.seeds)},
        documents=summaries[spec.seeds[0]].documents,
        corpus_per_seed=_corpus_per_seed(summaries),
        warnings=warnings + [f"seed {seed}: {w}" for seed in spec.seeds for w in summaries[seed].warnings],
    )


def _corpus_per_seed(summaries: dict[int, CompareResult]) -> dict[str, SeedCorpus] | None:
    """Per seed, what the combined report says beside its validation table: the targets' share of the tokens trained
    and the validation candidates left out as twins of the background (None without --background)."""
    if not all(summary.corpus for summary in summaries.values()):
        return None
    return {
        str(seed): SeedCorpus(
            target_share=summary.corpus["target_share"],  # type: ignore[index, arg-type]
            validation_removed_copies={
                kind: summary.corpus["validation"].get("removed_copies", {}).get(kind)  # type: ignore[index, union-attr]
                for kind in ("exact_text", "near")
            },
        )
        for seed, summary in summaries.items()
    }


def _bucket_sizes(assigned: dict[str, int]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for bucket in sorted(assigned.values()):
        sizes[str(bucket)] = sizes.get(str(bucket), 0) + 1
    return sizes
