"""The training loop: data order, micro-batches, schedule, clipping, logging, atomic checkpoints and exact resume.

It knows nothing of goldfish: the caller hands it examples (dicts of equal-length 1-D tensors, one per sequence) and
a loss function that returns the SUM of its per-token losses and the number of tokens behind it. The loop divides by
the token count of the whole optimizer step (all micro-batches, all ranks), so a run's gradient is the gradient of
the mean token loss over the global batch whatever the accumulation or the grid.

Rows layouts (TrainConfig.rows, engine/models/parallelize.py): "own" gives every rank its own rows of a step, so a
step's rows must divide by the world size; "shared" gives every rank of an x*y tensor-parallel group the same rows
(after AxoNN), split over data and z only, so they need only divide by data*z. Loss sums and token counts are then
summed over data and z only: each x*y group counts its rows once.
"""

from __future__ import annotations

import json
import math
import sys
import time
from contextlib import ExitStack, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from data.atomic import write_text_atomic
from engine.core import comm
from engine.core.grid import Grid, GridShape, is_main_process
from engine.core.placement import refuse_mixed
from engine.core.vocab_parallel import causal_lm_token_losses
from engine.memory.activation import checkpoint_decoder_layers
from engine.memory.offload import ActivationOffload
from engine.memory.zero import ZeroError, make_adamw, shard_data_axis, zero_state
from engine.models.compile import compiled_decoder_layers, eager_stance
from engine.models.parallelize import rows_layout
from engine.spec import (
    ParallelLayout,
    RowsLayout,
    row_split_axes,
)
from engine.training.batch import Collate, TrainingBatch, stack_rows
from engine.training.checkpoint import (
    AsyncSaver,
    CheckpointError,
    is_engine_checkpoint,
    load_checkpoint,
    load_serial_optimizer_state,
    read_trainer_state,
    save_checkpoint,
)
from engine.training.config import OPTIMIZERS, TrainConfig  # noqa: F401 - re-exported: defined torch-free
from engine.training.pipeline import Pipeline
from engine.training.state import clip_grad_norm_, sync_gradients

METRICS_FILE = "metrics.jsonl"


@dataclass
class StepLoss:
    """What a loss function returns for one micro-batch.

    loss_sum: scalar tensor with grad, the SUM of the optimised per-token losses.
    n_tokens: how many tokens loss_sum sums over.
    extras: other quantities to log, as (sum, count) pairs; logged as sum/count over the whole step.
    """

    loss_sum: torch.Tensor
    n_tokens: int
    extras: dict[str, tuple[float, int]] = field(default_factory=dict)


LossFn = Callable[[nn.Module, Any], StepLoss]  # (model, the micro-batch its rows were stacked into)


@dataclass(frozen=True)
class TokenLossFn:
    """A loss that sees the model only through the per-token cross-entropies of next-token targets: the form a
    pipeline's last stage can compute (engine/training/pipeline.py), and a LossFn everywhere else.

    targets(batch) -> (B, T) int64 next-token targets (IGNORE_INDEX where none).
    reduce(token_losses (B, T) float32, batch) -> StepLoss of those rows; `batch` holds the same rows.
    collate: how the rows are stacked into the batch the two read (engine.training.batch; mapping rows by default).
    """

    targets: Callable[[Any], torch.Tensor]
    reduce: Callable[[torch.Tensor, Any], StepLoss]
    collate: Collate = stack_rows

    def __call__(self, model: nn.Module, batch: TrainingBatch) -> StepLoss:
        token_ce = causal_lm_token_losses(model, batch.input_ids, self.targets(batch), position_ids=batch.position_ids)
        return self.reduce(token_ce, batch)


@dataclass
class TrainResult:
    steps: int
    history: list[dict[str, Any]]


def steps_per_epoch(n_examples: int, batch_size: int) -> int:
    return math.ceil(n_examples / batch_size)


def total_steps_of(n_examples: int, config: TrainConfig) -> int:
    """Optimizer steps of a run: every epoch, or config.max_steps when that is fewer."""
    total = config.epochs * steps_per_epoch(n_examples, config.batch_size)
    return min(total, config.max_steps) if config.max_steps else total


def epoch_order(n_examples: int, seed: int, epoch: int, shuffle: bool = True) -> torch.Tensor:
    """The example order of one epoch: a function of (seed, epoch) only, so a resumed run sees the same data.
    shuffle False: 0, 1, 2, ... (the examples' own order, e.g. a stream that is shuffled already)."""
    if not shuffle:
        return torch.arange(n_examples)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n_examples, generator=generator)


