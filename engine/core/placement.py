"""Parameters placed as DTensors: what engine.parallelize makes of every parameter on a grid with tensor axes (the
split ones Shard, the unsplit ones Replicate; engine/models/layout.py, place_parameters), and how the engine reads them.

A placed parameter is an nn.Parameter holding a DTensor on Grid.device_mesh() whose local tensor is this rank's shard:
torch's DTensor API sees the split (`p.full_tensor()` is the serial tensor, `p.grad` a DTensor of the same placements;
for a fused projection both in its stored row order, which the plan's ParamLayout.order maps to the natural one),
while the engine's kernels and collectives work on `local_shard(p)`, and transformers' modules on the local tensors of
the replicated ones (LocalDuringForward). ZeRO's DTensors (sharded over a data mesh only) are not placed parameters."""

from __future__ import annotations

from typing import Any

import torch

from engine.core.sharding import TENSOR_AXES


def is_placed(t: object) -> bool:
    """True for a DTensor split over tensor-parallel axes (a parameter engine.parallelize placed on
    Grid.device_mesh), False for a plain tensor and for ZeRO's DTensors (sharded over a data mesh only)."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor) and any(a in (t.device_mesh.mesh_dim_names or ()) for a in TENSOR_AXES)


class LocalDuringForward:
    """A forward pre-hook / post-hook pair (one object) that lets the modules below a module compute on the local
    tensors of their replicated parameters (Replicate DTensors: the unsplit norms, biases and position tables of
    transformers' modules, which compute on them directly and would mix them with plain activations).

    `held` lists (owner, name) of the parameters in the hooked module's subtree: for the duration of its forward each
    one that is a Replicate DTensor is replaced in `owner._parameters` by `param.to_local()`, which is differentiable:
    the gradient arrives on the parameter as a DTensor of its placements (as FSDP2 exposes its unsharded parameters).
    Hooked on every module above such a parameter, so a module that reads a child's parameter itself (Gemma 3n's
    AltUp) and a module called on its own (a decoder layer recomputed in backward, a pipeline stage's layers) both
    see local tensors; the outermost call swaps, the inner ones find nothing placed. A parameter that is not
    replicated on the grid's mesh (a shard, which its parallel module reads with `local_shard`; one ZeRO unplaced or
    FSDP2 holds) is left alone. The post-hook runs even when the forward raises."""

    def __init__(self, held: tuple[tuple[torch.nn.Module, str], ...]) -> None:
        self.held = held

    def expose(self, module: torch.nn.Module, args: Any) -> None:
        swapped: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []
        for owner, name in self.held:
            param = owner._parameters.get(name)
            if is_replicated(param):
                swapped.append((owner, name, param))
                owner._parameters[name] = param.to_local()
        module.__dict__.setdefault(_SWAPPED, []).append(swapped)

    def restore(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        stack = module.__dict__.get(_SWAPPED)
        for owner, name, param in stack.pop() if stack else ():
            owner._parameters[name] = param

    def register(self, module: torch.nn.Module) -> None:
        module.register_forward_pre_hook(self.expose)
        module.register_forward_hook(self.restore, always_call=True)


_SWAPPED = "_replicated_swapped"  # a module's stack, one entry per running forward, of what its pre-hook swapped


def is_replicated(t: object) -> bool:
    """True for a placed DTensor replicated on every dim of its mesh (an unsplit parameter parallelize placed)."""
    return is_placed(t) and all(p.is_replicate() for p in t.placements)


def local_shard(t: torch.Tensor | None) -> torch.Tensor | None:
    """The tensor this rank holds of `t`: a placed DTensor's local shard (a view of its storage, differentiable),
    any other tensor itself."""
    return t.to_local() if is_placed(t) else t


def placed_like(template: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """`local` (this rank's shard) as a DTensor placed like `template` when that is placed (no communication),
    else `local` itself: what a placed parameter's optimizer state and loaded values must be."""
    if not is_placed(template):
        return local
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, template.device_mesh, template.placements, run_check=False)


def write_counts(tensor: torch.Tensor) -> tuple[int, int]:
    """Counts of in-place writes to `tensor` (its version counters): a placed DTensor counts an update through the
    DTensor (an optimizer step) on itself and a write into its local shard (a load) on the shard, so both; a plain
    tensor's count twice."""
    with torch.no_grad():
        return tensor._version, local_shard(tensor)._version  # the shard: a view, sharing the shard's counter


def refuse_mixed(params: Any, who: str) -> None:
    """Raise ValueError when `params` (parameters, or optimizer parameter groups) mix placed DTensors with plain
    tensors. engine.parallelize places every parameter of the model it is given, so a mix means a parameter was added
    (or an optimizer built from parameters) outside it; torch's multi-tensor kernels (foreach, fused: the default on
    GPUs) refuse such a list at the first step, on some devices only, so it is refused here, on every device, first."""
    placed = plain = 0
    for item in params:
        for p in item["params"] if isinstance(item, dict) else [item]:
            if is_placed(p):
                placed += 1
            else:
                plain += 1
    if placed and plain:
        raise ValueError(
            f"{who} holds {plain} plain tensors beside {placed} DTensor parameters of a parallelized model; add every "
            "parameter to the model before engine.parallelize (which places them all), then build the optimizer "
            "from model.parameters()"
        )
