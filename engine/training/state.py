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
from engine.core.linear import ParallelLinear, ShardingError, current_rows_layout
from engine.core.vocab_parallel import is_vocab_parallel
from engine.memory.zero import full, is_dtensor, like, local, zero_state
from engine.models.parallelize import REGION_ATTR
from engine.spec import AXES, gradient_axes


def _reduction_axes(model: nn.Module) -> list[tuple[nn.Parameter, tuple[str, ...]]]:
    """Each distinct parameter of `model` with the grid axes its gradient must be summed over."""
    found: dict[int, tuple[nn.Parameter, tuple[str, ...]]] = {}
    layout = current_rows_layout(model)

    def visit(module: nn.Module, region: str | None, prefix: str) -> None:
        region = getattr(module, REGION_ATTR, region)
        for name, param in module.named_parameters(recurse=False):
            axes = ("data",) if isinstance(module, ParallelLinear) else gradient_axes(layout, region)
            seen = found.get(id(param))
            if seen is not None and seen[1] != axes:
                raise ShardingError(
                    f"parameter {prefix}{name} is shared between parts of the model whose "
                    "gradients mean different things (e.g. a decoder layer and an embedding)"
                )
            found[id(param)] = (param, axes)
        for name, child in module.named_children():
            visit(child, region, f"{prefix}{name}.")

    visit(model, None, "")
    return list(found.values())


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
    for param, axes in _reduction_axes(model):
        if param.grad is None:
            continue
        grad = param.grad
        if is_dtensor(grad):  # FSDP reduce-scattered it over data in backward
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
    counted on one rank of the axis it is replicated over, replicated parameters once, and ZeRO's gradient
    chunks summed over data. Call it after sync_gradients. Same semantics as torch.nn.utils.clip_grad_norm_
    (coefficient max_norm/(norm+1e-6), capped at 1); only the 2-norm is supported.
    """
    if norm_type != 2.0:
        raise ValueError(f"clip_grad_norm_ supports norm_type=2.0 only, got {norm_type}")
    params = [p for p in model.parameters() if p.grad is not None]
    zero = zero_state(model)
    if grid.size("x", "y", "z") == 1 and zero is None:
        return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=None)
    if not params:
        return torch.tensor(0.0)
    device = local(params[0].grad).device
    # squares of: replicated, tensor-sharded, and the same two for gradients chunked over data
    squares = torch.zeros(4, dtype=torch.float64, device=device)
    seen: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if param.grad is None or id(param) in seen:
                continue
            seen.add(id(param))
            if is_vocab_parallel(module):  # rows split over x*y*z
                slot = 1
            elif not isinstance(module, ParallelLinear):
                slot = 0
            elif name == "weight" or module.bias_is_counted():
                slot = 1
            else:
                continue
            chunked = is_dtensor(param.grad) or (zero is not None and zero.is_chunked(param))
            # a stage-1 gradient is zero outside this rank's chunk: its full sum of squares is the chunk's
            squares[slot + 2 * chunked] += local(param.grad).detach().double().square().sum()
    if zero is not None:
        squares[2:] = comm.all_reduce(squares[2:], grid.group("data"))
    total = (squares[0] + squares[2] + comm.all_reduce(squares[1] + squares[3], grid.group("x", "y", "z"))).sqrt()
    norm = total.to(params[0].grad.dtype).reshape(())
    coefficient = max_norm / (float(total) + 1e-6)
    if coefficient < 1.0 and math.isfinite(float(total)):
        for p in params:
            p.grad.mul_(coefficient)
    return norm


def _parallel_layers(model: nn.Module) -> dict[str, ParallelLinear]:
    """Every ParallelLinear by each of its names (shared modules appear under each name)."""
    return {name: m for name, m in model.named_modules(remove_duplicate=False) if isinstance(m, ParallelLinear)}


@torch.no_grad()
def full_state_dict(model: nn.Module, grid: Grid, rank0_only: bool = False) -> dict[str, torch.Tensor]:
    """The serial model's state dict: same keys, full tensors, serial layouts (e.g. GPT-2 Conv1D (in, out)).

    Collective over each tensor-parallel group (and, for a model partitioned with ZeRO stage 2 or 3, over each
    data group): every rank must call it. With `rank0_only`, rank 0 gets the dict and the others an empty one
    (they keep at most one gathered layer at a time).
    """
    keep = not rank0_only or grid.rank == 0
    state = model.state_dict()
    gathered: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
    layer_keys: set[str] = set()
    for name, layer in _parallel_layers(model).items():
        if id(layer) not in gathered:
            weight = layer.gather_weight(full(layer.weight))
            bias = None if layer.bias is None else layer.gather_bias(full(layer.bias))
            if layer.serial_layout == "conv1d":
                weight = weight.t().contiguous()
            gathered[id(layer)] = (weight, bias) if keep else (None, None)
        weight, bias = gathered[id(layer)]
        prefix = f"{name}." if name else ""
        layer_keys.update({f"{prefix}weight", f"{prefix}bias"})
        if keep:
            state[f"{prefix}weight"] = weight
            if bias is not None:
                state[f"{prefix}bias"] = bias
    for name, module in _vocab_modules(model).items():  # vocabulary-parallel embeddings and lm_head
        key = f"{name}.weight" if name else "weight"
        layer_keys.add(key)
        if id(module.weight) not in gathered:
            weight = module.gather_rows(full(module.weight))
            gathered[id(module.weight)] = (weight if keep else None, None)
        if keep:
            state[key] = gathered[id(module.weight)][0]
    whole: dict[int, torch.Tensor] = {}
    for key, value in list(state.items()):
        if key not in layer_keys and is_dtensor(value):
            if id(value) not in whole:
                whole[id(value)] = full(value)
            state[key] = whole[id(value)]
    return state if keep else {}


def _vocab_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Every vocabulary-parallel module by each of its names."""
    return {name: m for name, m in model.named_modules(remove_duplicate=False) if is_vocab_parallel(m)}