def step_rows(n_examples: int, config: TrainConfig, step: int) -> torch.Tensor:
    """The example indices optimizer step `step` (0-based) reads over all ranks: the epoch's order, sliced by step.
    The training loop reads exactly these (each rank its share), so what a run has trained is a function of its
    settings and step count, the same across resumes."""
    epoch, index_in_epoch = divmod(step, steps_per_epoch(n_examples, config.batch_size))
    order = epoch_order(n_examples, config.seed, epoch, config.shuffle)
    return order[index_in_epoch * config.batch_size : (index_in_epoch + 1) * config.batch_size]


@dataclass(frozen=True)
class RowsRead:
    """The example indices the first `steps` optimizer steps read: every index once in each of `whole_epochs`
    epochs, then `partial` (the begun epoch's, each index at most once). Held as a count and one tensor, not one
    tensor per epoch: a run of a million epochs costs as little to describe as a run of one."""

    whole_epochs: int
    partial: torch.Tensor  # (P,) int64 example indices, P < n_examples; empty when the steps end an epoch

    def n_rows(self, n_examples: int) -> int:
        """Rows read, counting each read of an index (`n_examples`: the examples of the run)."""
        return self.whole_epochs * n_examples + len(self.partial)


def rows_consumed(n_examples: int, config: TrainConfig, steps: int) -> RowsRead:
    """What the first `steps` optimizer steps read: what a checkpoint written after `steps` steps has trained on."""
    whole, rest = divmod(steps, steps_per_epoch(n_examples, config.batch_size))
    if rest == 0:
        return RowsRead(whole, torch.empty(0, dtype=torch.long))
    order = epoch_order(n_examples, config.seed, whole, config.shuffle)
    return RowsRead(whole, order[: min(rest * config.batch_size, n_examples)])


