"""The typed result of `goldfish compare --seeds`: one comparison per seed combined per model and repetition bucket,
what the combined summary.json, report.md and plots are rendered from (goldfish.app.seed_combination builds it).

`SeedsResult` holds per model a `CombinedModel`: its `SeedBucket`s (per bucket each metric's mean over seeds and
targets with its interval and each seed's value, and the exact match pooled over target-seed pairs,
`PooledExtraction`) and its validation loss over seeds (`SeedValidation`); beside them the paired tests against the
standard model (goldfish.app.bucket_tests), every seed's headline numbers, the bucket assignment, which seeds tuned
the settings, each seed's background corpus share and matched controls, the settings, documents and warnings.

`to_json` gives the summary exactly as written before this type existed; `from_json` reads one back, of any age:
every type keeps `keys`, the keys its JSON object had in their order (None: every key, as written today), so an
older file lacking e.g. "bucket_tests" or a pooled "rate" is written back as it was. What an older summary lacks
stays None here, and the report says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from eval.metrics import EXACT_MATCH, interval_key
from goldfish.app.bucket_tests import BucketTestsSection
from goldfish.app.compare_result import Headline
from goldfish.app.matched_section import MatchedControls
from goldfish.app.results import Interval, JsonValue, ordered_json

# The combined summary.json's keys in the order seed_combination writes them.
SEEDS_KEYS: tuple[str, ...] = (
    "seeds",
    "matched_controls_per_seed",
    "tuning_seeds",
    "exploratory_seeds_run",
    "confirmatory_seeds_run",
    "folders",
    "combined",
    "per_seed",
    "combination",
    "pooled_what",
    "bucket_tests",
    "buckets",
    "config",
    "documents",
    "corpus_per_seed",
    "warnings",
    "timings_s",
)
PER_SEED = "_per_seed"  # "<metric>_per_seed": the bucket's mean under each seed, in seed order
POOLED = f"{EXACT_MATCH}_pooled"


@dataclass(frozen=True)
class PooledExtraction:
    """One model's exact match at one bucket pooled over target-seed pairs (eval.paired.clustered_extraction): k of
    n pairs extracted, the rate k/n with its cluster bootstrap interval over targets, and the conservative exact
    bounds from the targets extracted under every seed and under some seed. Summaries written before the cluster
    statistics hold k, n and `pair_interval` (Clopper-Pearson over pairs, as if independent) only."""

    k: int
    n: int
    rate: float | None = None  # None: not in an older summary
    cluster_ci: Interval = None
    targets_every_seed: int | None = None
    targets_some_seed: int | None = None
    exact_bounds: Interval = None
    repeats: int | None = None
    n_targets: int | None = None
    n_seeds: int | None = None
    pair_interval: Interval = None  # older summaries' "ci": Clopper-Pearson over target-seed pairs
    keys: tuple[str, ...] | None = None

    @property
    def pooled_rate(self) -> float | None:
        """The pooled rate, k/n where an older summary did not write it."""
        return self.rate if self.rate is not None or not self.n else self.k / self.n

    def to_json(self) -> dict[str, JsonValue]:
        values: dict[str, JsonValue] = {
            "repeats": self.repeats,
            "n_targets": self.n_targets,
            "n_seeds": self.n_seeds,
            "k": self.k,
            "n": self.n,
            "rate": self.rate,
            "cluster_ci": self.cluster_ci,
            "targets_every_seed": self.targets_every_seed,
            "targets_some_seed": self.targets_some_seed,
            "exact_bounds": self.exact_bounds,
            "ci": self.pair_interval,
        }
        return ordered_json(values, self.keys)

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> PooledExtraction:
        e: dict = dict(entry)  # JSON values under the keys clustered_extraction gives them
        return cls(
            k=e["k"],
            n=e["n"],
            rate=e.get("rate"),
            cluster_ci=e.get("cluster_ci"),
            targets_every_seed=e.get("targets_every_seed"),
            targets_some_seed=e.get("targets_some_seed"),
            exact_bounds=e.get("exact_bounds"),
            repeats=e.get("repeats"),
            n_targets=e.get("n_targets"),
            n_seeds=e.get("n_seeds"),
            pair_interval=e.get("ci"),
            keys=tuple(e),
        )


@dataclass(frozen=True)
class SeedBucket:
    """One model at one bucket over seeds (eval.seeds.combine_seeds): per metric the mean over targets of each
    target's mean over seeds, its 95% bootstrap interval over targets and the bucket's mean under each seed."""

    repeats: int
    n_targets: int
    n_seeds: int
    means: dict[str, float | None]  # metric -> mean over seeds and targets
    intervals: dict[str, Interval]  # metric -> 95% percentile bootstrap over targets (None: no resamples)
    per_seed: dict[str, list[float | None]]  # metric -> the bucket's mean under each seed, in seed order
    pooled: PooledExtraction | None = None  # exact match pooled over target-seed pairs
    keys: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, JsonValue]:
        values: dict[str, JsonValue] = {"repeats": self.repeats, "n_targets": self.n_targets, "n_seeds": self.n_seeds}
        for metric, mean in self.means.items():
            values[metric] = mean
            if metric in self.intervals:
                values[interval_key(metric)] = self.intervals[metric]
            if metric in self.per_seed:
                values[metric + PER_SEED] = self.per_seed[metric]  # type: ignore[assignment]
        if self.pooled is not None:
            values[POOLED] = self.pooled.to_json()
        return ordered_json(values, self.keys)

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> SeedBucket:
        e: dict = dict(entry)  # JSON values under the keys combine_seeds gives them
        metrics = [key.removesuffix(PER_SEED) for key in e if key.endswith(PER_SEED)]
        return cls(
            repeats=e["repeats"],
            n_targets=e["n_targets"],
            n_seeds=e["n_seeds"],
            means={m: e.get(m) for m in metrics},
            intervals={m: e[interval_key(m)] for m in metrics if interval_key(m) in e},
            per_seed={m: e[m + PER_SEED] for m in metrics},
            pooled=PooledExtraction.from_json(e[POOLED]) if POOLED in e else None,
            keys=tuple(e),
        )


@dataclass(frozen=True)
class SeedValidation:
    """A model's validation loss over seeds: the mean with its 95% t interval over seeds and each seed's; against
    the standard model, the difference likewise and each seed's relative difference."""

    loss: float
    per_seed: list[float]
    loss_ci: Interval = None  # None: one seed, or an older summary
    difference_to_standard: float | None = None
    difference_ci: Interval = None
    difference_per_seed: list[float] | None = None
    relative_difference_per_seed: list[float] | None = None
    keys: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, JsonValue]:
        values: dict[str, JsonValue] = {
            "loss": self.loss,
            "loss_ci": self.loss_ci,
            "per_seed": self.per_seed,  # type: ignore[dict-item]
            "difference_to_standard": self.difference_to_standard,
            "difference_ci": self.difference_ci,
            "difference_per_seed": self.difference_per_seed,  # type: ignore[dict-item]
            "relative_difference_per_seed": self.relative_difference_per_seed,  # type: ignore[dict-item]
        }
        return ordered_json(values, self.keys)

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> SeedValidation:
        e: dict = dict(entry)
        return cls(
            loss=e["loss"],
            per_seed=e["per_seed"],
            loss_ci=e.get("loss_ci"),
            difference_to_standard=e.get("difference_to_standard"),
            difference_ci=e.get("difference_ci"),
            difference_per_seed=e.get("difference_per_seed"),
            relative_difference_per_seed=e.get("relative_difference_per_seed"),
            keys=tuple(e),
        )


