"""Plain-Python descriptions of a parallel run, shared by the runtime and the planner (no torch import): the grid's
axes and sizes, the ZeRO setting, the rows layouts, and the gradient bucket size both count in.

`goldfish plan` and engine.planner import only this module of the runtime, so they run where torch is not
installed; engine.core.grid and engine.memory.zero re-export these names.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

AXES: tuple[str, ...] = ("x", "y", "z", "data")  # a pipeline stage's axes, in rank order, fastest first
PIPE = "pipe"  # the pipeline axis: slowest of all, so each stage's data x X x Y x Z ranks are consecutive
GRID_AXES: tuple[str, ...] = (*AXES, PIPE)  # every axis, in rank order
RowsLayout = Literal["own", "shared"]  # every rank reads its own rows / every rank of an x*y group reads the same rows
ROWS_LAYOUTS: tuple[RowsLayout, ...] = ("own", "shared")
STAGES = (0, 1, 2, 3)  # ZeRO stages
BUCKET_ELEMENTS = 1 << 24  # gradients are reduced in buckets this large (engine.core.comm), as the cost model counts


class GridError(ValueError):
    """A grid that cannot be built: bad sizes, or sizes that do not match the world."""


@dataclass(frozen=True)
class GridShape:
    """Sizes of the grid axes. Each is an integer >= 1; their product is the number of ranks.

    pipe: pipeline stages (engine/training/pipeline.py). Each stage is a data x X x Y x Z grid of its own, so every
    table of the axes a sum runs over (AXES: gradients, rows, the vocabulary split) stays within one stage."""

    data: int = 1
    x: int = 1
    y: int = 1
    z: int = 1
    pipe: int = 1

    def __post_init__(self) -> None:
        for axis in GRID_AXES:
            value = getattr(self, axis)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise GridError(f"grid axis {axis} must be an integer >= 1, got {value!r}")

    @property
    def world_size(self) -> int:
        """Number of ranks the grid needs: pipe * data * x * y * z."""
        return self.pipe * self.stage_size

    @property
    def stage_size(self) -> int:
        """Ranks of one pipeline stage: data * x * y * z (the world size without a pipeline)."""
        return self.data * self.x * self.y * self.z

    def size(self, *axes: str) -> int:
        """Product of the sizes of `axes` (1 for no axes)."""
        out = 1
        for axis in axes:
            out *= getattr(self, _check_axis(axis))
        return out

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates {axis: index} of global `rank` (x fastest)."""
        if not 0 <= rank < self.world_size:
            raise GridError(f"rank {rank} is outside a grid of {self.world_size} ranks")
        out = {}
        for axis in GRID_AXES:
            size = getattr(self, axis)
            out[axis] = rank % size
            rank //= size
        return out

    def rank(self, coords: dict[str, int]) -> int:
        """Global rank of the coordinates {axis: index} (missing axes count as 0)."""
        rank = 0
        for axis in reversed(GRID_AXES):
            index = coords.get(axis, 0)
            size = getattr(self, axis)
            if not 0 <= index < size:
                raise GridError(f"coordinate {axis}={index} is outside the axis size {size}")
            rank = rank * size + index
        return rank

    def group_ranks(self, axes: tuple[str, ...]) -> list[list[int]]:
        """Every group of ranks that varies only along `axes`, each sorted ascending.

        Inside a group, the position of a rank (its group rank) follows the grid's rank order restricted
        to `axes`, e.g. x + X * y for ("x", "y").
        """
        axes = tuple(_check_axis(a) for a in axes)
        others = [a for a in GRID_AXES if a not in axes]
        groups = []
        for fixed in itertools.product(*(range(getattr(self, a)) for a in reversed(others))):
            base = dict(zip(reversed(others), fixed))
            ranks = []
            for varying in itertools.product(*(range(getattr(self, a)) for a in reversed(axes))):
                ranks.append(self.rank({**base, **dict(zip(reversed(axes), varying))}))
            groups.append(sorted(ranks))
        return groups

    def __str__(self) -> str:
        pipe = f",pipe={self.pipe}" if self.pipe > 1 else ""
        return f"data={self.data},x={self.x},y={self.y},z={self.z}{pipe}"


def _check_axis(axis: str) -> str:
    if axis not in GRID_AXES:
        raise GridError(f"unknown grid axis {axis!r}; the axes are {', '.join(GRID_AXES)}")
    return axis


