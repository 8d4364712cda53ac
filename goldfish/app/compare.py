"""`goldfish compare`: standard vs goldfish training from the same weights on the same documents.

A `Comparison` holds its state in plain attributes (documents, the initial weights, per-model results, curves,
breakdowns, membership, timings, warnings) and runs as a sequence of steps read top to bottom in `run()`:

    prepare           select the documents, build the initial weights
    evaluate_control  the initial weights, never trained on the documents
    train_and_evaluate(run)    for the standard loss, then each goldfish mask (with LoRA: LoRA models, and with
                      --with-full the full fine-tuning ones first): train from the initial weights (measuring the
                      exact-match curve every `curve_every` epochs), then evaluate
    summary / write   summary.json, report.md, plots, and the table on the console
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

from torch import nn

from conventions import IGNORE_INDEX
from data.atomic import write_jsonl_atomic
from engine import AXES, METRICS_FILE, Grid, barrier, evaluate_loss, is_main_process
from eval import parallel as parallel_eval
from eval.breakdown import group_means
from eval.files import CURVE_FILE
from eval.metrics import EXACT_MATCH, INTERVAL_METRICS, LONGEST_CORRECT_PREFIX
from goldfish.app import lora, matched
from goldfish.app.background_run import prepare_background
from goldfish.app.bucket_section import ModelBuckets
from goldfish.app.buckets import bucket_results, bucket_tests_section, with_bucket_intervals
from goldfish.app.compare_result import CompareResult
from goldfish.app.compare_table import format_table, one_line
from goldfish.app.config import CompareSpec, MaskSpec, TrainSpec, background_train_config
from goldfish.app.evaluation import REPEAT_METRICS, evaluate_parts
from goldfish.app.finished_seeds import finished_summary, read_finished_seed
from goldfish.app.matched_section import LossMatched
from goldfish.app.model_files import initial_model, save_hf_model
from goldfish.app.paired_losses import paired_losses
from goldfish.app.prepare import Prepared, pad_token_id, prepare_data
from goldfish.app.pretrained import load_pretrained_model
from goldfish.app.records import trained_copies
from goldfish.app.results import PARTS, ModelResult
from goldfish.app.run_grid import grid_sizes
from goldfish.app.seed_combination import combine_seed_runs
from goldfish.app.seeds_result import SeedsResult
from goldfish.app.targets import TARGETS_FILE, comparison_target_rows, seeds_target_rows, write_target_rows
from goldfish.app.tracking import ReportTo
from goldfish.app.training import train_model
from goldfish.app.training_rows import validation_loss_fn

# Per-document fields kept for every point of the exact-match-vs-epochs curve (OUT/<label>/curve.jsonl).
CURVE_ROW_KEYS = ("id", *INTERVAL_METRICS, LONGEST_CORRECT_PREFIX)
CONTROL = "control"


class Curve:
    """Greedy extraction of the training documents measured during training: one summary point per measured epoch
    (`points`) and the per-document rows behind them (`rows`)."""

    def __init__(self) -> None:
        self.points: list[dict[str, Any]] = []
        self.rows: list[dict[str, Any]] = []

    def add(self, epoch: int, step: int, rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
        self.points.append(
            {
                "epoch": epoch,
                "step": step,
                **{name: summary[name] for name in INTERVAL_METRICS},
                "n_docs": summary["n_docs"],
            }
        )
        self.rows.extend({"epoch": epoch, "step": step, **{key: row[key] for key in CURVE_ROW_KEYS}} for row in rows)


@dataclass(frozen=True)
class ModelRun:
    """One trained model of a comparison: its loss (mask) and whether it trains LoRA adapters or every weight."""

    mask: MaskSpec
    lora: lora.LoraSpec
    steps: int | None = None  # the compute-matched control's --max-steps (goldfish.app.matched); None: the run's

    @property
    def label(self) -> str:
        label = f"{self.lora.label}-{self.mask.label}" if self.lora.enabled else self.mask.label
        return label + (matched.COMPUTE_MATCHED_SUFFIX if self.steps is not None else "")


class Comparison:
    """One `goldfish compare` run. With a grid (under torchrun) every rank trains; rank 0 evaluates the consolidated
    checkpoint of each model and writes the outputs (other ranks' `run()` returns an empty dict)."""

    def __init__(
        self,
        spec: CompareSpec,
        out_dir: Path,
        *,
        grid: Grid | None = None,
        device: str | None = None,
        log: Callable[..., None] = print,
        report_to: ReportTo = "none",
        verify: bool = True,
    ) -> None:
        self.spec, self.out_dir, self.grid, self.device = spec, Path(out_dir), grid, device
        self.report_to, self.verify = report_to, verify
        self.main = is_main_process(grid)
        self.log = log if self.main else (lambda *a, **k: None)
        self.started = time.perf_counter()
        # The models trained: the standard loss first, then one per goldfish mask; with LoRA, every one of them
        # with adapters (after the same models with every weight trained, with --with-full).
        masks = [MaskSpec(strategy=None)] + [m for m in spec.masks if m.strategy is not None]
        labels = [m.label for m in masks]
        if len(set(labels)) != len(labels):
            raise ValueError(f"duplicate masks in {labels}")
        kinds = ([lora.LoraSpec()] if spec.with_full or not spec.lora.enabled else []) + (
            [spec.lora] if spec.lora.enabled else []
        )
        self.runs = [ModelRun(mask, kind) for kind in kinds for mask in masks]
        self.matched_mask = matched.matched_mask(masks) if spec.matched_controls else None
        # the standard and matched goldfish models' weights at their validation steps, by label
        self.snapshots: dict[str, matched.Snapshots] = {}
        self.loss_matched: LossMatched | None = None  # evaluate_loss_matched's choice
        if self.matched_mask is not None and grid is not None:
            raise ValueError("--matched-controls runs in one process: leave out --nproc/--grid")
        if self.matched_mask is not None:
            steps = matched.compute_matched_steps(spec.train.max_steps, int(self.matched_mask.k))
            self.runs.append(ModelRun(self.matched_mask, lora.LoraSpec(), steps=steps))
        if spec.lora.enabled and grid is not None:
            lora.check_grid(grid_sizes(grid))
        # Standard and control models have no mask of their own; their teacher-forced accuracy is split by the first
        # goldfish mask, so one can see how well each model predicts exactly the tokens goldfish hides.
        self.reference_mask = next((m for m in masks if m.strategy is not None), None)
        self.prepared: Prepared | None = None
        self.initial: nn.Module | None = None
        self.repeats: dict[str, int] | None = None
        self.models: dict[str, ModelResult] = {}  # label -> its evaluation (parts, membership)
        self.curves: dict[str, list[dict[str, Any]]] = {}
        self.breakdowns: dict[str, dict[str, Any]] = {}
        # With repetition buckets: label -> the per-bucket tables (goldfish.app.buckets), and the extraction rows of
        # every target behind them (for the tests between models).
        self.buckets: dict[str, ModelBuckets] = {}
        self.target_rows: dict[str, list[dict[str, Any]]] = {}
        self.timings: dict[str, float] = {}
        self.warnings: list[str] = []
        self.control_rows: list[dict[str, Any]] = []  # the control's training-document rows: epoch 0 of every curve
        self.background = None  # with --background: the stream of the standard model (exposures, validation rows)
        self.validation: dict[str, float] = {}  # label -> validation loss at the end (with --background)
        self.validation_curves: dict[str, list[dict[str, Any]]] = {}  # label -> [{"step", "loss"}]
        self.validation_rows: dict[str, list[float]] = {}  # label -> final validation loss of each validation row
        # label -> {held-out document id: its mean next-token loss}: the utility measure of every comparison
        self.heldout_losses: dict[str, dict[str, float]] = {}

    @property
    def results(self) -> dict[str, dict[str, dict[str, Any]]]:
        """label -> part -> evaluation summary, as summary.json's "details" holds them."""
        return {label: result.parts_json() for label, result in self.models.items()}

    @property
    def membership(self) -> dict[str, dict[str, Any]]:
        """label -> membership inference summary, for the models it ran on."""
        return {label: r.membership for label, r in self.models.items() if r.membership is not None}

    def run(self) -> CompareResult | None:
        """Train and evaluate every model, write the outputs; the result (None on ranks other than 0)."""
        self.prepare()
        if self.main:
            self.evaluate_control()
        for run in self.runs:
            self.train_and_evaluate(run)
        if self.matched_mask is not None:
            self.evaluate_loss_matched()
        if not self.main:
            return None
        result = self.summary()
        self.write(result)
        return result

    # ----- steps ---------------------------------------------------------------------------------------------------

    def prepare(self) -> None:
        if self.main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        self.prepared = prepare_data(self.spec.data, self.spec.model, log=self.log)
        self.initial = initial_model(self.spec.model, self.prepared, self.spec.init_seed)
        if self.spec.lora.enabled:
            lora.check_targets(self.initial, self.spec.lora)  # before any training: name the layers that exist
        if self.device is not None and self.grid is None:
            self.initial = self.initial.to(self.device)
        if self.spec.data.background is not None:
            # exposures do not depend on the mask: the standard model's stream says them for every model
            standard = TrainSpec(
                model=self.spec.model,
                data=self.spec.data,
                mask=MaskSpec(strategy=None),
                train=self.spec.train,
                init_seed=self.spec.init_seed,
            )
            self.background = prepare_background(standard, self.prepared, self.grid, self.log)
            self.repeats = {str(d.id): self.background.exposures[str(d.id)] for d in self.prepared.split.train}
            self.warnings += self.background.record["warnings"]
        elif self.spec.data.has_repeats(self.prepared.split):
            self.repeats = self.spec.data.times_seen(self.prepared.split)

    def evaluate_control(self) -> None:
        """The initial weights; warns when they already extract training documents (e.g. a pretrained model that saw
        them during pretraining: extraction would then measure that, not what fine-tuning memorized)."""
        rows = self.evaluate(CONTROL, self.initial, self.reference_mask)
        self.control_rows = rows["train"]
        if self.background is not None and self.background.validation is not None:
            self.validation_rows[CONTROL] = self.row_losses(self.initial)
            weights = [int((row.targets != IGNORE_INDEX).sum()) for row in self.background.validation]
            losses = self.validation_rows[CONTROL]
            self.validation[CONTROL] = sum(w * x for w, x in zip(weights, losses)) / sum(weights)
        already = self.models[CONTROL].parts["train"].metrics[EXACT_MATCH] or 0.0
        if already > 0:
            self.warnings.append(
                f"the untrained control already extracts {already:.3f} of the training documents: "
                "they are memorized before fine-tuning; choose other documents (--data, --data-seed) "
                "to measure what training adds"
            )
            self.log("warning: " + self.warnings[-1])

    def train_and_evaluate(self, run: ModelRun) -> None:
        spec, prepared, mask, label = self.spec, self.prepared, run.mask, run.label
        t0 = time.perf_counter()
        curve = Curve() if spec.curve_every > 0 else None
        if curve is not None and self.main:  # epoch 0: the initial weights, already evaluated as the control
            curve.add(0, 0, self.control_rows, self.results[CONTROL]["train"])
        train = spec.train if run.steps is None else replace(spec.train, max_steps=run.steps)
        train_spec = TrainSpec(
            model=spec.model, data=spec.data, mask=mask, train=train, init_seed=spec.init_seed, lora=run.lora
        )
        on_validation = None
        if self.matched_mask is not None and mask in (MaskSpec(strategy=None), self.matched_mask) and run.steps is None:
            self.snapshots[label] = on_validation = self._snapshots(label)
        model, _ = train_model(
            train_spec,
            self.out_dir / label,
            prepared=prepared,
            model=copy.deepcopy(self.initial),
            grid=self.grid,
            log=self.log,
            on_epoch_end=None if curve is None else self._curve_hook(curve),
            background_corpus=None if self.background is None else self.background.corpus,
            report_to=self.report_to,
            verify=self.verify,
            on_validation=on_validation,
        )
        if curve is not None and self.main:
            self.curves[label] = curve.points
            write_jsonl_atomic(self.out_dir / label / CURVE_FILE, curve.rows)
        self.timings[f"train {label}"] = time.perf_counter() - t0
        if self.background is not None and self.main:
            self.read_validation(label)
        eval_mask = mask if mask.strategy is not None else self.reference_mask
        if self.grid is not None:
            # Evaluate what was saved: the consolidated HF checkpoint, as any user of the result would load it.
            if self.main:
                self.evaluate(label, load_pretrained_model(self.out_dir / label / "checkpoint"), eval_mask)
            barrier(self.grid.group(*AXES))
        else:
            self.evaluate(label, model, eval_mask)  # with LoRA: the merged model
        if self.background is not None and self.background.validation is not None and self.main:
            evaluated = model if self.grid is None else load_pretrained_model(self.out_dir / label / "checkpoint")
            self.validation_rows[label] = self.row_losses(evaluated)
        if self.main:
            self.log(one_line(label, self.results[label]))

    def _snapshots(self, label: str) -> matched.Snapshots:
        """A model's on_validation hook: its weights at every validation step, as HF folders."""
        tokenizer, record = self.prepared.tokenizer, {"model": self.spec.model, "snapshot_of": label}

        def save(model: nn.Module, folder: Path) -> None:
            save_hf_model(model, tokenizer, record, folder)

        return matched.Snapshots(self.out_dir / label / matched.SNAPSHOT_FOLDER, save)

    def evaluate_loss_matched(self) -> None:
        """The loss-matched control: of the standard and the matched goldfish model, the one with the lower final
        validation loss, taken at its first validation step whose loss is at most the other's final one, and
        evaluated like every model (goldfish.app.matched.loss_matched_choice)."""
        standard = MaskSpec(strategy=None).label
        self.loss_matched = matched.loss_matched_choice(
            {label: self.validation.get(label) for label in (standard, self.matched_mask.label)},
            self.snapshots,
            standard=standard,
            of_steps=self.spec.train.max_steps,
        )
        step, early = self.loss_matched.step, self.loss_matched.model
        if step is not None:
            snapshots = self.snapshots[early]
            label = early + matched.LOSS_MATCHED_SUFFIX
            model = load_pretrained_model(snapshots.path(step))
            self.evaluate(label, model, self.matched_mask)
            self.validation[label] = snapshots.losses[step]
            self.validation_rows[label] = self.row_losses(model)
            train = background_train_config(self.spec.train)
            copies = trained_copies(self.prepared, None, {}, background=self.background)
            trained = copies.counts(len(self.background.rows), train, step)
            mean_copies = matched.mean_copies_by_bucket(self.repeats, trained)
            self.loss_matched = replace(
                self.loss_matched, label=label, val_loss=snapshots.losses[step], mean_copies_trained=mean_copies
            )
            self.log(one_line(label, self.results[label]))
        for label, snapshots in self.snapshots.items():
            snapshots.keep_only(step if label == early else None)

    def read_validation(self, label: str) -> None:
        """The validation losses the training loop logged (val_loss in OUT/<label>/metrics.jsonl)."""
        records = [json.loads(line) for line in (self.out_dir / label / METRICS_FILE).read_text().splitlines() if line]
        curve = [{"step": r["step"], "loss": r["val_loss"]} for r in records if "val_loss" in r]
        if curve:
            self.validation_curves[label] = curve
            self.validation[label] = curve[-1]["loss"]

    def row_losses(self, model: nn.Module) -> list[float]:
        """The validation loss of each validation row (mean next-token loss over its targets, no mask), one process:
        the units of the validation loss's interval and of the paired difference between models (the loss itself is
        the token-weighted mean, as the training loop logs it; rows are full but the last, so the two agree closely)."""
        config = replace(background_train_config(self.spec.train), batch_size=1)
        loss_fn = validation_loss_fn(self.prepared)
        rows = self.background.validation
        return [evaluate_loss(model, [rows[i]], loss_fn, config) for i in range(len(rows))]

    def validation_summary(self) -> dict[str, dict[str, Any]]:
        """Per model: the final validation loss, its bootstrap interval over validation rows, and its difference to
        the standard model's on the same rows (paired: the interval of the mean per-row difference)."""
        n = self.spec.extraction.bootstrap
        standard = self.validation_rows.get(MaskSpec(strategy=None).label)
        out = {}
        for label, loss in self.validation.items():
            entry: dict[str, Any] = {"loss": loss, "perplexity": math.exp(min(loss, 700.0))}
            rows = self.validation_rows.get(label)
            if rows:
                entry |= {"n_rows": len(rows)} | paired_losses(rows, standard, label, n)
            out[label] = entry
        return out

    def heldout_loss_summary(self) -> dict[str, dict[str, Any]]:
        """Per model: the mean next-token loss of the held-out documents (never trained on: what training did to
        the model on unseen text of the same kind), its bootstrap interval over documents, and its difference to the
        standard model's, paired over the same documents."""
        n = self.spec.extraction.bootstrap
        standard = self.heldout_losses.get(MaskSpec(strategy=None).label)
        out = {}
        for label, losses in self.heldout_losses.items():
            values = list(losses.values())
            aligned = None if standard is None else [standard[i] for i in losses]
            out[label] = {"loss": sum(values) / len(values), "n_docs": len(values)} | paired_losses(
                values, aligned, label, n
            )
        return out

    def _curve_hook(self, curve: Curve) -> Callable[[nn.Module, int, int], None]:
        """engine.training.train's on_epoch_end: greedy extraction of the training documents on the model being trained
        (under a grid every rank takes part: documents sharded over data, the model's own shards)."""
        tokenizer = self.prepared.tokenizer

        def on_epoch_end(model: nn.Module, epoch: int, step: int) -> None:
            if epoch % self.spec.curve_every == 0 or epoch == self.spec.train.epochs:
                rows, point = parallel_eval.evaluate_parallel(
                    model,
                    self.prepared.split.train,
                    self.spec.extraction,
                    self.grid,
                    pad_token_id=pad_token_id(tokenizer),
                    decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                )
                if point is not None:  # rank 0
                    curve.add(epoch, step, rows, point)

        return on_epoch_end

    def evaluate(self, label: str, model: nn.Module, mask: MaskSpec | None) -> dict[str, list[dict[str, Any]]]:
        """Every instrument on the training and held-out documents, then membership inference (rank 0 only;
        goldfish.app.evaluation.evaluate_parts); returns the extraction rows of each part."""
        t0 = time.perf_counter()
        # The untrained control is the reference model of the reference-ratio attack (not of itself).
        reference = None if label == CONTROL else self.initial
        result = evaluate_parts(
            model,
            self.prepared,
            PARTS,
            self.spec.extraction,
            self.out_dir / label / "eval",
            mask,
            self.spec.train.progress,
            self.spec.instruments,
            self.repeats,
            reference=lambda: reference,
        )
        self.models[label] = result
        rows = {part: result.parts[part].rows["extraction"] for part in PARTS}
        if self.repeats is not None:
            # Held-out documents are the "trained on 0 times" group of the repeats breakdown.
            self.breakdowns.setdefault("repeats", {})[label] = group_means(
                rows["train"] + rows["heldout"], "repeats", REPEAT_METRICS
            )
        by_prefix = result.parts["train"].breakdowns.get("prefix_length")
        if by_prefix is not None:
            self.breakdowns.setdefault("prefix_length", {})[label] = by_prefix
        membership_rows = result.membership_rows
        if result.membership is not None:
            self.heldout_losses[label] = {str(r["id"]): r["loss"] for r in membership_rows if r.get("member") is False}
        if self.repeats is not None:
            self.target_rows[label] = rows["train"] + rows["heldout"]
            self.buckets[label] = bucket_results(
                self.target_rows[label],
                self.repeats,
                self.spec.extraction,
                prefix_rows=result.rows("prefix_length"),
                membership_rows=membership_rows,
                beam_rows=result.rows("beam"),
                n_resamples=self.spec.extraction.bootstrap,
            )
            with_bucket_intervals(self.breakdowns["repeats"][label], self.buckets[label], REPEAT_METRICS)
        self.timings[f"eval {label}"] = time.perf_counter() - t0
        return rows

    # ----- outputs -------------------------------------------------------------------------------------------------

    def summary(self) -> CompareResult:
        """The comparison's result, as summary.json holds it (CompareResult.to_json)."""
        models: dict[str, dict[str, Any]] = {label: result.headline() for label, result in self.models.items()}
        for label, entry in self.validation_summary().items():
            models[label]["validation"] = entry
        for label, entry in self.heldout_loss_summary().items():
            models[label]["heldout_loss"] = entry
        result = CompareResult(
            models=dict(self.models),
            headlines=models,
            curves=self.curves,
            breakdowns=self.breakdowns,
            config=self.config_record(),
            documents=self.prepared.split.manifest(),
            repeats=self.repeats,
            warnings=self.warnings,
            timings_s=self.timings | {"total": time.perf_counter() - self.started},
            grid=grid_sizes(self.grid) if self.grid is not None else None,
        )
        if self.background is not None:
            result.validation_curves = self.validation_curves
            result.corpus = self.background.record
        if self.matched_mask is not None:
            result.matched_controls = matched.matched_controls(
                self.buckets,
                self.validation,
                self.repeats,
                mask=self.matched_mask,
                standard=MaskSpec(strategy=None).label,
                loss_matched=self.loss_matched,
                compute_matched=next((r.label, r.steps) for r in self.runs if r.steps is not None),
                of_steps=self.spec.train.max_steps,
            )
        if self.buckets:
            standard = MaskSpec(strategy=None).label
            result.buckets = self.buckets
            result.bucket_tests = bucket_tests_section(
                self.target_rows, self.repeats, standard, n_resamples=self.spec.extraction.bootstrap
            )
        return result

    def config_record(self) -> dict[str, Any]:
        """summary.json's "config": every setting that shapes the comparison (what --resume of a --seeds run checks
        a finished seed against)."""
        spec = self.spec
        return {
            "model": spec.model,
            "data": asdict(spec.data),
            "masks": [asdict(m) | {"label": m.label} for m in dict.fromkeys(r.mask for r in self.runs)],
            "runs": [
                {"label": r.label, "mask": r.mask.label, "lora": asdict(r.lora) if r.lora.enabled else None}
                for r in self.runs
            ],
            "train": asdict(spec.train),
            "extraction": asdict(spec.extraction),
            "init_seed": spec.init_seed,
            "instruments": asdict(spec.instruments),
            "curve_every": spec.curve_every,
        }

    def write(self, result: CompareResult) -> None:
        from goldfish.app.report import write_compare_report  # matplotlib: only when a report is written

        write_compare_report(result, self.out_dir)
        write_target_rows(self.out_dir / TARGETS_FILE, comparison_target_rows(self))
        self.log(format_table(result))
        self.log(
            f"wrote {self.out_dir / 'summary.json'}, {self.out_dir / 'report.md'} and plots in "
            f"{time.perf_counter() - self.started:.0f} s"
        )


def compare(
    spec: CompareSpec,
    out_dir: Path,
    *,
    grid: Grid | None = None,
    device: str | None = None,
    log: Callable[..., None] = print,
    report_to: ReportTo = "none",
    verify: bool = True,
    resume: bool = False,
) -> CompareResult | SeedsResult | None:
    """Train a standard model and one goldfish model per mask from the same initial weights on the same documents,
    evaluate each and an untrained control on training and held-out documents, write summary.json and report.md.
    With spec.seeds, once per seed (OUT/seed-S) and then combined (`compare_seeds`; `resume` reads back the seeds
    that finished, goldfish.app.finished_seeds). Returns the result (with spec.seeds the SeedsResult combining them;
    None on ranks other than 0)."""
    options = dict(grid=grid, device=device, log=log, report_to=report_to, verify=verify)
    if spec.seeds:
        return compare_seeds(spec, Path(out_dir), resume=resume or spec.resume, **options)
    return Comparison(spec, out_dir, **options).run()


def compare_seeds(spec: CompareSpec, out_dir: Path, *, resume: bool = False, **options: Any) -> SeedsResult | None:
    """One comparison per seed of spec.seeds (the model's init seed and the data order / insertion seed both set to
    it; the targets and their buckets are the data seed's, the same for every seed) in OUT/seed-S, then
    OUT/summary.json and OUT/report.md combining them: per model and bucket the mean over seeds and targets with
    its interval (eval.seeds.combine_seeds), each seed's value, and the validation loss per seed. With `resume`, a
    seed whose folder holds a finished comparison of the same settings is read back (its report written again from
    its rows), and any other seed folder is cleared and run."""
    from goldfish.app.report import write_compare_report  # matplotlib: only when a report is written
    from goldfish.app.report_seeds import write_seeds_report

    started = time.perf_counter()
    log = options.get("log", print)
    comparisons: dict[int, Comparison] = {}
    summaries: dict[int, CompareResult] = {}
    main = is_main_process(options.get("grid"))
    for seed in spec.seeds:
        seeded = replace(spec, seeds=(), resume=False, init_seed=seed, train=replace(spec.train, seed=seed))
        folder = out_dir / f"seed-{seed}"
        comparison = Comparison(seeded, folder, **options)
        done = finished_summary(folder, comparison.config_record()) if resume else None
        if done is not None:
            log(f"seed {seed} ({len(comparisons) + 1} of {len(spec.seeds)}): finished in OUT/seed-{seed}, read back")
            comparison.prepare()  # the documents and the stream (exposures, insertion steps): nothing trains
            comparisons[seed] = comparison
            summaries[seed] = read_finished_seed(comparison, done)
            if main:
                write_compare_report(summaries[seed], folder)
                write_target_rows(folder / TARGETS_FILE, comparison_target_rows(comparison))
            continue
        if resume and main and folder.exists():  # unfinished, or of other settings: run it again from scratch
            shutil.rmtree(folder)
        if resume and options.get("grid") is not None:
            barrier(options["grid"].group(*AXES))
        if main:
            log(f"seed {seed} ({len(comparisons) + 1} of {len(spec.seeds)}): OUT/seed-{seed}")
        comparisons[seed] = comparison
        ran = comparison.run()
        if ran is not None:
            summaries[seed] = ran
    if not is_main_process(options.get("grid")):
        return None
    timings = {"total": time.perf_counter() - started}
    result = replace(combine_seed_runs(spec, comparisons, summaries), timings_s=timings)
    write_seeds_report(result, out_dir)
    # every seed's per-target rows in one file (each seed folder's own, as that seed's run wrote it)
    write_target_rows(out_dir / TARGETS_FILE, seeds_target_rows(out_dir, spec.seeds))
    log(f"wrote {out_dir / 'summary.json'} and {out_dir / 'report.md'} (seeds {','.join(map(str, spec.seeds))})")
    return result
