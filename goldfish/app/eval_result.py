"""The typed result of `goldfish eval`: what its summary.json, report.md and plots are rendered from.

`EvalResult` holds the evaluated model (`ModelResult`: each part's `PartResult` and the membership inference) beside
what the command records with it: the documents' manifest, the training step and exposures of the checkpoint (when
its run record has them) and the grid it ran on. `to_json` gives the summary exactly as `goldfish eval` has written
it ({part: part summary, "membership", "documents", "checkpoint", "grid"}); `from_json` reads one back, of any age:
a section the file lacks stays None and is not written back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from goldfish.app.results import JsonValue, ModelResult, PartResult

MEMBERSHIP = "membership"
# The keys beside the parts, in the order the command writes them.
RECORD_KEYS = ("documents", "checkpoint", "grid")


@dataclass(frozen=True)
class EvalResult:
    """One model's evaluation by `goldfish eval`. model: its parts ("train", "heldout", or the one --part chose) and
    membership inference; documents: the split's manifest (what was selected and what deduplication removed);
    checkpoint: {"step", "exposures"} of the checkpoint evaluated, when its run record has them; grid: the parallel
    grid's sizes, when one ran."""

    model: ModelResult
    documents: dict[str, JsonValue] | None = None  # None: a summary written without it
    checkpoint: dict[str, JsonValue] | None = None
    grid: dict[str, JsonValue] | None = None

    @property
    def parts(self) -> dict[str, PartResult]:
        return self.model.parts

    @property
    def membership(self) -> dict[str, JsonValue] | None:
        return self.model.membership

    def to_json(self) -> dict[str, JsonValue]:
        """The summary as summary.json holds it: the same keys in the same order and the same values."""
        out: dict[str, JsonValue] = dict(self.model.to_json())
        for key, value in zip(RECORD_KEYS, (self.documents, self.checkpoint, self.grid)):
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_json(cls, summary: Mapping[str, JsonValue]) -> EvalResult:
        """The typed form of an eval summary.json: every value that is a part summary (a dict with n_docs) is a part.
        ValueError: the summary has no part."""
        parts = {
            key: PartResult.from_summary(value)
            for key, value in summary.items()
            if key != MEMBERSHIP and isinstance(value, Mapping) and "n_docs" in value
        }
        if not parts:
            raise ValueError(
                "the eval summary has no part summary (a dict with n_docs, e.g. under 'train'); pass the "
                "summary that `goldfish eval` builds: {part: extraction summary, 'membership': ...}"
            )
        membership = summary.get(MEMBERSHIP)
        record: dict = {key: summary.get(key) for key in RECORD_KEYS}  # JSON objects under the keys eval writes
        return cls(
            model=ModelResult(parts, membership if isinstance(membership, dict) else None),
            documents=record["documents"],
            checkpoint=record["checkpoint"],
            grid=record["grid"],
        )
