"""Collectives as autograd functions, in adjoint pairs: the only place where communication meets autograd.

Conventions. A tensor is *replicated* over a group when every rank holds the same full value; its gradient
is then replicated too (each rank holds the full gradient). A tensor is *split* when each rank holds one
chunk. A *partial* tensor is a sum of per-rank contributions. The pairs (forward / backward):

    copy_to_group        identity / all-reduce      replicated input consumed by rank-specific work
    reduce_from_group    all-reduce / identity      partial outputs summed into a replicated result
    split_to_group       take own chunk / all-gather
    gather_from_group    all-gather / take own chunk
    gather_sharded       all-gather / reduce-scatter  a sharded tensor whose full value every rank uses
                                                      on its own data (ZeRO-style weights, rows)
    reduce_scatter_to_group  reduce-scatter / all-gather

Each wrapper costs nothing for a group of one rank. `tensor_parallel_matmul` is the fused core of the
parallel Linear: it gathers a weight block sharded over Z, multiplies, and in backward overlaps its
collectives with its own matrix products.
"""

from __future__ import annotations

import torch

from engine.core import comm
from engine.core.grid import AxisGroup


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: AxisGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return comm.all_reduce(grad, ctx.group), None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: AxisGroup) -> torch.Tensor:
        return comm.all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class _SplitToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: AxisGroup, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return comm.chunk(x, group, dim).contiguous()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return comm.all_gather(grad, ctx.group, ctx.dim), None, None


class _GatherFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: AxisGroup, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return comm.all_gather(x, group, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return comm.chunk(grad, ctx.group, ctx.dim).contiguous(), None, None


class _GatherSharded(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: AxisGroup, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return comm.all_gather(x, group, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return comm.reduce_scatter(grad, ctx.group, ctx.dim), None, None


class _ReduceScatterToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group: AxisGroup, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return comm.reduce_scatter(x, group, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return comm.all_gather(grad, ctx.group, ctx.dim), None, None


def copy_to_group(x: torch.Tensor, group: AxisGroup) -> torch.Tensor:
    """Identity forward; backward sums the gradient over the group (x is replicated, its users are not)."""
    return x if group.size == 1 else _CopyToGroup.apply(x, group)


def reduce_from_group(x: torch.Tensor, group: AxisGroup) -> torch.Tensor:
    """Sum of the partial tensors `x` over the group; backward passes the replicated gradient through."""
    return x if group.size == 1 else _ReduceFromGroup.apply(x, group)


def split_to_group(x: torch.Tensor, group: AxisGroup, dim: int) -> torch.Tensor:
    """This rank's chunk of the replicated `x` along `dim`; backward all-gathers the chunk gradients."""
    return x if group.size == 1 else _SplitToGroup.apply(x, group, dim)


def gather_from_group(x: torch.Tensor, group: AxisGroup, dim: int) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim` (a replicated result); backward keeps this rank's chunk."""
    return x if group.size == 1 else _GatherFromGroup.apply(x, group, dim)


def gather_sharded(x: torch.Tensor, group: AxisGroup, dim: int) -> torch.Tensor:
    """Concatenate every rank's shard `x` along `dim`; backward reduce-scatters the (partial) gradients.

    For a shard whose full value each rank applies to different data: the full gradient is the sum of
    the ranks' gradients, and each rank keeps the chunk of that sum that belongs to its shard.
    """
    return x if group.size == 1 else _GatherSharded.apply(x, group, dim)


def reduce_scatter_to_group(x: torch.Tensor, group: AxisGroup, dim: int) -> torch.Tensor:
    """Sum the partial `x` over the group and keep this rank's chunk along `dim`; backward all-gathers."""
    return x if group.size == 1 else _ReduceScatterToGroup.apply(x, group, dim)


class _TensorParallelMatmul(torch.autograd.Function):
    """y = x @ W.T where W is the all-gather over `shard_group` (dim 0) of the local `weight` shard.

    x: (..., k) local input slice; weight: (m / shard_group.size, k); y: (..., m), partial over the
    group that splits k (the caller reduces it). Backward: dx = dy @ W summed over `input_grad_group`
    (the ranks that share x but produce other output slices); dW = dy.T @ x reduce-scattered over
    `shard_group`. W is gathered again in backward rather than kept (memory over bandwidth).
    With `overlap`, the weight gather runs behind dW's product and dW's reduce-scatter behind dx's
    product; without it the same collectives run one after another on the same data, so the numbers
    are identical.
    """

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        weight: torch.Tensor,
        shard_group: AxisGroup,
        input_grad_group: AxisGroup,
        overlap: bool,
        gathered: torch.Tensor | None,
    ) -> torch.Tensor:
        full = gathered if gathered is not None else comm.all_gather(weight, shard_group, 0)
        # Under autocast, multiply in the autocast dtype like F.linear would (a custom Function is not
        # cast automatically); gradients leave in the dtypes of x and the weight.
        device_type, x_dtype = x.device.type, x.dtype
        if torch.is_autocast_enabled(device_type) and x.is_floating_point():
            compute = torch.get_autocast_dtype(device_type)
            x, full = x.to(compute), full.to(compute)
        ctx.dtypes = (x_dtype, weight.dtype)
        ctx.save_for_backward(x, weight)
        ctx.shard_group, ctx.input_grad_group, ctx.overlap = shard_group, input_grad_group, overlap
        with torch.autocast(device_type, enabled=False):
            return torch.matmul(x, full.t())

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        shard_group, input_grad_group = ctx.shard_group, ctx.input_grad_group
        grad = grad.to(x.dtype)

        def weight_block() -> torch.Tensor:  # (out shard rows * z, in): this rank's rows' contribution
            return grad.reshape(-1, grad.shape[-1]).t().matmul(x.reshape(-1, x.shape[-1])).to(w_dtype)

        grad_x = grad_w = None
        if ctx.overlap:
            full_pending = comm.all_gather_async(weight, shard_group, 0) if need_x else None
            w_pending = comm.reduce_scatter_async(weight_block(), shard_group, 0) if need_w else None
            if need_x:
                partial = torch.matmul(grad, full_pending.wait().to(grad.dtype)).to(x_dtype)
                grad_x = comm.all_reduce(partial, input_grad_group, inplace=True)
            if need_w:
                grad_w = w_pending.wait()
        else:
            if need_x:
                full = comm.all_gather(weight, shard_group, 0)
                partial = torch.matmul(grad, full.to(grad.dtype)).to(x_dtype)
                grad_x = comm.all_reduce(partial, input_grad_group, inplace=True)
            if need_w:
                grad_w = comm.reduce_scatter(weight_block(), shard_group, 0)
        return grad_x, grad_w, None, None, None, None


def tensor_parallel_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    shard_group: AxisGroup,
    input_grad_group: AxisGroup,
    overlap: bool = True,
    gathered: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ W.T with W gathered from `weight` shards over `shard_group`; see _TensorParallelMatmul.

    Shapes: x (..., k), weight (m / shard_group.size, k) -> (..., m). `gathered`: W already gathered
    (e.g. prefetched while the previous layer computed); it must equal the all-gather of `weight`.
    """
    if shard_group.size == 1 and input_grad_group.size == 1:
        return torch.matmul(x, weight.t())
    return _TensorParallelMatmul.apply(
        x, weight, shard_group, input_grad_group, overlap, None if gathered is None else gathered.detach()
    )