def lr_factor(step: int, total_steps: int, config: TrainConfig) -> float:
    """Multiplier of config.lr at optimizer step `step` (0-based): linear warm-up, then constant or cosine."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / decay_steps)
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW (or SGD); no weight decay on biases and norm weights (1-D parameters), as is standard for transformers.
    A model partitioned with ZeRO stage 1 gets engine.memory.zero.ZeroAdamW (the same update on this rank's chunks).

    SGD's update is lr * gradient, so two runs' weights differ exactly as much as their gradients (times lr): the
    optimizer to prove a parallel run equal to a serial one. AdamW divides by the gradient's own running scale, so its
    first steps move every weight by about lr whatever the gradient's size, which hides a gradient off by a factor."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if config.optimizer == "sgd":
        refuse_mixed(groups, "the optimizer")
        return torch.optim.SGD(groups, lr=config.lr)
    return make_adamw(model, groups, lr=config.lr, betas=(config.beta1, config.beta2))


def prepare_zero(
    model: nn.Module, config: TrainConfig, grid: Grid | None, roots: Sequence[nn.Module] | None = None
) -> None:
    """Partition `model` over the data axis as config.zero_config says (engine.memory.zero.shard_data_axis, with
    `roots`: a pipeline's stages), unless it is partitioned that way already. Raises ZeroError for a setting the grid
    cannot carry."""
    zero = config.zero_config
    current = zero_state(model)
    if current is not None:
        if current.config != zero:
            raise ZeroError(
                f"the model is partitioned with {current.config}, the training config asks for {zero}; "
                "build the model again"
            )
        return
    if zero.stage == 0:
        return
    config.layout(grid.shape if grid is not None else GridShape())  # validated once: ZeroError when it cannot carry it
    shard_data_axis(model, grid, zero, roots=roots)


def _is_distributed(grid: Grid | None) -> bool:
    return grid is not None and grid.world_size > 1


def _row_group(grid: Grid, layout: RowsLayout):
    """The ranks that read different rows in `layout` (all of them, or data x z when x*y groups share rows)."""
    return grid.group(*row_split_axes(layout))


def check_step_rows(n_rows: int, shape: GridShape, layout: RowsLayout = "own") -> None:
    """Refuse (ValueError, naming the other layout when it would split them) a step of `n_rows` sequences that the
    grid `shape` cannot split evenly in rows layout `layout`. Needs no process group: launchers call it too."""
    ParallelLayout(shape=shape, rows=layout).check_step_rows(n_rows)


def _rank_rows(rows: torch.Tensor, grid: Grid | None, layout: RowsLayout = "own") -> torch.Tensor:
    """This rank's share of one optimizer step's rows: an equal contiguous slice per rank ("own" layout), or per
    x*y group ("shared" layout: every rank of the group gets the same slice). Raises ValueError, naming the other
    layout when it would split them, for rows that do not split evenly."""
    if not _is_distributed(grid):
        return rows
    check_step_rows(len(rows), grid.shape, layout)
    group = _row_group(grid, layout)
    share = len(rows) // group.size
    return rows[group.rank * share : (group.rank + 1) * share]


def _stack(
    examples: Sequence[Any], indices: torch.Tensor, step: int, device: torch.device, loss_fn: LossFn
) -> TrainingBatch:
    """One micro-batch of the rows at `indices`, read in optimizer step `step`: stacked by the loss's collate (a
    TokenLossFn's, also through a pipeline's stages), else as mapping rows (engine.training.batch.stack_rows)."""
    collate = loss_fn.collate if isinstance(loss_fn, (TokenLossFn, _ThroughStages)) else stack_rows
    return collate(examples, indices, step, device)


def _all_reduce_sums(values: torch.Tensor, grid: Grid | None, layout: RowsLayout = "own") -> torch.Tensor:
    """The step's loss sums and token counts summed over the ranks that read different rows (every rank, or data x z
    when x*y groups share rows: each row counted once; bookkeeping, not counted as traffic)."""
    return comm.sum_control(values, _row_group(grid, layout)) if _is_distributed(grid) else values


def _sync_and_clip(model: nn.Module, n_tokens: float, config: TrainConfig, grid: Grid | None) -> float:
    """Turn summed gradients into the gradient of the global mean loss; clip; return the pre-clip norm."""
    if _is_distributed(grid):
        sync_gradients(model, grid)
    scale = 1.0 / max(n_tokens, 1.0)
    for parameter in model.parameters():
        if parameter.grad is not None:
            parameter.grad.mul_(scale)
    max_norm = config.max_grad_norm if config.max_grad_norm is not None else float("inf")
    if _is_distributed(grid):
        norm = clip_grad_norm_(model, max_norm, grid)
    else:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return float(norm)


@dataclass
class _StepSums:
    """One optimizer step's bookkeeping, summed over micro-batches (and, once reduced, over ranks): `totals` is
    [loss sum, token count, then (sum, count) per extra quantity in `extra_names` order] in float64."""

    totals: torch.Tensor
    extra_names: list[str]
    n_input_tokens: int  # this rank's input tokens (for tokens/s)

    @property
    def n_tokens(self) -> float:
        return float(self.totals[1])

    def record(self, step: int, epoch: float) -> dict[str, Any]:
        """The metrics.jsonl record of the step: mean loss per token and the mean of each extra quantity."""
        totals = self.totals
        record: dict[str, Any] = {
            "step": step,
            "epoch": epoch,
            "loss": float(totals[0] / max(totals[1], 1.0)),
            "n_tokens": int(totals[1]),
        }
        for i, name in enumerate(self.extra_names):
            total, count = float(totals[2 + 2 * i]), float(totals[3 + 2 * i])
            record[name] = total / count if count > 0 else None
        return record


def _step_rows(
    n_examples: int, config: TrainConfig, epoch: int, index_in_epoch: int, grid: Grid | None
) -> torch.Tensor:
    """The example indices this rank processes in one optimizer step (step_rows, sliced by rank)."""
    step = epoch * steps_per_epoch(n_examples, config.batch_size) + index_in_epoch
    return _rank_rows(step_rows(n_examples, config, step), grid, config.rows)


def _forward_backward(
    model: nn.Module,
    examples: Sequence[Any],
    rows: torch.Tensor,
    step: int,
    loss_fn: LossFn,
    config: TrainConfig,
    device: torch.device,
    autocast: Any,
    offload: ActivationOffload,
) -> _StepSums:
    """Forward and backward over this rank's rows in config.grad_accum micro-batches, leaving the gradient of the
    SUM of the token losses in .grad; returns the step's sums (not yet reduced over ranks). `offload` holds the
    activations saved for backward in host memory (when enabled)."""
    extra_names: list[str] = []
    totals = None
    n_input_tokens = 0
    for micro_rows in torch.tensor_split(rows, min(config.grad_accum, len(rows))):
        batch = _stack(examples, micro_rows, step, device, loss_fn)
        n_input_tokens += batch.input_ids.numel() if batch.input_ids is not None else 0
        with offload:
            with autocast:
                out = loss_fn(model, batch)
            out.loss_sum.float().backward()
        if not extra_names:
            extra_names = sorted(out.extras)
        micro = torch.tensor(_sums_of(out, extra_names), dtype=torch.float64)
        totals = micro if totals is None else totals + micro
    assert totals is not None
    return _StepSums(totals, extra_names, n_input_tokens)


def _sums_of(out: StepLoss, extra_names: list[str]) -> list[float]:
    """One micro-batch's entries of _StepSums.totals: loss sum, token count, then (sum, count) per extra quantity."""
    return [float(out.loss_sum.detach().float()), float(out.n_tokens)] + [
        v for name in extra_names for v in out.extras[name]
    ]


