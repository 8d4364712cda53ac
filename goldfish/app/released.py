"""`goldfish compare --checkpoints`: evaluate models trained elsewhere, such as the goldfish paper's released ones.

Nothing is trained. The --data documents are selected as a compare run selects them (with the first checkpoint's
tokenizer, or --tokenizer), every checkpoint is loaded in turn and measured by `Comparison.evaluate`, the evaluation
of goldfish compare (greedy extraction and every instrument on the training and held-out documents, membership
inference), and the outputs are a compare run's (summary.json with the checkpoints named, report.md, plots). The
checkpoint labelled "control" is evaluated first and is the reference model of the other checkpoints' reference-ratio
attack, as the initial weights are in a compare run.

What the documents are to the checkpoints is the user's claim, not something this module can check: the training
documents should be the ones the models were trained on (for the paper's models, its canary set, each trained 50
times: --repeats 50), the held-out ones documents they never saw.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Callable

from goldfish.app import paper
from goldfish.app.compare import CONTROL, Comparison
from goldfish.app.compare_result import CompareResult
from goldfish.app.compare_table import one_line
from goldfish.app.config import RUN_FILE, CompareSpec, MaskSpec
from goldfish.app.model_files import check_vocabulary
from goldfish.app.prepare import prepare_data
from goldfish.app.pretrained import load_pretrained_model

PAPER = "paper"  # --checkpoints paper: the released checkpoints of goldfish.app.paper.RELEASED


def parse_checkpoints(text: str) -> dict[str, str]:
    """{label: model} from 'paper' or 'LABEL=MODEL,LABEL=MODEL' (a model: an HF folder or hub name); ValueError naming
    the fix for a pair without '=', an empty label or model, or a label given twice."""
    if text.strip() == PAPER:
        return dict(paper.RELEASED)
    checkpoints: dict[str, str] = {}
    for pair in text.split(","):
        label, separator, model = (part.strip() for part in pair.partition("="))
        if not separator or not label or not model:
            raise ValueError(
                f"--checkpoints: cannot read {pair.strip()!r}. Fix: give LABEL=MODEL pairs separated by commas, e.g. "
                "control=runs/a/control,standard=runs/a/standard/checkpoint, or 'paper' for the paper's released models"
            )
        if label in checkpoints:
            raise ValueError(f"--checkpoints: label {label!r} is given twice. Fix: give each model its own label")
        checkpoints[label] = model
    return checkpoints


class CheckpointComparison(Comparison):
    """A comparison of checkpoints trained elsewhere: compare's documents, evaluation and outputs, no training."""

    def __init__(
        self,
        spec: CompareSpec,
        checkpoints: dict[str, str],
        out_dir: Path,
        *,
        device: str | None = None,
        log: Callable[..., None] = print,
    ) -> None:
        super().__init__(spec, out_dir, device=device, log=log)
        # the control first: it is the reference model of every other checkpoint's reference-ratio attack
        self.checkpoints = dict(sorted(checkpoints.items(), key=lambda item: item[0] != CONTROL))
        self.runs = []  # nothing is trained

    def run(self) -> CompareResult:  # type: ignore[override]
        self.prepare_documents()
        for label, source in self.checkpoints.items():
            model = load_pretrained_model(source)
            check_vocabulary(model, self.prepared, source)
            model = model.to(self.device).eval() if self.device is not None else model.eval()
            if label == CONTROL:
                self.initial = model
            self.evaluate(label, model, recorded_mask(source))
            self.log(one_line(label, self.results[label]))
        self.warnings.append(
            "nothing was trained by this run: its models are the checkpoints named above, and the training line "
            "gives this run's settings, not those the checkpoints were trained with"
        )
        result = replace(self.summary(), checkpoints=dict(self.checkpoints), control=self.control_note())
        result.config["model"] = ", ".join(f"{label}={source}" for label, source in self.checkpoints.items())
        self.write(result)
        return result

    def control_note(self) -> str:
        """What the control is in this run (the report's "Control:" line)."""
        if CONTROL not in self.checkpoints:
            return "none (no checkpoint labelled control); the reference-ratio attack is not run"
        return (
            f"the checkpoint {self.checkpoints[CONTROL]}, the reference model of the other checkpoints' "
            "reference-ratio attack"
        )

    def prepare_documents(self) -> None:
        """The documents as a compare run selects them, tokenized with --tokenizer or the first checkpoint's."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        first = next(iter(self.checkpoints.values()))
        self.prepared = prepare_data(self.spec.data, first, log=self.log, train_within=recorded_bound(first, self.spec))
        if self.spec.data.has_repeats(self.prepared.split):
            self.repeats = self.spec.data.times_seen(self.prepared.split)


def recorded_bound(source: str, spec: CompareSpec) -> int | None:
    """The selection bound of a checkpoint folder's run whose own tokenizer it carries (the run record's
    `documents.train_within`, data.select_fitting_tokenizer), when that run drew from the same --data in the same
    order and no --tokenizer replaces its own: the same documents are then selected again. None otherwise."""
    record = Path(source) / RUN_FILE
    if not record.is_file() or spec.data.tokenizer is not None:
        return None
    saved = json.loads(record.read_text(encoding="utf-8"))
    same = {k: (saved.get("data") or {}).get(k) for k in ("source", "seed")} == {
        "source": spec.data.source,
        "seed": spec.data.seed,
    }
    return (saved.get("documents") or {}).get("train_within") if same else None


def recorded_mask(source: str) -> MaskSpec | None:
    """The goldfish mask a checkpoint folder's run record (goldfish train / compare) says it was trained with, for
    the kept/dropped split of its evaluation; None for any other model (the paper's are masked by its reference
    code's hash, not ours) and for the standard loss."""
    record = Path(source) / RUN_FILE
    if not record.is_file():
        return None
    mask = json.loads(record.read_text(encoding="utf-8")).get("mask") or {}
    if mask.get("strategy") is None:
        return None
    return MaskSpec(strategy=mask["strategy"], k=mask["k"], h=mask["h"], seed=mask.get("seed", 0))


def evaluate_checkpoints(
    spec: CompareSpec, checkpoints: dict[str, str], out_dir: Path, *, device: str | None = None
) -> CompareResult:
    """Evaluate `checkpoints` ({label: model}) on `spec`'s documents with compare's instruments; returns the result
    written to `out_dir`."""
    if not checkpoints:
        raise ValueError("--checkpoints names no model. Fix: give LABEL=MODEL pairs, or 'paper'")
    return CheckpointComparison(spec, checkpoints, out_dir, device=device).run()
