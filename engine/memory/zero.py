"""Partitioning over the data axis (ZeRO stages 1-3, hierarchical partitioning after ZeRO++, optimizer offload).

`shard_data_axis(model, grid, ZeroConfig(...))` is a separate step after `engine.parallelize` (as torchtitan
applies FSDP after tensor parallelism): every rank of a data group holds the same tensor-parallel shards, and
ZeRO splits those again over the data axis. What each stage partitions over the D ranks of the data axis
(P = this rank's tensor-parallel shard of the parameters):

    stage 0   nothing: parameters, gradients and AdamW moments replicated; gradients all-reduced over data.
    stage 1   AdamW moments: each rank keeps the moments of its dim-0 chunk of every parameter (1/D). At the
              end of the step the summed gradient is reduce-scattered (each rank gets the sum of its chunk),
              the rank updates its chunk, and the chunks are all-gathered into the full parameter. Parameters
              and the gradient buffer stay full (P each); traffic equals an all-reduce (reduce-scatter +
              all-gather). Our own code (ZeroAdamW): torch's ZeroRedundancyOptimizer assigns WHOLE parameters
              to ranks (uneven shares on small models, one rank owning an embedding) and consolidates its
              state on one rank, which does not fit the engine's per-tensor sharded checkpoints; FSDP2 has no
              optimizer-only mode.
    stage 2   + gradients: torch.distributed.fsdp.fully_shard with reshard_after_forward=False (FSDP's
              SHARD_GRAD_OP, the ZeRO-2 analogue). Each decoder layer's gradients are reduce-scattered as
              soon as its backward is done, so only the chunk (P/D) is kept; AdamW moments are chunks too.
              Between steps the parameters are also kept as chunks (FSDP always reshards after backward),
              but they are all-gathered in the forward and stay whole until the layer's backward: the peak
              holds every layer's full parameters, as ZeRO-2 does (its all-gather of the updated parameters
              after the step is FSDP's all-gather before the next forward: the same bytes).
    stage 3   + parameters: fully_shard(reshard_after_forward=True) per decoder layer: a layer's parameters
              are all-gathered just before it runs and freed after, in forward and again in backward (FSDP2
              prefetches the next layer's gather). The root (embeddings, final norm, lm_head) is gathered
              once per forward and kept until its backward.

Hierarchical partitioning (`node_size` = data ranks per node, > 1, and optionally `inner_levels` inside the node,
e.g. the two GCDs of an MI250X; stages 2 and 3): the data axis becomes nested levels (Grid.data_levels, innermost
first). Gradients are reduce-scattered level by level innermost first, so each level passes on 1/g of what it
received and only 1/node_size of the bytes leave a node; parameter all-gathers run outermost first; in stage 3 each
layer keeps after its forward a secondary copy of its parameters sharded over the node only
(fully_shard(reshard_after_forward=node_size), ZeRO++'s hpZ), so the backward all-gathers stay inside a node
(over its inner levels). The primary partition (what the optimizer updates, and its moments) stays over all D
ranks. (An HSDP 2-D mesh would instead replicate over nodes and partition only inside a node: D/node_size times
more optimizer state per rank, which is what the hierarchy must avoid.)

Quantized collectives (ZeRO++; stages 2 and 3): `quantize_weights` (qwZ) sends the parameter all-gathers from the
primary partition as int8 blocks with a float32 scale each, dequantized into FSDP's full-precision buffer;
`quantize_gradients` (qgZ) replaces each level's reduce-scatter with an all-to-all of quantized rows, dequantized
and summed in float32 before the next level. engine.core.comm.fsdp_comms implements all of these as FSDP2's custom
all-gather and reduce-scatter hooks; docs/memory.md has the placement and the bounds.

Offload (`offload=True`; stages 2 and 3): FSDP2's CPUOffloadPolicy keeps the parameter and gradient chunks and
the AdamW moments in host memory and runs the update there; FSDP copies the chunks to the device for the
all-gathers. pin_memory=False so that the path runs (and is tested) on a CPU-only machine, where it is exact.

The engine's conventions stay: gradients are those of the SUM of all ranks' losses (FSDP's divide factor is
1 and its reduce-scatters sum, set on EVERY fully_shard'ed module, since both settings act on one module's
own parameters), sync_gradients no longer reduces the data axis of partitioned parameters but still sums
their chunks over the other axes (e.g. embeddings over x, y and z), and clip_grad_norm_ sums the chunks'
squares over the data axis too. FSDP-managed parameters are DTensors sharded over a DeviceMesh built from
the grid's data group; checkpoints hand DCP each rank's data-axis chunk of its tensors (engine/training/
checkpoint.py), so any stage reads any other's.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from engine.core import comm
from engine.core.grid import AxisGroup, Grid
from engine.core.linear import ParallelLinear
from engine.core.placement import is_placed, placed_like, refuse_mixed
from engine.core.vocab_parallel import own_class
from engine.models.layout import PLAN_ATTR, ParallelPlan, plan_of, unplace_parameters
from engine.models.parallelize import decoder_layers
from engine.spec import STAGES, ZeroConfig, ZeroError, data_ranks_per_node  # noqa: F401 - re-exported


def chunk_rows(rows: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of chunk `index` when `rows` are split into `parts` as torch.chunk and DTensor Shard(0)
    split them: chunks of ceil(rows/parts), the last ones shorter or empty."""
    size = -(-rows // parts)
    return min(index * size, rows), min((index + 1) * size, rows)


class ZeroState:
    """What shard_data_axis records in a model's layout (ParallelPlan.zero): the config, the data group and, for
    stage 1, the parameters whose gradients and updates it partitions."""

    def __init__(self, grid: Grid, config: ZeroConfig, mesh: Any) -> None:
        self.grid, self.config, self.mesh = grid, config, mesh
        self.data: AxisGroup = grid.group("data")
        self.chunked: dict[int, nn.Parameter] = {}  # stage 1: id -> parameter

    def __deepcopy__(self, memo: dict) -> "ZeroState":
        return self

    def rows(self, param: torch.Tensor) -> slice:
        """This rank's dim-0 chunk of a stage-1 parameter."""
        start, stop = chunk_rows(param.shape[0], self.data.size, self.data.rank)
        return slice(start, stop)

    def is_chunked(self, param: torch.Tensor) -> bool:
        return id(param) in self.chunked

    # ----- stage 1 -------------------------------------------------------------------------------------

    def _buckets(self, params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
        """Groups of parameters whose padded (D x chunk) buffers together reach about comm's bucket size."""
        out, batch, count = [], [], 0
        for p in params:
            batch.append(p)
            count += self.data.size * _padded_chunk(p, self.data.size)
            if count >= comm.BUCKET_ELEMENTS:
                out.append(batch)
                batch, count = [], 0
        if batch:
            out.append(batch)
        return out

    @torch.no_grad()
    def reduce_scatter_gradients(self) -> None:
        """Stage 1, at the end of backward: reduce-scatter every chunked gradient over the data axis. Afterwards
        p.grad holds the data-summed gradient in this rank's rows and zeros elsewhere (the buffer stays full
        size, as in ZeRO-1)."""
        params = [p for p in self.chunked.values() if p.grad is not None]
        D = self.data.size
        for bucket in self._buckets(params):
            by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
            for p in bucket:
                by_dtype.setdefault(p.grad.dtype, []).append(p)
            for same in by_dtype.values():
                sizes = [_padded_chunk(p, D) for p in same]
                buffer = same[0].grad.new_zeros(D, sum(sizes))
                offset = 0
                for p, size in zip(same, sizes):
                    flat = p.grad.reshape(p.shape[0], -1)
                    padded = flat.new_zeros(D * -(-p.shape[0] // D), flat.shape[1])
                    padded[: p.shape[0]] = flat
                    buffer[:, offset : offset + size] = padded.reshape(D, size)
                    offset += size
                mine = comm.reduce_scatter(buffer.reshape(-1), self.data)
                offset = 0
                for p, size in zip(same, sizes):
                    rows = self.rows(p)
                    own = mine[offset : offset + size].reshape(-1, *p.shape[1:])[: rows.stop - rows.start]
                    p.grad.zero_()
                    p.grad[rows] = own
                    offset += size

    @torch.no_grad()
    def gather_parameters(self) -> None:
        """Stage 1, after the update of each rank's chunks: all-gather the chunks into the full parameters. Only those
        with a gradient were updated (the same ones on every data rank: a pipeline stage's own parameters)."""
        D = self.data.size
        params = [p for p in self.chunked.values() if p.grad is not None]
        for bucket in self._buckets(params):
            by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
            for p in bucket:
                by_dtype.setdefault(p.dtype, []).append(p)
            for same in by_dtype.values():
                sizes = [_padded_chunk(p, D) for p in same]
                buffer = same[0].new_zeros(sum(sizes))
                offset = 0
                for p, size in zip(same, sizes):
                    own = p.detach()[self.rows(p)].reshape(-1)
                    buffer[offset : offset + own.numel()] = own
                    offset += size
                gathered = comm.all_gather(buffer.unsqueeze(0), self.data, 0)  # (D, sum sizes)
                offset = 0
                for p, size in zip(same, sizes):
                    full = gathered[:, offset : offset + size].reshape(-1, *p.shape[1:])[: p.shape[0]]
                    p.detach().copy_(full)
                    offset += size


def _padded_chunk(p: torch.Tensor, parts: int) -> int:
    """Elements of one rank's chunk of `p` padded to ceil(rows/parts) rows (the all-gather unit)."""
    rows = p.shape[0]
    return -(-rows // parts) * (p.numel() // rows if rows else 0)


def _parent_step(cls: type, owner: type) -> Any:
    """The step function that `owner`'s step extends in `cls`'s method order, without torch's hook wrapper: torch wraps
    each optimizer class's step once to run the step hooks, so a subclass calling super().step() would run them twice
    (the wrapper of its own class already ran them)."""
    mro = cls.__mro__
    parent = next(c for c in mro[mro.index(owner) + 1 :] if "step" in c.__dict__)
    step = parent.__dict__["step"]
    return step.__wrapped__ if getattr(step, "hooked", False) else step


class ZeroAdamW(torch.optim.AdamW):
    """torch.optim.AdamW for ZeRO stage 1: each rank updates only its dim-0 chunk of every parameter and keeps
    only that chunk's moments (as DTensors sharded over the data axis, like FSDP's, so checkpoints treat every
    stage alike); step() then all-gathers the chunks. The update is torch's own AdamW arithmetic (same
    functional kernel, elementwise), so each element is exactly what the replicated AdamW computes."""

    checkpoint_class = "AdamW"  # its state is AdamW's: checkpoints move between stages

    def __init__(self, params: Any, *, zero: ZeroState, **kwargs: Any) -> None:
        if kwargs.get("amsgrad"):
            raise ZeroError("ZeRO stage 1 supports AdamW without amsgrad")
        self._zero = zero
        super().__init__(params, **kwargs)

    def _init_group(
        self,
        group,
        params_with_grad,
        grads,
        exp_avgs,
        exp_avg_sqs,
        max_exp_avg_sqs,  # noqa: ANN001
        state_steps,
    ):  # noqa: ANN001 - torch.optim.Adam's private hook, same signature
        from torch.distributed.tensor import DTensor, Shard
        from torch.optim.optimizer import _get_scalar_dtype

        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise ZeroError("ZeRO stage 1 does not support sparse gradients")
            rows = self._zero.rows(p)
            params_with_grad.append(p.detach()[rows])  # a view: the update writes into p
            grads.append(p.grad[rows])
            state = self.state[p]
            if len(state) == 0:
                state["step"] = torch.tensor(0.0, dtype=_get_scalar_dtype())
                for key in ("exp_avg", "exp_avg_sq"):
                    local = torch.zeros_like(p.detach()[rows], memory_format=torch.preserve_format)
                    state[key] = DTensor.from_local(
                        local, self._zero.mesh, [Shard(0)], run_check=False, shape=p.shape, stride=p.stride()
                    )
            exp_avgs.append(state["exp_avg"].to_local())
            exp_avg_sqs.append(state["exp_avg_sq"].to_local())
            state_steps.append(state["step"])
        return False

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = _parent_step(type(self), ZeroAdamW)(self, closure)  # AdamW's, its step hooks run once (by this class)
        self._zero.gather_parameters()
        return loss


def zero_state(model: nn.Module) -> ZeroState | None:
    """The ZeroState shard_data_axis recorded in `model`'s layout, or None (stage 0 or never sharded)."""
    layout = model.__dict__.get(PLAN_ATTR)
    return layout.zero if isinstance(layout, ParallelPlan) else None


def _record(model: nn.Module, grid: Grid, state: ZeroState) -> None:
    """Keep the ZeroState in the model's layout (engine/models/layout.py), the one record of what each rank holds."""
    # the model's own record, the records of parallelized models inside it (a wrapper), or what its modules declare
    layout = plan_of(model, grid).unbound()
    model.__dict__[PLAN_ATTR] = replace(layout, zero=state)


def make_adamw(model: nn.Module, groups: list[dict[str, Any]], **kwargs: Any) -> torch.optim.AdamW:
    """AdamW over `groups` of `model`'s parameters: ZeroAdamW for a stage-1 model, else torch's AdamW (stages
    2 and 3 partition through FSDP's DTensor parameters, so plain AdamW keeps chunk-sized moments; on a parallelized
    model without ZeRO every parameter is a DTensor, which torch's AdamW takes as it is). Raises ValueError for groups
    that mix DTensor parameters with plain ones (engine.core.placement.refuse_mixed)."""
    state = zero_state(model)
    if state is not None and state.config.stage == 1:
        return ZeroAdamW(groups, zero=state, **kwargs)
    refuse_mixed(groups, "the optimizer")
    return torch.optim.AdamW(groups, **kwargs)


def _keep_prefetch_inside(layers: list[nn.Module]) -> None:
    """A ParallelLinear prefetches the z-gather of the layers that run after it; across decoder layers the next
    layer's weight is still FSDP's data-sharded DTensor at that moment, so keep prefetching inside a layer."""
    for layer in layers:
        inside = {id(m) for m in layer.modules()}
        for module in layer.modules():
            if isinstance(module, ParallelLinear):
                module._prefetch_next = tuple(m for m in module._prefetch_next if id(m) in inside)


def data_node(grid: Grid, config: ZeroConfig) -> AxisGroup:
    """The group of stage 3's secondary partition: the data ranks of one node. With one level inside the node it
    is that level's group (same members); with more (--zero-hierarchy 2,8) a group of its own."""
    if not config.inner_levels:
        return grid.data_levels(config.level_sizes(grid.size("data")))[0]
    return grid.data_node(config.node_size)


@contextmanager
def _secondary_mesh_from_grid(grid: Grid, config: ZeroConfig, device_type: str) -> Iterator[None]:
    """While fully_shard runs: build the hpZ secondary partition's mesh from the grid's node groups.

    For reshard_after_forward=<int>, torch 2.13's fully_shard builds that mesh itself (_fsdp_init.py,
    _get_post_forward_mesh_info: DeviceMesh(device_type, mesh.mesh.view(-1, k)) over this data group's ranks only),
    and DeviceMesh.__init__ creates its process groups with new_group, collectively and with sequentially numbered
    names: with several data groups (any tensor-parallel axis > 1) each creates other groups under the same names and
    the ranks wait on each other forever (measured: 8 gloo ranks, data=4 x=2, that very call never returns). The
    same mesh is made here from the groups Grid.data_levels and Grid.data_node built on every rank (no group
    creation), through that function, fully_shard's own hook for it. torch offers no public way in: a 2-D mesh given
    to fully_shard means HSDP (the primary partition replicated over nodes: D/node_size times the optimizer state),
    FSDPModule.set_reshard_after_forward takes a bool only, an SPMD mesh (dp_mesh_dims) refuses an int, and a
    shard_placement_fn's mesh goes through the same function. Hence this narrow patch, for the fully_shard calls only.
    """
    if not config.hierarchical or config.stage != 3 or config.node_size >= grid.size("data"):
        yield
        return
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp._fully_shard import _fully_shard as fsdp_module
    from torch.distributed.fsdp._fully_shard._fsdp_common import HSDPMeshInfo

    node, inter = data_node(grid, config), grid.data_levels(config.level_sizes(grid.size("data")))[-1]
    data = grid.group("data")
    ranks = torch.tensor(data.ranks, dtype=torch.int).view(inter.size, node.size)
    mesh = DeviceMesh.from_group(
        [inter.group, node.group],
        device_type,
        mesh=ranks,
        mesh_dim_names=(f"node_{inter.group.group_name}", f"in_node_{node.group.group_name}"),
    )
    original = fsdp_module._get_post_forward_mesh_info

    def post_forward_mesh_info(reshard_after_forward: Any, mesh_info: Any) -> Any:
        if isinstance(reshard_after_forward, bool) or reshard_after_forward != config.node_size:
            return original(reshard_after_forward, mesh_info)
        return HSDPMeshInfo(mesh, shard_mesh_dim=1, replicate_mesh_dim=0)

    fsdp_module._get_post_forward_mesh_info = post_forward_mesh_info
    try:
        yield
    finally:
        fsdp_module._get_post_forward_mesh_info = original


def shard_data_axis(
    model: nn.Module, grid: Grid, config: ZeroConfig, *, roots: Sequence[nn.Module] | None = None
) -> nn.Module:
    """Partition `model` (already parallelized for `grid`) over the data axis as `config` says; return it.

    Call it before building the optimizer (engine.training.train does both). Stage 0 returns the model untouched.
    Stages 2 and 3 apply torch.distributed.fsdp.fully_shard to every decoder layer and to the root, over a
    DeviceMesh made from the grid's data group; stage 1 only records the parameters whose moments and
    updates ZeroAdamW partitions. Raises ZeroError for a setting the grid cannot carry (stage > 0 with
    data=1, a node size not dividing the data axis) and for a model sharded already.

    roots: the modules whose forward runs the model instead of model.forward (a pipeline's stages, every stage on
    every rank): each becomes an FSDP root, holding the parameters around its layers (embeddings, final norm,
    lm_head), so its own forward gathers them (stages 2 and 3; stage 1 partitions only AdamW's moments, and a stage's
    ranks hold gradients of its own parameters only, which is all its reduce-scatter and update see).
    """
    config.check(grid.shape)
    if zero_state(model) is not None:
        raise ZeroError("the model is already partitioned over the data axis; build it again to change the setting")
    if config.stage == 0:
        return model
    from torch.distributed.device_mesh import DeviceMesh

    unplace_parameters(model)  # ZeRO partitions plain local shards (FSDP2 takes at most two placed axes)
    device_type = grid.device.type
    data = grid.group("data")
    # DTensor caches layouts by mesh, and meshes compare by ranks and dimension names, not by process group: a
    # name of its own per data group keeps a later grid over the same ranks off a destroyed grid's group
    mesh = DeviceMesh.from_group(data.group, device_type, mesh_dim_names=(f"data_{data.group.group_name}",))
    state = ZeroState(grid, config, mesh)
    if config.stage == 1:
        for p in model.parameters():
            if p.requires_grad:
                if p.dim() == 0:
                    raise ZeroError("ZeRO stage 1 splits parameters along dim 0; the model has a 0-d parameter")
                state.chunked[id(p)] = p
        _record(model, grid, state)
        return model

    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard

    layers = decoder_layers(model)
    _keep_prefetch_inside(layers)
    policy = CPUOffloadPolicy(pin_memory=False) if config.offload else OffloadPolicy()
    if config.stage == 3:
        reshard: bool | int = config.node_size if config.hierarchical and config.node_size < data.size else True
    else:
        reshard = False
    with _secondary_mesh_from_grid(grid, config, device_type):
        for layer in layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard, offload_policy=policy)
    # the root (embeddings, final norm, lm_head) is needed again right at the start of backward: keep it
    for root in roots if roots is not None else (model,):
        fully_shard(root, mesh=mesh, reshard_after_forward=False, offload_policy=policy)
    all_gather, reduce_scatter = comm.fsdp_comms(
        data,
        grid.data_levels(config.level_sizes(data.size)),
        node=data_node(grid, config) if config.stage == 3 and 1 < config.node_size < data.size else None,
        weights=config.weight_format if config.quantize_weights else None,
        gradients=config.gradient_format if config.quantize_gradients else None,
    )
    units = {id(m): m for root in (model, *(roots or ())) for m in root.modules() if isinstance(m, FSDPModule)}
    for module in units.values():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # our gradients are of the SUM of all ranks' losses
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
            module.set_custom_all_gather(all_gather)
            module.set_custom_reduce_scatter(reduce_scatter)
    _record(model, grid, state)
    return model


# ----- helpers for state, checkpoints and measurements -----------------------------------------------------


def is_dtensor(t: Any) -> bool:
    """True for ZeRO's DTensors (FSDP's parameters and gradients, stage 1's moments: sharded over a data mesh); False
    for plain tensors and for parameters placed over tensor-parallel axes (engine.core.linear.is_placed)."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor) and not is_placed(t)


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: a DTensor's local chunk (ZeRO's or a placed parameter's), any other tensor
    itself."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def full(t: torch.Tensor) -> torch.Tensor:
    """The tensor whole over the data axis: DTensor.full_tensor() (a collective over its mesh: every rank of
    the data group calls it in the same order), any other tensor itself."""
    return t.full_tensor() if is_dtensor(t) else t


def like(template: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`value` (whole over the data axis) laid out as `template`: a DTensor with the template's mesh and
    placements, each rank keeping its chunk (no communication), or `value` itself for a plain template."""
    if not is_dtensor(template):
        return value
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(value.to(template.dtype), template.device_mesh, template.placements, src_data_rank=None)


def model_class_name(model: nn.Module) -> str:
    """The model's own class name: FSDP2's fully_shard swaps in a subclass named FSDP<name>."""
    return own_class(model).__name__


def optimizer_value(model: nn.Module, param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """A per-element optimizer state of `param` given whole over the data axis (e.g. read from a checkpoint),
    laid out as this model's optimizer keeps it: the data-axis chunk of a DTensor for FSDP-managed and
    stage-1 parameters, else `value` itself. No communication."""
    if is_dtensor(param):
        return like(param, value)
    if is_placed(param):
        return placed_like(param, value)
    state = zero_state(model)
    if state is not None and state.is_chunked(param):
        from torch.distributed.tensor import Shard, distribute_tensor

        return distribute_tensor(value.to(param.dtype), state.mesh, [Shard(0)], src_data_rank=None)
    return value


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Bytes this rank holds at rest (between steps): parameters, gradients and optimizer state (local chunks of
    DTensors; for stage 1 the moments' chunks; a stage-1 gradient buffer counts in full, as it stays allocated)."""
    out = {"params": 0, "grads": 0, "optimizer": 0}
    for p in model.parameters():
        out["params"] += local(p).numel() * p.element_size()
        if p.grad is not None:
            out["grads"] += local(p.grad).numel() * p.grad.element_size()
        if optimizer is not None:
            for value in optimizer.state.get(p, {}).values():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    out["optimizer"] += local(value).numel() * value.element_size()
    return out