@torch.no_grad()
def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor], grid: Grid) -> None:
    """Load a serial-layout state dict (e.g. from full_state_dict or a serial model) into a parallelized
    model: each rank copies its shards out of the full tensors (and its data-axis chunks, for a model
    partitioned with ZeRO stage 2 or 3). Keys must match exactly (strict). No communication."""
    local_state = dict(state)
    for name, layer in _parallel_layers(model).items():
        prefix = f"{name}." if name else ""
        key = f"{prefix}weight"
        if key not in state:
            continue  # strict loading reports it
        weight = state[key]
        if layer.serial_layout == "conv1d":
            weight = weight.t()
        expected = (layer.out_features, layer.in_features)
        if tuple(weight.shape) != expected:
            raise ShardingError(
                f"{key}: expected a full weight of shape {expected} (serial layout "
                f"{layer.serial_layout}), got {tuple(state[key].shape)}"
            )
        local_state[key] = layer.shard_weight(weight)
        bias_key = f"{prefix}bias"
        if layer.bias is not None and bias_key in state:
            if tuple(state[bias_key].shape) != (layer.out_features,):
                raise ShardingError(
                    f"{bias_key}: expected shape {(layer.out_features,)}, got {tuple(state[bias_key].shape)}"
                )
            local_state[bias_key] = layer.shard_bias(state[bias_key])
    for name, module in _vocab_modules(model).items():
        key = f"{name}.weight" if name else "weight"
        if key in state:
            if tuple(state[key].shape) != (module.full_vocab, module.weight.shape[1]):
                raise ShardingError(
                    f"{key}: expected a full weight of shape {(module.full_vocab, module.weight.shape[1])}, "
                    f"got {tuple(state[key].shape)}"
                )
            local_state[key] = module.shard_rows(state[key])
    for key, current in model.state_dict(keep_vars=True).items():
        if key in local_state and is_dtensor(current):
            local_state[key] = like(current, local_state[key].contiguous())
    model.load_state_dict(local_state, strict=True)