def _pipeline_forward_backward(
    pipes: dict[int, Pipeline],
    examples: Sequence[Any],
    rows: torch.Tensor,
    step: int,
    loss_fn: TokenLossFn,
    config: TrainConfig,
    device: torch.device,
    autocast: Any,
    offload: ActivationOffload,
) -> _StepSums:
    """_forward_backward through a pipeline: each of the config.grad_accum passes runs the pipeline's schedule over
    its micro-batches, the last stage reducing each micro-batch's token losses; the step's sums come from the last
    stage to every rank of the pipeline (a control message). `pipes`: the pipeline of each pass size (rows)."""
    records: list[StepLoss] = []
    n_input_tokens = 0
    for micro_rows in torch.tensor_split(rows, min(config.grad_accum, len(rows))):
        batch = _stack(examples, micro_rows, step, device, loss_fn)
        n_input_tokens += batch.input_ids.numel()
        pipe = pipes[len(micro_rows)]

        def reduce(token_losses: torch.Tensor, chunk: torch.Tensor, batch: TrainingBatch = batch) -> torch.Tensor:
            out = loss_fn.reduce(token_losses, batch.select(chunk))
            records.append(out)
            return out.loss_sum.float()

        with offload, autocast:
            pipe.step_token_losses(batch.input_ids, loss_fn.targets(batch), reduce, batch.position_ids)
    pipe = next(iter(pipes.values()))
    last = pipe.group.size - 1  # the last stage's rank in the pipeline group
    summary = None
    if pipe.group.rank == last:
        names = sorted(records[0].extras)
        summary = (torch.tensor([_sums_of(r, names) for r in records], dtype=torch.float64).sum(0).tolist(), names)
    totals, names = comm.broadcast_object(summary, pipe.group, device, src_group_rank=last)
    return _StepSums(torch.tensor(totals, dtype=torch.float64), names, n_input_tokens)


