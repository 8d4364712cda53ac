"""Gradients and weights of a parallelized model: sync, clipping, and full (serial-layout) state dicts.

What a parameter's gradient holds after backward, and the axes sync_gradients sums it over:

    ParallelLinear weight/bias shard   the rows of its x*y*z group (the Linear reduces over z itself)
                                       -> summed over data
    inside the decoder ("layer")       the rows of its x*y group, identical over x and y
    (norms, position embeddings)       -> summed over z and data
    per-head norms ("heads")           the rows of its x*y group, its own heads (partial over y)
                                       -> summed over y, z and data
    everything else ("rows": input     this rank's own rows
    embeddings, lm_head, ...)
                                       -> summed over all axes

In the "shared" rows layout (engine/models/parallelize.py) every rank of an x*y group reads the group's rows, so the
embeddings, lm_head and everything else outside the decoder see the rows of their x*y group, replicated over x and
y, like the decoder's norms: they are summed over z and data only (not X*Y times); the other regions keep their axes.

Afterwards every rank holds the gradient of the SUM of all ranks' local losses, and every copy of a
replicated parameter holds the same gradient.

Under ZeRO (engine/memory/zero.py) the data axis belongs to the partitioning: FSDP-managed parameters (stages 2, 3)
arrive with their gradient chunk already summed over data (a DTensor), and stage 1 reduce-scatters its
gradients here; either way only the chunk is summed over the remaining axes, and clip_grad_norm_ adds the
chunks' squares over the data axis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from engine.core import comm
from engine.core.grid import Grid
from engine.core.linear import ShardingError
from engine.core.placement import local_shard, placed_like
from engine.memory.zero import full, is_dtensor, like, local, zero_state
from engine.models.layout import ParamLayout, plan_of
from engine.spec import AXES


@torch.no_grad()
def sync_gradients(model: nn.Module, grid: Grid, *, over: Sequence[str] = AXES) -> None:
    """After backward: make every gradient the gradient of the sum of all ranks' local losses (in place).

    Call it once per optimizer step, after the last micro-batch's backward, on every rank. Free on a grid
    of one rank. Parameters without a gradient are skipped (they must be the same on every rank).
    over: the axes summed over. ("x", "y", "z") sums within each tensor-parallel group only, leaving each data
    group with the gradient of its own loss (per-sample gradients in evaluation); not with ZeRO.
    """
    if grid.world_size == 1:
        return
    zero = zero_state(model)
    if tuple(over) != AXES and zero is not None:
        raise ValueError("sync_gradients(over=...) is for models without ZeRO: ZeRO's chunks are summed over data")
    if zero is not None and zero.config.stage == 1:
        zero.reduce_scatter_gradients()  # the data axis: each rank keeps its summed chunk
    buckets: dict[tuple[str, ...], list[torch.Tensor]] = {}
    plan = plan_of(model, grid)
    for p in plan.params.values():
        param, axes = p.tensor, plan.gradient_axes(p)  # the axes the plan says its gradient is summed over
        if param.grad is None:
            continue
        grad = local_shard(param.grad)  # a placed parameter's gradient is placed as it is
        if is_dtensor(param.grad):  # FSDP reduce-scattered it over data in backward
            axes, grad = tuple(a for a in axes if a != "data"), local(grad)
        elif zero is not None and zero.is_chunked(param):
            axes, grad = tuple(a for a in axes if a != "data"), grad[zero.rows(param)]
        axes = tuple(a for a in axes if a in over)
        if grid.size(*axes) > 1:
            buckets.setdefault(axes, []).append(grad)
    for axes, grads in buckets.items():
        group = grid.group(*axes)
        batch, count = [], 0
        for g in grads:
            batch.append(g)
            count += g.numel()
            if count >= comm.BUCKET_ELEMENTS:
                comm.all_reduce_coalesced(batch, group)
                batch, count = [], 0
        comm.all_reduce_coalesced(batch, group)


@torch.no_grad()
def clip_grad_norm_(model: nn.Module, max_norm: float, grid: Grid, norm_type: float = 2.0) -> torch.Tensor:
    """Scale gradients so that their global norm is at most `max_norm`; return the norm before clipping.

    The norm is that of the full (serial) model's gradient: shards are summed over x*y*z, a bias shard is
    counted on one rank of the axis it is replicated over, replicated parameters once, ZeRO's gradient
    chunks summed over data, and a pipeline's stages (each holding its own parameters' gradients) summed over
    pipe. Call it after sync_gradients. Same semantics as torch.nn.utils.clip_grad_norm_
    (coefficient max_norm/(norm+1e-6), capped at 1); only the 2-norm is supported.
    """
    if norm_type != 2.0:
        raise ValueError(f"clip_grad_norm_ supports norm_type=2.0 only, got {norm_type}")
    params = [p for p in model.parameters() if p.grad is not None]
    zero = zero_state(model)
    pipelined = grid.size("pipe") > 1  # each stage's ranks hold the gradients of its parameters only
    if grid.size("x", "y", "z") == 1 and zero is None and not pipelined:
        return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=None)
    if not params and not pipelined:
        return torch.tensor(0.0)
    device = local(params[0].grad).device if params else grid.device
    # squares of: replicated, tensor-sharded, and the same two for gradients chunked over data
    squares = torch.zeros(4, dtype=torch.float64, device=device)
    for p in plan_of(model, grid).params.values():
        param = p.tensor
        if param.grad is None or not p.counted_in_norm():
            continue
        slot = 1 if p.split_axes else 0  # shards are summed over x*y*z, replicated tensors counted where they are
        chunked = is_dtensor(param.grad) or (zero is not None and zero.is_chunked(param))
        # a stage-1 gradient is zero outside this rank's chunk: its full sum of squares is the chunk's
        squares[slot + 2 * chunked] += local(param.grad).detach().double().square().sum()
    if zero is not None:
        squares[2:] = comm.all_reduce(squares[2:], grid.group("data"))
    total = squares[0] + squares[2] + comm.all_reduce(squares[1] + squares[3], grid.group("x", "y", "z"))
    if pipelined:
        total = comm.all_reduce(total, grid.group("pipe"))
    total = total.sqrt()
    norm = total.to(params[0].grad.dtype if params else torch.float32).reshape(())
    coefficient = max_norm / (float(total) + 1e-6)
    if coefficient < 1.0 and math.isfinite(float(total)):
        for p in params:
            p.grad.mul_(coefficient)
    return norm


def _gather_full(p: ParamLayout, grid: Grid) -> torch.Tensor:
    """The natural full tensor from every rank's local one (collective over the axes `p` is split over)."""
    value = full(p.local).detach()
    if not p.split_axes:
        return value
    group = grid.group("x", "y", "z")  # the groups the grid builds: ranks that repeat a block write the same values
    gathered = comm.all_gather(value.contiguous().unsqueeze(0), group, 0)
    return p.assemble([(grid.shape.coords(rank), gathered[i]) for i, rank in enumerate(group.ranks)])


