"""Typed tests of a model against the standard model bucket by bucket: summary.json's "bucket_tests" of one
comparison and of a `goldfish compare --seeds` combination.

A `BucketTest` is one bucket's entry: the paired statistics of eval.paired.paired_buckets (the extracted counts over
target-seed pairs, the discordant ones, the exact McNemar and sign-flip p, the paired differences with their
intervals) and, under one seed, eval.buckets.compare_buckets' unpaired counts with Fisher's exact p. Summaries
written before the paired tests existed hold the unpaired part only: their paired fields are None (`paired` False).

Every type keeps `keys`, the keys its JSON object had in their order (None: every key, in the order written
today), so `to_json` gives back a file's entry exactly, of any age.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from eval.buckets import EXACT_MATCH_K
from eval.metrics import EXACT_MATCH, interval_key
from goldfish.app.results import Interval, JsonValue, ordered_json

DIFFERENCE = "_difference"  # "<metric>_difference": the paired difference of a metric, model minus reference


@dataclass(frozen=True)
class UnpairedCounts:
    """eval.buckets.compare_buckets' entry for one bucket: the reference's (a) and the model's (b) targets, how many
    each extracted and the rate, and the two-sided Fisher exact p (treats the counts as independent samples)."""

    a_n: int
    a_k: int
    a_rate: float | None
    b_n: int
    b_k: int
    b_rate: float | None
    fisher_p: float | None

    def values(self) -> dict[str, JsonValue]:
        return {
            "a_n": self.a_n,
            f"a_{EXACT_MATCH_K}": self.a_k,
            f"a_{EXACT_MATCH}": self.a_rate,
            "b_n": self.b_n,
            f"b_{EXACT_MATCH_K}": self.b_k,
            f"b_{EXACT_MATCH}": self.b_rate,
            "fisher_p": self.fisher_p,
        }


@dataclass(frozen=True)
class BucketTest:
    """One bucket: a model against the reference on the same targets. The paired fields are None in summaries
    written before the paired tests (see `paired`); `unpaired` is None under several seeds."""

    repeats: int
    n_targets: int | None = None  # targets both models were scored on
    n_seeds: int | None = None
    reference_k: int | None = None  # target-seed pairs the reference extracts exactly
    model_k: int | None = None
    reference_only: int | None = None  # discordant pairs: the reference extracts, the model does not
    model_only: int | None = None
    mcnemar_p: float | None = None  # one seed only
    sign_flip_p: float | None = None
    differences: dict[str, float | None] = field(default_factory=dict)  # metric -> model minus reference
    difference_intervals: dict[str, Interval] = field(default_factory=dict)  # metric -> 95% bootstrap interval
    unpaired: UnpairedCounts | None = None
    keys: tuple[str, ...] | None = None

    @property
    def paired(self) -> bool:
        """Whether the entry has the paired statistics (False: a summary written before them)."""
        return self.n_targets is not None

    def to_json(self) -> dict[str, JsonValue]:
        values: dict[str, JsonValue] = {"repeats": self.repeats}
        values |= self.unpaired.values() if self.unpaired is not None else {}
        if self.paired:
            values |= {
                "n_targets": self.n_targets,
                "n_seeds": self.n_seeds,
                "reference_k": self.reference_k,
                "model_k": self.model_k,
                "reference_only": self.reference_only,
                "model_only": self.model_only,
                "mcnemar_p": self.mcnemar_p,
                "sign_flip_p": self.sign_flip_p,
            }
        for metric, difference in self.differences.items():
            values[metric + DIFFERENCE] = difference
            if metric in self.difference_intervals:
                values[interval_key(metric + DIFFERENCE)] = self.difference_intervals[metric]
        return ordered_json(values, self.keys)

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> BucketTest:
        """An entry as eval.paired.paired_buckets (merged with eval.buckets.compare_buckets under one seed) writes
        it, or as a summary of any age holds it."""
        e: dict = dict(entry)  # JSON values, read by the keys their writers give them
        metrics = [key.removesuffix(DIFFERENCE) for key in e if key.endswith(DIFFERENCE)]
        unpaired = None
        if "a_n" in e:
            unpaired = UnpairedCounts(
                a_n=e["a_n"],
                a_k=e[f"a_{EXACT_MATCH_K}"],
                a_rate=e.get(f"a_{EXACT_MATCH}"),
                b_n=e["b_n"],
                b_k=e[f"b_{EXACT_MATCH_K}"],
                b_rate=e.get(f"b_{EXACT_MATCH}"),
                fisher_p=e.get("fisher_p"),
            )
        return cls(
            repeats=e["repeats"],
            n_targets=e.get("n_targets"),
            n_seeds=e.get("n_seeds"),
            reference_k=e.get("reference_k"),
            model_k=e.get("model_k"),
            reference_only=e.get("reference_only"),
            model_only=e.get("model_only"),
            mcnemar_p=e.get("mcnemar_p"),
            sign_flip_p=e.get("sign_flip_p"),
            differences={m: e[m + DIFFERENCE] for m in metrics},
            difference_intervals={
                m: e[interval_key(m + DIFFERENCE)] for m in metrics if interval_key(m + DIFFERENCE) in e
            },
            unpaired=unpaired,
            keys=tuple(e),
        )


@dataclass(frozen=True)
class BucketTestsSection:
    """summary.json's "bucket_tests": the reference model, what the entries' keys mean ("what"; older summaries
    name their one test under "test" instead) and per model its entries, bucket by bucket."""

    reference: str
    models: dict[str, list[BucketTest]]
    what: dict[str, JsonValue] | None = None  # key -> its meaning
    test: str | None = None  # older summaries: the one test they ran (Fisher's exact test of the counts)
    keys: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, JsonValue]:
        values: dict[str, JsonValue] = {"reference": self.reference}
        if self.test is not None:
            values["test"] = self.test
        if self.what is not None:
            values["what"] = self.what
        values["models"] = {label: [t.to_json() for t in tests] for label, tests in self.models.items()}
        return ordered_json(values, self.keys)

    @classmethod
    def from_json(cls, section: Mapping[str, JsonValue]) -> BucketTestsSection:
        s: dict = dict(section)
        return cls(
            reference=s["reference"],
            models={label: [BucketTest.from_json(t) for t in tests] for label, tests in s["models"].items()},
            what=s.get("what"),
            test=s.get("test"),
            keys=tuple(s),
        )