def train(
    model: nn.Module,
    examples: Sequence[Any],
    loss_fn: LossFn,
    config: TrainConfig,
    *,
    out_dir: str | Path | None = None,
    grid: Grid | None = None,
    resume_from: str | Path | None = None,
    save_model: Callable[[nn.Module, Path, int], None] | None = None,
    on_log: Callable[[dict[str, Any]], None] | None = None,
    on_epoch_end: Callable[[nn.Module, int, int], None] | None = None,
    validation: Sequence[Any] | None = None,
    validation_loss_fn: LossFn | None = None,
    on_validation: Callable[[nn.Module, int, float], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> TrainResult:
    """Train `model` in place for config.epochs over `examples`.

    examples: one row per sequence, stacked into each micro-batch by the loss's collate (a TokenLossFn's; e.g.
        data.batch.Row rows into a data.batch.Batch), or mappings of equal-length 1-D tensors (input_ids, targets,
        ...) that the loss function receives stacked to (B, ...) plus "example_index" (B,) and "step" (0-d, the
        0-based optimizer step): engine.training.batch.
    out_dir: where checkpoints (out_dir/checkpoint) and metrics (out_dir/metrics.jsonl) go; None keeps nothing.
    grid: an engine Grid for parallel runs (every rank calls train with the same arguments), or None. With a pipe
        axis each rank keeps only its pipeline stages' parameters (the others on the meta device, during the run and
        after it: read the trained weights with engine.full_state_dict or from the checkpoint).
    resume_from: a checkpoint folder written by an earlier run with the same examples and config.
    save_model: save_model(model, folder, step) writes the model (and anything else the caller wants in a
        checkpoint, e.g. what the first `step` optimizer steps trained: rows_consumed) into a folder; required when
        out_dir is given. The loop adds its own trainer state next to it.
    A step whose loss or gradient norm is not finite stops the run with NonFiniteLossError (a ValueError naming the
    step) before the optimizer applies it, so no checkpoint holds the diverged weights.
    on_epoch_end: called on every rank as on_epoch_end(model, epoch, step) after each completed epoch (epoch counts
        from 1; step = optimizer steps done), with the model in eval mode (training mode is restored after), e.g. to
        measure extraction during training. Not called for epochs finished before a resume.
    validation: examples whose mean token loss under `validation_loss_fn` (default: loss_fn) is logged as
        "val_loss" every config.eval_every steps and after the last step (evaluate_loss: split over the ranks like
        the training rows, config.batch_size rows at a time).
    on_validation: called on every rank as on_validation(model, step, val_loss) after each validation (model in
        eval mode, no gradients; training mode is restored after), e.g. to keep the weights of a step whose
        validation loss a later comparison needs.
    stop: asked on every rank after each optimizer step (but the last); when it returns True on any rank, every rank
        writes a checkpoint of the steps done (when out_dir is given and this step wrote none) and raises
        TrainingStopped: e.g. a Ctrl-C handler's flag, so that an interrupted run keeps its finished steps.

    examples may be any sequence (rows built when indexed: only this rank's rows of each step are read). When it
    has state_dict() / load_state_dict(state) (a resumable data source), its state is saved in every checkpoint
    and handed back on resume, so the source can check (or restore) that it yields the same rows.
    """
    if not examples:
        raise ValueError("no training examples: give at least one document")
    config.check_async_save(grid.shape.world_size if _is_distributed(grid) else 1)
    device = next(p.device for p in model.parameters() if not p.is_meta)  # a pipe rank loaded with its stages only
    if config.activation_checkpointing:  # before ZeRO (fully_shard), the order composable checkpoint needs
        checkpoint_decoder_layers(model)
    per_epoch = steps_per_epoch(len(examples), config.batch_size)
    total_steps = total_steps_of(len(examples), config)
    pipes = _pipelines(model, loss_fn, config, grid, len(examples))  # ZeRO partitions the stages as they are built
    pipe = next(iter(pipes.values()), None)  # the full steps' pipeline; the others share its stages
    if pipe is not None and validation is not None:
        validation_loss_fn = _through_stages(pipe, validation_loss_fn or loss_fn)  # refused now, not at step N
    if pipe is None:
        prepare_zero(model, config, grid)
    optimizer = make_optimizer(model, config)  # a pipeline's other stages never get gradients here: no state
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total_steps, config))
    is_main = is_main_process(grid)
    out_path = Path(out_dir) if out_dir is not None else None
    if out_path is not None and save_model is None:
        raise ValueError("train(out_dir=...) needs save_model to write the model into checkpoints")

    start_step = 0
    if resume_from is not None:  # a pipeline's rank loads its own stages' weights and optimizer state only
        start_step = _resume(Path(resume_from), model, optimizer, scheduler, config, total_steps, grid, examples)

    metrics_file = None
    if out_path is not None and is_main:
        out_path.mkdir(parents=True, exist_ok=True)
        metrics_file = _open_metrics(out_path / METRICS_FILE, start_step)

    history: list[dict[str, Any]] = []
    model.train()
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=config.precision == "bf16")
    offload = ActivationOffload(config.offload_activations, device)
    bar = tqdm(
        total=total_steps, initial=start_step, desc="train", unit="step", disable=not (config.progress and is_main)
    )
    if _is_distributed(grid):
        grid.traffic.reset()
        grid.traffic.enabled = True  # per-step bytes by grid axis group, logged below
    # With async_save a checkpoint's DCP write runs in the background; the next save and the end of the run wait.
    saver = AsyncSaver(grid) if config.async_save and out_path is not None else None
    # --compile: the decoder layers run compiled in the training steps and eagerly in evaluations (whose shapes would
    # each cost a compilation); the model is returned with its layers' own forward
    compiled = ExitStack()
    if config.compile:
        compiled.enter_context(compiled_decoder_layers(model))
    eager = eager_stance if config.compile else nullcontext
    whole = pipe.whole_model if pipe is not None else nullcontext  # for the hooks that run the whole model

    def checkpoint(done: int) -> None:
        """Write out_dir/checkpoint of the first `done` steps (in the background with async_save)."""
        extra_state = _trainer_state(scheduler, done, config, examples)
        model_files = lambda m, folder: save_model(m, folder, done)  # noqa: E731
        if saver is not None:
            saver.save(out_path / "checkpoint", model, optimizer, extra_state=extra_state, save_model=model_files)
        else:
            distributed = grid if _is_distributed(grid) else None
            save_checkpoint(
                out_path / "checkpoint", model, optimizer, distributed, extra_state=extra_state, save_model=model_files
            )

    try:
        for step in range(start_step, total_steps):
            epoch, index_in_epoch = divmod(step, per_epoch)
            started = time.perf_counter()
            if _is_distributed(grid):  # this step's bytes only, not the last checkpoint's or evaluation's
                grid.traffic.reset()
            optimizer.zero_grad(set_to_none=True)
            with rows_layout(model, config.rows):
                rows = _step_rows(len(examples), config, epoch, index_in_epoch, grid)
                offload.reset(model.parameters())  # placed parameters: see ActivationOffload.reset
                if pipe is None:
                    sums = _forward_backward(model, examples, rows, step, loss_fn, config, device, autocast, offload)
                else:
                    sums = _pipeline_forward_backward(
                        pipes, examples, rows, step, loss_fn, config, device, autocast, offload
                    )
                sums.totals = _all_reduce_sums(sums.totals, grid, config.rows)
                grad_norm = _sync_and_clip(model, sums.n_tokens, config, grid)
            # every rank holds the same reduced sums and global norm, so all stop together, before the update
            _check_finite(sums, grad_norm, step + 1, scheduler.get_last_lr()[0])
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            elapsed = time.perf_counter() - started
            # Read before any checkpoint so its gathers do not count as the next step's traffic.
            step_bytes = grid.traffic.reset() if _is_distributed(grid) else None
            readers = _row_group(grid, config.rows).size if _is_distributed(grid) else 1  # ranks reading different rows
            record = sums.record(step + 1, epoch + (index_in_epoch + 1) / per_epoch)
            record.update(lr=lr, grad_norm=grad_norm, tokens_per_s=sums.n_input_tokens * readers / elapsed)
            if step_bytes is not None:
                record["bytes_sent"] = step_bytes  # this rank (rank 0 in the log), per process group of the grid
            if offload.enabled:  # this rank's saved activations at the step's peak: all of them, and left on device
                record["activation_bytes"] = offload.stats.saved_peak_bytes
                record["activation_device_bytes"] = offload.stats.device_peak_bytes
            done = step + 1
            evaluate_now = done == total_steps or (config.eval_every and done % config.eval_every == 0)
            if validation is not None and evaluate_now:
                chosen = validation_loss_fn or loss_fn
                with eager():
                    record["val_loss"] = evaluate_loss(model, validation, chosen, config, grid, step=done)
                if on_validation is not None:
                    model.eval()
                    with torch.no_grad(), eager(), whole():
                        on_validation(model, done, record["val_loss"])
                    model.train()
                if _is_distributed(grid):
                    grid.traffic.reset()  # the evaluation's (and the hook's) bytes are not the next step's
            history.append(record)
            if metrics_file is not None:
                metrics_file.write(json.dumps(record) + "\n")
                metrics_file.flush()
            if on_log is not None and is_main:
                on_log(record)
            bar.set_postfix(loss=f"{record['loss']:.4f}")
            bar.update(1)

            saved = out_path is not None and _saves_now(done, total_steps, config)
            if saved:
                checkpoint(done)
            if on_epoch_end is not None and done % per_epoch == 0:
                model.eval()
                with torch.no_grad(), eager(), whole():
                    on_epoch_end(model, done // per_epoch, done)
                model.train()
            if done < total_steps and _stop_requested(stop, grid):
                if out_path is not None and not saved:
                    checkpoint(done)
                if saver is not None:
                    saver.close()  # published before the run says where it is
                    saver = None
                raise TrainingStopped(done, total_steps, None if out_path is None else out_path / "checkpoint")
        if saver is not None:
            saver.close()  # the last checkpoint is written and published before the run returns
            saver = None
    finally:
        if saver is not None:  # the run failed: the checkpoint in flight still finishes (its write is collective)
            try:
                saver.close()
            except CheckpointError as error:  # the run's own failure is the one to report
                print(f"warning: the checkpoint in flight failed as well: {error}", file=sys.stderr)
        bar.close()
        compiled.close()
        if _is_distributed(grid):
            grid.traffic.enabled = False
        if metrics_file is not None:
            metrics_file.close()
    return TrainResult(steps=total_steps, history=history)


def _saves_now(done: int, total_steps: int, config: TrainConfig) -> bool:
    """Whether a checkpoint is written after `done` optimizer steps."""
    return done == total_steps or bool(config.save_every and done % config.save_every == 0)


def _pipelines(
    model: nn.Module, loss_fn: LossFn, config: TrainConfig, grid: Grid | None, n_examples: int
) -> dict[int, Pipeline]:
    """The pipelines of a grid whose pipe axis is > 1, by the rows of a pipeline pass ({} otherwise): one for the full
    steps and, when an epoch ends with a shorter step, one for it on the same stage modules (torch's stages keep the
    micro-batch shape of their first step). Built after checking every step of the run can feed them (ValueError)."""
    if grid is None or grid.shape.pipe == 1:
        return {}
    if not isinstance(loss_fn, TokenLossFn):
        raise ValueError(
            "a pipeline computes the loss on its last stage from per-token losses: give train a TokenLossFn"
        )
    sizes = [min(config.batch_size, n_examples)]
    reaches_epoch_end = total_steps_of(n_examples, config) >= steps_per_epoch(n_examples, config.batch_size)
    if n_examples % config.batch_size and n_examples > config.batch_size and reaches_epoch_end:
        sizes.append(n_examples % config.batch_size)  # the shorter last step of each epoch (n_examples % batch_size)
    microbatches = config.check_pipeline(grid.shape, tuple(sizes))
    settings, pipes = config.pipe_config, {}
    for rows, count in microbatches.items():
        first = next(iter(pipes.values()), None)
        pipes[rows] = Pipeline(
            model,
            grid.group("pipe"),
            schedule=settings.schedule,
            microbatches=count,
            virtual=settings.virtual,
            splits=list(settings.splits) or None,
            prepare=lambda stages: prepare_zero(model, config, grid, roots=stages),
            stages=None if first is None else first.all_stages,
        )
    return pipes


@dataclass(frozen=True)
class _ThroughStages:
    """A TokenLossFn computed in one pass through a pipeline's stages (a LossFn; its rows stacked by its collate)."""

    pipe: Pipeline
    loss_fn: TokenLossFn

    @property
    def collate(self) -> Collate:
        return self.loss_fn.collate

    def __call__(self, model: nn.Module, batch: TrainingBatch) -> StepLoss:
        token_ce = self.pipe.token_losses(batch.input_ids, self.loss_fn.targets(batch), batch.position_ids)
        return self.loss_fn.reduce(token_ce, batch)


def _through_stages(pipe: Pipeline, loss_fn: LossFn) -> _ThroughStages:
    """`loss_fn` (a TokenLossFn) computed in one pass through the pipeline's stages, each on its own rank
    (Pipeline.token_losses): an evaluation of a pipelined model, whose ranks hold their own stages only."""
    if not isinstance(loss_fn, TokenLossFn):
        raise ValueError("evaluating a pipelined model needs a TokenLossFn (per-token losses on the last stage)")
    return _ThroughStages(pipe, loss_fn)


class TrainingStopped(KeyboardInterrupt):
    """The run stopped because `train(stop=...)` asked it to: every rank stopped after the same optimizer step,
    `step` of `total_steps`, whose checkpoint is `checkpoint` (None when the run keeps none: no out_dir). A
    KeyboardInterrupt, so that code which cleans up after an interrupt does so, and no `except Exception` takes it
    for a failure."""

    def __init__(self, step: int, total_steps: int, checkpoint: Path | None) -> None:
        super().__init__(f"stopped after step {step} of {total_steps}")
        self.step, self.total_steps, self.checkpoint = step, total_steps, checkpoint


def _stop_requested(stop: Callable[[], bool] | None, grid: Grid | None) -> bool:
    """Whether any rank's `stop()` asks the run to stop now: one flag maximised over the world (a control message),
    so that every rank stops after the same step and writes its share of the same checkpoint."""
    if stop is None:
        return False
    flag = bool(stop())
    if not _is_distributed(grid):
        return flag
    wanted = torch.tensor([1 if flag else 0], dtype=torch.int32, device=grid.device)
    return bool(comm.max_over_world(wanted).item())


class NonFiniteLossError(ValueError):
    """A training step whose loss or gradient norm is inf or NaN: the run diverged (or its data or settings are
    broken), and every later step would train on NaN weights."""


def _check_finite(sums: _StepSums, grad_norm: float, step: int, lr: float) -> None:
    """Raise NonFiniteLossError for a step (1-based) whose loss or gradient norm is not finite."""
    loss = float(sums.totals[0])
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return
    raise NonFiniteLossError(
        f"the loss is {loss} and the gradient norm {grad_norm} at step {step} (learning rate {lr:g}): the run "
        "diverged and was stopped before this step's update; no checkpoint of it was written. Fix: lower the "
        "learning rate or lengthen the warm-up and start again"
    )


def _open_metrics(path: Path, start_step: int):
    """Open metrics.jsonl for appending one record per step.

    A new run starts it empty. A resumed run keeps the records of the steps its checkpoint holds: when the file
    has more (steps after the checkpoint) or a torn last line (a run killed while writing it), the kept records are
    written to a new file that replaces the old one atomically, so a kill at any moment leaves the history whole."""
    if start_step == 0:
        return path.open("w")
    if not path.exists():
        return path.open("a")
    text = path.read_text()
    lines = text.splitlines()
    torn = bool(lines) and not text.endswith("\n")  # the last record was cut short by a kill
    if torn:
        lines = lines[:-1]
        print(f"{path}: removed its torn last line (a run killed while writing it)", file=sys.stderr)
    kept = []
    for number, line in enumerate(lines, 1):
        if not line:
            continue
        try:
            step = json.loads(line)["step"]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise ValueError(
                f"{path} line {number} is not a metrics record ({error}): it was edited or damaged. Fix: delete "
                "that line (or the file, losing the loss history) and resume again"
            ) from None
        if step <= start_step:
            kept.append(line)
    if torn or len(kept) != sum(1 for line in lines if line):
        write_text_atomic(path, "".join(line + "\n" for line in kept))
    return path.open("a")


def evaluate_loss(
    model: nn.Module,
    examples: Sequence[Any],
    loss_fn: LossFn,
    config: TrainConfig,
    grid: Grid | None = None,
    *,
    step: int = 0,
) -> float:
    """The mean token loss of `examples` under loss_fn (loss sum over token count), without gradients, in eval mode
    (training mode is restored after). Rows are read config.batch_size at a time and split over the ranks as
    training rows are (config.rows), so every rank calls this with the same arguments; a batch must split evenly."""
    device = next(p.device for p in model.parameters() if not p.is_meta)  # a pipeline's rank: its own stages'
    was_training = model.training
    model.eval()
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=config.precision == "bf16")
    totals = torch.zeros(2, dtype=torch.float64)
    try:
        with torch.no_grad(), rows_layout(model, config.rows):
            for first in range(0, len(examples), config.batch_size):
                rows = _rank_rows(torch.arange(first, min(first + config.batch_size, len(examples))), grid, config.rows)
                batch = _stack(examples, rows, step, device, loss_fn)
                with autocast:
                    out = loss_fn(model, batch)
                totals += torch.tensor([float(out.loss_sum.float()), float(out.n_tokens)], dtype=torch.float64)
        totals = _all_reduce_sums(totals, grid, config.rows)
    finally:
        model.train(was_training)
    return float(totals[0] / max(float(totals[1]), 1.0))


