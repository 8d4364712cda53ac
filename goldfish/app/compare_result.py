"""The typed result of `goldfish compare` (one seed): what summary.json, report.md, the plots and the console table
are rendered from.

`CompareResult` holds per model its `ModelResult` (the parts' full evaluation and membership inference: summary.json's
"details" and "membership") beside the sections summary.json has always held: the headline numbers per model and
part with the validation and held-out losses ("models"), the extraction curves, the breakdowns, the per-bucket
results (goldfish.app.bucket_section) and their tests (goldfish.app.bucket_tests), the validation curves, the
background corpus, the matched controls (goldfish.app.matched_section), the settings, the documents, warnings and
timings. Sections whose contents are free-form JSON keep JsonValue leaves.

`to_json` gives the summary dict exactly as written before this type existed (the same keys, order and values);
`from_json` reads a summary.json back, of any age: `keys` records which top-level keys a file had, so an older file
without e.g. "warnings" or "details" is written back without them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from goldfish.app.bucket_section import ModelBuckets
from goldfish.app.bucket_tests import BucketTestsSection
from goldfish.app.matched_section import MatchedControls
from goldfish.app.results import PARTS, JsonValue, ModelResult, PartResult, Row

# summary.json's top-level keys in the order compare writes them.
SUMMARY_KEYS: tuple[str, ...] = (
    "validation_curves",
    "corpus",
    "matched_controls",
    "buckets",
    "bucket_tests",
    "models",
    "details",
    "membership",
    "curves",
    "breakdowns",
    "config",
    "documents",
    "repeats",
    "control",
    "warnings",
    "timings_s",
    "grid",
    "checkpoints",
)
# Sections written only when their run had them (a background corpus, matched controls, buckets, released
# checkpoints): absent, not null, otherwise.
OPTIONAL_KEYS = frozenset({"validation_curves", "corpus", "matched_controls", "buckets", "bucket_tests", "checkpoints"})
CONTROL_NOTE = "the initial weights every model started from, never trained on the documents"

Headline = dict[str, JsonValue]  # a part's headline numbers, or a model's "validation" / "heldout_loss" entry


@dataclass
class CompareResult:
    """One comparison's results. models: label -> ModelResult (its parts' evaluation and membership inference, in
    training order, the control first); headlines: label -> {part: headline numbers, "validation": ...,
    "heldout_loss": ...} (summary.json's "models")."""

    models: dict[str, ModelResult]
    headlines: dict[str, dict[str, Headline]]
    curves: dict[str, list[Row]] = field(default_factory=dict)  # label -> one point per measured epoch
    breakdowns: dict[str, dict[str, JsonValue]] = field(default_factory=dict)  # kind -> label -> group rows
    config: dict[str, JsonValue] = field(default_factory=dict)  # every setting that shapes the comparison
    documents: dict[str, JsonValue] = field(default_factory=dict)  # the split's manifest
    repeats: dict[str, JsonValue] | None = None  # document id -> copies trained on (None: one copy each)
    control: str = CONTROL_NOTE
    warnings: list[str] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    grid: dict[str, JsonValue] | None = None  # the parallel grid's sizes, when one ran
    validation_curves: dict[str, list[Row]] | None = None  # label -> [{"step", "loss"}] (a background corpus)
    corpus: dict[str, JsonValue] | None = None  # the background corpus' record
    matched_controls: MatchedControls | None = None  # loss- and compute-matched controls and their table
    buckets: dict[str, ModelBuckets] | None = None  # label -> its per-bucket results
    bucket_tests: BucketTestsSection | None = None  # every model against the standard model, bucket by bucket
    checkpoints: dict[str, str] | None = None  # label -> the released checkpoint evaluated (goldfish.app.released)
    keys: tuple[str, ...] = SUMMARY_KEYS  # the always-written keys summary.json has (an older file lacks some)

    def parts(self, label: str) -> dict[str, PartResult]:
        """A model's evaluated parts ("train", "heldout")."""
        return self.models[label].parts

    @property
    def membership(self) -> dict[str, dict[str, JsonValue]]:
        """label -> membership inference summary, for the models it ran on (summary.json's "membership")."""
        return {label: m.membership for label, m in self.models.items() if m.membership is not None}

    def validation(self, label: str) -> Headline:
        """A model's validation loss and perplexity ({} when none was measured)."""
        entry = self.headlines[label].get("validation")
        return entry if isinstance(entry, dict) else {}

    def to_json(self) -> dict[str, JsonValue]:
        """The summary as summary.json holds it: the same keys in the same order and the same values."""
        values: dict[str, JsonValue] = {
            "validation_curves": self.validation_curves,
            "corpus": self.corpus,
            "matched_controls": None if self.matched_controls is None else self.matched_controls.to_json(),
            "buckets": None if self.buckets is None else {label: b.to_json() for label, b in self.buckets.items()},
            "bucket_tests": None if self.bucket_tests is None else self.bucket_tests.to_json(),
            "models": self.headlines,
            "details": {label: m.parts_json() for label, m in self.models.items()},
            "membership": self.membership,
            "curves": self.curves,
            "breakdowns": self.breakdowns,
            "config": self.config,
            "documents": self.documents,
            "repeats": self.repeats,
            "control": self.control,
            "warnings": self.warnings,
            "timings_s": self.timings_s,
            "grid": self.grid,
            "checkpoints": self.checkpoints,
        }
        return {
            key: value
            for key, value in values.items()
            if (value is not None if key in OPTIONAL_KEYS else key in self.keys)
        }

    @classmethod
    def from_json(cls, summary: Mapping[str, JsonValue]) -> CompareResult:
        """The typed form of a compare summary.json, of any age: a model without "details" gets its parts from the
        headline numbers; a section the file lacks stays empty and is not written back. ValueError: not a compare
        summary (e.g. the combined summary of a --seeds run)."""
        unknown = set(summary) - set(SUMMARY_KEYS)
        if unknown:
            raise ValueError(f"not a compare summary: unknown keys {sorted(unknown)} (a --seeds summary?)")
        headlines = dict(summary["models"])  # type: ignore[arg-type]
        details = summary.get("details") or {}
        membership = summary.get("membership") or {}
        tests, buckets, matched = summary.get("bucket_tests"), summary.get("buckets"), summary.get("matched_controls")
        models = {
            label: ModelResult(
                parts={
                    part: PartResult.from_summary(s)
                    for part, s in (details.get(label) or _headline_parts(parts)).items()  # type: ignore[union-attr]
                },
                membership=membership.get(label),  # type: ignore[union-attr]
            )
            for label, parts in headlines.items()
        }
        return cls(
            models=models,
            headlines=headlines,
            curves=dict(summary.get("curves") or {}),
            breakdowns=dict(summary.get("breakdowns") or {}),
            config=dict(summary.get("config") or {}),
            documents=dict(summary.get("documents") or {}),
            repeats=summary.get("repeats"),
            control=summary.get("control", "n/a"),
            warnings=list(summary.get("warnings") or []),
            timings_s=dict(summary.get("timings_s") or {}),
            grid=summary.get("grid"),
            validation_curves=summary.get("validation_curves"),
            corpus=summary.get("corpus"),
            matched_controls=None if matched is None else MatchedControls.from_json(matched),  # type: ignore[arg-type]
            buckets=None if buckets is None else {label: ModelBuckets.from_json(b) for label, b in buckets.items()},  # type: ignore[union-attr]
            bucket_tests=None if tests is None else BucketTestsSection.from_json(tests),  # type: ignore[arg-type]
            checkpoints=summary.get("checkpoints"),
            keys=tuple(key for key in SUMMARY_KEYS if key in summary),
        )


def _headline_parts(parts: Mapping[str, Headline]) -> dict[str, Headline]:
    """The evaluated parts of a model's headline entry (an older summary without "details")."""
    return {part: s for part, s in parts.items() if part in PARTS}
