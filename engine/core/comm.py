"""Raw collectives on an explicit AxisGroup: the one place that moves data with torch.distributed.

Two other modules call torch.distributed, for jobs that are not collectives on a grid group: engine/core/grid.py
creates and destroys the process groups, and engine/planner/measure.py times raw collectives on ad-hoc groups to fit a
machine profile. Everything else (layers, gradient sync, checkpoints, the training loop, sharded evaluation)
goes through the functions here.

Every function takes the group as an argument (no default group), returns new tensors (inputs are never
modified), and costs nothing for a group of one rank. Backend and device come from the tensors, so the
same code runs on gloo/CPU and NCCL/GPU. When the grid's ByteCounter is enabled each call adds the bytes
this rank sends (ring model) under the group's name.

`*_async` variants start the collective and return a `Pending` whose `wait()` gives the result; they let
a layer overlap communication with computation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from engine.core.grid import AxisGroup
from engine.core.quantize import dequantize, quantize

# engine.training.state and engine.memory.zero read comm.BUCKET_ELEMENTS
from engine.spec import BUCKET_ELEMENTS, BlockFormat  # noqa: F401

# torch 2.13 renamed the single-tensor collectives; older releases only have the old names.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# Gradient sums are coalesced into flat buckets of at most BUCKET_ELEMENTS elements (engine.training.state's sync,
# ZeRO-1's reduce-scatter in engine.memory.zero; the cost model counts the same buckets: engine.spec defines it for
# both).


@dataclass
class Pending:
    """A collective in flight: `wait()` blocks until it is done and returns its result tensor."""

    work: dist.Work | None
    finish: Callable[[], torch.Tensor]

    def wait(self) -> torch.Tensor:
        if self.work is not None:
            self.work.wait()
            self.work = None
        return self.finish()


def _done(t: torch.Tensor) -> Pending:
    return Pending(None, lambda: t)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def all_reduce_async(t: torch.Tensor, group: AxisGroup, *, inplace: bool = False) -> Pending:
    """Start summing `t` over the group; the result has t's shape.

    `t` is left unchanged unless `inplace` (then a contiguous `t` receives the sum, saving a copy).
    """
    if group.size == 1:
        return _done(t)
    out = t if inplace and t.is_contiguous() else t.contiguous().clone()
    group.counter.add(group.name, 2 * _nbytes(out) * (group.size - 1) / group.size)
    work = dist.all_reduce(out, group=group.group, async_op=True)
    return Pending(work, lambda: out)


def all_reduce(t: torch.Tensor, group: AxisGroup, *, inplace: bool = False) -> torch.Tensor:
    """Sum of `t` over the group's ranks (same shape on every rank); see all_reduce_async for `inplace`."""
    return all_reduce_async(t, group, inplace=inplace).wait()


def all_gather_async(t: torch.Tensor, group: AxisGroup, dim: int = 0) -> Pending:
    """Start concatenating every rank's `t` along `dim`, in group-rank order. Shapes must match across ranks."""
    if group.size == 1:
        return _done(t)
    dim = dim % max(t.dim(), 1)
    if t.dim() == 0:
        raise ValueError("all_gather needs a tensor with at least one dimension (gloo cannot gather 0-d tensors)")
    front = t.movedim(dim, 0).contiguous()
    out = torch.empty((group.size * front.shape[0], *front.shape[1:]), dtype=t.dtype, device=t.device)
    group.counter.add(group.name, _nbytes(out) * (group.size - 1) / group.size)
    work = _all_gather_single(out, front, group=group.group, async_op=True)
    return Pending(work, lambda: out.movedim(0, dim) if dim else out)


def all_gather(t: torch.Tensor, group: AxisGroup, dim: int = 0) -> torch.Tensor:
    """Every rank's `t` concatenated along `dim` in group-rank order (size along dim grows by group.size)."""
    return all_gather_async(t, group, dim).wait()