@torch.no_grad()
def full_state_dict(model: nn.Module, grid: Grid, rank0_only: bool = False) -> dict[str, torch.Tensor]:
    """The serial model's state dict: same keys, full tensors, serial layouts (e.g. GPT-2 Conv1D (in, out)).

    Collective over each tensor-parallel group (and, for a model partitioned with ZeRO stage 2 or 3, over each
    data group; on a pipe grid, over the pipeline group, each stage's tensors coming from its own ranks): every rank
    must call it. With `rank0_only`, rank 0 gets the dict and the others an empty one
    (they keep at most one gathered tensor at a time).
    """
    keep = not rank0_only or grid.rank == 0
    state: dict[str, torch.Tensor] = {}
    params = list(plan_of(model, grid).params.values())
    holders = _pipe_holders(params, grid)
    for p, holder in zip(params, holders):
        value = _gather_full(p, grid) if holder in (None, grid.group("pipe").rank) else None
        if holder is not None:  # held by one pipeline stage's ranks: theirs, to every rank of the pipeline group
            if value is None:
                value = torch.empty(p.full_shape, dtype=p.tensor.dtype, device=grid.device)
            value = comm.broadcast_(value.to(grid.device).contiguous(), grid.group("pipe"), holder)
        if p.serial_transposed:
            value = value.t().contiguous()
        if keep:
            for key in (p.key, *p.aliases):
                state[key] = value
    return {key: state[key] for key in model.state_dict(keep_vars=True)} if keep else {}


def _pipe_holders(params: list[ParamLayout], grid: Grid) -> list[int | None]:
    """Per tensor, the pipe coordinate of the ranks holding it when only one pipeline stage's ranks do (the others'
    copies are on the meta device, engine/training/pipeline.py), else None (every rank holds its own part).
    Collective over the pipe group when the grid has one."""
    if grid.size("pipe") == 1:
        return [None] * len(params)
    held = torch.tensor([[not p.tensor.is_meta for p in params]], dtype=torch.int32, device=grid.device)
    by_rank = comm.all_gather(held, grid.group("pipe"), 0).bool().cpu()  # (P, tensors)
    return [None if bool(column.all()) else int(column.int().argmax()) for column in by_rank.t()]


@torch.no_grad()
def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor], grid: Grid) -> None:
    """Load a serial-layout state dict (e.g. from full_state_dict or a serial model) into a parallelized
    model: each rank copies its shards out of the full tensors (and its data-axis chunks, for a model
    partitioned with ZeRO stage 2 or 3). Keys must match exactly (strict). No communication."""
    local_state = dict(state)
    for p in plan_of(model, grid).params.values():
        for key in (p.key, *p.aliases):
            if key not in state:
                continue  # strict loading reports it
            value = state[key].t() if p.serial_transposed else state[key]
            if tuple(value.shape) != p.full_shape:
                expected = p.full_shape[::-1] if p.serial_transposed else p.full_shape
                what = key.rpartition(".")[2]  # weight, bias, ...
                raise ShardingError(f"{key}: expected a full {what} of shape {expected}, got {tuple(state[key].shape)}")
            value = p.take_local(value) if p.split else value
            if is_dtensor(p.tensor):
                value = like(p.tensor, value.contiguous())
            local_state[key] = placed_like(p.tensor, value)
    model.load_state_dict(local_state, strict=True)
