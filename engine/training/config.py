"""The optimisation settings of a training run (TrainConfig), importable without torch: the command line builds
and validates them before the training loop (engine.training.train, which re-exports them) is loaded."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from engine.spec import (
    DEFAULT_QUANT_BLOCK,
    TRAIN_PRECISION,
    GridShape,
    ParallelLayout,
    PipeConfig,
    PipeSchedule,
    Precision,
    RowsLayout,
    ZeroConfig,
    check_precision,
    check_rows_layout,
    parse_quantize,
)

# The values of TrainConfig's string settings (Precision and PipeSchedule: engine.spec's, beside the tables that
# validate them; tests/unit/test_modes.py checks that they agree).
Optimizer = Literal["adamw", "sgd"]
OPTIMIZERS: tuple[Optimizer, ...] = get_args(Optimizer)
LrSchedule = Literal["constant", "cosine"]  # the learning rate after the linear warm-up
LR_SCHEDULES: tuple[LrSchedule, ...] = get_args(LrSchedule)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings. `batch_size` counts sequences per optimizer step over all ranks. Frozen: a changed
    setting is a new config (dataclasses.replace), so a resolved run's settings stay what was resolved."""

    epochs: int = 1
    batch_size: int = 8
    grad_accum: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    schedule: LrSchedule = "constant"  # "constant" or "cosine", both after a linear warm-up
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1  # cosine floor, as a fraction of lr
    max_grad_norm: float | None = 1.0  # None disables clipping
    precision: Precision = TRAIN_PRECISION  # "fp32", or "bf16" (autocast, fp32 weights)
    seed: int = 0
    save_every: int = 0  # optimizer steps between checkpoints; 0 = only at the end
    async_save: bool = False  # a checkpoint's DCP write runs in the background (runs on a grid of 2 or more ranks)
    progress: bool = True
    zero: int = (
        0  # ZeRO stage over the data axis (engine/memory/zero.py): 0 off, 1 optimizer state, 2 + grads, 3 + params
    )
    zero_node_size: int = 1  # data-axis ranks per node; > 1: hierarchical partitioning (stages 2 and 3)
    zero_inner_levels: tuple[int, ...] = ()  # level sizes inside a node, innermost first (e.g. (2,): GCD pairs)
    zero_quantize: str = ""  # ZeRO++ quantized collectives: "", "weights" (qwZ), "gradients" (qgZ) or both, ","-joined
    zero_quantize_bits: int = 8  # qgZ's codes: 8 or 4 bits
    zero_quantize_block: int = DEFAULT_QUANT_BLOCK  # elements per float32 scale of qwZ and qgZ
    offload_optimizer: bool = False  # AdamW state and update in host memory (stages 2 and 3)
    activation_checkpointing: bool = False  # recompute decoder layers in backward (engine/memory/activation.py)
    offload_activations: bool = False  # activations saved for backward kept in host memory (engine/memory/offload.py)
    compile: bool = False  # decoder layers' forward through torch.compile in training steps (engine/models/compile.py)
    rows: RowsLayout = "own"  # "own" rows per rank (batch % world), or "shared" per x*y group (batch % data*z)
    optimizer: Optimizer = "adamw"  # or "sgd" (plain SGD without momentum: updates proportional to the gradient)
    max_steps: int = 0  # stop after this many optimizer steps (0: run every epoch to the end)
    shuffle: bool = True  # a seeded new order of the examples each epoch; False: the examples' own order
    eval_every: int = 0  # optimizer steps between validation losses (0: only at the end, when validation is given)
    # the pipeline axis (grid pipe > 1; engine/training/pipeline.py): schedule, micro-batches per pass (0: chosen),
    # stages per rank, first decoder layer of stages 1..S-1 (empty: balanced)
    pipe_schedule: PipeSchedule = "1f1b"
    microbatches: int = 0
    pipe_virtual: int = 1
    pipe_split: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "grad_accum"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.batch_size % self.grad_accum:
            raise ValueError(
                f"batch_size {self.batch_size} is not divisible by grad_accum {self.grad_accum}: "
                "each micro-batch must hold the same number of sequences"
            )
        for name in ("lr", "weight_decay", "beta1", "beta2", "min_lr_ratio"):
            if not math.isfinite(getattr(self, name)):  # an inf or NaN setting trains to an all-NaN model
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.schedule not in LR_SCHEDULES:
            raise ValueError(f"schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        check_precision(self.precision)
        if self.warmup_steps < 0 or self.save_every < 0 or self.max_steps < 0 or self.eval_every < 0:
            raise ValueError("warmup_steps, save_every, max_steps and eval_every must be >= 0")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.optimizer == "sgd" and self.zero == 1:
            raise ValueError(
                "ZeRO stage 1 partitions AdamW's moments and SGD keeps none. Fix: use --zero 2 or 3 with "
                "SGD (they partition gradients and parameters), or --optimizer adamw"
            )
        check_rows_layout(self.rows)
        if self.max_grad_norm is not None and not (self.max_grad_norm > 0 and math.isfinite(self.max_grad_norm)):
            raise ValueError(f"max_grad_norm must be a finite number > 0 or None, got {self.max_grad_norm}")
        # a run record stores JSON lists; frozen: set while it is built
        object.__setattr__(self, "zero_inner_levels", tuple(self.zero_inner_levels))
        object.__setattr__(self, "pipe_split", tuple(self.pipe_split))
        self.zero_config  # validates the ZeRO fields
        self.pipe_config  # validates the pipeline fields

    @property
    def pipe_config(self) -> PipeConfig:
        """The pipeline setting of the pipe_* and microbatches fields (used on a grid whose pipe axis is > 1)."""
        return PipeConfig(
            schedule=self.pipe_schedule,
            microbatches=self.microbatches,
            virtual=self.pipe_virtual,
            splits=self.pipe_split,
        )

    def check_pipeline(self, shape: GridShape, step_rows: tuple[int, ...] = ()) -> dict[int, int]:
        """Refuse (ValueError, one line) pipeline settings `shape` cannot run, before any process starts; return the
        micro-batches of each pipeline pass by its rows ({} without a pipeline). step_rows: the sizes of the run's
        steps (default: batch_size), e.g. a shorter last step of an epoch, which runs with micro-batches of its own
        (the set --microbatches must divide it too)."""
        if shape.pipe == 1:
            return {}
        if self.compile and self.pipe_schedule == "zero-bubble":
            # zero bubble splits each stage's backward into input and weight gradients by walking the autograd graph,
            # and a compiled layer is one opaque node of it (measured: torch's stage_backward_input fails)
            raise ValueError(
                "--pipe-schedule zero-bubble with --compile is not supported (its split backward cannot see inside a "
                "compiled layer); use 1f1b, gpipe or interleaved-1f1b, or drop --compile"
            )
        if self.pipe_schedule == "zero-bubble" and (self.zero == 3 or self.activation_checkpointing):
            # zero bubble runs each backward as two autograd passes (input, then weight gradients): its weight pass
            # misses the gradients of layers FSDP reshards after forward (measured: norms 15% off), and recomputes
            # checkpointed layers a second time, which torch's checkpoint refuses
            what = "--zero 3" if self.zero == 3 else "--activation-checkpointing"
            raise ValueError(
                f"--pipe-schedule zero-bubble with {what} is not supported (its split backward loses or recomputes "
                "what they free); use interleaved-1f1b, or --zero 2 without activation checkpointing"
            )
        sizes = [self.pipeline_pass_rows(shape, n) for n in (step_rows or (self.batch_size,))]
        return {size: self.pipe_config.resolve_microbatches(shape.pipe, size) for size in sizes}

    def pipeline_pass_rows(self, shape: GridShape, step_rows: int) -> int:
        """Sequences per pipeline pass of one data rank, for a step of `step_rows`: the rank's rows of the step, cut
        into grad_accum passes (ValueError when they do not cut evenly)."""
        local = step_rows // shape.size(*self.layout(shape).row_split_axes)
        passes = min(self.grad_accum, max(local, 1))
        if local % passes:
            raise ValueError(
                f"{local} sequences per data rank do not cut into {passes} equal --grad-accum passes, which a pipeline "
                "needs: choose a batch size that is a multiple of grad_accum times the data ranks"
            )
        return local // passes

    @property
    def zero_config(self) -> ZeroConfig:
        """The ZeRO setting of the zero_* and offload_optimizer fields."""
        parts = parse_quantize(self.zero_quantize)
        return ZeroConfig(
            stage=self.zero,
            node_size=self.zero_node_size,
            offload=self.offload_optimizer,
            inner_levels=tuple(self.zero_inner_levels),
            quantize_weights="weights" in parts,
            quantize_gradients="gradients" in parts,
            gradient_bits=self.zero_quantize_bits,
            quantize_block=self.zero_quantize_block,
        )

    def check_async_save(self, world_size: int) -> None:
        """Refuse async_save for a run of one process (ValueError): its checkpoint is an HF folder, not DCP shards."""
        if self.async_save and world_size == 1:
            raise ValueError(
                "--async-save writes a run's sharded (DCP) checkpoint in the background, and a one-process run writes "
                "an HF folder in the step instead. Fix: drop --async-save, or train on 2 or more processes (--nproc)"
            )

    def layout(self, shape: GridShape, vocab_parallel: bool | None = None) -> ParallelLayout:
        """The parallel run these settings describe on a grid of `shape` (validated: ZeroError or ValueError)."""
        self.check_async_save(shape.world_size)
        return ParallelLayout(
            shape=shape, rows=self.rows, vocab_parallel=vocab_parallel, zero=self.zero_config, precision=self.precision
        )
