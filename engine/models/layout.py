"""The plan of a parallelized model: its rows layout, ZeRO's state, and how each state-dict tensor is cut over the grid.

`engine.parallelize` writes one frozen ParallelPlan for the model it shards; gradient sync, clipping, the full state
dict, loading, ZeRO and checkpoints read it instead of the grid or the modules. For every state-dict tensor it says:

    full_shape        the serial tensor, in the engine's natural layout: (out, in) for every linear (GPT-2's Conv1D
                      stores the transpose: serial_transposed), output features in their natural order
    split             how the full tensor is cut: (axis, dim) pairs, outermost first. A "normal" ParallelLinear weight
                      is (("y", 0), ("z", 0), ("x", 1)): rows split over y, each y block's rows over z, columns over x;
                      a vocabulary-parallel table (("x", 0), ("y", 0), ("z", 0)), rows in mesh order (x outermost)
    order             a fused projection stores its rows regrouped per y rank ([q_i | k_i | v_i]): stored row i is
                      natural row order[i]; None = natural order. Its placed DTensor is of the stored tensor
    region            what the gradient of an unsplit tensor covers ("layer", "heads", "rows", "tensor", or None: this
                      rank's own rows), which fixes the axes sync_gradients sums it over (engine.spec.gradient_axes)

A rank's local tensor is then the block of the stored full tensor at its coordinates; `ParamLayout.pieces` maps it
back to rectangular chunks of the natural full tensor, which is what makes a checkpoint readable at any other grid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from engine.core.grid import Grid
from engine.core.linear import ParallelLinear, ShardingError
from engine.core.placement import LocalDuringForward, is_placed, local_shard
from engine.core.vocab_parallel import is_vocab_parallel
from engine.models.adapter import find_planned
from engine.spec import AXES, OWN, GridShape, RowsLayout, check_rows_layout, gradient_axes

LINEAR_SPLITS = {
    "normal": (("y", 0), ("z", 0), ("x", 1)),
    "default": (("y", 0), ("z", 0), ("x", 1)),
    "transposed": (("x", 0), ("z", 0), ("y", 1)),
}
VOCAB_SPLIT = (("x", 0), ("y", 0), ("z", 0))  # engine.core.vocab_parallel.vocab_block: mesh order, x outermost
PLAN_ATTR = "parallel_plan"  # the one attribute parallelize sets, on the model it was given
# The attribute of a module whose forward reads the rows layout (ParallelLinear, a vocabulary-parallel table, a planned
# base model's row hooks): a mode like `training`, set from the plan by engine.models.parallelize.rows_layout.
ROWS_MODE = "rows_layout"


@dataclass(frozen=True)
class Piece:
    """A rectangular part of a rank's local tensor (`local`: slices into it) and where it sits in the full (natural
    order) tensor; `transposed`: offsets and sizes are in the serial model's layout, which stores the transpose
    (engine.training.checkpoint.serial_chunks)."""

    local: tuple[slice, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    transposed: bool = False

    def of(self, held: torch.Tensor) -> torch.Tensor:
        """This piece of `held` (the local tensor), shaped as it sits in the full tensor (a view)."""
        part = held[self.local]
        return part.t() if self.transposed else part


@dataclass(frozen=True)
class ParamLayout:
    """How one state-dict tensor is laid out over the grid (see the module doc); `coords` are this rank's."""

    key: str
    full_shape: tuple[int, ...]
    coords: Mapping[str, int]
    sizes: Mapping[str, int]
    split: tuple[tuple[str, int], ...] = ()
    order: tuple[int, ...] | None = None
    serial_transposed: bool = False
    region: str | None = None
    is_linear: bool = False  # a ParallelLinear shard: its gradient already covers the rows of its x*y*z group
    aliases: tuple[str, ...] = ()
    tensor: torch.Tensor | None = field(default=None, compare=False, repr=False)

    @property
    def local(self) -> torch.Tensor | None:
        """The tensor this rank holds of the bound `tensor`: a placed DTensor's local shard (a view outside autograd,
        sharing its storage: writes land in the parameter), else `tensor` itself (a ZeRO DTensor included: its
        data-axis chunk is ZeRO's)."""
        with torch.no_grad():
            return local_shard(self.tensor)

    @property
    def split_axes(self) -> tuple[str, ...]:
        return tuple(axis for axis, _ in self.split if self.sizes[axis] > 1)

    def gradient_axes(self, rows: RowsLayout = "own") -> tuple[str, ...]:
        """The axes sync_gradients sums this tensor's gradient over in the rows layout `rows`."""
        return ("data",) if self.is_linear else gradient_axes(rows, self.region)

    def counted_in_norm(self) -> bool:
        """True on the one rank of each set of replicas that counts this shard in the gradient norm (a shard that is
        split over some axes and replicated over others, e.g. a bias); tensors split over nothing are counted by
        every rank without a sum over x*y*z."""
        replicated = (a for a in ("x", "y", "z") if a not in self.split_axes)  # every rank holds the same there
        return not self.split_axes or all(self.coords[a] == 0 for a in replicated)

    def local_block(self) -> tuple[tuple[int, int], ...]:
        """(start, length) per dim of this rank's block in the stored (regrouped) full tensor."""
        block = [[0, size] for size in self.full_shape]
        for axis, dim in self.split:
            n = self.sizes[axis]
            block[dim][1] //= n
            block[dim][0] += self.coords[axis] * block[dim][1]
        return tuple((start, length) for start, length in block)

    def local_shape(self) -> tuple[int, ...]:
        return tuple(length for _, length in self.local_block())

    def pieces(self, rows: range | None = None) -> list[Piece]:
        """This rank's local tensor as rectangular chunks of the natural full tensor, restricted to the local rows
        `rows` (e.g. a ZeRO chunk; rows beyond the local tensor belong to no piece)."""
        block = self.local_block()
        if not block:  # a scalar
            return [Piece((), (), ())]
        (row_start, n_rows), rest = block[0], block[1:]
        wanted = range(n_rows) if rows is None else range(max(rows.start, 0), min(rows.stop, n_rows))
        if len(wanted) == 0:
            return []
        tail_local = tuple(slice(0, length) for _, length in rest)
        tail_offsets = tuple(start for start, _ in rest)
        tail_sizes = tuple(length for _, length in rest)
        if self.order is None:
            runs = [(wanted.start, row_start + wanted.start, len(wanted))]
        else:  # consecutive natural rows make one piece
            runs = []
            for i in wanted:
                natural = self.order[row_start + i]
                if runs and runs[-1][1] + runs[-1][2] == natural and runs[-1][0] + runs[-1][2] == i:
                    runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
                else:
                    runs.append((i, natural, 1))
        return [
            Piece((slice(local, local + n), *tail_local), (natural, *tail_offsets), (n, *tail_sizes))
            for local, natural, n in runs
        ]

    def take_local(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's local tensor cut out of the natural full tensor (a view where no regrouping is involved)."""
        out = torch.empty(self.local_shape(), dtype=full.dtype, device=full.device) if self.order else None
        if out is None:
            index = tuple(slice(start, start + length) for start, length in self.local_block())
            return full[index]
        for piece in self.pieces():
            out[piece.local] = full[tuple(slice(o, o + s) for o, s in zip(piece.offsets, piece.sizes))]
        return out

    def placements(self, mesh_axes: tuple[str, ...]) -> tuple:
        """DTensor placements of this rank's local tensor on a DeviceMesh whose dims are `mesh_axes` (Grid.device_mesh):
        Shard(dim) on each axis the tensor is split over, Replicate on the others. Every split parallelize builds
        nests its axes in mesh order (LINEAR_SPLITS, VOCAB_SPLIT: a vocabulary table's rows in
        engine.core.vocab_parallel.vocab_block order), which is what DTensor's Shard means; raises ValueError for a
        split that does not.

        The placements cut the STORED full tensor: for a fused projection (`order` set) that is the rows regrouped per
        y rank, so the DTensor's global tensor (`full_tensor()`, `redistribute` to Replicate) is the stored order,
        not the natural weight. Readers that need the natural tensor (full state dicts, HF export, loading,
        checkpoints) go through this layout (`pieces`, `assemble`, `take_local`), never through `full_tensor()`."""
        from torch.distributed.tensor import Replicate, Shard

        for dim in {d for _, d in self.split}:
            nesting = [axis for axis, d in self.split if d == dim and self.sizes[axis] > 1]
            if nesting != [axis for axis in mesh_axes if axis in nesting]:
                raise ValueError(
                    f"{self.key}: dim {dim} is split over {nesting}, outermost first, not in the mesh's order "
                    f"{mesh_axes}; DTensor's Shard nests mesh dims in mesh order"
                )
        split = {axis: dim for axis, dim in self.split if self.sizes[axis] > 1}
        return tuple(Shard(split[axis]) if axis in split else Replicate() for axis in mesh_axes)

    def assemble(self, locals_by_coords: list[tuple[Mapping[str, int], torch.Tensor]]) -> torch.Tensor:
        """The natural full tensor from the local tensors of ranks (coords, local) covering every split axis."""
        first = locals_by_coords[0][1]
        full = torch.empty(self.full_shape, dtype=first.dtype, device=first.device)
        for coords, local in locals_by_coords:
            for piece in replace(self, coords=dict(coords), tensor=None).pieces():  # as the rank at `coords` holds it
                full[tuple(slice(o, o + n) for o, n in zip(piece.offsets, piece.sizes))] = local[piece.local]
        return full


@dataclass(frozen=True)
class ParallelPlan:
    """One parallelized model on one rank of `grid`, built once by parallelize and read by every reader (gradient sync,
    clipping, full state dicts, loading, ZeRO, checkpoints, the training loop) instead of the grid or the modules.

    params: every state-dict tensor's placement (by its first key, in state-dict order: ParamLayout); stacks: the base
    models whose decoder layers parallelize planned (module paths); regions: module path -> region, as parallelize
    recorded them; rows: the rows layout the model runs in ("own" or "shared", engine/models/parallelize.py), which
    fixes the axes every gradient is summed over; zero: engine.memory.zero.ZeroState once shard_data_axis partitioned
    the data axis (its config: stage, levels, quantization). Frozen: rows_layout and shard_data_axis record a new plan.
    """

    grid: Grid
    params: dict[str, ParamLayout]
    stacks: tuple[str, ...] = ()
    regions: Mapping[str, str] = field(default_factory=dict)
    rows: RowsLayout = OWN
    zero: object = None

    def __post_init__(self) -> None:
        check_rows_layout(self.rows)

    @property
    def shape(self) -> GridShape:
        """The grid's axis sizes."""
        return self.grid.shape

    def gradient_axes(self, p: ParamLayout) -> tuple[str, ...]:
        """The axes the gradient of tensor `p` is summed over in this plan's rows layout."""
        return p.gradient_axes(self.rows)

    def bind(self, model: nn.Module) -> "ParallelPlan":
        """The same layout with each entry's `tensor` and `aliases` read from `model`'s current state dict (ZeRO
        replaces parameters by DTensors after parallelize). Raises ValueError when the model's tensors no longer are
        the ones laid out (one added, reshaped, tied or untied after parallelize): every reader would skip or cut it."""
        tensors = model.state_dict(keep_vars=True)
        ties = tied_keys(tensors)
        changed = [key for key in self.params if key not in ties] + [key for key in ties if key not in self.params]
        # a placed DTensor by its local shard, a DTensor of ZeRO by its global shape: what this rank holds of `p`
        changed += [
            key
            for key, p in self.params.items()
            if key not in changed and tuple(local_shard(tensors[key]).shape) != p.local_shape()
        ]
        if changed:
            raise ValueError(
                f"{changed[0]!r} is not as parallelize laid it out (the model was changed after parallelize: a tensor "
                "added, removed, reshaped or tied); change the model before parallelizing it"
            )
        params = {key: replace(p, tensor=tensors[key], aliases=tuple(ties[key])) for key, p in self.params.items()}
        return replace(self, params=params)

    def unbound(self) -> "ParallelPlan":
        """The layout without tensors, as stored on the model (ZeRO replaces the parameters later; holding the old
        ones would keep them alive)."""
        params = {key: replace(p, tensor=None, aliases=()) for key, p in self.params.items()}
        return replace(self, params=params)


def describe(
    model: nn.Module,
    grid: Grid,
    regions: Mapping[str, str] | None = None,
    stacks: tuple[str, ...] = (),
    rows: RowsLayout = OWN,
) -> ParallelPlan:
    """The layout of `model` on `grid`, read from the parallel modules' own declarations (ParallelLinear's mode and
    output order, a vocabulary-parallel module's table) and `regions` (module path -> region of the parameters below
    it, the longest path winning), as parallelize records them."""
    regions = dict(regions or {})
    coords = {axis: grid.coord(axis) for axis in AXES}
    sizes = {axis: grid.size(axis) for axis in AXES}
    owners: dict[str, tuple[nn.Module, str]] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        prefix = f"{path}." if path else ""
        for name, _ in module.named_parameters(recurse=False, remove_duplicate=False):
            owners.setdefault(f"{prefix}{name}", (module, name))
        for name, _ in module.named_buffers(recurse=False, remove_duplicate=False):
            owners.setdefault(f"{prefix}{name}", (module, name))
    params: dict[str, ParamLayout] = {}
    tensors = model.state_dict(keep_vars=True)
    for key, ties in tied_keys(tensors).items():
        tensor = tensors[key]
        module, name = owners.get(key, (None, key))
        common = {"key": key, "coords": coords, "sizes": sizes}
        if isinstance(module, ParallelLinear) and name in ("weight", "bias"):
            split = LINEAR_SPLITS[module.mode]
            shape = (module.out_features, module.in_features)
            if name == "bias":
                split, shape = tuple(s for s in split if s[1] == 0), shape[:1]
            order = None if module.out_order is None else tuple(int(i) for i in module.out_order.tolist())
            transposed = name == "weight" and module.serial_layout == "conv1d"
            params[key] = ParamLayout(
                full_shape=shape, split=split, order=order, serial_transposed=transposed, is_linear=True, **common
            )
        elif module is not None and is_vocab_parallel(module) and name == "weight":
            shape = (module.full_vocab, *tensor.shape[1:])
            params[key] = ParamLayout(full_shape=shape, split=VOCAB_SPLIT, region="tensor", **common)
        else:
            params[key] = ParamLayout(full_shape=tuple(tensor.shape), region=_region(key, regions), **common)
        for alias in ties if not params[key].split else ():  # a split tensor's meaning comes from its module
            _check_same_gradient(params[key], alias, regions)
    return ParallelPlan(grid, params, tuple(stacks), regions, rows).bind(model)


def tied_keys(tensors: Mapping[str, torch.Tensor]) -> dict[str, list[str]]:
    """Each distinct tensor of a state dict by its first key, with its other (tied) keys, in state-dict order."""
    first: dict[int, str] = {}
    ties: dict[str, list[str]] = {}
    for key, tensor in tensors.items():
        owner = first.setdefault(id(tensor), key)
        ties.setdefault(owner, []).extend([key] if owner != key else [])
    return ties


def place_parameters(model: nn.Module, layout: "ParallelPlan") -> None:
    """Make every parameter a DTensor on Grid.device_mesh() with its ParamLayout.placements over the same local
    tensor (no copy, same requires_grad, ties kept): a split one (a ParallelLinear's weight and bias, fused ones
    included, and a vocabulary-parallel table) Shard on its split axes, an unsplit one Replicate on every axis. The
    parallel modules compute on their parameters' local shards themselves; every module above a replicated one
    (transformers' norms, position tables) gets engine.core.placement.LocalDuringForward, so the modules compute on
    its local tensor. torch's DTensor API (full_tensor, redistribute) sees the split, of a fused projection's
    stored (regrouped) rows."""
    if layout.grid.size("x", "y", "z") == 1:
        return
    from torch.distributed.tensor import DTensor

    names = layout.grid.device_mesh().mesh_dim_names
    held = model.state_dict(keep_vars=True)
    swaps: dict[int, nn.Parameter] = {}
    replicated: set[int] = set()
    for key, p in layout.params.items():
        tensor = held.get(key)
        if not isinstance(tensor, nn.Parameter) or is_placed(tensor):
            continue
        local = DTensor.from_local(tensor.detach(), layout.grid.device_mesh(), p.placements(names), run_check=False)
        swaps[id(tensor)] = nn.Parameter(local, requires_grad=tensor.requires_grad)
        swaps[id(tensor)].__dict__.update(tensor.__dict__)  # flags such as transformers' _is_hf_initialized
        if not p.split_axes:
            replicated.add(id(tensor))
    _expose_replicated_locally(model, replicated)
    _swap_parameters(model, swaps)


def _expose_replicated_locally(model: nn.Module, replicated: set[int]) -> None:
    """Hook engine.core.placement.LocalDuringForward on every module of `model` above a parameter whose id is in
    `replicated` (a module holding several ties of it lists each name)."""
    below: dict[int, list[tuple[nn.Module, str]]] = {}

    def walk(module: nn.Module) -> list[tuple[nn.Module, str]]:
        if id(module) not in below:
            own = [(module, name) for name, p in module._parameters.items() if id(p) in replicated]
            below[id(module)] = own + [entry for child in module.children() for entry in walk(child)]
            if below[id(module)]:
                LocalDuringForward(tuple(dict.fromkeys(below[id(module)]))).register(module)
        return below[id(module)]

    walk(model)


def unplace_parameters(model: nn.Module) -> None:
    """The inverse of place_parameters: every placed parameter becomes a plain parameter over its local shard (no
    copy, ties kept). ZeRO partitions plain shards: FSDP2 composes with at most two placed mesh dimensions beside its
    data dimension (the grid has three tensor axes), and stage 1 slices gradients by rows."""
    swaps: dict[int, nn.Parameter] = {}
    for param in model.parameters():
        if is_placed(param):
            swaps[id(param)] = nn.Parameter(param.detach().to_local(), requires_grad=param.requires_grad)
            swaps[id(param)].__dict__.update(param.__dict__)
    _swap_parameters(model, swaps)


def _swap_parameters(model: nn.Module, swaps: dict[int, nn.Parameter]) -> None:
    """Replace each parameter whose id is in `swaps` by its new object, under every name that holds it."""
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False, remove_duplicate=False)):
            if id(param) in swaps:
                setattr(module, name, swaps[id(param)])