def _trainer_state(
    scheduler: torch.optim.lr_scheduler.LRScheduler, step: int, config: TrainConfig, examples: Any = None
) -> dict[str, Any]:
    state: dict[str, Any] = {
        "step": step,
        "scheduler": scheduler.state_dict(),
        "config": asdict(config),
        "torch_rng": torch.random.get_rng_state(),
    }
    if hasattr(examples, "state_dict"):  # a resumable data source: where it stands, to continue exactly
        state["data"] = examples.state_dict()
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    return state


_RESUME_MUST_MATCH = (
    "epochs",
    "batch_size",
    "grad_accum",
    "lr",
    "schedule",
    "warmup_steps",
    "min_lr_ratio",
    "seed",
    "weight_decay",
    "beta1",
    "beta2",
    "max_grad_norm",
    "precision",
    "optimizer",
    "max_steps",
    "shuffle",
)


def _resume(
    directory: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    config: TrainConfig,
    total_steps: int,
    grid: Grid | None,
    examples: Any = None,
) -> int:
    """Restore a checkpoint and return the step to continue from.

    A serial checkpoint (written by a run with no grid or a grid of one rank) restores optimizer, schedule
    and RNG; the caller has already loaded the model weights (a parallel run keeps its shards of the
    optimizer state). A sharded engine checkpoint (written by a parallel run) also restores the parameter
    shards, re-sharding them when this run's grid differs from the saving run's, or loading them whole
    into a serial model.
    """
    sharded = is_engine_checkpoint(directory)
    state = read_trainer_state(directory)
    _check_trainer_state(state, config, total_steps)
    if hasattr(examples, "load_state_dict"):
        if "data" not in state:
            raise ValueError(
                f"{directory} holds no data-source state: it was written by a run on other data; resume "
                "with the settings of the original run"
            )
        examples.load_state_dict(state["data"])
    if not _is_distributed(grid) and not sharded:
        return _load_trainer_state(directory, optimizer, scheduler, config, total_steps)
    if sharded:
        state = load_checkpoint(directory, model, optimizer, grid if _is_distributed(grid) else None)
    else:  # a single-process run's checkpoint, continued in parallel: shard its full optimizer state
        load_serial_optimizer_state(model, optimizer, state.pop("optimizer"))
    _restore_trainer_state(state, optimizer, scheduler)
    return int(state["step"])


