"""Typed results of an evaluation: what summary.json, report.md and the plots are rendered from.

`PartResult` is one part's evaluation (the training or the held-out documents): the metric means, their intervals,
the instruments' summaries and the breakdowns, with the per-document rows behind them; `ModelResult` is one model's
parts and its membership inference. Each serializes with `to_json` to the dict that summary.json has always held
(the same keys and values), so readers of earlier files keep working.

Names are defined once: the metrics in eval.metrics (METRICS, HEADLINE_METRICS, INTERVAL_METRICS), the per-document
files in eval.files. The evaluation that fills these objects is goldfish.app.evaluation.evaluate_parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from eval.metrics import HEADLINE_METRICS, INTERVAL_METRICS, INTERVAL_SUFFIX, METRICS, interval_key

# What a JSON file holds: the values of summary.json's entries and of the per-document rows (JSON-lines files).
JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]
Row = dict[str, JsonValue]  # one document's row of an instrument (eval.files.ROW_FILES), or one breakdown group
Interval = list[float] | None  # a 95% interval [low, high]; None: not computed (no resamples)


def ordered_json(values: Mapping[str, JsonValue], keys: tuple[str, ...] | None) -> dict[str, JsonValue]:
    """A result's JSON object: `values` (every key it can hold, in the order written today) in the order of `keys`,
    the keys a file read back had (None: every value, as written today). A key the file lacked stays out."""
    if keys is None:
        return dict(values)
    return {key: values[key] for key in keys if key in values}


PARTS = ("train", "heldout")  # the evaluated parts of a model: its training (members) and held-out documents
# The keys of a part's entry under "models" in compare's summary.json: the document count and the headline metrics,
# each interval right after its metric.
HEADLINE_KEYS: tuple[str, ...] = ("n_docs",) + tuple(
    key for name in HEADLINE_METRICS for key in ((name, interval_key(name)) if name in INTERVAL_METRICS else (name,))
)
# Instruments whose summary sits under its own key in a part summary (their rows: eval.files.ROW_FILES).
INSTRUMENTS = ("divergence", "probabilistic", "beam", "sampling")
# Keys of the extraction summary written before the metric means (the rest follow them).
_LEADING = ("n_skipped_too_short", "skipped_ids", "min_tokens")
_TIMINGS = "timings_s"
_BREAKDOWNS = "breakdowns"


@dataclass
class PartResult:
    """One part's evaluation. rows: per-document rows by instrument ("extraction", "divergence", ...: the keys of
    eval.files.ROW_FILES), kept in memory for per-bucket tables and never serialized."""

    n_docs: int | None  # None only in summaries written without it
    metrics: dict[str, float | None]  # every eval.metrics.METRICS name present -> mean over documents
    intervals: dict[str, Interval]  # INTERVAL_METRICS name -> 95% bootstrap interval [low, high] (None: not computed)
    instruments: dict[str, dict[str, JsonValue]]  # INSTRUMENTS name -> that instrument's summary, for those that ran
    breakdowns: dict[str, list[Row]]  # "repeats" / "prefix_length" -> group means
    details: dict[str, JsonValue]  # the rest: skipped documents, extraction config, ROUGE settings, near tie, timings
    rows: dict[str, list[Row]] = field(default_factory=dict, repr=False)

    @classmethod
    def from_summary(
        cls, summary: Mapping[str, Any], rows: Mapping[str, list[dict[str, Any]]] | None = None
    ) -> PartResult:
        """The typed form of a part summary (as eval.extraction.summarize_extraction plus the instruments build it,
        or as read back from summary.json, of any age: what it lacks stays empty)."""
        intervals = {name: summary[interval_key(name)] for name in INTERVAL_METRICS if interval_key(name) in summary}
        taken = {"n_docs", _BREAKDOWNS, *METRICS, *INSTRUMENTS, *(interval_key(name) for name in intervals)}
        return cls(
            n_docs=summary.get("n_docs"),
            metrics={name: summary[name] for name in METRICS if name in summary},
            intervals=intervals,
            instruments={name: summary[name] for name in INSTRUMENTS if name in summary},
            breakdowns=dict(summary.get(_BREAKDOWNS) or {}),
            details={key: value for key, value in summary.items() if key not in taken},
            rows=dict(rows or {}),
        )

    def metric(self, name: str) -> Any:
        """A headline value by its summary key: a metric's mean, `<metric>_ci` its interval, or n_docs."""
        if name == "n_docs":
            return self.n_docs
        if name.endswith(INTERVAL_SUFFIX):
            return self.intervals.get(name.removesuffix(INTERVAL_SUFFIX))
        return self.metrics.get(name)

    def headline(self) -> dict[str, Any]:
        """The part's entry under "models" in compare's summary.json (HEADLINE_KEYS)."""
        return {key: self.metric(key) for key in HEADLINE_KEYS}

    def to_json(self) -> dict[str, Any]:
        """The part summary as summary.json holds it (the same keys and values, in the order they were written)."""
        details = {key: value for key, value in self.details.items() if key != _TIMINGS}
        out: dict[str, Any] = {"n_docs": self.n_docs}
        out |= {key: details.pop(key) for key in _LEADING if key in details}
        out |= self.metrics
        out |= {interval_key(name): interval for name, interval in self.intervals.items()}
        out |= details | self.instruments
        if self.breakdowns:
            out[_BREAKDOWNS] = self.breakdowns
        if _TIMINGS in self.details:
            out[_TIMINGS] = self.details[_TIMINGS]
        return out


@dataclass
class ModelResult:
    """One model's evaluation: its parts ("train", "heldout", or the one --part chose) and, when both parts have
    documents and it ran, membership inference (its summary; its per-document rows beside, never serialized)."""

    parts: dict[str, PartResult]
    membership: dict[str, JsonValue] | None = None
    membership_rows: list[Row] = field(default_factory=list, repr=False)

    def parts_json(self) -> dict[str, dict[str, Any]]:
        """{part: part summary}: a model's entry under "details" in compare's summary.json."""
        return {name: part.to_json() for name, part in self.parts.items()}

    def headline(self) -> dict[str, dict[str, Any]]:
        """{part: headline}: a model's entry under "models" in compare's summary.json."""
        return {name: part.headline() for name, part in self.parts.items()}

    def to_json(self) -> dict[str, Any]:
        """The parts and membership as `goldfish eval`'s summary.json holds them: {part: summary, "membership": ...}."""
        return self.parts_json() | ({} if self.membership is None else {"membership": self.membership})

    def rows(self, instrument: str) -> list[dict[str, Any]]:
        """Every part's per-document rows of one instrument, parts in order (e.g. the training then the held-out
        documents' extraction rows)."""
        return [row for part in self.parts.values() for row in part.rows.get(instrument, [])]
