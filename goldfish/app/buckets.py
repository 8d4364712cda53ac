"""Per-bucket results of a comparison: every measure of a model split by the number of copies each target was
trained on (bucket 0: the held-out targets of the same pool), each with its interval, and the field's named scores.

eval.buckets computes the tables from per-document rows; this module picks the rows of one evaluated model (greedy
extraction of train and held-out targets, the fixed-prefix sweep, membership scores) and assembles them into its
typed entry of summary.json's `buckets` (goldfish.app.bucket_section.ModelBuckets), which report.md and the plots
render.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from eval.breakdown import tag_rows
from eval.buckets import bucket_extraction, bucket_membership, compare_buckets
from eval.extraction import ExtractionConfig
from eval.field_scores import recall_at_incorrect
from eval.intervals import DEFAULT_RESAMPLES
from eval.metrics import EXACT_MATCH, GENERATED_LOGPROB_MEAN, MATCH_FRACTION, interval_key
from eval.paired import PAIRED_KEYS, clustered_extraction, paired_buckets
from goldfish.app.bucket_section import (
    BucketMembership,
    BucketSplit,
    BucketStats,
    FieldRecall,
    ModelBuckets,
    PythiaBucket,
    PythiaScores,
)
from goldfish.app.bucket_tests import BucketTestsSection
from goldfish.app.results import Row

# lm-extraction-benchmark reports recall at 100 incorrect guesses; the smaller budgets show the high-precision end.
RECALL_BUDGETS = (1, 10, 100)
# Pythia's memorization score is defined on a 32-token prefix and the 32 tokens after it.
PYTHIA_SPLIT = (32, 32)


def bucket_results(
    extraction_rows: Sequence[Mapping[str, Any]],
    repeats: Mapping[str, int],
    extraction: ExtractionConfig,
    *,
    prefix_rows: Sequence[Mapping[str, Any]] = (),
    membership_rows: Sequence[Mapping[str, Any]] = (),
    beam_rows: Sequence[Mapping[str, Any]] = (),
    n_resamples: int,
) -> ModelBuckets:
    """The per-bucket results of one model (summary.json's buckets[label]).

    extraction_rows: greedy extraction rows of the training and held-out targets (held-out ids are absent from
        `repeats` and form bucket 0). repeats: {training target id: copies trained on}.
    prefix_rows: rows of the fixed-prefix sweep (each with `prefix_len`), training and held-out targets.
    membership_rows: eval.membership rows with `member` set (held-out targets are the non-members).
    beam_rows: beam-search extraction rows (eval.adaptive.beam_extract, --beams), training and held-out targets.
    """
    tagged = tag_rows(extraction_rows, "repeats", repeats, default=0)
    by_prefix: dict[str, list[BucketStats]] = {}
    for prefix_len in sorted({int(r["prefix_len"]) for r in prefix_rows}):
        rows = tag_rows([r for r in prefix_rows if int(r["prefix_len"]) == prefix_len], "repeats", repeats, default=0)
        by_prefix[str(prefix_len)] = _table(rows, n_resamples)
    members = [r for r in membership_rows if r.get("member")]
    nonmembers = [r for r in membership_rows if r.get("member") is False]
    membership = (
        bucket_membership(members, nonmembers, dict(repeats), n_resamples=n_resamples) if members and nonmembers else []
    )
    return ModelBuckets(
        split=BucketSplit(extraction.prefix_len, extraction.suffix_len),
        extraction=_table(tagged, n_resamples),
        prefix_length=by_prefix,
        beam=_table(tag_rows(beam_rows, "repeats", repeats, default=0), n_resamples) if beam_rows else None,
        membership=[BucketMembership.from_json(entry) for entry in membership],
        recall_at_incorrect=_recall(tagged),
        pythia=_pythia(tagged, extraction),
    )


def _table(tagged: Sequence[Mapping[str, Any]], n_resamples: int) -> list[BucketStats]:
    """eval.buckets.bucket_extraction's table of rows tagged with their bucket, typed."""
    return [BucketStats.from_json(e) for e in bucket_extraction(tagged, "repeats", n_resamples=n_resamples)]


def with_bucket_intervals(groups: Sequence[Row], buckets: ModelBuckets, metrics: Sequence[str]) -> None:
    """Give the groups of a model's repeats breakdown (eval.breakdown.group_means rows by "repeats") the intervals of
    its bucket table, for `metrics` (None where the bucket or the interval is missing): breakdown_repeats.png draws
    them. The groups are updated in place."""
    for group in groups:
        stats = buckets.bucket(group["repeats"])  # type: ignore[arg-type]
        group |= {interval_key(m): None if stats is None else stats.interval(m) for m in metrics}


def _recall(tagged: Sequence[Mapping[str, Any]]) -> dict[str, FieldRecall]:
    """lm-extraction-benchmark's recall of the trained targets (one greedy guess each, ranked by the model's mean
    log-probability of its own guess) at each budget of incorrect guesses."""
    trained = [r for r in tagged if r["repeats"] and r.get(GENERATED_LOGPROB_MEAN) is not None]
    if not trained:
        return {}
    confidences = [float(r[GENERATED_LOGPROB_MEAN]) for r in trained]
    correct = [bool(r[EXACT_MATCH]) for r in trained]
    return {str(n): FieldRecall.from_json(recall_at_incorrect(confidences, correct, n)) for n in RECALL_BUDGETS}


def _pythia(tagged: Sequence[Mapping[str, Any]], extraction: ExtractionConfig) -> PythiaScores | None:
    """Pythia's 32/32 memorization score per bucket (the mean share of the 32 suffix tokens greedy decoding gets
    right, and the share of targets with all 32), when extraction used the 32/32 split; None otherwise."""
    if (extraction.prefix_len, extraction.suffix_len) != PYTHIA_SPLIT:
        return None
    table = []
    for bucket in sorted({int(r["repeats"]) for r in tagged}):
        rows = [r for r in tagged if int(r["repeats"]) == bucket]
        scores = [float(r[MATCH_FRACTION]) for r in rows]
        table.append(
            PythiaBucket(
                repeats=bucket,
                n=len(rows),
                score=sum(scores) / len(scores),
                memorized=sum(1 for s in scores if s == 1.0) / len(scores),
            )
        )
    return PythiaScores(split="32/32", table=table)


def bucket_tests(
    rows_by_model: Mapping[str, Sequence[Mapping[str, Any]]],
    repeats: Mapping[str, int],
    reference: str,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
) -> dict[str, list[dict[str, Any]]]:
    """Per bucket, every model against `reference` (e.g. goldfish against standard) on the same targets: the paired
    statistics of eval.paired.paired_buckets (exact McNemar p, the paired differences in exact match and RougeL with
    their bootstrap intervals over targets) and, in the same entry, eval.buckets.compare_buckets' counts and Fisher
    exact p (which treats the two counts as independent samples: kept for reference, the paired test is McNemar's)."""
    if reference not in rows_by_model:
        return {}
    base = tag_rows(rows_by_model[reference], "repeats", repeats, default=0)
    tests = {}
    for label, rows in rows_by_model.items():
        if label == reference:
            continue
        tagged = tag_rows(rows, "repeats", repeats, default=0)
        # pairs: the targets both models were scored on (every model of a comparison scores the same ones)
        common = {str(r["id"]) for r in base} & {str(r["id"]) for r in tagged}
        pairs = [[r for r in side if str(r["id"]) in common] for side in (base, tagged)]
        paired = {
            e["repeats"]: e for e in paired_buckets({0: pairs[0]}, {0: pairs[1]}, "repeats", n_resamples=n_resamples)
        }
        tests[label] = [e | paired.get(e["repeats"], {}) for e in compare_buckets(base, tagged, "repeats")]
    return tests


def seed_bucket_statistics(
    rows_by_model: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
    bucket_of: Mapping[str, int],
    reference: str,
    *,
    n_resamples: int,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """Several seeds repeating the same targets, grouped by each target's assigned bucket (`bucket_of`): per model
    its exact match pooled over seeds with the targets as clusters (eval.paired.clustered_extraction), and per model
    but `reference` the clustered paired statistics against it (eval.paired.paired_buckets: the sign-flip test over
    targets, the paired differences with their bootstrap intervals over targets).

    rows_by_model: {label: {seed: extraction rows of the targets}}. Returns ({label: pooled table}, {label: tests})."""
    tagged = {
        label: {seed: tag_rows(rows, "repeats", bucket_of) for seed, rows in by_seed.items()}
        for label, by_seed in rows_by_model.items()
    }
    pooled = {
        label: clustered_extraction(by_seed, "repeats", n_resamples=n_resamples) for label, by_seed in tagged.items()
    }
    tests = {}
    if reference in tagged:
        for label, by_seed in tagged.items():
            if label != reference:
                tests[label] = paired_buckets(tagged[reference], by_seed, "repeats", n_resamples=n_resamples)
    return pooled, tests


# What the keys of a bucket test entry mean, under one seed: the paired statistics and the unpaired Fisher test.
ONE_SEED_TEST_KEYS = dict(PAIRED_KEYS) | {
    "fisher_p": "two-sided Fisher exact test of the two exact-match counts, which treats them as independent samples "
    "(they are not: the same targets); kept for reference, the paired test is mcnemar_p",
    "a_*, b_*": "the reference's (a) and the model's (b) targets, count extracted and rate",
}


def bucket_tests_section(
    rows_by_model: Mapping[str, Sequence[Mapping[str, Any]]],
    repeats: Mapping[str, int],
    reference: str,
    *,
    n_resamples: int,
) -> BucketTestsSection:
    """summary.json's "bucket_tests" of one seed: the reference, what each key means and `bucket_tests`."""
    return seed_tests_section(
        bucket_tests(rows_by_model, repeats, reference, n_resamples=n_resamples), reference, what=ONE_SEED_TEST_KEYS
    )


def seed_tests_section(
    tests: Mapping[str, list[dict[str, Any]]], reference: str, what: Mapping[str, str] = PAIRED_KEYS
) -> BucketTestsSection:
    """The "bucket_tests" of tests against `reference` (bucket_tests, or seed_bucket_statistics' tests of the
    combined summary): {"reference", "what", "models"}, typed."""
    return BucketTestsSection.from_json({"reference": reference, "what": dict(what), "models": dict(tests)})
