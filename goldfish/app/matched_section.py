"""Typed matched controls of a corpus comparison: summary.json's "matched_controls" (goldfish.app.matched builds
it and renders "## Matched controls" from it).

`MatchedControls` holds the goldfish mask the controls are built for, their definitions in words, which model and
step the loss-matched control took (`LossMatched`), the compute-matched run and whether it reached the standard
model's validation loss (`ComputeMatched`), and the table at the top buckets, one `MatchedRow` per control.

Every type keeps `keys`, the keys its JSON object had in their order (None: every key, in the order written today),
so `to_json` gives back a file's section exactly, of any age; `from_json` refuses a key it does not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from eval.buckets import EXACT_MATCH_K
from eval.metrics import EXACT_MATCH, ROUGE_L, interval_key
from goldfish.app.bucket_section import BucketStats, refuse_unknown
from goldfish.app.results import Interval, JsonValue, ordered_json

# The rows of the table: goldfish at B, standard at B, standard at B * (k-1)/k copies, the loss-matched model (the
# one that ended lower, taken early) and the compute-matched goldfish model, each at bucket B.
Control = Literal["goldfish", "standard", "exposure-matched", "loss-matched", "compute-matched"]
_LOSS_MATCHED_KEYS = ("model", "target_loss", "step", "of_steps", "label", "val_loss", "mean_copies_trained")


@dataclass(frozen=True)
class LossMatched:
    """Which model and step the loss-matched control took: `model`, the one whose final validation loss is the
    lower (None: a final loss is missing), at `step`, its first validation step at or below the other's final loss
    `target_loss` (None: no step got there), of `of_steps`. Once evaluated: its `label`, its validation loss then and
    per bucket the mean copies its targets had trained by then."""

    model: str | None
    target_loss: float | None
    step: int | None
    of_steps: int
    label: str | None = None  # None: no step, nothing evaluated
    val_loss: float | None = None
    mean_copies_trained: dict[str, float] | None = None  # bucket (copies, as a string) -> mean copies trained
    keys: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, JsonValue]:
        values: dict[str, JsonValue] = {
            "model": self.model,
            "target_loss": self.target_loss,
            "step": self.step,
            "of_steps": self.of_steps,
            "label": self.label,
            "val_loss": self.val_loss,
            "mean_copies_trained": self.mean_copies_trained,  # type: ignore[dict-item]
        }
        if self.keys is None and self.label is None:  # not evaluated: the choice only
            return {key: values[key] for key in _LOSS_MATCHED_KEYS[:4]}
        return ordered_json(values, self.keys)

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> LossMatched:
        e: dict = dict(entry)
        refuse_unknown(e, _LOSS_MATCHED_KEYS, "the loss-matched control")
        return cls(**{key: e.get(key) for key in _LOSS_MATCHED_KEYS}, keys=tuple(e))


_COMPUTE_MATCHED_KEYS = ("label", "steps", "of_steps", "val_loss", "standard_val_loss", "reached")


@dataclass(frozen=True)
class ComputeMatched:
    """The compute-matched goldfish run: `steps` optimizer steps instead of `of_steps`, its final validation loss and
    the standard model's, and whether it reached it (None: a loss is missing)."""

    label: str
    steps: int
    of_steps: int
    val_loss: float | None
    standard_val_loss: float | None
    reached: bool | None

    def to_json(self) -> dict[str, JsonValue]:
        return {key: getattr(self, key) for key in _COMPUTE_MATCHED_KEYS}

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> ComputeMatched:
        refuse_unknown(entry, _COMPUTE_MATCHED_KEYS, "the compute-matched control")
        return cls(**{key: entry[key] for key in _COMPUTE_MATCHED_KEYS})  # type: ignore[arg-type]


def _with_interval(metric: str) -> tuple[str, str]:
    return metric, interval_key(metric)


# A row's keys: the control, the model read and its measures (exact match's count, rate and interval, RougeL's).
_ROW_KEYS = (
    ("bucket", "control", "model", "copies", "val_loss", "n", EXACT_MATCH_K)
    + _with_interval(EXACT_MATCH)
    + _with_interval(ROUGE_L)
)
_LOSS_MATCHED_EXTRA = ("step", "mean_copies_trained")  # the loss-matched rows' own keys
_COMPUTE_MATCHED_EXTRA = ("steps",)  # the compute-matched rows'