class ZeroError(ValueError):
    """A ZeRO setting that does not fit the grid or the model (named in the message, with the fix)."""


QUANT_BITS = (8, 4)  # element formats of ZeRO++'s quantized collectives: int8 or int4 codes
DEFAULT_QUANT_BLOCK = 256  # elements per float32 scale: the scales are 4 / 256 = 1.6% of an int8 payload


@dataclass(frozen=True)
class BlockFormat:
    """How engine.core.quantize packs a flat tensor: `bits` per element (8 or 4) and `block` elements per
    float32 scale (max|block| / qmax). Every element comes back within max|block| / (2 qmax)."""

    bits: int = 8
    block: int = DEFAULT_QUANT_BLOCK

    def __post_init__(self) -> None:
        if self.bits not in QUANT_BITS:
            raise ZeroError(f"quantization bits (--zero-quantize-bits) must be one of {QUANT_BITS}, got {self.bits!r}")
        if isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 2 or self.block % 2:
            raise ZeroError(
                "a quantization block (--zero-quantize-block) must be an even number of elements >= 2, "
                f"got {self.block!r}"
            )

    @property
    def qmax(self) -> int:
        """The largest code: 127 for int8, 7 for int4."""
        return 2 ** (self.bits - 1) - 1

    def blocks(self, numel: int) -> int:
        """Blocks (scales) of a tensor of `numel` elements."""
        return -(-numel // self.block)

    def payload_bytes(self, numel: int) -> int:
        """Bytes that travel for `numel` elements: the codes of the zero-padded blocks, then 4 per scale."""
        n = self.blocks(numel)
        return n * self.block * self.bits // 8 + 4 * n


@dataclass(frozen=True)
class ZeroConfig:
    """How to partition over the data axis.

    stage: 0 (off), 1 (AdamW moments), 2 (+ gradients), 3 (+ parameters); see engine/memory/zero.py.
    node_size: data-axis ranks per node; > 1 turns on hierarchical partitioning (stages 2 and 3).
    inner_levels: sizes of the levels inside a node, innermost first, each dividing the next and node_size
        (e.g. (2,) for the two GCDs of an MI250X in a node of 8): `--zero-hierarchy 2,8`.
    offload: AdamW moments, parameter and gradient chunks in host memory, update on the host (stages 2, 3).
    quantize_weights: ZeRO++ qwZ: parameter all-gathers from the primary partition carry int8 blocks.
    quantize_gradients: ZeRO++ qgZ: gradients reduced by all-to-alls of `gradient_bits` blocks, level by
        level, dequantized and summed in float32 at each level.
    quantize_block: elements per scale of both.
    """

    stage: int = 0
    node_size: int = 1
    offload: bool = False
    inner_levels: tuple[int, ...] = ()
    quantize_weights: bool = False
    quantize_gradients: bool = False
    gradient_bits: int = 8
    quantize_block: int = DEFAULT_QUANT_BLOCK

    def __post_init__(self) -> None:
        if isinstance(self.stage, bool) or self.stage not in STAGES:
            raise ZeroError(f"ZeRO stage must be one of {STAGES}, got {self.stage!r}")
        if isinstance(self.node_size, bool) or not isinstance(self.node_size, int) or self.node_size < 1:
            raise ZeroError(f"node size must be an integer >= 1 (data-axis ranks per node), got {self.node_size!r}")
        object.__setattr__(self, "inner_levels", tuple(self.inner_levels))
        sizes = (*self.inner_levels, self.node_size)
        for inner, outer in zip(sizes, sizes[1:]):
            if isinstance(inner, bool) or not isinstance(inner, int) or inner < 2 or outer % inner or outer == inner:
                raise ZeroError(
                    f"hierarchy levels {','.join(map(str, sizes))}: each size counts the data ranks of a level's "
                    "group, innermost first, so each must be >= 2, smaller than the next and divide it (e.g. "
                    "--zero-hierarchy 2,8 for GCD pairs in nodes of 8; 2,4 for three levels of 2 on data=8)"
                )
        if self.node_size > 1 and self.stage < 2:
            raise ZeroError(
                f"hierarchical partitioning needs ZeRO stage 2 or 3 (it splits the gradient reduce-"
                f"scatter and stage 3's parameter gathers by node), got stage {self.stage}; use --zero 2 "
                "or 3, or drop the hierarchy"
            )
        if self.offload and self.stage < 2:
            raise ZeroError(
                f"optimizer offload needs ZeRO stage 2 or 3 (the host updates the partitioned state "
                f"FSDP keeps there), got stage {self.stage}; use --zero 2 or 3 with --offload-optimizer"
            )
        if (self.quantize_weights or self.quantize_gradients) and self.stage < 2:
            raise ZeroError(
                f"--zero-quantize needs ZeRO stage 2 or 3 (it quantizes FSDP's parameter gathers and gradient "
                f"reductions), got stage {self.stage}; use --zero 3 (or 2)"
            )
        BlockFormat(self.gradient_bits, self.quantize_block)  # raises for bad bits or block

    def check(self, shape: GridShape) -> None:
        """Raise ZeroError when the grid cannot carry this setting."""
        if self.stage > 0 and shape.data == 1:
            raise ZeroError(
                f"ZeRO stage {self.stage} partitions over the data axis, but the grid {shape} has data=1; "
                "use a grid with data >= 2 or --zero 0"
            )
        if shape.data % self.node_size:
            raise ZeroError(
                f"node size {self.node_size} (data ranks per node) does not divide the data axis of size "
                f"{shape.data} (grid {shape}); choose a node size dividing it or no hierarchy"
            )

    @property
    def hierarchical(self) -> bool:
        return self.node_size > 1

    @property
    def quantized(self) -> bool:
        return self.quantize_weights or self.quantize_gradients

    def level_sizes(self, data: int) -> tuple[int, ...]:
        """Group size of each level of the data axis, innermost first; their product is `data`.

        No hierarchy: (data,). Nodes of n: (n, data/n). Levels (2,) in nodes of 8 on data=32: (2, 4, 4), the
        GCD pair, the GPUs of a node, the nodes. A level of size 1 (a node holding the whole axis) is dropped.
        """
        bounds = (1, *self.inner_levels, self.node_size, data) if self.hierarchical else (1, data)
        sizes = tuple(outer // inner for inner, outer in zip(bounds, bounds[1:]))
        return tuple(s for s in sizes if s > 1) or (1,)

    @property
    def weight_format(self) -> BlockFormat:
        """qwZ's format: int8 blocks, as ZeRO++ uses for the forward all-gather."""
        return BlockFormat(8, self.quantize_block)

    @property
    def gradient_format(self) -> BlockFormat:
        return BlockFormat(self.gradient_bits, self.quantize_block)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["inner_levels"] = list(self.inner_levels)
        return out


QUANTIZE_PARTS = ("weights", "gradients")  # what --zero-quantize may name


def parse_quantize(text: str) -> tuple[str, ...]:
    """The parts of a --zero-quantize value ("weights", "gradients", both ","-joined, "" or "none" for neither),
    in QUANTIZE_PARTS order; ZeroError naming the choices for anything else."""
    parts = {p.strip() for p in text.split(",") if p.strip()} - {"none"}
    unknown = sorted(parts - set(QUANTIZE_PARTS))
    if unknown:
        raise ZeroError(f"ZeRO++ quantization takes weights, gradients or weights,gradients (qwZ, qgZ), got {text!r}")
    return tuple(p for p in QUANTIZE_PARTS if p in parts)


def data_ranks_per_node(gpus_per_node: int, shape: GridShape) -> int:
    """Data-axis ranks that share a node of `gpus_per_node` ranks (e.g. the launcher's local world size).

    Ranks are laid out with the data axis slowest, so a node holds whole tensor-parallel groups when
    x*y*z divides gpus_per_node, and then gpus_per_node / (x*y*z) consecutive data indices (capped at the
    data size). A tensor-parallel group spanning nodes leaves one data rank per node (no hierarchy).
    """
    if gpus_per_node < 1:
        raise ZeroError(f"GPUs per node must be >= 1, got {gpus_per_node}")
    tp = shape.size("x", "y", "z")
    if gpus_per_node % tp:
        return 1
    return math.gcd(gpus_per_node // tp, shape.data)


# ----- the pipeline axis ----------------------------------------------------------------------------------------------
# Schedules of torch.distributed.pipelining the engine runs (engine/training/pipeline.py), and whether each runs
# several stages per rank (V > 1).
PipeSchedule = Literal["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"]
PIPE_SCHEDULES: dict[PipeSchedule, bool] = {
    "gpipe": False,
    "1f1b": False,
    "interleaved-1f1b": True,
    "zero-bubble": True,
}


@dataclass(frozen=True)
class PipeConfig:
    """How a pipelined run cuts and schedules its model (used when the grid's pipe axis is > 1).

    schedule: a key of PIPE_SCHEDULES. microbatches: pipeline micro-batches per forward-backward pass of one data
    rank (0: resolve_microbatches picks). virtual: stages per rank (interleaved schedules). splits: the first decoder
    layer of stages 1..S-1 (empty: balanced by parameter count)."""

    schedule: PipeSchedule = "1f1b"
    microbatches: int = 0
    virtual: int = 1
    splits: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "splits", tuple(self.splits))
        if self.schedule not in PIPE_SCHEDULES:
            raise ValueError(
                f"unknown pipeline schedule {self.schedule!r} (--pipe-schedule); choose one of "
                f"{', '.join(PIPE_SCHEDULES)}"
            )
        if isinstance(self.virtual, bool) or not isinstance(self.virtual, int) or self.virtual < 1:
            raise ValueError(f"--pipe-virtual must be an integer >= 1, got {self.virtual!r}")
        if self.virtual > 1 and not PIPE_SCHEDULES[self.schedule]:
            raise ValueError(
                f"{self.schedule} runs one stage per rank, not {self.virtual} (--pipe-virtual); use "
                "--pipe-schedule interleaved-1f1b or zero-bubble, or --pipe-virtual 1"
            )
        if isinstance(self.microbatches, bool) or not isinstance(self.microbatches, int) or self.microbatches < 0:
            raise ValueError(f"--microbatches must be an integer >= 1 (or 0: chosen), got {self.microbatches!r}")
        if any(a >= b for a, b in zip(self.splits, self.splits[1:])) or any(s < 1 for s in self.splits):
            raise ValueError(f"--pipe-split {list(self.splits)}: give increasing decoder-layer indices >= 1")

    def check_microbatches(self, pipe: int, microbatches: int) -> None:
        """ValueError (one line, with the fix) for a micro-batch count the schedule cannot run on `pipe` ranks."""
        if microbatches < 1:
            raise ValueError(f"a pipeline step needs at least 1 micro-batch, got {microbatches}")
        if self.schedule == "1f1b" and microbatches < pipe:
            raise ValueError(
                f"{self.schedule} needs at least as many micro-batches as pipeline ranks ({pipe}), not {microbatches}: "
                f"use --microbatches {pipe} or more, or another --pipe-schedule"
            )
        rounds = max(1, microbatches // pipe)  # torch's interleaved schedules run M in rounds of about P
        if PIPE_SCHEDULES[self.schedule] and microbatches % rounds:
            raise ValueError(
                f"{self.schedule} runs {microbatches} micro-batches in {rounds} rounds on {pipe} ranks; choose "
                f"--microbatches dividing evenly (a multiple of {pipe})"
            )

    def resolve_microbatches(self, pipe: int, rows: int) -> int:
        """The micro-batch count for `rows` sequences per forward-backward pass of one data rank: the one set, or
        the smallest divisor of `rows` >= 2 * pipe (a 1F1B bubble of at most (P-1)/(3P-1)), else the largest that
        the schedule accepts. ValueError (one line) when none divides `rows` or the set one does not."""
        if self.microbatches:
            if rows % self.microbatches:
                raise ValueError(
                    f"{rows} sequences per pipeline pass (batch per data rank and --grad-accum micro-batch) do not "
                    f"split into --microbatches {self.microbatches}; choose a count dividing {rows}"
                )
            self.check_microbatches(pipe, self.microbatches)
            return self.microbatches
        usable = []
        for m in range(1, rows + 1):
            if rows % m == 0:
                try:
                    self.check_microbatches(pipe, m)
                except ValueError:
                    continue
                usable.append(m)
        if not usable:
            raise ValueError(
                f"{rows} sequences per pipeline pass cannot feed {self.schedule} on {pipe} ranks (no micro-batch count "
                f"of whole sequences suits it): raise the batch size (or lower --grad-accum) to a multiple of {pipe} "
                "per data rank, or use another --pipe-schedule"
            )
        return next((m for m in usable if m >= 2 * pipe), usable[-1])

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "splits": list(self.splits)}


# ----- precision -----------------------------------------------------------------------------------------------------
# Element bytes (weights and gradients, matmul products, residual stream) of each `goldfish train --precision`:
# bf16 is torch.autocast(bf16) over fp32 weights (matrix products in bf16; weights, gradients, residual stream and
# AdamW state in fp32); fp32 is fp32 throughout. Either way a parameter costs 16 bytes (weight, gradient, two moments).
Precision = Literal["fp32", "bf16"]
PRECISIONS: dict[Precision, tuple[int, int, int]] = {"bf16": (4, 2, 4), "fp32": (4, 4, 4)}
# The trainer's default is exact float32 (what every parallel-equals-serial test compares, and what a CPU runs
# fast); the planner plans GPU clusters, where runs use bf16 autocast, and prints --precision in its commands.
TRAIN_PRECISION: Precision = "fp32"
PLAN_PRECISION: Precision = "bf16"


def check_precision(precision: str) -> str:
    """Return `precision` if it is a key of PRECISIONS, else raise ValueError naming the choices."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    return precision


# ----- rows layouts: which ranks read which rows of a step, and so which axes every sum runs over -------------------
OWN, SHARED = ROWS_LAYOUTS
# The regions of a parallelized model (engine.models.parallelize tags modules with one): which rows a parameter's
# gradient saw. None/"rows": this rank's own rows; "layer": the rows of its x*y group, replicated over x and y;
# "heads": the same rows, this y rank's heads only; "tensor": vocabulary-parallel shards (rows of all of x*y*z).
REGIONS: tuple[str | None, ...] = (None, "rows", "layer", "heads", "tensor")
_GRADIENT_AXES: dict[str, dict[str | None, tuple[str, ...]]] = {
    OWN: {None: AXES, "rows": AXES, "layer": ("z", "data"), "heads": ("y", "z", "data"), "tensor": ("data",)},
    # shared rows: what saw "own rows" saw the rows of its x*y group, replicated over x and y
    SHARED: {
        None: ("z", "data"),
        "rows": ("z", "data"),
        "layer": ("z", "data"),
        "heads": ("y", "z", "data"),
        "tensor": ("data",),
    },
}


def check_rows_layout(rows: str) -> RowsLayout:
    """Return `rows` if it is a rows layout ("own" or "shared"), else raise ValueError naming the choices."""
    if rows not in ROWS_LAYOUTS:
        raise ValueError(f"rows layout must be one of {ROWS_LAYOUTS}, got {rows!r}")
    return rows


def row_split_axes(rows: RowsLayout) -> tuple[str, ...]:
    """The axes a step's rows are split over: every axis ("own"), or data and z ("shared": x*y groups share rows)."""
    return AXES if check_rows_layout(rows) == OWN else ("z", "data")


def row_replica_axes(rows: RowsLayout) -> tuple[str, ...]:
    """The axes whose ranks hold this rank's rows too: none ("own"), or x and y ("shared")."""
    return () if check_rows_layout(rows) == OWN else ("x", "y")


def row_gather_axes(rows: RowsLayout) -> tuple[str, ...]:
    """The axes a decoder layer (and a default-mode ParallelLinear) gathers rows over before its tensor-parallel
    work: x and y ("own"), or none ("shared": the inputs already hold the x*y group's rows)."""
    return ("x", "y") if check_rows_layout(rows) == OWN else ()


def vocab_row_axes(rows: RowsLayout) -> tuple[str, ...]:
    """The axes of the vocabulary split (x, y, z) whose ranks hold different rows: all three ("own"), or z only."""
    return tuple(a for a in ("x", "y", "z") if a not in row_replica_axes(rows))


def gradient_axes(rows: RowsLayout, region: str | None) -> tuple[str, ...]:
    """The axes the gradient of a (non-ParallelLinear) parameter in `region` is summed over so that it becomes the
    gradient of the sum of every rank's loss. ParallelLinear shards always sum over data alone."""
    if region not in REGIONS:
        raise ValueError(f"unknown region {region!r}; the regions are {REGIONS}")
    return _GRADIENT_AXES[check_rows_layout(rows)][region]


def parse_grid_sizes(text: str) -> dict[str, int]:
    """Parse 'data=2,x=2' (any subset of the axes; missing axes are 1) into {axis: size}; ValueError otherwise."""
    sizes: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in GRID_AXES or not value.isdigit() or int(value) < 1:
            raise ValueError(
                f"cannot parse grid {text!r}: use AXIS=SIZE pairs with axes {GRID_AXES} and sizes >= 1, e.g. data=2,x=2"
            )
        if name in sizes:
            raise ValueError(f"grid {text!r} names axis {name!r} twice")
        sizes[name] = int(value)
    return sizes


@dataclass(frozen=True)
class ParallelLayout:
    """The settings of one parallel run, validated once: the grid shape, the rows layout, the vocabulary split, ZeRO
    and precision, before any process group or model exists (launchers, TrainConfig.layout, the planner).

    Every axis table of the engine is derived here (rows split, rows shared, gradient sums, vocabulary rows), so the
    trainer, the cost model and the planner ask one object instead of comparing strings. Plain Python: the planner
    builds it without torch. A parallelized model's own record is its ParallelPlan (engine.models.layout), whose rows
    layout the gradient sync reads.

    shape: sizes of data, x, y, z. rows: "own" (every rank its own rows of a step) or "shared" (every rank of an x*y
    group the group's rows). vocab_parallel: embeddings and lm_head split by vocabulary rows over x*y*z (None: when
    the model allows it). zero: the ZeRO setting over the data axis. precision: a key of PRECISIONS.
    """

    shape: GridShape = GridShape()
    rows: RowsLayout = OWN
    vocab_parallel: bool | None = None
    zero: ZeroConfig = ZeroConfig()
    precision: Precision = TRAIN_PRECISION

    def __post_init__(self) -> None:
        if not isinstance(self.shape, GridShape):
            raise GridError(f"shape must be a GridShape, got {type(self.shape).__name__}")
        if not isinstance(self.zero, ZeroConfig):
            raise ZeroError(f"zero must be a ZeroConfig, got {type(self.zero).__name__}")
        if self.vocab_parallel not in (None, True, False):
            raise ValueError(f"vocab_parallel must be True, False or None (auto), got {self.vocab_parallel!r}")
        check_rows_layout(self.rows)
        check_precision(self.precision)
        self.zero.check(self.shape)

    @classmethod
    def parse(cls, grid: str, **settings: Any) -> ParallelLayout:
        """The layout of a grid written 'data=2,x=2' (see parse_grid_sizes) and the other settings by keyword."""
        return cls(shape=GridShape(**parse_grid_sizes(grid)), **settings)

    @property
    def shares_rows(self) -> bool:
        """Whether ranks of an x*y group read the same rows (the "shared" layout on a grid with x*y > 1)."""
        return self.rows == SHARED and self.shape.size("x", "y") > 1

    @property
    def row_split_axes(self) -> tuple[str, ...]:
        return row_split_axes(self.rows)

    @property
    def row_replica_axes(self) -> tuple[str, ...]:
        return row_replica_axes(self.rows)

    @property
    def row_splits(self) -> int:
        """Into how many different parts a step's rows are split (world size, or data*z when x*y groups share)."""
        return self.shape.size(*self.row_split_axes)

    def gradient_axes(self, region: str | None) -> tuple[str, ...]:
        return gradient_axes(self.rows, region)

    def group_rows(self, rows_per_rank: int) -> int:
        """Rows an x*y group runs its decoder layers on when each rank reads `rows_per_rank`: x*y times as many in
        the "own" layout (the layers gather them), the same rows in the "shared" one."""
        return rows_per_rank * self.shape.size(*row_gather_axes(self.rows))

    def check_step_rows(self, n_rows: int) -> None:
        """Refuse (ValueError, naming the other layout when it would split them) a step of `n_rows` sequences that
        this layout cannot split evenly over its ranks."""
        if n_rows % self.row_splits == 0:
            return
        shape, data_z = self.shape, self.shape.size(*row_split_axes(SHARED))
        if self.rows == OWN:
            hint = (
                f"; or share rows within each x*y group (--rows shared), which needs only multiples of data*z={data_z}"
                if data_z < shape.stage_size and n_rows % data_z == 0
                else ""
            )
            ranks = "the world size" if shape.pipe == 1 else "the ranks of a pipeline stage"
            raise ValueError(
                f"a step holds {n_rows} sequences, not divisible by {ranks} {shape.stage_size}: "
                f"choose a batch size and a document count that are multiples of {shape.stage_size}{hint}"
            )
        # (the own layout needs multiples of the world size, a multiple of data*z: it is never the fix here)
        raise ValueError(
            f"a step holds {n_rows} sequences, not divisible by data*z={data_z} (the rows layout "
            f"'shared' splits them over data and z): choose a batch size and a document count that are "
            f"multiples of {data_z}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "grid": str(self.shape),
            "rows": self.rows,
            "vocab_parallel": self.vocab_parallel,
            "zero": self.zero.to_json(),
            "precision": self.precision,
        }