def _check_same_gradient(p: ParamLayout, alias: str, regions: Mapping[str, str]) -> None:
    """Refuse a tensor shared (tied) between parts of the model whose gradients mean different things."""
    region = _region(alias, regions)
    if any(gradient_axes(rows, region) != p.gradient_axes(rows) for rows in ("own", "shared")):
        raise ShardingError(
            f"parameter {alias} is shared with {p.key}, in a part of the model whose gradients mean something else "
            "(e.g. a decoder layer and an embedding); untie them before parallelizing"
        )


def _region(key: str, regions: Mapping[str, str]) -> str | None:
    """The region of the longest module path in `regions` that contains `key` ("" is the whole model)."""
    best, region = -1, None
    for path, value in regions.items():
        if (path == "" or key == path or key.startswith(f"{path}.")) and len(path) > best:
            best, region = len(path), value
    return region


def plan_of(model: nn.Module, grid: Grid | None = None) -> ParallelPlan:
    """The plan parallelize recorded for `model` (or for the models inside it, when `model` wraps them), bound to its
    current tensors; for a model parallelize never saw (built from ParallelLinears by hand, or plain), the plan its
    parallel modules declare on `grid`, in the rows layout they run in."""
    declared = model.__dict__.get(PLAN_ATTR)
    if isinstance(declared, ParallelPlan):
        if grid is not None and declared.grid is not grid:
            raise ValueError("the model was parallelized on another grid than the one given")
        return declared.bind(model)
    inner = declared_plans(model)
    grid = grid if grid is not None or not inner else inner[0][1].grid
    if grid is None:
        raise ValueError("this model was not parallelized: pass the grid its parallel modules were built on")
    if not inner and _sharded_layers_grid(model) is not None:  # its regions are in the record of the model holding it
        raise ValueError(
            f"this {type(model).__name__} is part of a model parallelize was given (its decoder layers are sharded, "
            "but it holds no layout): pass the model that parallelize returned"
        )
    regions, stacks = recorded(model)  # a wrapper around parallelized models: their records, under their paths
    rows = inner[0][1].rows if inner else running_rows(model)
    return describe(model, grid, regions, tuple(stacks), rows)


