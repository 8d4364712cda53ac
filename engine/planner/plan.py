"""The planner: rank every pipe x data x X x Y x Z grid of G GPUs by predicted step time, with memory per GPU.

For each ordered factorisation of the GPU count (pipe sizes: PlanRequest.pipes) it

1. rejects grids the engine cannot shard the model on (heads, kv heads or features not divisible), and
   considers each rows layout of `goldfish train --rows` (engine/training/train.py, _rank_rows) in which the global
   batch splits into whole rows: "own" gives every GPU its own rows, so the batch must be a multiple of the WORLD
   size; "shared" (after AxoNN) gives every GPU of an x*y group the group's rows, so the batch need only be a
   multiple of data*z (AxoNN's 4,096 x 4,096-token batches on 6,144 or 32,768 GPUs are expressible this way).
   A grid without x or y parallelism has one layout (both are the same); a grid is rejected when neither
   layout splits the batch. The faster layout is kept and reported (the "rows" column);
2. picks the ZeRO setting, activation checkpointing (on or off) and the number of micro-batches (gradient
   accumulation): for each setting allowed, the fewest micro-batches that fit the memory estimate
   (engine.planner.cost_model.memory_per_rank), keeping the fastest; grids that never fit are rejected. The ZeRO
   settings are the request's stages, and for stages 2 and 3 each of its hierarchies (flat, the node, or the package
   inside the node, sized from the machine profile: PlanRequest.hierarchy_levels) and ZeRO++ quantizations (qwZ
   int8 weight gathers, qgZ int8/int4 gradient all-to-alls);
3. predicts the step time = compute (FLOPs one GPU runs, at a stated fraction of the profile's peak)
   + memory-bound work (bytes of non-matmul work and optimizer over the device memory bandwidth, which
   charges the engine's replication of norms and elementwise work over x and y)
   + communication (every collective of engine.planner.cost_model.llama_step_collectives, over the bandwidth its
   group gets on the machine given the rank placement, see engine.planner.profiles). Overlap is not modelled:
   the prediction is an upper bound that ranks grids, as in the AxoNN paper.

A grid with pipe > 1 (plan_pipelined) is planned per pipe rank: each holds its stages' layers (the embeddings on the
first rank, the head on the last) on its stage's data x X x Y x Z grid, for each schedule, stages per rank, ZeRO
setting the engine runs with a pipe axis (PIPE_ZERO_STAGES) and checkpointing setting, with the most micro-batches the
schedule accepts that fit; pipeline_step_prediction stretches the busiest rank's work by the schedule's bubble and
adds the point-to-point time between stages.

`goldfish plan` (goldfish.app.plan) builds a PlanRequest from its options and prints `format_table` and the fastest
grid's `train_command`; its
`--measure OUT.json` instead times the collectives of every group size and placement on the current cluster under
torchrun (engine.planner.measure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from engine.planner.cost_model import (
    INTERLEAVED,
    PIPE_SCHEDULES,
    ROWS_LAYOUTS,
    Collective,
    MemoryEstimate,
    StepSettings,
    TransformerShape,
    bytes_by_group,
    grid_fits_shape,
    group_axes,
    llama_step_collectives,
    memory_per_rank,
    model_flops_per_token,
    ordered_grids,
    pass_collectives,
    pipe_rank_shape,
    pipeline_bubble,
    pipeline_check,
    pipeline_in_flight,
    pipeline_message_bytes,
    pipeline_p2p_bytes,
    rank_flops_per_step,
    rank_memory_traffic_per_step,
    update_collectives,
)
from engine.planner.profiles import MachineProfile, group_stride
from engine.spec import (
    DEFAULT_QUANT_BLOCK,
    OWN,
    PLAN_PRECISION,
    PRECISIONS,
    QUANT_BITS,
    QUANTIZE_PARTS,
    STAGES,
    GridShape,
    RowsLayout,
    ZeroConfig,
    check_precision,
    data_ranks_per_node,
    row_replica_axes,
    row_split_axes,
)

GIB = 1024**3
# PRECISIONS (engine.spec): element bytes of each `goldfish train --precision`. The engine has no pure-bf16
# weights, so neither does the planner.
CHECKPOINTING = ("auto", "on", "off")
# ZeRO hierarchies the planner derives from a machine profile (stages 2 and 3): "off" (flat over the data axis),
# "node" (two levels: the data ranks of one node, then the nodes) and "package,node" (three levels: the data ranks of
# one package, such as the two GCDs of an MI250X, then the packages of a node, then the nodes).
HIERARCHIES = ("off", "node", "package,node")
# Pipeline schedules weighed unless the request names others: zero bubble only when asked, because the cost model
# does not charge its backward split into two autograd passes (docs/pipeline.md measures that cost), so it would
# always win; GPipe only when asked, because 1F1B has its bubble with fewer micro-batches in flight.
DEFAULT_PIPE_SCHEDULES = ("1f1b", "interleaved-1f1b")
# What a pipelined plan may use inside its stages: rows layouts and ZeRO stages the engine's pipeline runs
# (engine.training.config.TrainConfig.check_pipeline). Stage 1 runs too but is not proposed: the pipelined cost model
# covers stages 0 and 2. Stage 3 is left out although the engine runs it: torch's PipelineStage keeps FSDP's
# parameters gathered after each backward until the step's last micro-batch, so stage 3 holds what stage 2 holds and
# gathers them again at every forward. The planner proposes no other composition.
PIPE_ROWS_LAYOUTS = ROWS_LAYOUTS
PIPE_ZERO_STAGES = (0, 2)


@dataclass(frozen=True)
class PlanRequest:
    """What to plan for. global_batch counts sequences of `seq` tokens per optimizer step."""

    shape: TransformerShape
    gpus: int
    global_batch: int
    seq: int
    profile: MachineProfile
    compute_efficiency: float = 0.5  # fraction of peak the matrix products reach
    grad_accum: int | None = None  # None: the smallest that fits in memory (grids without a pipeline)
    precision: str = PLAN_PRECISION  # a key of PRECISIONS (the values of `goldfish train --precision`)
    bytes_per_param: float = 16.0  # fp32 weight + gradient + AdamW's two moments
    memory_fraction: float = 0.9  # share of GPU memory the estimate may use (allocator, CUDA context)
    mask_bytes: int = 0  # attention mask bytes per token fed to the model (0: none, packed sequences)
    checkpointing: str = "auto"  # activation checkpointing of decoder layers: "auto", "on" or "off"
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)  # ZeRO stages to consider per grid (stages > 0 need data >= 2)
    offload: bool = False  # with stages 2 and 3: optimizer state and parameter/gradient chunks in host memory
    # with stages 2 and 3, each considered per grid (the fastest kept): the levels of HIERARCHIES, sized from the
    # profile's package and node, and the ZeRO++ quantizations (tuples of QUANTIZE_PARTS; () is none)
    hierarchies: tuple[str, ...] = ("off",)
    quantize: tuple[tuple[str, ...], ...] = ((),)
    gradient_bits: int = 8  # qgZ's codes: 8 or 4 bits
    quantize_block: int = DEFAULT_QUANT_BLOCK  # elements per scale of qwZ and qgZ
    rows_layouts: tuple[str, ...] = ROWS_LAYOUTS  # rows layouts of `goldfish train --rows` to consider per grid
    # the pipeline axis: pipe sizes to consider (None: every divisor of the GPU count up to the decoder layers; (1,):
    # no pipeline), the schedules weighed on each pipelined grid, their stages per rank V (interleaved schedules) and
    # the micro-batches M per step and data rank (None: per grid, the fastest that fits)
    pipe_sizes: tuple[int, ...] | None = None
    pipe_schedules: tuple[str, ...] = DEFAULT_PIPE_SCHEDULES
    pipe_virtual: tuple[int, ...] = (2,)
    microbatches: int | None = None

    def __post_init__(self) -> None:
        for name in ("gpus", "global_batch", "seq"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.mask_bytes, bool) or not isinstance(self.mask_bytes, int) or self.mask_bytes < 0:
            raise ValueError(f"mask_bytes must be an integer >= 0, got {self.mask_bytes!r}")
        size = self.bytes_per_param
        if isinstance(size, bool) or not isinstance(size, (int, float)) or not size > 0:
            raise ValueError(f"bytes_per_param must be a positive number, got {self.bytes_per_param!r}")
        if not 0 < self.compute_efficiency <= 1:
            raise ValueError(f"compute_efficiency must be in (0, 1], got {self.compute_efficiency}")
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {self.memory_fraction}")
        check_precision(self.precision)
        if self.checkpointing not in CHECKPOINTING:
            raise ValueError(f"checkpointing must be one of {CHECKPOINTING}, got {self.checkpointing!r}")
        if self.grad_accum is not None and self.grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {self.grad_accum}")
        if not self.zero_stages or any(s not in STAGES for s in self.zero_stages):
            raise ValueError(f"zero_stages must be a non-empty subset of {STAGES}, got {self.zero_stages!r}")
        if not self.rows_layouts or any(r not in ROWS_LAYOUTS for r in self.rows_layouts):  # (a subset, not one)
            raise ValueError(f"rows_layouts must be a non-empty subset of {ROWS_LAYOUTS}, got {self.rows_layouts!r}")
        self._check_zero_plus_plus()
        self._check_pipeline()

    def _check_pipeline(self) -> None:
        """Refuse pipeline settings no plan could use, in one line naming `goldfish plan`'s option and the fix."""
        for size in self.pipe_sizes or ():
            if isinstance(size, bool) or not isinstance(size, int) or size < 1 or self.gpus % size:
                raise ValueError(f"--pipe {size} does not divide --gpus {self.gpus}; give divisors of the GPU count")
            if size > self.shape.layers:
                raise ValueError(
                    f"--pipe {size}: more stages than the {self.shape.layers} decoder layers of "
                    f"{self.shape.name or 'the model'}; give at most {self.shape.layers}"
                )
        if self.pipe_sizes is not None and not self.pipe_sizes:
            raise ValueError("--pipe needs at least one size (1: no pipeline)")
        if not self.pipe_schedules or any(s not in PIPE_SCHEDULES for s in self.pipe_schedules):
            raise ValueError(f"--pipe-schedule takes {', '.join(PIPE_SCHEDULES)}, got {' '.join(self.pipe_schedules)}")
        bad = [v for v in self.pipe_virtual if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if not self.pipe_virtual or bad:
            raise ValueError(f"--pipe-virtual takes stage counts >= 1, got {self.pipe_virtual}")
        if self.microbatches is not None and (isinstance(self.microbatches, bool) or self.microbatches < 1):
            raise ValueError(f"--microbatches must be >= 1, got {self.microbatches}")

    @property
    def pipes(self) -> list[int]:
        """The pipe sizes to plan: the request's, or every divisor of the GPU count up to the decoder layers (only 1
        for a model the engine cannot pipeline: pipeline_refusal)."""
        if self.pipe_sizes is not None:
            return sorted(set(self.pipe_sizes))
        if pipeline_refusal(self.shape, 1):
            return [1]
        return [p for p in range(1, min(self.gpus, self.shape.layers) + 1) if self.gpus % p == 0]

    def _check_zero_plus_plus(self) -> None:
        """Refuse hierarchies and quantizations that no plan could use, each in one line naming the fix (the
        messages name `goldfish plan`'s options, which set these fields)."""
        if not self.hierarchies or any(h not in HIERARCHIES for h in self.hierarchies):
            raise ValueError(f"--zero-hierarchy takes {', '.join(HIERARCHIES)}, got {' '.join(self.hierarchies)!r}")
        if not self.quantize or any(not set(q) <= set(QUANTIZE_PARTS) for q in self.quantize):
            raise ValueError(f"--zero-quantize takes none, weights, gradients or weights,gradients: {self.quantize}")
        if self.gradient_bits not in QUANT_BITS:
            raise ValueError(f"--zero-quantize-bits must be 8 or 4 (qgZ's int8 or int4), got {self.gradient_bits}")
        block = self.quantize_block
        if isinstance(block, bool) or not isinstance(block, int) or block < 2 or block % 2:
            raise ValueError(f"--zero-quantize-block must be an even number of elements >= 2, got {block!r}")
        stages = ", ".join(map(str, self.zero_stages))
        if any(q for q in self.quantize) and max(self.zero_stages) < 2:
            raise ValueError(
                f"--zero-quantize quantizes the gathers and reductions of ZeRO stages 2 and 3, but --zero considers "
                f"only {stages}; add --zero 3 (or 2), or drop --zero-quantize"
            )
        if any(h != "off" for h in self.hierarchies) and max(self.zero_stages) < 2:
            raise ValueError(
                f"--zero-hierarchy partitions ZeRO stages 2 and 3 by level, but --zero considers only {stages}; "
                "add --zero 3 (or 2), or drop --zero-hierarchy"
            )
        if self.gradient_bits != 8 and not any("gradients" in q for q in self.quantize):
            raise ValueError(
                f"--zero-quantize-bits {self.gradient_bits} sets qgZ's gradient codes, but no --zero-quantize setting "
                "quantizes gradients; add --zero-quantize gradients (or weights,gradients)"
            )
        profile = self.profile
        if "node" in self.hierarchies and profile.gpus_per_node < 2:
            raise ValueError(
                f"--zero-hierarchy node needs nodes of 2 or more GPUs, but profile {profile.name} has "
                f"{profile.gpus_per_node}; set --gpus-per-node or drop --zero-hierarchy"
            )
        if "package,node" in self.hierarchies and profile.package_size < 2:
            raise ValueError(
                f"--zero-hierarchy package,node needs GPUs that share a package, but profile {profile.name} has "
                f"package_size {profile.package_size}; use --zero-hierarchy node, or a profile with packages "
                "(frontier: the two GCDs of an MI250X)"
            )

    def hierarchy_levels(self, grid: GridShape, hierarchy: str) -> tuple[int, tuple[int, ...]]:
        """(node_size, inner_levels) of ZeroConfig for `hierarchy` (a HIERARCHIES name) on `grid`: the data ranks
        of one node and of one package, counted as the engine lays ranks out (engine.spec.data_ranks_per_node:
        the data axis slowest, so a node or package holds whole tensor-parallel groups or no hierarchy level).
        A level of one data rank is dropped: a tensor-parallel group filling the package leaves two levels."""
        if hierarchy == "off":
            return 1, ()
        node = data_ranks_per_node(self.profile.gpus_per_node, grid)
        if hierarchy == "node" or node < 2:
            return node, ()
        package = data_ranks_per_node(self.profile.package_size, grid)
        return node, ((package,) if 1 < package < node else ())

    def zero_configs(self, grid: GridShape, stage: int) -> list[ZeroConfig]:
        """The ZeRO settings of `stage` on `grid` to consider: stage 1 alone, stages 2 and 3 with each of this
        request's hierarchies and quantizations (with its offload), distinct ones only, in request order (so a tie
        keeps the simpler setting)."""
        if stage < 2:
            return [ZeroConfig(stage=stage)]
        out: list[ZeroConfig] = []
        for hierarchy in self.hierarchies:
            node, inner = self.hierarchy_levels(grid, hierarchy)
            for parts in self.quantize:
                zero = ZeroConfig(
                    stage=stage,
                    node_size=node,
                    inner_levels=inner,
                    offload=self.offload,
                    quantize_weights="weights" in parts,
                    quantize_gradients="gradients" in parts,
                    gradient_bits=self.gradient_bits if "gradients" in parts else 8,
                    quantize_block=self.quantize_block,
                )
                if zero not in out:
                    out.append(zero)
        return out

    @property
    def zero_plus_plus(self) -> bool:
        """Whether this request considers a ZeRO hierarchy or quantization (the table then shows them)."""
        return any(h != "off" for h in self.hierarchies) or any(q for q in self.quantize)

    @property
    def element_bytes(self) -> tuple[int, int, int]:
        """(weights and gradients, matmul products, residual stream) bytes per element."""
        return PRECISIONS[self.precision]

    def step_settings(self, grid: GridShape, rows_layout: RowsLayout, grad_accum: int, recompute: bool) -> StepSettings:
        """The StepSettings of one prediction on `grid` (for a pipelined plan, a stage's grid) in rows layout
        `rows_layout` with `grad_accum` micro-batches (a pipeline's M) and activation checkpointing `recompute`: the
        global batch split over the GPUs that read different rows (readers) and over the micro-batches, the request's
        precision, attention mask and bytes per parameter, and the embeddings split by vocabulary where
        engine.parallelize splits them by default."""
        param_bytes, act_bytes, stream_bytes = self.element_bytes
        return StepSettings(
            rows_per_rank=self.global_batch // (readers(grid, rows_layout) * grad_accum),  # per GPU and micro-batch
            seq=self.seq,
            param_bytes=param_bytes,
            act_bytes=act_bytes,
            stream_bytes=stream_bytes,
            grad_accum=grad_accum,
            mask_bytes=self.mask_bytes,
            recompute=recompute,
            rows=rows_layout,
            bytes_per_param=self.bytes_per_param,
        )

    def rows_layouts_on(self, grid: GridShape, allowed: tuple[str, ...] = ROWS_LAYOUTS) -> list[str]:
        """The request's rows layouts among `allowed` to plan on `grid`: without x or y parallelism both layouts are
        the same, planned once as the default "own"."""
        return [
            r
            for r in self.rows_layouts
            if r in allowed and (not row_replica_axes(r) or grid.size(*row_replica_axes(r)) > 1)
        ] or [OWN]

    def zero_choices(self, grid: GridShape, allowed: tuple[int, ...] = STAGES) -> list[ZeroConfig | None]:
        """The ZeRO settings to weigh on `grid` (None: no ZeRO), from the request's stages among `allowed`: stages
        above 0 only where the grid has a data axis to partition over, and no ZeRO when none is left."""
        stages = [s for s in self.zero_stages if s in allowed and (s == 0 or grid.data > 1)] or [0]
        return [z for s in stages for z in (self.zero_configs(grid, s) if s else [None])]

    @property
    def recompute_choices(self) -> tuple[bool, ...]:
        """The activation checkpointing settings to weigh, without it first: both for "auto", else the one asked."""
        return {"auto": (False, True), "on": (True,), "off": (False,)}[self.checkpointing]

    @property
    def memory_limit(self) -> float:
        """Bytes per GPU the memory estimate may use: memory_fraction of the profile's GPU memory."""
        return self.profile.gpu_memory_gib * GIB * self.memory_fraction

    def compute_seconds(self, flops: float) -> float:
        """Seconds one GPU takes for `flops` of matrix products at compute_efficiency of the profile's peak."""
        return flops / (self.profile.peak_tflops * 1e12 * self.compute_efficiency)

    def memory_seconds(self, traffic: float) -> float:
        """Seconds one GPU takes to move `traffic` bytes through device memory at the profile's bandwidth."""
        return traffic / (self.profile.memory_gbps * 1e9)

    def mfu(self, step_s: float) -> float:
        """Model FLOPs utilisation of a step of `step_s` seconds: the FLOPs MFU counts (model_flops_per_token) of the
        global batch over what the GPUs' peak gives in that time."""
        useful = model_flops_per_token(self.shape, self.seq) * self.global_batch * self.seq
        return useful / (step_s * self.gpus * self.profile.peak_tflops * 1e12)


@dataclass
class GridPlan:
    """The prediction for one grid. Times in seconds, memory in bytes per GPU, bytes sent per GPU per step."""

    grid: GridShape
    feasible: bool
    reason: str = ""
    grad_accum: int = 0
    recompute: bool = False
    rows_per_micro_batch: int = 0
    step_s: float = math.inf
    compute_s: float = 0.0
    memory_s: float = 0.0
    comm_s: float = 0.0
    comm_s_by_group: dict[str, float] = field(default_factory=dict)
    bytes_by_group: dict[str, int] = field(default_factory=dict)
    memory: MemoryEstimate | None = None
    mfu: float = 0.0
    zero: ZeroConfig | None = None
    rows: RowsLayout = "own"  # the rows layout (goldfish train --rows): "own" per GPU or "shared" per x*y group
    # a pipelined plan (grid.pipe > 1): its schedule, stages per rank, micro-batches per step and data rank (then
    # also grad_accum), the bubble's share of the step and its seconds, the point-to-point seconds between stages
    # (inside comm_s), and the memory of each pipe rank (bytes; `memory` is the largest)
    schedule: str = ""
    virtual: int = 1
    bubble: float = 0.0
    bubble_s: float = 0.0
    p2p_s: float = 0.0
    stage_memory: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        g = self.grid
        out = {
            "grid": {"pipe": g.pipe, "data": g.data, "x": g.x, "y": g.y, "z": g.z},
            "feasible": self.feasible,
            "reason": self.reason,
            "grad_accum": self.grad_accum,
            "checkpointing": self.recompute,
            "rows_per_micro_batch": self.rows_per_micro_batch,
            "step_s": self.step_s if self.feasible else None,
            "compute_s": self.compute_s,
            "memory_s": self.memory_s,
            "comm_s": self.comm_s,
            "comm_s_by_group": self.comm_s_by_group,
            "bytes_by_group": self.bytes_by_group,
            "mfu": self.mfu,
            "zero": None if self.zero is None else self.zero.to_json(),
            "rows": self.rows,
        }
        if g.pipe > 1:
            out["pipeline"] = {
                "schedule": self.schedule,
                "virtual": self.virtual,
                "microbatches": self.grad_accum,
                "bubble": self.bubble,
                "bubble_s": self.bubble_s,
                "p2p_s": self.p2p_s,
                "stage_memory_gib": [m / GIB for m in self.stage_memory],
            }
        if self.memory is not None:
            out["memory_gib"] = {
                "params": self.memory.params / GIB,
                "activations": self.memory.activations / GIB,
                "transient": self.memory.transient / GIB,
                "total": self.memory.total / GIB,
            }
        return out


def readers(grid: GridShape, rows: RowsLayout) -> int:
    """How many GPUs read different rows of a step in rows layout `rows`: all of them, or data*z when shared."""
    return grid.size(*row_split_axes(rows))


def comm_seconds(
    profile: MachineProfile, grid: GridShape, collectives: list[Collective], zero: ZeroConfig | None
) -> dict[str, float]:
    """Seconds of `collectives` per group name on `grid` (one pipeline stage's grid: its groups are laid out as a
    grid without a pipeline), each at the bandwidth its members' placement gets on `profile`."""
    sizes = {"data": grid.data, "x": grid.x, "y": grid.y, "z": grid.z}
    totals: dict[tuple[str, str, int], list[int]] = {}
    for c in collectives:
        entry = totals.setdefault((c.group, c.kind, c.ranks), [0, 0])
        entry[0] += c.sent_bytes
        entry[1] += c.count
    out: dict[str, float] = {}
    for (group, kind, ranks), (sent, calls) in totals.items():
        stride = group_stride(group_axes(group), sizes)
        if group.startswith("data.level") and zero is not None:  # ZeRO's levels: members step over the inner ones
            stride *= math.prod(zero.level_sizes(grid.data)[: int(group.removeprefix("data.level")) - 1])
        seconds = profile.collective_seconds(kind, ranks, stride, sent, calls)
        out[group] = out.get(group, 0.0) + seconds
    return out


def step_prediction(
    request: PlanRequest,
    grid: GridShape,
    grad_accum: int,
    recompute: bool = False,
    zero: ZeroConfig | None = None,
    rows_layout: RowsLayout = "own",
) -> GridPlan:
    """Predicted time and traffic of one step on `grid` with `grad_accum` micro-batches, optional activation
    checkpointing, ZeRO setting and rows layout (no feasibility checks: see plan_grid)."""
    step = request.step_settings(grid, rows_layout, grad_accum, recompute)
    # embeddings split by vocabulary as parallelize does (step.vocab_parallel None)
    collectives = llama_step_collectives(request.shape, grid, step, zero=zero)
    comm_by_group = comm_seconds(request.profile, grid, collectives, zero)
    compute = request.compute_seconds(rank_flops_per_step(request.shape, grid, step))
    memory_s = request.memory_seconds(rank_memory_traffic_per_step(request.shape, grid, step))
    comm = sum(comm_by_group.values())
    step_s = compute + memory_s + comm
    return GridPlan(
        grid,
        True,
        "",
        grad_accum,
        recompute,
        step.rows_per_rank,
        step_s,
        compute,
        memory_s,
        comm,
        comm_by_group,
        bytes_by_group(collectives),
        None,
        request.mfu(step_s),
        zero,
        rows_layout,
    )


@dataclass(frozen=True)
class _RankWork:
    """One pipe rank's share of a step: `busy` seconds of compute, memory-bound work and the collectives inside its
    micro-batches' forward and backward (what the bubble stretches), and `after` seconds of the work after the last
    backward (gradient sync, ZeRO's reduction, gradient clipping, the optimizer), with the parts and bytes sent per
    group."""

    busy: float
    after: float
    compute: float
    memory: float
    comm_by_group: dict[str, float]
    sent_by_group: dict[str, int]


# A pipe rank's part of the model, as far as its work depends on it: its decoder layers, and whether it looks up the
# input embeddings and runs the head (pipe_rank_shape)
PartKey = tuple[int, bool, bool]


def part_key(part: TransformerShape) -> PartKey:
    """The PartKey of `part`: ranks of equal keys do the same work on equal stage grids."""
    return part.layers, part.runs_embeddings, part.runs_head


@dataclass
class PipeCache:
    """What planning one request's pipelined grids computes more than once: each pipe rank's work (_RankWork, keyed by
    its stage's grid, its part of the model, the step's settings and the ZeRO setting) and the seconds and bytes of
    its passes' collectives, which no ZeRO setting changes (pass_collectives; keyed by the same without the ZeRO
    setting)."""

    work: dict[tuple[GridShape, PartKey, StepSettings, ZeroConfig | None], _RankWork] = field(default_factory=dict)
    passes: dict[tuple[GridShape, PartKey, StepSettings], tuple[dict[str, float], dict[str, int]]] = field(
        default_factory=dict
    )


def _pipe_rank_work(
    request: PlanRequest,
    stage: GridShape,
    shape: TransformerShape,
    step: StepSettings,
    *,
    zero: ZeroConfig | None,
    cache: PipeCache,
) -> _RankWork:
    """The step of one pipe rank holding `shape` (pipe_rank_shape) on its stage's grid, `step.grad_accum`
    micro-batches of `step.rows_per_rank` rows per GPU (its passes' collectives kept in `cache`)."""
    profile = request.profile
    key = (stage, part_key(shape), step)
    if key not in cache.passes:
        collectives = pass_collectives(shape, stage, step)
        cache.passes[key] = (comm_seconds(profile, stage, collectives, None), bytes_by_group(collectives))
    pass_seconds, pass_bytes = cache.passes[key]
    # ZeRO 2 under torch's PipelineStage: FSDP gathers a stage's parameters at its first forward and keeps them,
    # and reduce-scatters the gradients after the last backward: once per step, whatever M
    updates = update_collectives(shape, stage, replace(step, grad_accum=1), zero=zero)
    in_passes = [c for c in updates if c.phase in ("forward", "backward")]  # ZeRO 2 and 3, per micro-batch
    during = dict(pass_seconds)
    for group, seconds in comm_seconds(profile, stage, in_passes, zero).items():  # (seconds add up: linear in bytes)
        during[group] = during.get(group, 0.0) + seconds
    after = comm_seconds(profile, stage, [c for c in updates if c.phase not in ("forward", "backward")], zero)
    compute = request.compute_seconds(rank_flops_per_step(shape, stage, step))
    memory_s = request.memory_seconds(rank_memory_traffic_per_step(shape, stage, step))
    # 0 passes: the optimizer's part alone, which runs after the pipeline
    optimizer_s = request.memory_seconds(rank_memory_traffic_per_step(shape, stage, replace(step, grad_accum=0)))
    sent = dict(pass_bytes)
    for group, n in bytes_by_group(updates).items():
        sent[group] = sent.get(group, 0) + n
    return _RankWork(
        busy=compute + memory_s - optimizer_s + sum(during.values()),
        after=optimizer_s + sum(after.values()),
        compute=compute,
        memory=memory_s,
        comm_by_group={g: during.get(g, 0.0) + after.get(g, 0.0) for g in dict.fromkeys([*during, *after])},
        sent_by_group=sent,
    )


def pipeline_step_prediction(
    request: PlanRequest,
    grid: GridShape,
    schedule: str,
    microbatches: int,
    virtual: int = 1,
    recompute: bool = False,
    zero: ZeroConfig | None = None,
    rows_layout: RowsLayout = "own",
    cache: PipeCache | None = None,
    parts: list[TransformerShape] | None = None,
) -> GridPlan:
    """Predicted time and traffic of one step on a pipelined `grid` (grid.pipe = P > 1) under `schedule` with
    `microbatches` M per step and data rank and `virtual` V stages per rank (no feasibility checks: see plan_grid).

    Each pipe rank's work (_RankWork) is that of its layers on its stage's grid; the pipeline stretches the busiest
    rank's by the bubble b (pipeline_bubble): busy / (1 - b). After it come the slowest rank's collectives after the
    pipeline (each stage syncs its own gradients, at once), the point-to-point time of the rank that sends the most
    between stages (pipeline_p2p_bytes: one message per micro-batch, stage and direction, over the link the pipe
    group's members span: ranks are laid out pipe slowest, so stages a node apart or more use its NICs) and one
    float64 all-reduce over pipe (the gradient norm's sum over stages). Step = compute + memory + comm + bubble of
    the busiest rank, with comm holding the point-to-point time. `cache` keeps each rank's work across calls for one
    request (ranks holding the same part do the same work, whatever the schedule); `parts`: pipe_rank_shape of each
    rank, when the caller has them."""
    profile, shape, p, v, m = request.profile, request.shape, grid.pipe, virtual, microbatches
    stage = replace(grid, pipe=1)
    step = request.step_settings(stage, rows_layout, m, recompute)
    cache = PipeCache() if cache is None else cache
    work = cache.work
    per_rank = []
    parts = parts or [pipe_rank_shape(shape, p, v, r) for r in range(p)]
    for part in parts:
        key = (stage, part_key(part), step, zero)
        if key not in work:
            work[key] = _pipe_rank_work(request, stage, part, step, zero=zero, cache=cache)
        per_rank.append(work[key])
    busiest = max(per_rank, key=lambda w: w.busy)
    bubble = pipeline_bubble(schedule, p, m, v)
    bandwidth, latency, _ = profile.link(p, stage.world_size)  # the pipe group: P members, a stage's ranks apart
    p2p = [pipeline_p2p_bytes(shape, grid, step, rank=r, virtual=v) for r in range(p)]
    message = pipeline_message_bytes(shape, stage, step)  # one micro-batch's
    p2p_s = max(sent / bandwidth + sent // message * latency for sent in p2p)
    clip = Collective("pipe", "all_reduce", p, 8, "clip", "squared gradient norm over stages")
    clip_s = profile.collective_seconds("all_reduce", p, stage.world_size, clip.sent_bytes, 1)
    after = max(w.after for w in per_rank) + clip_s
    bubble_s = busiest.busy * bubble / (1 - bubble)
    step_s = busiest.busy + bubble_s + after + p2p_s
    comm = step_s - busiest.compute - busiest.memory - bubble_s
    sent = dict(busiest.sent_by_group)
    sent["pipe"] = max(p2p) + clip.sent_bytes
    by_group = dict(busiest.comm_by_group)
    by_group["pipe"] = p2p_s + clip_s
    return GridPlan(
        grid,
        True,
        "",
        m,
        recompute,
        step.rows_per_rank,
        step_s,
        busiest.compute,
        busiest.memory,
        comm,
        by_group,
        sent,
        None,
        request.mfu(step_s),
        zero,
        rows_layout,
        schedule=schedule,
        virtual=v,
        bubble=bubble,
        bubble_s=bubble_s,
        p2p_s=p2p_s,
    )


def pipeline_memory(
    request: PlanRequest,
    grid: GridShape,
    schedule: str,
    microbatches: int,
    virtual: int = 1,
    recompute: bool = False,
    zero: ZeroConfig | None = None,
    rows_layout: RowsLayout = "own",
    ranks: list[int] | None = None,
    parts: list[TransformerShape] | None = None,
) -> list[MemoryEstimate]:
    """The memory estimate of each pipe rank of a pipelined `grid` (or of `ranks` only): its layers' parameters,
    gradients and optimizer state (ZeRO over the stage's data axis), and the activations of the micro-batches it
    holds at once (pipeline_in_flight: M for GPipe, P - r for 1F1B's rank r, more for the interleaved schedules).
    `parts`: pipe_rank_shape of each rank, when the caller has them."""
    stage = replace(grid, pipe=1)
    step = request.step_settings(stage, rows_layout, microbatches, recompute)
    out = []
    for r in range(grid.pipe) if ranks is None else ranks:
        out.append(
            memory_per_rank(
                parts[r] if parts else pipe_rank_shape(request.shape, grid.pipe, virtual, r),
                stage,
                step,
                zero=zero,
                in_flight=pipeline_in_flight(schedule, grid.pipe, microbatches, virtual, r),
                whole_gradients=True,  # (ZeRO 2: reduced after the step's last micro-batch)
            )
        )
    return out


def pipeline_refusal(shape: TransformerShape, pipe: int, virtual: int = 1) -> str | None:
    """Why the engine cannot cut `shape` into pipe * virtual stages (None when it can): a family whose stage set-up
    is not confirmed, input embeddings tied to lm_head (they would sit on the first and the last stage), or more
    stages than decoder layers."""
    if shape.pipeline_refusal:
        return shape.pipeline_refusal
    if shape.tie_embeddings:
        return "input embeddings tied to lm_head would sit on different stages (the engine refuses them); untie them"
    if pipe * virtual > shape.layers:
        return f"{pipe * virtual} stages for {shape.layers} decoder layers; choose at most one stage per layer"
    return None


def _compute_bound(request: PlanRequest, stage: GridShape, parts: list[TransformerShape], step: StepSettings) -> float:
    """Seconds of the busiest pipe rank's matrix products in a step: a lower bound of its busy time (_RankWork),
    cheap enough to skip predictions that cannot win."""
    flops = max(
        rank_flops_per_step(part, stage, step)
        for part in {(q.layers, q.runs_head): q for q in parts}.values()  # the embeddings cost no products
    )
    return request.compute_seconds(flops)


def plan_pipelined(request: PlanRequest, grid: GridShape) -> GridPlan:
    """plan_grid for grid.pipe > 1: for each rows layout, schedule (and V), ZeRO setting and checkpointing setting,
    the micro-batch counts M the schedule accepts whose every pipe rank fits in memory, keeping the fastest."""
    shape, p = request.shape, grid.pipe
    refusal = pipeline_refusal(shape, p)
    if refusal:
        return GridPlan(grid, False, f"cannot pipeline: {refusal}")
    stage = replace(grid, pipe=1)
    reason = grid_fits_shape(shape, stage)
    if reason is not None:
        return GridPlan(grid, False, f"cannot shard: {reason}")
    layouts = request.rows_layouts_on(stage, PIPE_ROWS_LAYOUTS)
    splits = [r for r in layouts if request.global_batch % readers(stage, r) == 0]
    if not splits:
        return GridPlan(
            grid,
            False,
            f"global batch {request.global_batch} is not divisible by the GPUs of a stage reading different rows "
            f"({' or '.join(str(readers(stage, r)) for r in layouts)}): not a multiple of a stage's GPUs",
        )
    limit = request.memory_limit
    zeros = request.zero_choices(stage, PIPE_ZERO_STAGES)
    best: GridPlan | None = None
    smallest: tuple[float, GridPlan] | None = None
    refused: list[str] = []
    cache = PipeCache()
    for layout in splits:
        rows_total = request.global_batch // readers(stage, layout)  # rows each GPU reads per step
        counts = [request.microbatches] if request.microbatches else range(rows_total, 0, -1)
        for schedule in request.pipe_schedules:
            for v in request.pipe_virtual if schedule in INTERLEAVED else (1,):
                if pipeline_refusal(shape, p, v):
                    refused.append(pipeline_refusal(shape, p, v))
                    continue
                choices = [m for m in counts if rows_total % m == 0 and not pipeline_check(schedule, p, m, v)]
                if not choices:
                    refused.append(f"{schedule} (V={v}) has no micro-batch count for {rows_total} rows per GPU")
                # the ranks whose memory can peak: per part of the model, the one holding the most micro-batches
                parts = [pipe_rank_shape(shape, p, v, r) for r in range(p)]
                fullest: dict[PartKey, int] = {}
                for r, part in enumerate(parts):
                    fullest.setdefault(part_key(part), r)  # (lowest r: most)
                for zero in zeros:
                    for recompute in request.recompute_choices:
                        fitted = False
                        for m in choices:  # the most micro-batches first: the smallest memory and bubble
                            memory = pipeline_memory(
                                request, grid, schedule, m, v, recompute, zero, layout, sorted(fullest.values()), parts
                            )
                            peak = max(memory, key=lambda e: e.total)
                            if peak.total > limit:
                                if smallest is None or peak.total < smallest[0]:
                                    tried = GridPlan(grid, False, "", m, recompute, memory=peak, zero=zero, rows=layout)
                                    smallest = (peak.total, replace(tried, schedule=schedule, virtual=v))
                                break  # fewer micro-batches hold more activations each: none fits either
                            fitted = True
                            bound = _compute_bound(
                                request, stage, parts, request.step_settings(stage, layout, m, recompute)
                            )
                            if best is not None and bound / (1 - pipeline_bubble(schedule, p, m, v)) >= best.step_s:
                                break  # its compute alone, stretched by its bubble (longer with fewer M), is slower
                            plan = pipeline_step_prediction(
                                request, grid, schedule, m, v, recompute, zero, layout, cache, parts
                            )
                            plan.memory = peak
                            if best is None or plan.step_s < best.step_s:
                                best = plan
                            # fewer micro-batches would save only message latencies and lengthen the bubble: the
                            # model charges no other cost per micro-batch (ZeRO 2 gathers once per step)
                            break
                        if fitted:
                            break  # checkpointing adds a forward: only where the plan does not fit without it
    if best is not None:
        best.stage_memory = [
            e.total
            for e in pipeline_memory(
                request, grid, best.schedule, best.grad_accum, best.virtual, best.recompute, best.zero, best.rows
            )
        ]
        return best
    if smallest is None:
        return GridPlan(grid, False, "cannot pipeline: " + "; ".join(dict.fromkeys(refused)))
    need = smallest[1]
    setting = f", ZeRO stage {need.zero.stage}" if need.zero is not None else ""
    return replace(
        need,
        reason=f"needs {need.memory.total / GIB:.1f} GiB per GPU (params {need.memory.params / GIB:.1f}, "
        f"activations {need.memory.activations / GIB:.1f}) on its fullest stage even with {need.grad_accum} "
        f"micro-batches ({need.schedule}){' and checkpointing' if need.recompute else ''}{setting}; "
        f"{limit / GIB:.1f} GiB usable",
    )


def plan_grid(request: PlanRequest, grid: GridShape) -> GridPlan:
    """Feasibility, micro-batching, memory and predicted step time of one grid."""
    if grid.pipe > 1:
        return plan_pipelined(request, grid)
    reason = grid_fits_shape(request.shape, grid)
    if reason is not None:
        return GridPlan(grid, False, f"cannot shard: {reason}")
    layouts = request.rows_layouts_on(grid)
    splits = [r for r in layouts if request.global_batch % readers(grid, r) == 0]
    if not splits:
        need = " or ".join(
            f"{readers(grid, r)} ({'shared rows: data*z' if r == 'shared' else 'the world size'})" for r in layouts
        )
        hint = "" if "shared" in layouts else "; goldfish train --rows shared needs only a multiple of data*z"
        return GridPlan(
            grid,
            False,
            f"global batch {request.global_batch} is not divisible by {need}: not a multiple of the world size{hint}",
        )
    limit, recompute_choices = request.memory_limit, request.recompute_choices
    best, smallest, tried = None, None, (0, None, "own")
    accum_refused = []
    for layout in splits:
        rows_total = request.global_batch // readers(grid, layout)  # rows each GPU reads per step
        if request.grad_accum is not None:
            if rows_total % request.grad_accum:
                accum_refused.append(
                    f"{rows_total} rows per GPU ({layout} rows) do not split into {request.grad_accum} micro-batches"
                )
                continue
            choices = [request.grad_accum]
        else:
            choices = [a for a in range(1, rows_total + 1) if rows_total % a == 0]
        for zero in request.zero_choices(grid):
            for recompute in recompute_choices:
                for accum in choices:
                    step = request.step_settings(grid, layout, accum, recompute)  # rows_total // accum rows per GPU
                    memory = memory_per_rank(request.shape, grid, step, zero=zero)
                    if smallest is None or memory.total < smallest.total:
                        smallest, tried = memory, (accum, zero, layout)
                    if memory.total <= limit:
                        plan = step_prediction(request, grid, accum, recompute, zero, layout)
                        plan.memory = memory
                        if best is None or plan.step_s < best.step_s:
                            best = plan
                        break  # more micro-batches only add weight gathers: the fewest that fit is the fastest
    if best is not None:
        return best
    if smallest is None:
        return GridPlan(grid, False, "; ".join(accum_refused))
    accum, zero, layout = tried
    setting = f", ZeRO stage {zero.stage}" if zero is not None else ""
    return GridPlan(
        grid,
        False,
        f"needs {smallest.total / GIB:.1f} GiB per GPU (params {smallest.params / GIB:.1f}, "
        f"activations {smallest.activations / GIB:.1f}) even with {accum} micro-batches"
        f"{' and checkpointing' if recompute_choices[-1] else ''}{setting}; {limit / GIB:.1f} GiB usable",
        grad_accum=accum,
        recompute=recompute_choices[-1],
        memory=smallest,
        zero=zero,
        rows=layout,
    )


def rank_grids(request: PlanRequest) -> list[GridPlan]:
    """Every ordered grid of request.gpus: feasible ones by predicted step time (fastest first), then the
    rejected ones with their reasons."""
    plans = [plan_grid(request, g) for g in pipe_grids(request.gpus, request.pipes)]
    feasible = sorted(
        (p for p in plans if p.feasible), key=lambda p: (p.step_s, p.grid.pipe, p.grid.x * p.grid.y * p.grid.z)
    )
    rejected = [p for p in plans if not p.feasible]
    return feasible + rejected


def pipe_grids(gpus: int, pipes: list[int]) -> list[GridShape]:
    """Every ordered grid pipe * data * x * y * z of `gpus` with pipe in `pipes` (each a divisor of gpus)."""
    return [replace(g, pipe=p) for p in pipes for g in ordered_grids(gpus // p)]


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}B"


def format_table(request: PlanRequest, plans: list[GridPlan], top: int = 20) -> str:
    """The ranked grids as a text table (first `top` feasible ones) with a summary line."""
    feasible = [p for p in plans if p.feasible]
    rejected = [p for p in plans if not p.feasible]
    shape, profile = request.shape, request.profile
    lines = [
        f"{shape.name or 'model'}: {shape.n_params / 1e9:.2f}B parameters, {request.gpus} GPUs on "
        f"{profile.name} ({profile.gpus_per_node} per node, {profile.gpu_memory_gib:g} GiB, "
        f"{profile.peak_tflops:g} Tflop/s at {request.compute_efficiency:.0%}), global batch "
        f"{request.global_batch} x {request.seq} tokens",
        f"{len(plans)} grids: {len(feasible)} feasible, {len(rejected)} rejected",
        "",
    ]
    refusal = pipeline_refusal(shape, 1) if request.pipe_sizes is None else None
    if refusal:
        lines.insert(-1, f"pipe 1 only: {refusal}")
    extra = request.zero_plus_plus  # the levels and quantization columns, when the request considers them
    piped = max(request.pipes) > 1  # the schedule and bubble columns, when the request considers a pipeline
    header = (
        f"{'rank':>4} {'pipe':>4} {'data':>5} {'x':>4} {'y':>4} {'z':>4} {'rows':>6} {'zero':>4} "
        + (f"{'levels':>6} {'quant':>5} " if extra else "")
        + (f"{'schedule':>8} " if piped else "")
        + f"{'accum':>5} {'ckpt':>4} "
        f"{'step s':>9} "
        f"{'compute':>9} "
        f"{'memory':>9} {'comm':>9} "
        + (f"{'bubble':>9} " if piped else "")
        + f"{'mem GiB':>8} {'MFU':>6}  bytes sent per GPU by group"
    )
    lines.append(header)
    for i, p in enumerate(feasible[:top], 1):
        g = p.grid
        traffic = ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in sorted(p.bytes_by_group.items(), key=lambda kv: -kv[1]))
        ckpt = "yes" if p.recompute else "no"
        stage = p.zero.stage if p.zero is not None else 0
        levels, quant = zero_plus_plus_label(p.zero)
        lines.append(
            f"{i:>4} {g.pipe:>4} {g.data:>5} {g.x:>4} {g.y:>4} {g.z:>4} {p.rows:>6} {stage:>4} "
            + (f"{levels:>6} {quant:>5} " if extra else "")
            + (f"{schedule_label(p):>8} " if piped else "")
            + f"{p.grad_accum:>5} {ckpt:>4} "
            f"{p.step_s:>9.4g} "
            f"{p.compute_s:>9.4g} {p.memory_s:>9.4g} {p.comm_s:>9.4g} "
            + (f"{p.bubble_s:>9.4g} " if piped else "")
            + f"{p.memory.total / GIB:>8.1f} {p.mfu:>6.1%}  {traffic}"
        )
    if not feasible:
        lines.append("(no grid fits)")
        best = min((p for p in rejected if p.memory is not None), key=lambda p: p.memory.total, default=None)
        if best is not None:
            lines.append(f"smallest memory need: grid {best.grid}: {best.reason}")
            replicated = best.memory.detail["replicated_params"] * request.bytes_per_param / GIB
            if best.zero is None and best.memory.detail["vocab_parts"] == 1:
                lines.append(
                    f"of which {replicated:.1f} GiB are the replicated embeddings, lm_head and norms (split "
                    "by vocabulary only when x*y*z > 1 divides the vocabulary, else only by ZeRO)"
                )
    reasons: dict[str, int] = {}
    for p in rejected:
        key = (
            p.reason.split(":")[0]
            if p.reason.startswith(("cannot shard", "cannot pipeline"))
            else (
                "out of memory"
                if p.reason.startswith("needs")
                else "batch not divisible by the GPUs reading different rows"
                if p.reason.startswith("global batch")
                else p.reason
            )
        )
        reasons[key] = reasons.get(key, 0) + 1
    if reasons:
        lines.append("rejected: " + "; ".join(f"{n} {k}" for k, n in reasons.items()))
    if any(p.reason.startswith("global batch") for p in rejected):
        lines.append(
            "(rows: 'own' = every GPU reads its own rows, the batch a multiple of the world size; 'shared' = "
            "the GPUs of an x*y group read the same rows (goldfish train --rows shared, as AxoNN), the batch "
            "a multiple of data*z)"
        )
    return "\n".join(lines)


RENDEZVOUS_PORT = 29500  # torchrun's default master port
MASTER_ADDRESS = '"$MASTER_ADDR"'  # the first node's address, set by the user or the job script


def launch_nodes(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, processes per node) that run `gpus` processes on nodes of `gpus_per_node` GPUs: the fewest nodes
    that hold them with the same count on each (torchrun starts as many on every node)."""
    nodes = math.ceil(gpus / max(gpus_per_node, 1))
    while gpus % nodes:
        nodes += 1
    return nodes, gpus // nodes


def launcher(request: PlanRequest) -> str:
    """The command that starts `request.gpus` processes of `-m goldfish` on the profile's nodes, to paste as it is:
    `goldfish` itself for one GPU, `torchrun --standalone` on one node, and on several a torchrun to start on each
    node, meeting at $MASTER_ADDR (the first node's address)."""
    if request.gpus == 1:
        return "goldfish"
    nodes, per_node = launch_nodes(request.gpus, request.profile.gpus_per_node)
    if nodes == 1:
        return f"torchrun --standalone --nproc-per-node {per_node} -m goldfish"
    return (
        f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-backend c10d "
        f"--rdzv-endpoint {MASTER_ADDRESS}:{RENDEZVOUS_PORT} -m goldfish"
    )


def train_command(request: PlanRequest, plan: GridPlan, leading: Sequence[str] = ()) -> str:
    """The command that runs `plan`: `launcher` and `goldfish train` with `leading` (e.g. the model and the run
    folder, which the caller knows) and the options of every choice the planner makes (grid, batch, micro-batches,
    precision, activation checkpointing, ZeRO). Embeddings are split by vocabulary by default whenever the planner
    assumed so."""
    g = plan.grid
    sizes = (("pipe", g.pipe), ("data", g.data), ("x", g.x), ("y", g.y), ("z", g.z))
    axes = ",".join(f"{a}={v}" for a, v in sizes if v > 1) or "data=1"
    if g.pipe > 1:  # the pipeline's micro-batches replace gradient accumulation
        micro = [f"--pipe-schedule {plan.schedule}", f"--microbatches {plan.grad_accum}"]
        micro += [f"--pipe-virtual {plan.virtual}"] if plan.schedule in INTERLEAVED else []
    else:
        micro = [f"--grad-accum {plan.grad_accum}"]
    parts = [
        f"{launcher(request)} train",
        *leading,
        f"--grid {axes}" if request.gpus > 1 else "",
        f"--batch-size {request.global_batch}",
        *micro,
        f"--seq-len {request.seq}",
        f"--precision {request.precision}",
    ]
    if plan.rows != "own":
        parts.append(f"--rows {plan.rows}")
    if plan.recompute:
        parts.append("--activation-checkpointing")
    zero = plan.zero
    if zero is not None and zero.stage:
        parts.append(f"--zero {zero.stage}")
        if zero.node_size > 1:  # level sizes innermost first, ending with the node: 8, or 2,8
            parts.append(f"--zero-hierarchy {','.join(map(str, (*zero.inner_levels, zero.node_size)))}")
        if zero.quantized:
            quantized = [p for p, on in zip(QUANTIZE_PARTS, (zero.quantize_weights, zero.quantize_gradients)) if on]
            parts.append(f"--zero-quantize {','.join(quantized)}")
            if zero.quantize_gradients and zero.gradient_bits != 8:
                parts.append(f"--zero-quantize-bits {zero.gradient_bits}")
            if zero.quantize_block != DEFAULT_QUANT_BLOCK:
                parts.append(f"--zero-quantize-block {zero.quantize_block}")
        if zero.offload:
            parts.append("--offload-optimizer")
    return " ".join(p for p in parts if p)


def schedule_label(plan: GridPlan) -> str:
    """The table's "schedule" cell: "-" without a pipeline, else the schedule and, for the interleaved ones, its
    stages per rank ("1f1b", "gpipe", "i1f1b:2", "zb:2")."""
    if plan.grid.pipe == 1:
        return "-"
    short = {"interleaved-1f1b": "i1f1b", "zero-bubble": "zb"}.get(plan.schedule, plan.schedule)
    return f"{short}:{plan.virtual}" if plan.schedule in INTERLEAVED else short


def zero_plus_plus_label(zero: ZeroConfig | None) -> tuple[str, str]:
    """The table's "levels" and "quant" cells of a ZeRO setting: level sizes innermost first ending with the node
    ("2,8", "8", "-" when flat) and the quantized collectives ("w" qwZ, "g8"/"g4" qgZ and its bits, "-" none)."""
    if zero is None or zero.stage < 2:
        return "-", "-"
    levels = ",".join(map(str, (*zero.inner_levels, zero.node_size))) if zero.node_size > 1 else "-"
    quant = "+".join(
        (["w"] if zero.quantize_weights else []) + ([f"g{zero.gradient_bits}"] if zero.quantize_gradients else [])
    )
    return levels, quant or "-"
