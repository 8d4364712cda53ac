"""Per-target rows of a comparison with repetition buckets: one row per target and model (and seed), so that anyone
can redo the per-bucket analysis, the paired tests included, from a file (OUT/targets.jsonl; with --seeds, each
seed's in OUT/seed-S/targets.jsonl and all of them in OUT/targets.jsonl).

A row: {"id": the target, "bucket": the copies it was assigned (0: held out, never inserted), "copies": the copies
the run trained on (the grouping of the run's own bucket tables; differs from the bucket only when a run stops before
inserting them all), "last_insertion_step": the optimizer step (counted from 1, as metrics.jsonl counts) that
trained the target's last copy (None: held out, or no copy trained, or a run without a background stream), "seed":
the run's training seed (data order and insertion positions; with --seeds also the initialisation), "model": the
model's label, and the model's exact_match (bool), rouge_l, match_fraction and suffix_logprob_mean on the target}.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from data.atomic import write_jsonl_atomic
from data.background import Background
from engine import TrainConfig, epoch_order, steps_per_epoch, total_steps_of
from eval.metrics import EXACT_MATCH, MATCH_FRACTION, ROUGE_L, SUFFIX_LOGPROB_MEAN
from goldfish.app.config import CompareSpec, background_train_config
from goldfish.app.prepare import Prepared
from goldfish.app.records import TrainedCopies, trained_copies


class BucketComparison(Protocol):
    """What the per-target rows read of a finished goldfish.app.compare.Comparison."""

    spec: CompareSpec
    prepared: Prepared
    background: Background | None
    repeats: dict[str, int] | None
    target_rows: dict[str, list[dict[str, Any]]]


TARGETS_FILE = "targets.jsonl"
# The per-target measures a row carries for its model.
TARGET_METRICS = (EXACT_MATCH, ROUGE_L, MATCH_FRACTION, SUFFIX_LOGPROB_MEAN)


def last_insertion_steps(copies: TrainedCopies, n_rows: int, train: TrainConfig) -> dict[str, int | None]:
    """{training document id: the optimizer step, counted from 1, after which its last trained copy is complete;
    None when no copy of it is trained}.

    The training loop reads step s (from 0) as the rows engine.training.train.step_rows gives: the epoch's order
    (stream order for a background run, whose config does not shuffle) sliced by train.batch_size, the global batch:
    gradient accumulation and the data axis split a step's rows, they do not change which rows it reads. A copy in
    rows first..last is complete at the step reading the last of them to be read. Only the last begun epoch and the
    one before (read whole) can hold a document's last copy."""
    total = total_steps_of(n_rows, train)
    per_epoch = steps_per_epoch(n_rows, train.batch_size)
    last: dict[str, int | None] = dict.fromkeys(copies.ids, None)
    if total == 0 or n_rows == 0:
        return last
    final = (total - 1) // per_epoch
    for epoch in sorted({final, max(final - 1, 0)}):
        order = epoch_order(n_rows, train.seed, epoch, train.shuffle)  # (R,) rows in reading order
        position = torch.empty(n_rows, dtype=torch.long)
        position[order] = torch.arange(n_rows)
        step_of_row = epoch * per_epoch + position // train.batch_size  # (R,) the 0-based step reading each row
        for document, first, end in zip(copies.documents, copies.first.tolist(), copies.last.tolist()):
            done = int(step_of_row[first : end + 1].max())
            if done < total:
                previous = last[document]
                last[document] = done + 1 if previous is None else max(previous, done + 1)
    return last


def target_rows(
    rows_by_model: Mapping[str, Sequence[Mapping[str, Any]]],
    bucket: Mapping[str, int],
    copies: Mapping[str, int],
    last_step: Mapping[str, int | None],
    seed: int,
) -> list[dict[str, Any]]:
    """The per-target rows (module docstring) of one run: extraction rows per model label (``id`` and the
    TARGET_METRICS), each target's assigned bucket, trained copies and last insertion step (targets absent from
    `copies` or `last_step`: 0 copies, None)."""
    out = []
    for model, rows in rows_by_model.items():
        for row in rows:
            target = str(row["id"])
            if target not in bucket:
                raise ValueError(f"target {target!r} of {model} has no bucket")
            out.append(
                {
                    "id": target,
                    "bucket": bucket[target],
                    "copies": copies.get(target, 0),
                    "last_insertion_step": last_step.get(target),
                    "seed": seed,
                    "model": model,
                }
                | {name: bool(row[name]) if name == EXACT_MATCH else row.get(name) for name in TARGET_METRICS}
            )
    return out


def comparison_target_rows(comparison: BucketComparison) -> list[dict[str, Any]]:
    """The per-target rows of a finished comparison with buckets (rank 0; [] without buckets). Buckets are the data
    seed's assignment; the last insertion step is read from the background stream's rows (None without one)."""
    if not comparison.target_rows or comparison.repeats is None:
        return []
    spec, split = comparison.spec, comparison.prepared.split
    bucket = spec.data.repeats_by_id(split.train) | {str(d.id): 0 for d in split.heldout}
    last_step: dict[str, int | None] = {}
    if comparison.background is not None:
        copies = trained_copies(comparison.prepared, None, {}, background=comparison.background)
        last_step = last_insertion_steps(copies, len(comparison.background.rows), background_train_config(spec.train))
    return target_rows(comparison.target_rows, bucket, comparison.repeats, last_step, spec.train.seed)


def write_target_rows(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path | None:
    """Write the rows as JSON lines (None, nothing written, for no rows)."""
    return write_jsonl_atomic(path, rows) if rows else None


def read_target_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a per-target file ([] when there is none: a run without buckets)."""
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def seeds_target_rows(out_dir: Path, seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Every seed's per-target rows, as each seed's run wrote them in OUT/seed-S/targets.jsonl, seed after seed."""
    return [row for seed in seeds for row in read_target_rows(Path(out_dir) / f"seed-{seed}" / TARGETS_FILE)]
