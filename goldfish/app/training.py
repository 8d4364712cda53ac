"""One training run of `goldfish train` (and of each model `goldfish compare` trains), as a short sequence of parts.

Each part is chosen once from the run's settings:

    build_model      where the weights come from: given, an HF folder loaded sharded on the grid, or the model's
                     initial weights; then LoRA adapters and a resumed run's weights
    training_rows    where the rows come from: one example per document (repeated per bucket), whole documents
                     packed into rows (--pack), or targets inserted into a background stream (--background)
    place_on_grid    the model sharded on the grid, with what the run record says of it
    CheckpointWriter how a checkpoint is written: plain, sharded on a grid, or LoRA's merged model and adapter
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from torch import nn

import engine
from conventions import IGNORE_INDEX
from data.atomic import write_json_atomic
from data.background import Background
from data.batch import Row
from data.corpus import TokenizedCorpus
from data.rows import pack_documents
from engine import Grid, can_load_sharded, is_main_process, is_vocab_parallel, load_sharded
from goldfish.app import lora
from goldfish.app.background_run import prepare_background
from goldfish.app.config import TrainSpec, background_train_config
from goldfish.app.data_settings import row_mask
from goldfish.app.interrupt import ctrl_c_stops
from goldfish.app.model_config_check import check_config_file
from goldfish.app.model_files import (
    check_vocabulary,
    initial_model,
    load_model_weights,
    save_hf_model,
    save_parallel_hf_model,
)
from goldfish.app.models import is_tiny_model
from goldfish.app.prepare import Prepared, pad_token_id, prepare_data
from goldfish.app.pretrained import check_weights_readable
from goldfish.app.records import TrainedCopies, checkpoint_record, run_record, trained_copies
from goldfish.app.run_grid import grid_sizes
from goldfish.app.tracking import ReportTo, tracker
from goldfish.app.training_rows import (
    chat_row_of,
    check_mask_drops,
    make_examples,
    make_step_loss,
    target_drops,
    validation_loss_fn,
)
from goldfish.app.weights_folder import local_weights_folder

RUN_RECORD = "run.json"


def train_model(
    spec: TrainSpec,
    out_dir: Path,
    *,
    prepared: Prepared | None = None,
    model: nn.Module | None = None,
    resume_from: Path | None = None,
    grid: Grid | None = None,
    log: Callable[..., None] = print,
    on_epoch_end: Callable[[nn.Module, int, int], None] | None = None,
    background: Background | None = None,
    background_corpus: TokenizedCorpus | None = None,
    report_to: ReportTo = "none",
    verify: bool = True,
    on_validation: Callable[[nn.Module, int, float], None] | None = None,
    stop_on_ctrl_c: bool = False,
) -> tuple[nn.Module, Prepared]:
    """Train one model: OUT/checkpoint (HF checkpoint, tokenizer, trainer state), OUT/run.json, OUT/metrics.jsonl.
    Returns the trained model (LoRA's merged one) and the documents; `background`/`background_corpus` reuse a
    stream or corpus the caller built; on_epoch_end(model, epoch, step) runs after each epoch on every rank;
    on_validation(model, step, val_loss) after each validation of a background run (engine.training.train).
    stop_on_ctrl_c: a Ctrl-C while it trains stops it after the step in progress, with that step's checkpoint
    (engine.training.train.TrainingStopped; goldfish.app.interrupt)."""
    prepared = prepared or prepare_data(spec.data, spec.model, log=log)
    model = build_model(spec, prepared, grid, model, resume_from, log=log)
    rows = training_rows(spec, prepared, grid, log, background=background, corpus=background_corpus)
    log(rows.summary + _run_notes(spec, model, grid, rows))
    check_mask_drops(spec.mask, rows.n_dropped, spec.data)
    record = rows.add_to_record(run_record(spec, prepared), spec.data.seq_len)
    model = place_on_grid(model, grid, record, verify=verify, log=log)
    if resume_from is not None:  # refused before run.json is rewritten (the engine checks it again on resume)
        step = engine.check_resume(resume_from, rows.train_config)
        total = engine.total_steps_of(len(rows.examples), rows.train_config)
        log(f"resuming {resume_from} at step {step} of {total}")
    write_plan(out_dir, record, grid)
    stops = ctrl_c_stops(announce=is_main_process(grid)) if stop_on_ctrl_c else nullcontext(None)
    with tracker(report_to, out_dir if is_main_process(grid) else None) as on_log, stops as stop:
        fit(model, rows, spec, prepared, record, out_dir, grid, resume_from, on_epoch_end, on_log, on_validation, stop)
    return (lora.merged_model(model).eval() if spec.lora.enabled else model), prepared


def fit(
    model: nn.Module,
    rows: TrainingRows,
    spec: TrainSpec,
    prepared: Prepared,
    record: dict[str, Any],
    out_dir: Path,
    grid: Grid | None,
    resume_from: Path | None,
    on_epoch_end: Callable[[nn.Module, int, int], None] | None,
    on_log: Callable[..., None] | None,
    on_validation: Callable[[nn.Module, int, float], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> None:
    """engine.training.train on the run's rows: the goldfish loss of spec's mask, checkpoints by CheckpointWriter,
    the held-out validation rows of a background run; `stop`: asked after each step (engine.training.train)."""
    engine.train(
        model,
        rows.examples,
        make_step_loss(spec.mask, prepared.special_token_ids),
        rows.train_config,
        out_dir=out_dir,
        grid=grid,
        resume_from=resume_from,
        save_model=CheckpointWriter(spec, prepared, record, rows, grid),
        on_epoch_end=on_epoch_end,
        validation=rows.validation,
        validation_loss_fn=validation_loss_fn(prepared),
        on_log=on_log,
        on_validation=on_validation,
        stop=stop,
    )


def write_plan(out_dir: Path, record: dict[str, Any], grid: Grid | None) -> None:
    """OUT/run.json, the plan of the whole run (main process only)."""
    if is_main_process(grid):
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out_dir / RUN_RECORD, record)


# ----- where the weights come from -----------------------------------------------------------------------------


def build_model(
    spec: TrainSpec,
    prepared: Prepared,
    grid: Grid | None,
    model: nn.Module | None,
    resume_from: Path | None,
    *,
    log: Callable[..., None],
) -> nn.Module:
    """The model to train: `model` if given; under a grid, a model with a local folder of safetensors weights (the
    folder, a GGUF file's export, a hub model's snapshot: goldfish.app.weights_folder) loaded sharded (built on the
    meta device, each rank reads only its own slices); on a pipe grid (without LoRA) a resumed run's checkpoint folder
    too, and each rank builds and reads only its own pipeline stages, the others left on the meta device; else the
    model's initial weights. Then LoRA's adapters (a resumed LoRA run starts from the base weights and reloads its
    adapter) or a resumed run's full weights (valid at any grid)."""
    given = model is not None
    source = spec.model if resume_from is None else str(resume_from)  # where the weights come from
    if not given and grid is not None and resume_from is None and not is_tiny_model(spec.model):
        folder = local_weights_folder(spec.model, grid)  # a hub name's snapshot, a GGUF file's export, the folder
        source = str(folder) if folder is not None else source
    pipelined = grid is not None and grid.shape.pipe > 1 and not spec.lora.enabled
    sharded = not given and grid is not None and (resume_from is None or pipelined) and can_load_sharded(source)
    staged = sharded and pipelined
    if sharded:
        pipe = spec.train.pipe_config if staged else None  # the cut engine.train's Pipeline takes
        check_config_file(source)  # the one-line refusals load_pretrained_model gives a folder, before any read
        check_weights_readable(source)
        model = load_sharded(source, grid, pipe=pipe)  # place_on_grid verifies its sharding once (verify)
        check_vocabulary(model, prepared, spec.model)
    if not given and grid is not None and grid.shape.pipe > 1:
        log(_pipe_weights_line(spec, source, staged))
    model = model if model is not None else initial_model(spec.model, prepared, spec.init_seed)
    if spec.lora.enabled:
        if grid is not None:
            lora.check_grid(grid_sizes(grid))
        model = lora.apply_lora(model, spec.lora, seed=spec.init_seed)
        if resume_from is not None:
            lora.load_adapter_weights(model, resume_from)
    elif resume_from is not None and not staged:  # staged: read from the checkpoint already
        load_model_weights(model, resume_from)
    return model


def _pipe_weights_line(spec: TrainSpec, source: str, staged: bool) -> str:
    """The progress line of a pipe grid's model: each rank built and read only its own stages (from `source`, the
    model's folder or a resumed run's checkpoint), or why every rank built the whole model (its other stages then go
    to the meta device when engine.train's Pipeline is built)."""
    if staged:
        return f"model: each pipe rank built and read only its own stages' weights from {source}"
    if spec.lora.enabled:
        reason = "LoRA draws its adapters over the whole model"
    elif is_tiny_model(spec.model):
        reason = "a model at random init draws every layer from one random stream"
    else:
        reason = f"{source} has no safetensors weights (pickled ones only) or could not be fetched as a folder"
    return f"model: built whole on every pipe rank ({reason}), then each keeps only its own stages"


# ----- where the rows come from ----------------------------------------------------------------------------------


@dataclass
class TrainingRows:
    """The rows a run trains on and what they are: `examples` (a list, or a background stream read as it trains),
    the TrainConfig they train with, held-out validation rows (background runs), the copies of each document they
    hold (for checkpoints' exposure records), the dropped-target count checked against the mask, and the summary
    line the run prints."""

    examples: Sequence[Row]  # the run's rows (data.batch.Row): examples, packed rows or a background stream
    train_config: Any
    copies: TrainedCopies
    n_dropped: int
    summary: str
    validation: Sequence[Row] | None = None
    background: Background | None = None
    target_copies: dict[str, int] = field(default_factory=dict)  # background: copies of each training document

    def tokens_read(self, steps: int, seq_len: int) -> int:
        """Tokens of the rows the first `steps` optimizer steps read (every row is `seq_len` tokens)."""
        read = engine.rows_consumed(len(self.examples), self.train_config, steps)
        return seq_len * read.n_rows(len(self.examples))

    def add_to_record(self, record: dict[str, Any], seq_len: int) -> dict[str, Any]:
        """The run record with the tokens the whole run trains on, and what a background run adds: its own
        TrainConfig, the corpus record and the copies of each target it trains on."""
        record["tokens_trained"] = self.tokens_read(
            engine.total_steps_of(len(self.examples), self.train_config), seq_len
        )
        if self.background is not None:
            record["train"] = asdict(self.train_config)
            record["corpus"] = self.background.record
            record["repeats"] = dict(self.target_copies)
        return record


def training_rows(
    spec: TrainSpec,
    prepared: Prepared,
    grid: Grid | None,
    log: Callable[..., None],
    *,
    background: Background | None = None,
    corpus: TokenizedCorpus | None = None,
) -> TrainingRows:
    """The rows of `spec`'s data setting: background stream, packed documents, or one example per document."""
    if spec.data.background is not None:
        return _background_rows(spec, prepared, background or prepare_background(spec, prepared, grid, log, corpus))
    if spec.data.pack:
        return _packed_rows(spec, prepared)
    return _example_rows(spec, prepared)


def _repeated(spec: TrainSpec, prepared: Prepared, repeats: dict[str, int]) -> str:
    if set(repeats.values()) == {1}:
        return ""
    counts = "/".join(map(str, spec.data.train_buckets))
    return f" ({len(prepared.split.train)} documents repeated {counts} times per epoch)"


def _counted(spec: TrainSpec, examples: Sequence[Row], what: str, *, packed: bool) -> tuple[int, str]:
    """(dropped targets, the summary line) of rows built ahead of training; `packed` rows say their target count."""
    n_dropped = sum(int(e.dropped.sum()) for e in examples)
    n_targets = sum(int((e.targets != IGNORE_INDEX).sum()) for e in examples)
    if packed:
        what += f", whole documents packed ({n_targets} targets per epoch)"
    line = (
        f"train {spec.mask.label}: {len(examples)} sequences{what}, {n_dropped}/{n_targets} targets dropped "
        f"({n_dropped / max(n_targets, 1):.3f}), {spec.train.epochs} epochs"
    )
    return n_dropped, line


def _example_rows(spec: TrainSpec, prepared: Prepared) -> TrainingRows:
    repeats = spec.data.example_repeats(prepared.split)
    examples = make_examples(
        prepared.split.training_documents,
        spec.mask,
        prepared.special_token_ids,
        repeats,
        chat_row=chat_row_of(prepared),
    )
    n_dropped, line = _counted(spec, examples, _repeated(spec, prepared, repeats), packed=False)
    return TrainingRows(examples, spec.train, trained_copies(prepared, examples, repeats), n_dropped, line)


def _packed_rows(spec: TrainSpec, prepared: Prepared) -> TrainingRows:
    repeats = spec.data.example_repeats(prepared.split)
    documents = prepared.split.training_documents
    examples, pack_order = pack_documents(
        documents,
        [repeats[str(d.id)] for d in documents],
        spec.data.seq_len,
        row_mask(spec.mask, prepared.special_token_ids),
        eos_id=prepared.tokenizer.eos_token_id,
        pad_id=pad_token_id(prepared.tokenizer),
        seed=spec.train.seed,
        multiple=spec.train.batch_size,
    )
    n_dropped, line = _counted(spec, examples, _repeated(spec, prepared, repeats), packed=True)
    copies = trained_copies(prepared, examples, repeats, pack_order=pack_order)
    return TrainingRows(examples, spec.train, copies, n_dropped, line)


def _background_rows(spec: TrainSpec, prepared: Prepared, background: Background) -> TrainingRows:
    """Targets inside a background stream: not read ahead of training, so the mask's drops are counted on the
    targets themselves."""
    repeats = spec.data.example_repeats(prepared.split)
    train_config = background_train_config(spec.train)
    examples, validation = background.rows, background.validation
    steps = engine.total_steps_of(len(examples), train_config)
    trained = sorted(set(background.exposures[str(d.id)] for d in prepared.split.train))
    line = (
        f"train {spec.mask.label}: {len(examples)} rows of {spec.data.seq_len} tokens in the stream, {steps} steps; "
        f"{len(prepared.split.train)} targets trained on {'/'.join(map(str, trained))} times, "
        f"{len(prepared.split.heldout)} held out; validation {len(validation) if validation else 0} rows; "
        f"{background.record['n_removed_as_target_copies']} background documents removed as copies of targets "
        f"({background.record['removed_copies']['near']} near copies)"
    )
    line += "".join(f"\nwarning: {warning}" for warning in background.record["warnings"])
    copies = trained_copies(prepared, examples, repeats, background=background)
    n_dropped = target_drops(spec.mask, prepared)
    ids = {str(d.id) for d in prepared.split.training_documents}
    target_copies = {k: v for k, v in background.exposures.items() if k in ids}
    return TrainingRows(examples, train_config, copies, n_dropped, line, validation, background, target_copies)


def _run_notes(spec: TrainSpec, model: nn.Module, grid: Grid | None, rows: TrainingRows) -> str:
    """The grid and LoRA's share of trainable parameters, after the rows' summary (a background run's line says the
    stream instead)."""
    if rows.background is not None:
        return ""
    notes = f", grid {grid.shape}" if grid is not None else ""
    if spec.lora.enabled:
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        notes += (
            f", LoRA rank {spec.lora.rank} alpha {spec.lora.scale_alpha:g} on {','.join(spec.lora.targets)}: "
            f"{trainable} of {sum(p.numel() for p in model.parameters())} parameters train"
        )
    return notes


# ----- the grid and the checkpoints ------------------------------------------------------------------------------


def place_on_grid(
    model: nn.Module, grid: Grid | None, record: dict[str, Any], *, verify: bool, log: Callable[..., None]
) -> nn.Module:
    """The model sharded on `grid` (itself without one); the run record gets the grid's sizes and whether the
    embeddings and lm_head are split by vocabulary over x*y*z (whenever the grid has tensor parallelism and the
    vocabulary divides)."""
    if grid is None:
        return model
    record["grid"] = grid_sizes(grid)
    if not any(p.is_meta for p in model.parameters()):  # a pipe rank's own stages are loaded on its device already
        model = model.to(grid.device)
    model = engine.parallelize(model, grid, verify=verify, report=_verification_logger(log))
    record["vocab_parallel"] = is_vocab_parallel(model.get_input_embeddings())
    return model


class CheckpointWriter:
    """The trainer's save_model: writes the checkpoint's model with the record of what its first `step` steps
    trained, as the run needs it (LoRA: rank 0 writes the merged model and the adapter; on a grid: the shards
    gathered into one HF folder; else the plain model)."""

    def __init__(
        self, spec: TrainSpec, prepared: Prepared, record: dict[str, Any], rows: TrainingRows, grid: Grid | None
    ) -> None:
        self.spec, self.prepared, self.record, self.rows, self.grid = spec, prepared, record, rows, grid

    def __call__(self, model: nn.Module, folder: Path, step: int) -> None:
        rows, tokenizer = self.rows, self.prepared.tokenizer
        at_step = checkpoint_record(self.record, rows.copies, len(rows.examples), rows.train_config, step)
        at_step["tokens_trained"] = rows.tokens_read(step, self.spec.data.seq_len)  # by this checkpoint's step
        if self.spec.lora.enabled:  # data and pipe axes only: a rank holds whole tensors (its stages' on a pipe grid)
            if self.grid is not None and self.grid.shape.pipe > 1:
                model = _gathered_on_rank0(model, self.grid)  # rank 0 holds its own stages' weights only
            if is_main_process(self.grid):
                lora.save_lora(model, folder, lambda plain, into: save_hf_model(plain, tokenizer, at_step, into))
        elif self.grid is not None:
            save_parallel_hf_model(model, self.grid, tokenizer, at_step, folder)
        else:
            save_hf_model(model, tokenizer, at_step, folder)


def _gathered_on_rank0(model: nn.Module, grid: Grid) -> nn.Module | None:
    """On rank 0, a copy of `model` holding the whole model's weights, each pipeline stage's from its own ranks
    (engine.full_state_dict); None on the other ranks. Collective."""
    state = engine.full_state_dict(model, grid, rank0_only=True)
    if grid.rank != 0:
        return None
    whole = copy.deepcopy(model)  # the other stages' parameters are on the meta device: no storage copied
    whole.load_state_dict(state, assign=True)
    return whole


def _verification_logger(log: Callable[[str], None]) -> Callable[[Any], None]:
    """A report callback for engine.parallelize(verify=True): one line with what the check ran and cost."""

    def report(result: Any) -> None:
        log(
            f"sharding of {result.family} verified against one process on a miniature ({result.parameters / 1e6:.2f}M "
            f"parameters, 2 layers) in {result.seconds:.1f} s"
        )

    return report