@dataclass(frozen=True)
class MatchedRow:
    """One control at one top bucket: the model read at `copies` copies, its exact match (k of n, the rate with its
    Clopper-Pearson interval), RougeL (bootstrap interval) and final validation loss; the loss-matched row adds the
    step taken and the mean copies trained by then, the compute-matched row its steps."""

    bucket: int
    control: Control
    model: str
    copies: int
    val_loss: float | None
    n: int
    k: int
    rate: float
    rate_ci: Interval
    rouge: float | None
    rouge_ci: Interval
    step: int | None = None  # loss-matched rows
    mean_copies_trained: float | None = None  # loss-matched rows (None: not recorded for the bucket)
    steps: int | None = None  # compute-matched rows
    keys: tuple[str, ...] | None = None

    @classmethod
    def of_bucket(
        cls,
        bucket: int,
        control: Control,
        model: str,
        stats: BucketStats,
        val_loss: float | None,
        *,
        step: int | None = None,
        mean_copies_trained: float | None = None,
        steps: int | None = None,
    ) -> MatchedRow:
        """A row reading a model's bucket entry (its copies are the entry's bucket)."""
        return cls(
            bucket=bucket,
            control=control,
            model=model,
            copies=stats.repeats,
            val_loss=val_loss,
            n=stats.n,
            k=stats.k,
            rate=stats.rate,
            rate_ci=stats.rate_ci,
            rouge=stats.means.get(ROUGE_L),
            rouge_ci=stats.intervals.get(ROUGE_L),
            step=step,
            mean_copies_trained=mean_copies_trained,
            steps=steps,
        )

    def to_json(self) -> dict[str, JsonValue]:
        values: dict[str, JsonValue] = {
            "bucket": self.bucket,
            "control": self.control,
            "model": self.model,
            "copies": self.copies,
            "val_loss": self.val_loss,
            "n": self.n,
            EXACT_MATCH_K: self.k,
            EXACT_MATCH: self.rate,
            interval_key(EXACT_MATCH): self.rate_ci,  # type: ignore[dict-item]
            ROUGE_L: self.rouge,
            interval_key(ROUGE_L): self.rouge_ci,  # type: ignore[dict-item]
        }
        if self.keys is not None or self.control == "loss-matched":
            values |= {"step": self.step, "mean_copies_trained": self.mean_copies_trained}
        if self.keys is not None or self.control == "compute-matched":
            values["steps"] = self.steps
        return ordered_json(values, self.keys)

    @classmethod
    def from_json(cls, entry: Mapping[str, JsonValue]) -> MatchedRow:
        e: dict = dict(entry)
        refuse_unknown(e, (*_ROW_KEYS, *_LOSS_MATCHED_EXTRA, *_COMPUTE_MATCHED_EXTRA), "a matched-controls row")
        return cls(
            bucket=e["bucket"],
            control=e["control"],
            model=e["model"],
            copies=e["copies"],
            val_loss=e.get("val_loss"),
            n=e["n"],
            k=e[EXACT_MATCH_K],
            rate=e[EXACT_MATCH],
            rate_ci=e.get(interval_key(EXACT_MATCH)),
            rouge=e.get(ROUGE_L),
            rouge_ci=e.get(interval_key(ROUGE_L)),
            step=e.get("step"),
            mean_copies_trained=e.get("mean_copies_trained"),
            steps=e.get("steps"),
            keys=tuple(e),
        )


_SECTION_KEYS = ("mask", "definition", "loss_matched", "compute_matched", "rows")


@dataclass(frozen=True)
class MatchedControls:
    """summary.json's "matched_controls": the goldfish mask the controls are built for (its label), their
    definitions in words, the loss- and compute-matched runs and the table at the top two buckets."""

    mask: str
    definition: str
    loss_matched: LossMatched
    compute_matched: ComputeMatched
    rows: list[MatchedRow]

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "mask": self.mask,
            "definition": self.definition,
            "loss_matched": self.loss_matched.to_json(),
            "compute_matched": self.compute_matched.to_json(),
            "rows": [row.to_json() for row in self.rows],
        }

    @classmethod
    def from_json(cls, section: Mapping[str, JsonValue]) -> MatchedControls:
        s: dict = dict(section)
        refuse_unknown(s, _SECTION_KEYS, "the matched controls")
        return cls(
            mask=s["mask"],
            definition=s["definition"],
            loss_matched=LossMatched.from_json(s["loss_matched"]),
            compute_matched=ComputeMatched.from_json(s["compute_matched"]),
            rows=[MatchedRow.from_json(row) for row in s["rows"]],
        )
