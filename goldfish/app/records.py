"""The run record a training run writes, the checkpoint records after each step, and where each copy of a
training document lies in the rows (TrainedCopies) to count the copies a checkpoint has trained."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import torch

from data.background import Background
from engine import TrainConfig, rows_consumed
from goldfish.app.config import TrainSpec
from goldfish.app.prepare import Prepared


def run_record(spec: TrainSpec, prepared: Prepared) -> dict[str, Any]:
    record = {
        "model": spec.model,
        "init_seed": spec.init_seed,
        "data": asdict(spec.data),
        "mask": asdict(spec.mask) | {"label": spec.mask.label},
        "train": asdict(spec.train),
        "lora": asdict(spec.lora) if spec.lora.enabled else None,
        "documents": prepared.split.manifest(),
        "repeats": spec.data.repeats_by_id(prepared.split.train),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }
    return record


@dataclass(frozen=True)
class TrainedCopies:
    """Where each copy of a training document lies in a run's rows, to count the copies a checkpoint has trained.

    Copy i is of training document documents[i] (a kept duplicate counts for its twin: the same text) and its
    tokens fill rows first[i]..last[i]; it counts as trained once per epoch in which every one of those rows was read.
    """

    documents: tuple[str, ...]
    first: torch.Tensor  # (C,) int64
    last: torch.Tensor  # (C,) int64
    ids: tuple[str, ...]  # every training document, copies trained or not

    def counts(self, n_rows: int, config: TrainConfig, steps: int) -> dict[str, int]:
        """{training document id: copies trained by the first `steps` optimizer steps}, counted from the rows those
        steps read (engine.training.train.rows_consumed, the rows the training loop reads)."""
        counts = dict.fromkeys(self.ids, 0)
        consumed = rows_consumed(n_rows, config, steps)
        read = torch.zeros(n_rows + 1, dtype=torch.long)
        read[consumed.partial + 1] = 1
        read = read.cumsum(0)  # read[r]: rows below r read in the begun epoch
        whole = (read[self.last + 1] - read[self.first]) == (self.last - self.first + 1)
        for document, trained in zip(self.documents, whole.tolist()):
            counts[document] += consumed.whole_epochs + trained  # a whole epoch reads every row of every copy
        return counts


def trained_copies(
    prepared: Prepared,
    examples: Any,
    repeats: dict[str, int],
    *,
    pack_order: Sequence[int] | None = None,
    background: Background | None = None,
) -> TrainedCopies:
    """The TrainedCopies of a run's training rows: one example per copy (make_examples), whole documents packed in
    `pack_order` (pack_documents), or targets inside a background stream."""
    split = prepared.split
    twin = {str(d.id): str(d.repeat_of) for d in split.repeats}
    documents = split.training_documents
    if background is not None:
        codes = torch.as_tensor(background.rows.codes)
        pieces = torch.nonzero(codes < 0).flatten().tolist()
        names = [str(split.train[-int(codes[p]) - 1].id) for p in pieces]
        spans = [background.rows.layout.rows_of(p) for p in pieces]
    elif pack_order is not None:
        names = [str(documents[d].id) for d in pack_order]
        spans = [examples.layout.rows_of(p) for p in range(len(pack_order))]
    else:
        names = [str(d.id) for d in documents for _ in range(repeats[str(d.id)])]
        spans = [(i, i) for i in range(len(names))]
    first, last = (torch.tensor([span[j] for span in spans], dtype=torch.long) for j in (0, 1))
    return TrainedCopies(
        tuple(twin.get(name, name) for name in names), first, last, tuple(str(d.id) for d in split.train)
    )


def checkpoint_record(
    record: dict[str, Any], copies: TrainedCopies, n_rows: int, train: TrainConfig, step: int
) -> dict[str, Any]:
    """The run record of the checkpoint written after `step` optimizer steps: the run's record plus its step and
    the copies of each training document trained so far ("exposures"; a background run's "repeats" and per-target
    "trained" too, which goldfish eval reads), not the whole run's plan."""
    exposures = copies.counts(n_rows, train, step)
    out = dict(record, step=step, exposures=exposures)
    if record.get("corpus"):
        out["repeats"] = exposures
        out["corpus"] = dict(
            record["corpus"],
            targets=[dict(t, trained=exposures[t["id"]]) for t in record["corpus"]["targets"]],
            rows_trained=min(step * train.batch_size, n_rows * train.epochs),
        )
    return out