def recorded(model: nn.Module) -> tuple[dict[str, str], list[str]]:
    """The regions and planned stacks of every plan parallelize recorded on `model` or a module inside it (a model
    parallelized before, e.g. by auto_parallelize, or a wrapper around parallelized models), by path in `model`."""
    regions: dict[str, str] = {}
    stacks: list[str] = []
    for path, layout in declared_plans(model):
        join = lambda part: ".".join(p for p in (path, part) if p)  # noqa: E731
        regions.update({join(part): region for part, region in layout.regions.items()})
        stacks += [join(part) for part in layout.stacks]
    return regions, stacks


def running_rows(model: nn.Module) -> RowsLayout:
    """The rows layout the parallel modules of `model` run in (their `rows_layout` mode; "own" for a plain model)."""
    return next((m.__dict__[ROWS_MODE] for m in model.modules() if ROWS_MODE in m.__dict__), OWN)


def _sharded_layers_grid(model: nn.Module) -> Grid | None:
    """The grid of the ParallelLinear decoder layers of a transformers base model inside `model` (parallelize planned
    it), or None when it has none."""
    sharded = (m for _, stack, _ in find_planned(model) for m in stack.modules() if isinstance(m, ParallelLinear))
    return next((m.grid for m in sharded), None)


def declared_plans(model: nn.Module) -> list[tuple[str, ParallelPlan]]:
    """Every layout parallelize recorded on `model` or a module inside it (a wrapper around a parallelized model),
    with that module's path."""
    return [
        (path, module.__dict__[PLAN_ATTR])
        for path, module in model.named_modules()
        if isinstance(module.__dict__.get(PLAN_ATTR), ParallelPlan)
    ]


def planned_stacks(model: nn.Module) -> list[tuple[str, nn.Module, Grid]]:
    """(path, module, grid) of every base model whose decoder layers parallelize planned inside `model`."""
    found: dict[int, tuple[str, nn.Module, Grid]] = {}
    for path, layout in declared_plans(model):
        holder = model.get_submodule(path)
        for stack_path in layout.stacks:
            stack = holder.get_submodule(stack_path)
            full = ".".join(p for p in (path, stack_path) if p)
            found.setdefault(id(stack), (full, stack, layout.grid))
    return list(found.values())


def parallel_grid(model: nn.Module) -> Grid | None:
    """The grid `model`'s decoder layers were parallelized on, or None for a model parallelize never planned. A part
    of a parallelized model (its record sits on the model holding it) answers with its sharded layers' grid."""
    stacks = planned_stacks(model)
    return stacks[0][2] if stacks else _sharded_layers_grid(model)
