"""Matched controls of a corpus comparison (`goldfish compare --matched-controls`, docs/corpus.md).

A goldfish model that drops 1 token in k differs from the standard model in more than its mask: it is supervised on
fewer tokens of each copy and ends at a higher validation loss. Three controls separate the mask's effect from those:

* **exposure-matched**: the standard model at the copies goldfish effectively supervises. A target inserted B times
  has each kept token supervised B times under goldfish, and (k-1)/k of its tokens kept; the standard model at
  B * (k-1)/k copies trains as many supervised target tokens. Read from the buckets that run (a bucket list such as
  0,64,192,256 holds 192 = 256 * 3/4), nothing extra trains.
* **loss-matched**: of the two models, the one with the lower final validation loss, at its first validation step
  whose loss is at most the other's final one (the same utility: usually the standard model, earlier; where the
  targets are a large share of training the goldfish model can end lower, and is then the one taken earlier). The
  weights are saved at every validation step by `Snapshots` and measured like every model; the model has trained
  fewer copies by then: the report gives the mean per bucket.
* **compute-matched**: the goldfish model trained for ceil(steps * k / (k-1)) steps, so that it is supervised on as
  many tokens as the standard model; the same copies are inserted (spread over its longer stream) and all trained.
  Whether that reaches the standard model's final validation loss is reported beside it, not assumed.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from goldfish.app.bucket_section import ModelBuckets
from goldfish.app.config import MaskSpec
from goldfish.app.matched_section import ComputeMatched, Control, LossMatched, MatchedControls, MatchedRow

LOSS_MATCHED_SUFFIX = "-loss-matched"
COMPUTE_MATCHED_SUFFIX = "-compute-matched"
SNAPSHOT_FOLDER = "snapshots"  # under the standard model's folder; only the loss-matched step is kept


def matched_mask(masks: Sequence[MaskSpec]) -> MaskSpec | None:
    """The goldfish mask the controls are built for: the first one that drops the same positions on every copy
    (hashed or static), the mechanism the controls test; None when there is none."""
    return next((m for m in masks if m.strategy in ("hashed", "static")), None)


def compute_matched_steps(steps: int, k: int) -> int:
    """Optimizer steps that supervise a 1-in-k goldfish model on as many tokens as `steps` steps of the standard
    loss: ceil(steps * k / (k - 1))."""
    if k < 2:
        raise ValueError(f"a compute-matched goldfish run needs k >= 2, got k={k}")
    return math.ceil(steps * k / (k - 1))


def exposure_pairs(buckets: Sequence[int], k: int) -> list[tuple[int, int]]:
    """(goldfish bucket B, standard bucket B * (k-1) / k) for every non-zero bucket whose supervised-copy count is
    itself a bucket, e.g. (256, 192) for k=4 and buckets 0,64,192,256."""
    present = set(buckets)
    pairs = []
    for bucket in sorted(b for b in present if b > 0):
        matched = bucket * (k - 1)
        if matched % k == 0 and matched // k in present:
            pairs.append((bucket, matched // k))
    return pairs


@dataclass
class Snapshots:
    """engine.training.train's on_validation hook for the standard model: its weights at every validation step,
    written as HF folders `folder/step-S` (written to a .partial folder, then renamed: never half-written).

    save(model, directory) writes a model folder (goldfish.app.model_files.save_hf_model with the run's tokenizer)."""

    folder: Path
    save: Any  # Callable[[nn.Module, Path], None]
    losses: dict[int, float] = field(default_factory=dict)  # step -> validation loss

    def __call__(self, model: nn.Module, step: int, val_loss: float) -> None:
        target = self.path(step)
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        self.save(model, partial)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        self.losses[step] = float(val_loss)

    def path(self, step: int) -> Path:
        return self.folder / f"step-{step}"

    def first_at_most(self, loss: float) -> int | None:
        """The first step whose validation loss is at most `loss` (None: the standard run never got that low)."""
        return next((step for step in sorted(self.losses) if self.losses[step] <= loss), None)

    def keep_only(self, step: int | None) -> None:
        """Remove every snapshot but `step`'s (the loss-matched weights stay with the run)."""
        for other in self.losses:
            if other != step:
                shutil.rmtree(self.path(other), ignore_errors=True)


def loss_matched_choice(
    final: Mapping[str, float | None], snapshots: Mapping[str, Snapshots], *, standard: str, of_steps: int
) -> LossMatched:
    """Which model and step the loss-matched control takes: the model whose final validation loss is the lower (the
    standard model on a tie), the other's final loss as the target, and that model's first validation step at or
    below it (None: none, or a final loss is missing), of the run's `of_steps`."""
    (a, loss_a), (b, loss_b) = ((standard, final[standard]), *((k, v) for k, v in final.items() if k != standard))
    if loss_a is None or loss_b is None:
        return LossMatched(model=None, target_loss=None, step=None, of_steps=of_steps)
    early, target = (a, loss_b) if loss_a <= loss_b else (b, loss_a)
    return LossMatched(model=early, target_loss=target, step=snapshots[early].first_at_most(target), of_steps=of_steps)


def matched_rows(
    buckets: Mapping[str, ModelBuckets],
    val_losses: Mapping[str, float | None],
    *,
    mask: MaskSpec,
    standard: str,
    top_buckets: Sequence[int],
    loss_matched: LossMatched | None,
    compute_matched: ComputeMatched | None,
) -> list[MatchedRow]:
    """The matched-controls table: per top bucket B, one row per model: goldfish (mask) at B, the standard model at
    B, the standard model at B * (k-1)/k copies (exposure-matched, when that bucket ran), the loss-matched model
    (standard or goldfish, whichever ended lower) and the compute-matched goldfish model at B; each with exact match
    (k of n, its exact interval), RougeL (bootstrap interval) and the model's final validation loss. buckets: label
    -> bucket_results; val_losses: label -> final validation loss."""
    goldfish = mask.label
    all_buckets = sorted({e.repeats for entry in buckets.values() for e in entry.extraction})
    exposure = dict(exposure_pairs(all_buckets, int(mask.k or 0))) if mask.k else {}
    rows = []

    def add(bucket: int, control: Control, label: str, at: int, **extra: Any) -> None:
        stats = buckets[label].bucket(at) if label in buckets else None
        if stats is not None:
            rows.append(MatchedRow.of_bucket(bucket, control, label, stats, val_losses.get(label), **extra))

    for bucket in top_buckets:
        add(bucket, "goldfish", goldfish, bucket)
        add(bucket, "standard", standard, bucket)
        if bucket in exposure:
            add(bucket, "exposure-matched", standard, exposure[bucket])
        if loss_matched is not None and loss_matched.label is not None:
            copies = (loss_matched.mean_copies_trained or {}).get(str(bucket))
            add(bucket, "loss-matched", loss_matched.label, bucket, step=loss_matched.step, mean_copies_trained=copies)
        if compute_matched is not None:
            add(bucket, "compute-matched", compute_matched.label, bucket, steps=compute_matched.steps)
    return rows


def matched_controls(
    buckets: Mapping[str, ModelBuckets],
    val_losses: Mapping[str, float | None],
    repeats: Mapping[str, int],
    *,
    mask: MaskSpec,
    standard: str,
    loss_matched: LossMatched,
    compute_matched: tuple[str, int],
    of_steps: int,
) -> MatchedControls:
    """summary.json's "matched_controls": the definitions (this module's docstring), the loss- and compute-matched
    runs, and the table at the top two buckets (matched_rows). val_losses: label -> final validation loss;
    repeats: target id -> its bucket; compute_matched: the compute-matched run's label and steps, of `of_steps`."""
    label, steps = compute_matched
    standard_loss, compute_loss = val_losses.get(standard), val_losses.get(label)
    compute = ComputeMatched(
        label=label,
        steps=steps,
        of_steps=of_steps,
        val_loss=compute_loss,
        standard_val_loss=standard_loss,
        reached=None if compute_loss is None or standard_loss is None else compute_loss <= standard_loss,
    )
    top = sorted(b for b in set(repeats.values()) if b > 0)[-2:]
    return MatchedControls(
        mask=mask.label,
        definition=__doc__.split("\n\n", 1)[1].strip(),
        loss_matched=loss_matched,
        compute_matched=compute,
        rows=matched_rows(
            buckets,
            val_losses,
            mask=mask,
            standard=standard,
            top_buckets=top,
            loss_matched=loss_matched if loss_matched.step is not None else None,
            compute_matched=compute,
        ),
    )


def mean_copies_by_bucket(assigned: Mapping[str, int], trained: Mapping[str, int]) -> dict[str, float]:
    """Per bucket (the copies each target was assigned), the mean copies its targets had trained at a checkpoint."""
    sums: dict[int, list[int]] = {}
    for target, bucket in assigned.items():
        sums.setdefault(bucket, []).append(trained.get(target, 0))
    return {str(b): sum(v) / len(v) for b, v in sorted(sums.items())}


def _ci(interval: Sequence[float] | None) -> str:
    return "" if not interval else f" [{interval[0]:.2f}, {interval[1]:.2f}]"


def _loss(value: float | None) -> str:
    return f"{math.nan if value is None else value:.3f}"


def render_matched(section: MatchedControls) -> list[str]:
    """report.md lines of the summary's "matched_controls" section."""
    lines = ["## Matched controls", "", section.definition, ""]
    loss_matched = section.loss_matched
    early = loss_matched.model
    other = section.mask if early == "standard" else "the standard model"
    if early is None:
        lines.append("Loss-matched: a final validation loss is missing; no loss-matched row.")
    elif loss_matched.step is None:
        lines.append(
            f"Loss-matched: {early} ends lower, but no validation step of it reached {other}'s final "
            f"{_loss(loss_matched.target_loss)}; no loss-matched row."
        )
    else:
        lines.append(
            f"Loss-matched: {early} ends with the lower validation loss; it is taken at step "
            f"{loss_matched.step} of {loss_matched.of_steps} (validation loss "
            f"{_loss(loss_matched.val_loss)}, the first at most {other}'s final {_loss(loss_matched.target_loss)})."
        )
    compute = section.compute_matched
    reached = "reaches" if compute.reached else "does not reach"
    lines.append(
        f"Compute-matched: {section.mask} trained {compute.steps} steps instead of {compute.of_steps}; "
        f"its final validation loss {_loss(compute.val_loss)} {reached} the standard model's "
        f"{_loss(compute.standard_val_loss)}."
    )
    lines += [
        "",
        "| bucket | control | model | copies | exact match | RougeL | validation loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in section.rows:
        copies = str(row.copies)
        if row.mean_copies_trained is not None:
            copies += f" (trained by then: {row.mean_copies_trained:.1f})"
        loss = "" if row.val_loss is None else f"{row.val_loss:.3f}"
        rouge = "" if row.rouge is None else f"{row.rouge:.2f}{_ci(row.rouge_ci)}"
        lines.append(
            f"| {row.bucket} | {row.control} | {row.model} | {copies} | "
            f"{row.k}/{row.n}{_ci(row.rate_ci)} | {rouge} | {loss} |"
        )
    lines.append("")
    return lines


def render_matched_seeds(per_seed: Mapping[str, MatchedControls]) -> list[str]:
    """The combined --seeds report's lines on the matched controls: per seed, which model the loss-matched control
    took and at which step, whether the compute-matched run reached the standard model's validation loss, and the
    exact match of every control at the top buckets (each seed's own report has the whole table)."""
    if not per_seed:
        return []
    lines = [
        "## Matched controls, seed by seed",
        "",
        "The loss-matched control is whichever model ended with the lower validation loss, so it can be another "
        "model under each seed; each seed's report has the whole table with intervals.",
        "",
        "| seed | loss-matched: model at step | compute-matched: validation loss (standard's) | exact match at the top "
        "buckets |",
        "|---|---|---|---|",
    ]
    for seed, section in per_seed.items():
        loss = section.loss_matched
        taken = "none" if loss.step is None else f"{loss.model} at {loss.step} of {loss.of_steps}"
        compute = section.compute_matched
        reached = "" if compute.val_loss is None else f"{compute.val_loss:.3f} ({_loss(compute.standard_val_loss)})"
        top = max((row.bucket for row in section.rows), default=None)
        counts = "; ".join(f"{row.control} @{row.copies}: {row.k}/{row.n}" for row in section.rows if row.bucket == top)
        lines.append(f"| {seed} | {taken} | {reached} | {counts} |")
    lines.append("")
    return lines
