"""The planner: rank every data x X x Y x Z grid of G GPUs by predicted step time, with memory per GPU.

For each ordered factorisation of the GPU count it

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

`goldfish plan` (goldfish.app.plan) builds a PlanRequest from its options and prints `format_table`; its
`--measure OUT.json` instead times the collectives of every group size and placement on the current cluster under
torchrun (engine.planner.measure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from engine.planner.cost_model import (
    ROWS_LAYOUTS,
    MemoryEstimate,
    TransformerShape,
    bytes_by_group,
    grid_fits_shape,
    group_axes,
    llama_step_collectives,
    memory_per_rank,
    model_flops_per_token,
    ordered_grids,
    rank_flops_per_step,
    rank_memory_traffic_per_step,
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


@dataclass(frozen=True)
class PlanRequest:
    """What to plan for. global_batch counts sequences of `seq` tokens per optimizer step."""

    shape: TransformerShape
    gpus: int
    global_batch: int
    seq: int
    profile: MachineProfile
    compute_efficiency: float = 0.5  # fraction of peak the matrix products reach
    grad_accum: int | None = None  # None: the smallest that fits in memory
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

    def __post_init__(self) -> None:
        for name in ("gpus", "global_batch", "seq"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
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
    rows: str = "own"  # the rows layout (goldfish train --rows): "own" per GPU or "shared" per x*y group

    def to_json(self) -> dict[str, Any]:
        g = self.grid
        out = {
            "grid": {"data": g.data, "x": g.x, "y": g.y, "z": g.z},
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
        if self.memory is not None:
            out["memory_gib"] = {
                "params": self.memory.params / GIB,
                "activations": self.memory.activations / GIB,
                "transient": self.memory.transient / GIB,
                "total": self.memory.total / GIB,
            }
        return out


def readers(grid: GridShape, rows: str) -> int:
    """How many GPUs read different rows of a step in rows layout `rows`: all of them, or data*z when shared."""
    return grid.size(*row_split_axes(rows))


def step_prediction(
    request: PlanRequest,
    grid: GridShape,
    grad_accum: int,
    recompute: bool = False,
    zero: ZeroConfig | None = None,
    rows_layout: str = "own",
) -> GridPlan:
    """Predicted time and traffic of one step on `grid` with `grad_accum` micro-batches, optional activation
    checkpointing, ZeRO setting and rows layout (no feasibility checks: see plan_grid)."""
    profile = request.profile
    rows = request.global_batch // (readers(grid, rows_layout) * grad_accum)  # rows each GPU reads per micro-batch
    param_bytes, act_bytes, stream_bytes = request.element_bytes
    collectives = llama_step_collectives(
        request.shape,
        grid,
        rows_per_rank=rows,
        seq=request.seq,
        param_bytes=param_bytes,
        act_bytes=act_bytes,
        stream_bytes=stream_bytes,
        grad_accum=grad_accum,
        mask_bytes=request.mask_bytes,
        recompute=recompute,
        zero=zero,
        rows=rows_layout,
    )  # embeddings split by vocabulary as parallelize does
    sizes = {"data": grid.data, "x": grid.x, "y": grid.y, "z": grid.z}
    totals: dict[tuple[str, str, int], list[int]] = {}
    for c in collectives:
        entry = totals.setdefault((c.group, c.kind, c.ranks), [0, 0])
        entry[0] += c.sent_bytes
        entry[1] += c.count
    comm_by_group: dict[str, float] = {}
    for (group, kind, ranks), (sent, calls) in totals.items():
        stride = group_stride(group_axes(group), sizes)
        if group.startswith("data.level") and zero is not None:  # ZeRO's levels: members step over the inner ones
            stride *= math.prod(zero.level_sizes(grid.data)[: int(group.removeprefix("data.level")) - 1])
        seconds = profile.collective_seconds(kind, ranks, stride, sent, calls)
        comm_by_group[group] = comm_by_group.get(group, 0.0) + seconds
    flops = rank_flops_per_step(
        request.shape,
        grid,
        rows_per_rank=rows,
        seq=request.seq,
        grad_accum=grad_accum,
        recompute=recompute,
        rows=rows_layout,
    )
    compute = flops / (profile.peak_tflops * 1e12 * request.compute_efficiency)
    traffic = rank_memory_traffic_per_step(
        request.shape,
        grid,
        rows_per_rank=rows,
        seq=request.seq,
        act_bytes=act_bytes,
        bytes_per_param=request.bytes_per_param,
        grad_accum=grad_accum,
        recompute=recompute,
        rows=rows_layout,
    )
    memory_s = traffic / (profile.memory_gbps * 1e9)
    comm = sum(comm_by_group.values())
    step = compute + memory_s + comm
    useful = model_flops_per_token(request.shape, request.seq) * request.global_batch * request.seq
    mfu = useful / (step * request.gpus * profile.peak_tflops * 1e12)
    return GridPlan(
        grid,
        True,
        "",
        grad_accum,
        recompute,
        rows,
        step,
        compute,
        memory_s,
        comm,
        comm_by_group,
        bytes_by_group(collectives),
        None,
        mfu,
        zero,
        rows_layout,
    )


def plan_grid(request: PlanRequest, grid: GridShape) -> GridPlan:
    """Feasibility, micro-batching, memory and predicted step time of one grid."""
    reason = grid_fits_shape(request.shape, grid)
    if reason is not None:
        return GridPlan(grid, False, f"cannot shard: {reason}")
    # without x or y parallelism both layouts are the same: plan it once, as the default "own"
    layouts = [r for r in request.rows_layouts if not row_replica_axes(r) or grid.size(*row_replica_axes(r)) > 1] or [
        OWN
    ]
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
    param_bytes, act_bytes, stream_bytes = request.element_bytes
    limit = request.profile.gpu_memory_gib * GIB * request.memory_fraction
    settings = {"auto": (False, True), "on": (True,), "off": (False,)}[request.checkpointing]
    best, smallest, tried = None, None, (0, None, "own")
    stages = [s for s in request.zero_stages if s == 0 or grid.data > 1] or [0]
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
        for zero in [z for s in stages for z in (request.zero_configs(grid, s) if s else [None])]:
            for recompute in settings:
                for accum in choices:
                    memory = memory_per_rank(
                        request.shape,
                        grid,
                        rows_per_rank=rows_total // accum,
                        seq=request.seq,
                        bytes_per_param=request.bytes_per_param,
                        act_bytes=act_bytes,
                        param_bytes=param_bytes,
                        recompute=recompute,
                        zero=zero,
                        stream_bytes=stream_bytes,
                        rows=layout,
                    )
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
        f"{' and checkpointing' if settings[-1] else ''}{setting}; {limit / GIB:.1f} GiB usable",
        grad_accum=accum,
        recompute=settings[-1],
        memory=smallest,
        zero=zero,
        rows=layout,
    )


def rank_grids(request: PlanRequest) -> list[GridPlan]:
    """Every ordered grid of request.gpus: feasible ones by predicted step time (fastest first), then the
    rejected ones with their reasons."""
    plans = [plan_grid(request, g) for g in ordered_grids(request.gpus)]
    feasible = sorted((p for p in plans if p.feasible), key=lambda p: (p.step_s, p.grid.x * p.grid.y * p.grid.z))
    rejected = [p for p in plans if not p.feasible]
    return feasible + rejected


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
    extra = request.zero_plus_plus  # the levels and quantization columns, when the request considers them
    header = (
        f"{'rank':>4} {'data':>5} {'x':>4} {'y':>4} {'z':>4} {'rows':>6} {'zero':>4} "
        + (f"{'levels':>6} {'quant':>5} " if extra else "")
        + f"{'accum':>5} {'ckpt':>4} "
        f"{'step s':>9} "
        f"{'compute':>9} "
        f"{'memory':>9} {'comm':>9} {'mem GiB':>8} {'MFU':>6}  bytes sent per GPU by group"
    )
    lines.append(header)
    for i, p in enumerate(feasible[:top], 1):
        g = p.grid
        traffic = ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in sorted(p.bytes_by_group.items(), key=lambda kv: -kv[1]))
        ckpt = "yes" if p.recompute else "no"
        stage = p.zero.stage if p.zero is not None else 0
        levels, quant = zero_plus_plus_label(p.zero)
        lines.append(
            f"{i:>4} {g.data:>5} {g.x:>4} {g.y:>4} {g.z:>4} {p.rows:>6} {stage:>4} "
            + (f"{levels:>6} {quant:>5} " if extra else "")
            + f"{p.grad_accum:>5} {ckpt:>4} "
            f"{p.step_s:>9.4g} "
            f"{p.compute_s:>9.4g} {p.memory_s:>9.4g} {p.comm_s:>9.4g} {p.memory.total / GIB:>8.1f} "
            f"{p.mfu:>6.1%}  {traffic}"
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
            if p.reason.startswith("cannot shard")
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
    if feasible:
        lines.append(f"fastest, as goldfish train runs it: {train_command(request, feasible[0])}")
    return "\n".join(lines)


def train_command(request: PlanRequest, plan: GridPlan) -> str:
    """The `goldfish train` options that run `plan` (grid, batch, micro-batches, precision, activation
    checkpointing, ZeRO): every choice the planner makes is one of them. Embeddings are split by vocabulary
    by default whenever the planner assumed so."""
    g = plan.grid
    axes = ",".join(f"{a}={v}" for a, v in (("data", g.data), ("x", g.x), ("y", g.y), ("z", g.z)) if v > 1) or "data=1"
    parts = [
        f"torchrun --nproc-per-node ... ({request.gpus} processes) -m goldfish train"
        if request.gpus > 1
        else "goldfish train",
        f"--grid {axes}" if request.gpus > 1 else "",
        f"--batch-size {request.global_batch}",
        f"--grad-accum {plan.grad_accum}",
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