def reduce_scatter_async(t: torch.Tensor, group: AxisGroup, dim: int = 0) -> Pending:
    """Start summing `t` over the group and keeping this rank's chunk along `dim` (chunk i for group rank i)."""
    if group.size == 1:
        return _done(t)
    if t.dim() == 0 or t.shape[dim] % group.size:
        raise ValueError(
            f"reduce_scatter over {group.name} ({group.size} ranks) needs dim {dim} of shape "
            f"{tuple(t.shape)} to be divisible by {group.size}"
        )
    dim = dim % t.dim()
    front = t.movedim(dim, 0).contiguous()
    out = torch.empty((front.shape[0] // group.size, *front.shape[1:]), dtype=t.dtype, device=t.device)
    group.counter.add(group.name, _nbytes(front) * (group.size - 1) / group.size)
    work = _reduce_scatter_single(out, front, group=group.group, async_op=True)
    return Pending(work, lambda: out.movedim(0, dim) if dim else out)


def reduce_scatter(t: torch.Tensor, group: AxisGroup, dim: int = 0) -> torch.Tensor:
    """Sum of `t` over the group, split along `dim`: this rank keeps chunk number group.rank."""
    return reduce_scatter_async(t, group, dim).wait()


def all_to_all(t: torch.Tensor, group: AxisGroup) -> torch.Tensor:
    """Row i of `t` (shape (group.size, ...)) goes to group rank i; row j of the result came from group rank j.
    Counts the rows this rank sends to the others: (size - 1) / size of t's bytes."""
    if group.size == 1:
        return t
    if t.dim() == 0 or t.shape[0] != group.size:
        raise ValueError(f"all_to_all over {group.name} needs dim 0 of size {group.size}, got shape {tuple(t.shape)}")
    front = t.contiguous()
    out = torch.empty_like(front)
    group.counter.add(group.name, _nbytes(front) * (group.size - 1) / group.size)
    dist.all_to_all_single(out, front, group=group.group)
    return out


def chunk(t: torch.Tensor, group: AxisGroup, dim: int = 0) -> torch.Tensor:
    """This rank's chunk of `t` along `dim` (no communication); dim must divide by the group size."""
    if group.size == 1:
        return t
    if t.shape[dim] % group.size:
        raise ValueError(
            f"cannot split dim {dim} of shape {tuple(t.shape)} over {group.name} ({group.size} ranks): not divisible"
        )
    return t.chunk(group.size, dim=dim)[group.rank]


def exchange_ints(values: list[int], group: AxisGroup, device: torch.device) -> list[list[int]]:
    """Every rank's list of small integers (same length on all ranks), in group-rank order.

    A control message (shapes, flags) for decisions every rank of the group must take alike; it is not
    counted by the ByteCounter, which measures data.
    """
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    if group.size == 1:
        return [values]
    out = torch.empty(group.size * mine.numel(), dtype=torch.int64, device=device)
    _all_gather_single(out, mine, group=group.group)
    return out.reshape(group.size, -1).tolist()


def all_reduce_coalesced(tensors: list[torch.Tensor], group: AxisGroup) -> None:
    """Sum each tensor of `tensors` over the group IN PLACE, with one collective per dtype (flattened buffer)."""
    if group.size == 1 or not tensors:
        return
    by_dtype: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault((t.dtype, t.device), []).append(t)
    for same in by_dtype.values():
        flat = torch.cat([t.reshape(-1) for t in same])
        group.counter.add(group.name, 2 * _nbytes(flat) * (group.size - 1) / group.size)
        dist.all_reduce(flat, group=group.group)
        offset = 0
        for t in same:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def sum_control(t: torch.Tensor, group: AxisGroup) -> torch.Tensor:
    """Sum of `t` over the group, NOT counted by the ByteCounter: for small bookkeeping values (loss sums,
    token counts) that the training loop exchanges each step, so the logged traffic stays the model's own."""
    if group.size == 1:
        return t
    out = t.contiguous().clone()
    dist.all_reduce(out, group=group.group)
    return out


def max_over_world(t: torch.Tensor) -> torch.Tensor:
    """`t`, in place, made the maximum of `t` over every process of the world (the default group, which a Grid spans);
    a control message, NOT counted, free for one process: for flags every rank must agree on (an overflow found in one
    rank's shards, engine/training/scaler.py)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def all_agree(ok: bool, group: AxisGroup, device: torch.device) -> bool:
    """True when every rank of the group passes ok=True (a control message; free for one rank). Lets every rank
    take the same decision after a step that may fail on some ranks only (a checkpoint write, a load)."""
    if group.size == 1:
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group.group)
    return bool(flag.item())


def broadcast_object(obj: object, group: AxisGroup, device: torch.device, src_group_rank: int = 0) -> object:
    """The picklable `obj` of the group's rank `src_group_rank`, on every rank of the group (a control message)."""
    if group.size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=group.ranks[src_group_rank], group=group.group, device=device)
    return box[0]


def broadcast_(t: torch.Tensor, group: AxisGroup, src_group_rank: int) -> torch.Tensor:
    """Overwrite `t` in place with the group's rank `src_group_rank`'s tensor of the same shape; counted as the
    src rank sending its bytes once to each other rank of the group (the tree model is at most that)."""
    if group.size > 1:
        if group.rank == src_group_rank:
            group.counter.add(group.name, _nbytes(t) * (group.size - 1))
        dist.broadcast(t, src=group.ranks[src_group_rank], group=group.group)
    return t


def send(t: torch.Tensor, group: AxisGroup, dst_group_rank: int, *, counted: bool = True) -> None:
    """Send `t` point to point to the group's rank `dst_group_rank`, counted as its bytes once on the sender unless
    `counted` is False (a few bytes of control, e.g. a shape announced before the tensor, kept out of the traffic log
    that is compared with the planner's prediction)."""
    if counted:
        group.counter.add(group.name, _nbytes(t))
    dist.send(t.contiguous(), group=group.group, group_dst=dst_group_rank)


def recv(t: torch.Tensor, group: AxisGroup, src_group_rank: int) -> torch.Tensor:
    """Overwrite `t` in place with the tensor the group's rank `src_group_rank` sends (same shape and dtype)."""
    dist.recv(t, group=group.group, group_src=src_group_rank)
    return t


def gather_objects(obj: object, group: AxisGroup, dst_group_rank: int = 0) -> list[object] | None:
    """Every rank's picklable `obj`, in group-rank order, on the group's rank `dst_group_rank` (None elsewhere)."""
    if group.size == 1:
        return [obj]
    received: list[object] | None = [None] * group.size if group.rank == dst_group_rank else None
    dist.gather_object(obj, received, dst=group.ranks[dst_group_rank], group=group.group)
    return received


def all_gather_objects(obj: object, group: AxisGroup) -> list[object]:
    """Every rank's picklable `obj`, in group-rank order, on every rank of the group (a control message)."""
    if group.size == 1:
        return [obj]
    received: list[object] = [None] * group.size
    dist.all_gather_object(received, obj, group=group.group)
    return received


def barrier(group: AxisGroup) -> None:
    """Wait until every rank of the group reaches this point."""
    if group.size > 1:
        dist.barrier(group=group.group)


# ----- FSDP2's collectives, counted (engine/memory/zero.py plugs these into torch.distributed.fsdp.fully_shard) -----


def _fsdp_api():
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter  # FSDP2's comm hooks

    return AllGather, ReduceScatter


class _NamedGroups:
    """Maps the process groups FSDP2 hands its comm hooks (ours, or the secondary ones it builds itself for
    reshard_after_forward=<int>) to the grid's AxisGroup of the same members, for counting under its name."""

    def __init__(self, groups: list[AxisGroup]) -> None:
        self._by_ranks = {tuple(g.ranks): g for g in groups}
        self._cache: dict[int, AxisGroup] = {}

    def __call__(self, group: dist.ProcessGroup) -> AxisGroup:
        found = self._cache.get(id(group))
        if found is None:
            ranks = tuple(dist.get_process_group_ranks(group))
            if ranks not in self._by_ranks:
                raise RuntimeError(
                    f"FSDP issued a collective on ranks {ranks}, not a data-axis group of the grid "
                    f"({', '.join(g.name for g in self._by_ranks.values())})"
                )
            found = self._cache[id(group)] = self._by_ranks[ranks]
        return found


def gather_levels(payload: torch.Tensor, levels: tuple[AxisGroup, ...]) -> torch.Tensor:
    """Every rank's 1-D `payload` over the nested `levels` (innermost first, engine.core.grid.Grid.data_levels),
    as rows in data-index order: shape (product of the level sizes, payload.numel()).

    Outermost level first, so the slowest link carries only each rank's own payload and every level inward
    carries what the levels outside it gathered (ring bytes per rank: p * (g_out - 1) at the outermost level,
    p * g_out * (g_next - 1) at the next, ...; p * (D - 1) in all, as one flat all-gather)."""
    rows = payload.reshape(1, -1)
    for group in reversed(levels):
        rows = all_gather(rows, group)  # leading index: this level's digit, then the outer digits gathered so far
    sizes = [g.size for g in levels]
    # rows are ordered (a1, a2, ..., ak) with a1 slowest; a data index has the innermost digit fastest
    digits = rows.reshape(*sizes, -1).permute(*reversed(range(len(sizes))), len(sizes))
    return digits.reshape(math.prod(sizes), -1)


def reduce_levels(blocks: torch.Tensor, levels: tuple[AxisGroup, ...], fmt: BlockFormat | None = None) -> torch.Tensor:
    """Sum `blocks` (shape (D, n): row d is what this rank sends to data index d) over the data axis, level by
    level innermost first, and return this rank's row summed over all D ranks (shape (n,)).

    At each level of g ranks the rows left are regrouped by that level's digit and reduce-scattered, so the
    fastest link carries the most bytes and only 1/g of them go on outward. With `fmt` (ZeRO++'s qgZ) each
    level instead quantizes every row it sends (engine.core.quantize), exchanges them with an all-to-all, and
    dequantizes and sums the g rows it receives in float32: each level adds the rounding of one quantization
    of partial sums, never of a running ring sum."""
    n = blocks.shape[-1]
    buf = blocks.reshape(-1, n)
    for group in levels:
        g = group.size
        # remaining row r = digit + g * rest: put this level's digit first
        by_digit = buf.reshape(-1, g, n).transpose(0, 1).reshape(g, -1)
        if fmt is None:
            buf = reduce_scatter(by_digit, group).reshape(-1, n)
            continue
        payloads = torch.stack([quantize(row, fmt) for row in by_digit])
        received = all_to_all(payloads, group)
        width = by_digit.shape[1]
        total = sum(dequantize(p, width, fmt, torch.float32) for p in received.unbind(0))
        buf = total.to(blocks.dtype).reshape(-1, n)
    return buf.reshape(n)


def fsdp_comms(
    data: AxisGroup,
    levels: tuple[AxisGroup, ...] = (),
    *,
    node: AxisGroup | None = None,
    weights: BlockFormat | None = None,
    gradients: BlockFormat | None = None,
) -> tuple[Any, Any]:
    """(all-gather, reduce-scatter) hooks for FSDPModule.set_custom_all_gather / set_custom_reduce_scatter.

    data: the data group. levels: the data axis as nested groups, innermost first (Grid.data_levels; empty or the
    data group alone: flat). node: the
    group of stage 3's secondary partition (hpZ), whose levels are all but the outermost. weights / gradients:
    the block formats of ZeRO++'s qwZ and qgZ (None: full precision).

    - A flat, unquantized collective is FSDP2's own (asynchronous), counted under the group's name.
    - A parameter all-gather over the data axis runs level by level (gather_levels), outermost first; with
      `weights` each rank's shard travels as int8 blocks and the gathered rows are dequantized into FSDP's
      output. The secondary partition's backward all-gather (over `node`) runs over the node's levels in full
      precision: it copies shards that the forward's dequantized gather produced.
    - The gradient reduce-scatter runs level by level innermost first (reduce_levels), with `gradients` as
      quantized all-to-alls.
    Every level's bytes are counted under its own name ("data.level1", ...). Unquantized, the result equals the
    flat collective up to float summation order.
    """
    AllGather, ReduceScatter = _fsdp_api()
    levels = tuple(levels) or (data,)
    named = _NamedGroups([data, *levels] + ([node] if node is not None else []))
    node_levels = levels[:-1]

    class CountedAllGather(AllGather):
        def allocate(self, size, *, dtype, device):  # noqa: ANN001 - FSDP2's protocol
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, async_op=False):  # noqa: ANN001
            axis = named(group)
            primary = axis is data
            path = levels if primary else node_levels if node is not None and axis is node else (axis,)
            fmt = weights if primary and input_tensor.is_floating_point() else None
            if len(path) == 1 and fmt is None:
                axis.counter.add(axis.name, _nbytes(output_tensor) * (axis.size - 1) / axis.size)
                return _all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)
            if fmt is None:
                output_tensor.copy_(gather_levels(input_tensor, path).reshape(-1))
                return None
            rows = gather_levels(quantize(input_tensor, fmt), path)
            out = output_tensor.view(rows.shape[0], -1)
            for index, payload in enumerate(rows.unbind(0)):
                out[index].copy_(dequantize(payload, out.shape[1], fmt, out.dtype))
            return None

    class CountedReduceScatter(ReduceScatter):
        def allocate(self, size, *, dtype, device):  # noqa: ANN001
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):  # noqa: ANN001
            if op != dist.ReduceOp.SUM:
                raise RuntimeError(
                    f"the engine's FSDP reduce-scatter sums gradients; FSDP asked for {op} (set "
                    "set_force_sum_reduction_for_comms(True) on every fully_shard'ed module)"
                )
            axis = named(group)
            if axis is not data:
                raise RuntimeError(f"FSDP reduced gradients over {axis.name}; the engine's ZeRO reduces over data")
            fmt = gradients if input_tensor.is_floating_point() else None
            if len(levels) == 1 and fmt is None:
                axis.counter.add(axis.name, _nbytes(input_tensor) * (axis.size - 1) / axis.size)
                return _reduce_scatter_single(output_tensor, input_tensor, group=group, async_op=async_op)
            output_tensor.copy_(reduce_levels(input_tensor.view(data.size, -1), levels, fmt))
            return None

    return CountedAllGather(), CountedReduceScatter()
