"""The 3D tensor-parallel Linear: a torch.nn.Linear whose weight is split over the x, y and z grid axes.

Layout of the weight W (out, in) on the rank at (x, y, z):

    mode "default" and "normal":  input features split over X, output features over Y, and the rows of
                                  each (out/Y, in/X) block split over Z -> shard (out/(Y Z), in/X)
    mode "transposed":            the roles of X and Y swapped       -> shard (out/(X Z), in/Y)

The bias follows the rows of the weight (split over Y and Z, or X and Z) and is replicated over the
remaining axis. Shards stay 2-D (a real nn.Linear weight), rows of shard (y, z) are rows
[(y Z + z) r, (y Z + z + 1) r) of W with r = out/(Y Z) (x instead of y when transposed).

What a rank feeds and gets back (U = the rows of the whole x*y group; "replicated over A" = every rank of
axis A holds the same tensor; ranks that differ in z or data always hold different rows):

    default     in (..., in)  own rows          -> out (..., out)  own rows       (nn.Linear semantics; in the
                                                                                "shared" rows layout U, replicated)
    normal      in (U, ..., in) replicated x,y  -> out (U, ..., out/Y) y-slice, replicated over x
    transposed  in (U, ..., in/Y) y-slice       -> out (U, ..., out) replicated over x and y

A normal layer followed by a transposed one (with any elementwise work or per-y-slice work in between,
e.g. attention heads or an MLP activation) keeps the activations inside the grid.

Forward gathers the weight block over Z, multiplies the local input slice and all-reduces the partial
outputs over X (Y when transposed); backward gathers the block again, all-reduces the input gradient over
Y (X) and reduce-scatters the weight gradient over Z. Parameter gradients after backward are the
gradients of the loss summed over the rows of this rank's tensor group (x, y, z); sum them over `data`
(engine.sync_gradients does it) to get the gradient of the whole global batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from engine.core import comm
from engine.core.functional import (
    gather_from_group,
    gather_sharded,
    reduce_from_group,
    split_to_group,
    tensor_parallel_matmul,
)
from engine.core.grid import Grid
from engine.core.placement import is_placed, local_shard, write_counts
from engine.spec import OWN, RowsLayout, row_gather_axes

MODES = ("default", "normal", "transposed")


class ShardingError(ValueError):
    """A layer or model that the engine cannot shard on the given grid (named in the message)."""


class _Prefetch:
    """A weight all-gather started early (by the layer that runs before this one) and not yet used."""

    def __init__(self) -> None:
        self.pending: comm.Pending | None = None
        self.weight: torch.Tensor | None = None
        self.version = (-1, -1)

    def __deepcopy__(self, memo: dict) -> "_Prefetch":
        return _Prefetch()  # a copied model starts with nothing in flight

    def start(self, weight: torch.Tensor, group) -> None:
        self.take(weight)  # finish (and drop) an earlier one that was never used
        self.pending = comm.all_gather_async(local_shard(weight).detach(), group, 0)
        self.weight, self.version = weight, write_counts(weight)

    def take(self, weight: torch.Tensor) -> torch.Tensor | None:
        """The gathered weight if a prefetch of exactly this, unchanged, weight is in flight; else None."""
        if self.pending is None:
            return None
        full = self.pending.wait()
        valid = self.weight is weight and self.version == write_counts(weight)
        self.pending, self.weight = None, None
        return full if valid else None


def mode_axes(mode: str) -> tuple[str, str]:
    """(axis splitting a layer's input features, axis splitting its output features) in sharding `mode`: the
    transposed mode swaps the roles of x and y so consecutive layers chain without moving activations."""
    return ("y", "x") if mode == "transposed" else ("x", "y")


class ParallelLinear(nn.Linear):
    """nn.Linear(in_features, out_features, bias) sharded over a grid's x, y and z axes (see module doc).

    `in_features` and `out_features` are the full (serial) sizes; `weight` and `bias` hold this rank's
    shards. `overlap` runs the backward collectives behind the layer's matrix products (same numbers
    either way). `name` appears in error messages.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        grid: Grid,
        mode: str = "default",
        overlap: bool = True,
        name: str = "",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self._setup(
            in_features,
            out_features,
            bias,
            grid=grid,
            mode=mode,
            overlap=overlap,
            name=name,
            device=device,
            dtype=dtype,
        )
        self.reset_parameters()

    def _setup(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        *,
        grid: Grid,
        mode: str,
        overlap: bool,
        name: str,
        device: torch.device | str | None,
        dtype: torch.dtype | None,
    ) -> None:
        nn.Module.__init__(self)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.in_features, self.out_features = in_features, out_features
        self.grid, self.mode, self.overlap = grid, mode, bool(overlap)
        self._sharded = grid.size("x", "y", "z") > 1  # False: a plain F.linear, no collectives
        # Layers that usually run right after this one: with overlap, their weight all-gathers over z
        # start before this layer's product (a tuple, so that nn.Module does not register them as children).
        self._prefetch_next: tuple[ParallelLinear, ...] = ()
        self._prefetch = _Prefetch()
        self.name = name or f"Linear({in_features}, {out_features})"
        # Order of the full output features as stored (a fused projection may regroup them per shard);
        # None = natural order. Kept as a plain attribute: it is layout, not state.
        self.out_order: torch.Tensor | None = None
        # How the serial model stores this layer's weight: "linear" (out, in) or "conv1d" (in, out, GPT-2);
        # full_state_dict and load_full_state_dict use it to speak the serial model's layout.
        self.serial_layout = "linear"
        # The rows layout the forward runs in ("own" rows per rank, or rows "shared" by every rank of an x*y group):
        # a mode of the module like `training`, set by engine.models.parallelize.rows_layout from the model's plan.
        self.rows_layout: RowsLayout = OWN
        self._check_divisible(mode)
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(self._shard_shape(mode), **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(self._shard_shape(mode)[0], **factory))
        else:
            self.register_parameter("bias", None)

    # ----- layout -----------------------------------------------------------------------------------

    def _check_divisible(self, mode: str) -> None:
        in_axis, out_axis = mode_axes(mode)
        n_in, n_out, n_z = self.grid.size(in_axis), self.grid.size(out_axis), self.grid.size("z")
        if self.in_features % n_in:
            raise ShardingError(
                f"{self.name}: in_features {self.in_features} is not divisible by {in_axis}={n_in} "
                f"(its input features are split over {in_axis}); choose {in_axis} dividing {self.in_features}"
            )
        if self.out_features % (n_out * n_z):
            raise ShardingError(
                f"{self.name}: out_features {self.out_features} is not divisible by {out_axis}*z={n_out}*{n_z} "
                f"(its output features are split over {out_axis}, each block's rows over z); choose "
                f"{out_axis}*z dividing {self.out_features}"
            )

    def _shard_shape(self, mode: str) -> tuple[int, int]:
        in_axis, out_axis = mode_axes(mode)
        return (
            self.out_features // (self.grid.size(out_axis) * self.grid.size("z")),
            self.in_features // self.grid.size(in_axis),
        )

    def _shard_slices(self, mode: str) -> tuple[slice, slice]:
        """(rows, columns) of the full weight (in stored output order) that this rank holds."""
        in_axis, out_axis = mode_axes(mode)
        rows, cols = self._shard_shape(mode)
        row_block = self.grid.coord(out_axis) * self.grid.size("z") + self.grid.coord("z")
        col_block = self.grid.coord(in_axis)
        return slice(row_block * rows, (row_block + 1) * rows), slice(col_block * cols, (col_block + 1) * cols)

    def _stored(self, full: torch.Tensor) -> torch.Tensor:
        """Full tensor (natural output order, dim 0) -> stored output order."""
        return full if self.out_order is None else full.index_select(0, self.out_order.to(full.device))

    def _natural(self, stored: torch.Tensor) -> torch.Tensor:
        """Full tensor in stored output order -> natural output order."""
        if self.out_order is None:
            return stored
        inverse = torch.empty_like(self.out_order)
        inverse[self.out_order] = torch.arange(self.out_order.numel())
        return stored.index_select(0, inverse.to(stored.device))

    def shard_weight(self, full: torch.Tensor, mode: str | None = None) -> torch.Tensor:
        """This rank's shard of a full (out, in) weight (natural order), e.g. a serial layer's weight."""
        rows, cols = self._shard_slices(mode or self.mode)
        return self._stored(full)[rows, cols]

    def shard_bias(self, full: torch.Tensor, mode: str | None = None) -> torch.Tensor:
        """This rank's shard of a full (out,) bias (natural order)."""
        rows, _ = self._shard_slices(mode or self.mode)
        return self._stored(full)[rows]

    def gather_weight(self, shard: torch.Tensor) -> torch.Tensor:
        """Full (out, in) tensor, natural order, from every rank's weight-shaped `shard` (e.g. a gradient).

        Collective over the x*y*z group: all its ranks must call it.
        """
        shard = local_shard(shard).detach()
        pieces = comm.all_gather(shard.contiguous().unsqueeze(0), self.grid.group("x", "y", "z"), 0)  # (XYZ, r, c)
        grid5 = pieces.reshape(self.grid.size("z"), self.grid.size("y"), self.grid.size("x"), *shard.shape)
        # normal: rows ordered (y, z), columns by x; transposed: rows (x, z), columns by y
        order = (1, 0, 3, 2, 4) if self.mode != "transposed" else (2, 0, 3, 1, 4)
        return self._natural(grid5.permute(*order).reshape(self.out_features, -1))

    def gather_bias(self, shard: torch.Tensor) -> torch.Tensor:
        """Full (out,) tensor, natural order, from every rank's bias-shaped `shard` (collective over x*y*z): gathered
        as a weight of one column per rank, whose copies over the axis that splits the input are equal (the first
        is taken)."""
        return self.gather_weight(local_shard(shard).unsqueeze(-1))[:, 0].contiguous()

    def full_weight(self) -> torch.Tensor:
        """The full (out, in) weight, equal to the serial layer's (collective over x*y*z)."""
        return self.gather_weight(self.weight)

    def full_bias(self) -> torch.Tensor | None:
        """The full (out,) bias or None (collective over x*y*z)."""
        return None if self.bias is None else self.gather_bias(self.bias)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """nn.Linear's initialisation drawn for the FULL weight, then sliced: identical values to a serial
        layer built from the same random state, and the same random numbers consumed."""
        if self.weight.is_meta:
            return
        full = torch.empty(self.out_features, self.in_features, dtype=self.weight.dtype, device=self.weight.device)
        nn.init.kaiming_uniform_(full, a=math.sqrt(5))
        local_shard(self.weight).copy_(self.shard_weight(full))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            full_bias = torch.empty(self.out_features, dtype=self.bias.dtype, device=self.bias.device)
            nn.init.uniform_(full_bias, -bound, bound)
            local_shard(self.bias).copy_(self.shard_bias(full_bias))

    @torch.no_grad()
    def reshard_(self, mode: str) -> "ParallelLinear":
        """Switch to another mode in place, moving the weights to its layout (collective when it changes)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode_axes(mode) != mode_axes(self.mode):
            if is_placed(self.weight):
                raise ShardingError(f"{self.name}: placed by engine.parallelize already; reshard before it")
            self._check_divisible(mode)
            weight, bias = self.full_weight(), self.full_bias()
            new_weight = nn.Parameter(self.shard_weight(weight, mode).clone(), self.weight.requires_grad)
            new_weight.__dict__.update(self.weight.__dict__)  # keep flags such as _is_hf_initialized
            self.weight = new_weight
            if bias is not None:
                new_bias = nn.Parameter(self.shard_bias(bias, mode).clone(), self.bias.requires_grad)
                new_bias.__dict__.update(self.bias.__dict__)
                self.bias = new_bias
        self.mode = mode
        return self

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, grid: Grid, *, mode: str = "default", overlap: bool = True, name: str = ""
    ) -> "ParallelLinear":
        """A ParallelLinear holding this rank's shards of `linear`'s weights exactly (no random init)."""
        return cls.from_weights(linear.weight, linear.bias, grid, mode=mode, overlap=overlap, name=name).train(
            linear.training
        )

    @classmethod
    def from_weights(
        cls,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        grid: Grid,
        *,
        mode: str = "default",
        overlap: bool = True,
        name: str = "",
        out_order: torch.Tensor | None = None,
    ) -> "ParallelLinear":
        """A ParallelLinear holding this rank's shards of the full (out, in) `weight` and (out,) `bias` exactly, with
        their requires_grad; `out_order` regroups a fused projection's output features (see `out_order`)."""
        layer = cls.__new__(cls)
        layer._setup(
            weight.shape[1],
            weight.shape[0],
            bias is not None,
            grid=grid,
            mode=mode,
            overlap=overlap,
            name=name,
            device=weight.device,
            dtype=weight.dtype,
        )
        layer.out_order = out_order
        with torch.no_grad():  # this rank's shards, no communication
            layer.weight.copy_(layer.shard_weight(weight))
            if bias is not None:
                layer.bias.copy_(layer.shard_bias(bias))
        layer.weight.requires_grad_(weight.requires_grad)
        if bias is not None:
            layer.bias.requires_grad_(bias.requires_grad)
        return layer

    # ----- forward ----------------------------------------------------------------------------------

    def _core(self, x: torch.Tensor, mode: str) -> torch.Tensor:
        """normal: (U, .., in/X) -> (U, .., out/Y); transposed: (U, .., in/Y) -> (U, .., out/X), both
        replicated over the input-splitting axis' partner as described in the module doc."""
        in_axis, out_axis = mode_axes(mode)
        grid = self.grid
        z = grid.group("z")
        gathered = None
        weight = local_shard(self.weight)
        if self.overlap and z.size > 1:
            gathered = self._prefetch.take(self.weight)
            if gathered is None:
                gathered = comm.all_gather(weight.detach(), z, 0)
            for layer in self._prefetch_next:  # they gather while this layer multiplies
                layer._prefetch.start(layer.weight, z)
        y = tensor_parallel_matmul(x, weight, z, grid.group(out_axis), self.overlap, gathered)
        y = reduce_from_group(y, grid.group(in_axis))
        if self.bias is not None:
            y = y + gather_sharded(local_shard(self.bias), grid.group("z"), 0).to(y.dtype)  # y is bf16 under autocast
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._sharded:
            return F.linear(x, local_shard(self.weight), local_shard(self.bias))
        return self._sharded_forward(x)

    # Under torch.compile (--compile, engine/models/compile.py) a sharded product runs eagerly between the compiled
    # pieces of its layer: its collectives, the z prefetch's pending handles (state carried from one layer to the
    # next) and parameters placed on two or more tensor axes are not what dynamo traces soundly (inductor refused
    # the y*z-placed DTensors' aliased outputs); the GEMM is an ATen call either way.
    @torch.compiler.disable
    def _sharded_forward(self, x: torch.Tensor) -> torch.Tensor:
        grid = self.grid
        if self.mode == "normal":
            return self._core(split_to_group(x, grid.group("x"), -1), "normal")
        if self.mode == "transposed":
            return gather_from_group(self._core(x, "transposed"), grid.group("x"), -1)
        if not row_gather_axes(self.rows_layout):  # the rows of the x*y group already, on every rank of it
            return gather_from_group(self._core(split_to_group(x, grid.group("x"), -1), "normal"), grid.group("y"), -1)
        # default: gather the rows of the x*y group, run the normal layout, hand back own rows, all features
        unbatched = x.dim() == 1
        if unbatched:
            x = x.unsqueeze(0)
        rows = grid.group("x", "y")
        full_rows = gather_from_group(x, rows, 0)
        y = self._core(split_to_group(full_rows, grid.group("x"), -1), "normal")
        y = split_to_group(gather_from_group(y, grid.group("y"), -1), rows, 0)
        return y.squeeze(0) if unbatched else y

    def prefetch_before(self, *layers: "ParallelLinear") -> "ParallelLinear":
        """Declare the layers that usually run right after this one (on the same grid): with overlap, this
        layer starts their weight all-gathers over z before its own product, and they use the result if
        their weights have not changed meanwhile. Only a matter of timing: the numbers are the same."""
        for layer in layers:
            if not isinstance(layer, ParallelLinear) or layer.grid is not self.grid:
                raise ValueError(f"{self.name}: can only prefetch for ParallelLinears on the same grid")
        self._prefetch_next = tuple(layers)
        return self

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"mode={self.mode}, shard={tuple(local_shard(self.weight).shape)}, overlap={self.overlap}"
        )