@dataclass(frozen=True)
class CombinedModel:
    """One model over seeds: its buckets (None: some seed kept no target rows for it) and validation loss (None:
    not measured under every seed)."""

    buckets: list[SeedBucket] | None = None
    validation: SeedValidation | None = None

    def to_json(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {}
        if self.buckets is not None:
            out["buckets"] = [b.to_json() for b in self.buckets]
        if self.validation is not None:
            out["validation"] = self.validation.to_json()
        return out

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> CombinedModel:
        e: dict = dict(entry)
        return cls(
            buckets=[SeedBucket.from_json(b) for b in e["buckets"]] if "buckets" in e else None,
            validation=SeedValidation.from_json(e["validation"]) if "validation" in e else None,
        )


@dataclass(frozen=True)
class SeedCorpus:
    """One seed's background corpus as the combined report states it: the targets' share of the tokens trained and
    the validation candidates left out as twins of the background ("exact_text", "near")."""

    target_share: float
    validation_removed_copies: dict[str, int | None]

    def to_json(self) -> dict[str, JsonValue]:
        return {"target_share": self.target_share, "validation_removed_copies": dict(self.validation_removed_copies)}

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> SeedCorpus:
        e: dict = dict(entry)
        return cls(target_share=e["target_share"], validation_removed_copies=dict(e["validation_removed_copies"]))


@dataclass(frozen=True)
class BucketAssignment:
    """How targets were assigned to buckets (the same under every seed) and how many each bucket holds."""

    assignment: str
    n_per_bucket: dict[str, int]  # bucket (copies, as a string) -> targets

    def to_json(self) -> dict[str, JsonValue]:
        return {"assignment": self.assignment, "n_per_bucket": dict(self.n_per_bucket)}  # type: ignore[dict-item]


COMBINATION = (
    "per bucket: each target's mean over seeds, then the mean over targets with the 95% percentile bootstrap interval "
    "over targets (eval.seeds.combine_seeds: the targets are the clusters, a target's seeds drawn together); "
    "validation loss: the mean over seeds with its 95% t interval over seeds"
)


@dataclass(frozen=True)
class SeedsResult:
    """The combination of one comparison per seed (see the module docstring). Seeds are ints in `seeds` and strings
    as keys of the per-seed sections, as summary.json has them."""

    seeds: list[int]
    combined: dict[str, CombinedModel]  # label -> the model over seeds, for models every seed trained
    per_seed: dict[str, dict[str, dict[str, Headline]]]  # seed -> that seed's summary.json "models"
    folders: dict[str, str]  # seed -> its folder, relative to OUT
    buckets: BucketAssignment
    config: dict[str, JsonValue]  # the first seed's settings with "seeds"
    documents: dict[str, JsonValue]  # the split's manifest
    combination: str = COMBINATION  # how the seeds were combined, in words
    matched_controls_per_seed: dict[str, MatchedControls] = field(default_factory=dict)
    tuning_seeds: list[int] = field(default_factory=list)  # --tuning-seeds: seeds used to choose the settings
    exploratory_seeds_run: list[int] = field(default_factory=list)  # seeds of this run among the tuning seeds
    confirmatory_seeds_run: list[int] = field(default_factory=list)  # the others
    pooled_what: dict[str, str] | None = None  # what each key of a pooled entry means (None: an older summary)
    bucket_tests: BucketTestsSection | None = None  # None: an older summary, written before the paired tests
    corpus_per_seed: dict[str, SeedCorpus] | None = None  # None: no background corpus
    warnings: list[str] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    keys: tuple[str, ...] | None = None  # the keys an older file had, in its order (None: every key)

    def to_json(self) -> dict[str, JsonValue]:
        """The summary as summary.json holds it: the same keys in the same order and the same values."""
        values: dict[str, JsonValue] = {
            "seeds": self.seeds,  # type: ignore[dict-item]
            "matched_controls_per_seed": {seed: m.to_json() for seed, m in self.matched_controls_per_seed.items()},
            "tuning_seeds": self.tuning_seeds,  # type: ignore[dict-item]
            "exploratory_seeds_run": self.exploratory_seeds_run,  # type: ignore[dict-item]
            "confirmatory_seeds_run": self.confirmatory_seeds_run,  # type: ignore[dict-item]
            "folders": self.folders,  # type: ignore[dict-item]
            "combined": {label: model.to_json() for label, model in self.combined.items()},
            "per_seed": self.per_seed,  # type: ignore[dict-item]
            "combination": self.combination,
            "pooled_what": self.pooled_what,  # type: ignore[dict-item]
            "bucket_tests": None if self.bucket_tests is None else self.bucket_tests.to_json(),
            "buckets": self.buckets.to_json(),
            "config": self.config,
            "documents": self.documents,
            "corpus_per_seed": None
            if self.corpus_per_seed is None
            else {seed: corpus.to_json() for seed, corpus in self.corpus_per_seed.items()},
            "warnings": self.warnings,  # type: ignore[dict-item]
            "timings_s": self.timings_s,  # type: ignore[dict-item]
        }
        return ordered_json(values, self.keys)

    @classmethod
    def from_json(cls, summary: Mapping[str, JsonValue]) -> SeedsResult:
        """The typed form of a --seeds summary.json, of any age. ValueError: not one (e.g. one seed's summary)."""
        if "seeds" not in summary or "combined" not in summary:
            raise ValueError("not a --seeds summary: it has no 'seeds' and 'combined' (one comparison's summary?)")
        unknown = set(summary) - set(SEEDS_KEYS)
        if unknown:
            raise ValueError(f"not a --seeds summary: unknown keys {sorted(unknown)}")
        s: dict = dict(summary)  # JSON values under the keys seed_combination gives them
        corpus = s.get("corpus_per_seed")
        tests = s.get("bucket_tests")
        return cls(
            seeds=list(s["seeds"]),
            combined={label: CombinedModel.from_json(entry) for label, entry in s["combined"].items()},
            per_seed=dict(s["per_seed"]),
            folders=dict(s["folders"]),
            buckets=BucketAssignment(s["buckets"]["assignment"], dict(s["buckets"]["n_per_bucket"])),
            config=dict(s["config"]),
            documents=dict(s["documents"]),
            combination=s["combination"],
            matched_controls_per_seed={
                seed: MatchedControls.from_json(m) for seed, m in (s.get("matched_controls_per_seed") or {}).items()
            },
            tuning_seeds=list(s.get("tuning_seeds") or []),
            exploratory_seeds_run=list(s.get("exploratory_seeds_run") or []),
            confirmatory_seeds_run=list(s.get("confirmatory_seeds_run") or []),
            pooled_what=s.get("pooled_what"),
            bucket_tests=None if tests is None else BucketTestsSection.from_json(tests),
            corpus_per_seed=None if corpus is None else {seed: SeedCorpus.from_json(c) for seed, c in corpus.items()},
            warnings=list(s.get("warnings") or []),
            timings_s=dict(s.get("timings_s") or {}),
            keys=tuple(s),
        )