def _load_trainer_state(
    directory: Path,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    config: TrainConfig,
    total_steps: int,
) -> int:
    """Restore optimizer, schedule and RNG from a checkpoint; the caller has already loaded the model weights."""
    state = read_trainer_state(directory)
    _check_trainer_state(state, config, total_steps)
    _restore_trainer_state(state, optimizer, scheduler)
    return int(state["step"])


def check_resume(directory: str | Path, config: TrainConfig, n_examples: int | None = None) -> int:
    """Refuse (ValueError) a resume that would not continue the saved run exactly; return the saved step.

    Cheap enough for a launcher to call before any worker process starts: it reads only the checkpoint's trainer
    state. n_examples: training sequences per epoch, which fix the run's step count (None: not checked)."""
    state = read_trainer_state(directory)
    total = None if n_examples is None else config.epochs * steps_per_epoch(n_examples, config.batch_size)
    _check_trainer_state(state, config, total)
    return int(state["step"])


def _check_trainer_state(state: dict[str, Any], config: TrainConfig, total_steps: int | None) -> None:
    """Refuse to resume with settings that would not reproduce the saved run's loss trajectory."""
    saved = state["config"]
    default = TrainConfig()  # a checkpoint older than a setting ran with its default
    changed = [
        f"{key}: {saved.get(key, getattr(default, key))!r} -> {getattr(config, key)!r}"
        for key in _RESUME_MUST_MATCH
        if saved.get(key, getattr(default, key)) != getattr(config, key)
    ]
    if changed:
        raise ValueError(
            "cannot resume with different optimisation settings (the loss trajectory would not be "
            "reproduced): " + "; ".join(changed) + ". Use the settings of the original run."
        )
    if total_steps is not None and state["step"] > total_steps:
        raise ValueError(f"checkpoint is at step {state['step']} but this run has only {total_steps} steps")


def _restore_trainer_state(
    state: dict[str, Any], optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler
) -> None:
    """Optimizer (serial checkpoints carry it here), schedule and RNG."""
    if "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.random.set_rng_state(state["torch_rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
