"""Plain-Python descriptions of a parallel run, shared by the runtime and the planner (no torch import): the grid's
axes and sizes, the ZeRO setting, the rows layouts, and the gradient bucket size both count in.

`goldfish plan` and engine.planner import only this module of the runtime, so they run where torch is not
installed; engine.core.grid and engine.memory.zero re-export these names.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Any

AXES: tuple[str, ...] = ("x", "y", "z", "data")  # rank order, fastest first
ROWS_LAYOUTS = ("own", "shared")  # every rank reads its own rows / every rank of an x*y group reads the same rows
STAGES = (0, 1, 2, 3)  # ZeRO stages
BUCKET_ELEMENTS = 1 << 24  # gradients are reduced in buckets this large (engine.core.comm), as the cost model counts


class GridError(ValueError):
    """A grid that cannot be built: bad sizes, or sizes that do not match the world."""


@dataclass(frozen=True)
class GridShape:
    """Sizes of the four grid axes. Each is an integer >= 1; their product is the number of ranks."""

    data: int = 1
    x: int = 1
    y: int = 1
    z: int = 1

    def __post_init__(self) -> None:
        for axis in AXES:
            value = getattr(self, axis)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise GridError(f"grid axis {axis} must be an integer >= 1, got {value!r}")

    @property
    def world_size(self) -> int:
        """Number of ranks the grid needs: data * x * y * z."""
        return self.data * self.x * self.y * self.z

    def size(self, *axes: str) -> int:
        """Product of the sizes of `axes` (1 for no axes)."""
        out = 1
        for axis in axes:
            out *= getattr(self, _check_axis(axis))
        return out

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates {axis: index} of global `rank` (x fastest)."""
        if not 0 <= rank < self.world_size:
            raise GridError(f"rank {rank} is outside a grid of {self.world_size} ranks")
        out = {}
        for axis in AXES:
            size = getattr(self, axis)
            out[axis] = rank % size
            rank //= size
        return out

    def rank(self, coords: dict[str, int]) -> int:
        """Global rank of the coordinates {axis: index} (missing axes count as 0)."""
        rank = 0
        for axis in reversed(AXES):
            index = coords.get(axis, 0)
            size = getattr(self, axis)
            if not 0 <= index < size:
                raise GridError(f"coordinate {axis}={index} is outside the axis size {size}")
            rank = rank * size + index
        return rank

    def group_ranks(self, axes: tuple[str, ...]) -> list[list[int]]:
        """Every group of ranks that varies only along `axes`, each sorted ascending.

        Inside a group, the position of a rank (its group rank) follows the grid's rank order restricted
        to `axes`, e.g. x + X * y for ("x", "y").
        """
        axes = tuple(_check_axis(a) for a in axes)
        others = [a for a in AXES if a not in axes]
        groups = []
        for fixed in itertools.product(*(range(getattr(self, a)) for a in reversed(others))):
            base = dict(zip(reversed(others), fixed))
            ranks = []
            for varying in itertools.product(*(range(getattr(self, a)) for a in reversed(axes))):
                ranks.append(self.rank({**base, **dict(zip(reversed(axes), varying))}))
            groups.append(sorted(ranks))
        return groups

    def __str__(self) -> str:
        return f"data={self.data},x={self.x},y={self.y},z={self.z}"


def _check_axis(axis: str) -> str:
    if axis not in AXES:
        raise GridError(f"unknown grid axis {axis!r}; the axes are {', '.join(AXES)}")
    return axis


class ZeroError(ValueError):
    """A ZeRO setting that does not fit the grid or the model (named in the message, with the fix)."""


@dataclass(frozen=True)
class ZeroConfig:
    """How to partition over the data axis.

    stage: 0 (off), 1 (AdamW moments), 2 (+ gradients), 3 (+ parameters); see the module doc.
    node_size: data-axis ranks per node; > 1 turns on hierarchical partitioning (stages 2 and 3).
    offload: AdamW moments, parameter and gradient chunks in host memory, update on the host (stages 2, 3).
    """

    stage: int = 0
    node_size: int = 1
    offload: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stage, bool) or self.stage not in STAGES:
            raise ZeroError(f"ZeRO stage must be one of {STAGES}, got {self.stage!r}")
        if isinstance(self.node_size, bool) or not isinstance(self.node_size, int) or self.node_size < 1:
            raise ZeroError(f"node size must be an integer >= 1 (data-axis ranks per node), got {self.node_size!r}")
        if self.node_size > 1 and self.stage < 2:
            raise ZeroError(f"hierarchical partitioning needs ZeRO stage 2 or 3 (it splits the gradient reduce-"
                            f"scatter and stage 3's parameter gathers by node), got stage {self.stage}; use --zero 2 "
                            "or 3, or drop the hierarchy")
        if self.offload and self.stage < 2:
            raise ZeroError(f"optimizer offload needs ZeRO stage 2 or 3 (the host updates the partitioned state "
                            f"FSDP keeps there), got stage {self.stage}; use --zero 2 or 3 with --offload-optimizer")

    def check(self, shape: GridShape) -> None:
        """Raise ZeroError when the grid cannot carry this setting."""
        if self.stage > 0 and shape.data == 1:
            raise ZeroError(f"ZeRO stage {self.stage} partitions over the data axis, but the grid {shape} has data=1; "
                            "use a grid with data >= 2 or --zero 0")
        if shape.data % self.node_size:
            raise ZeroError(f"node size {self.node_size} (data ranks per node) does not divide the data axis of size "
                            f"{shape.data} (grid {shape}); choose a node size dividing it or no hierarchy")

    @property
    def hierarchical(self) -> bool:
        return self.node_size > 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def data_ranks_per_node(gpus_per_node: int, shape: GridShape) -> int:
    """Data-axis ranks that share a node of `gpus_per_node` ranks (e.g. the launcher's local world size).

    Ranks are laid out with the data axis slowest, so a node holds whole tensor-parallel groups when
    x*y*z divides gpus_per_node, and then gpus_per_node / (x*y*z) consecutive data indices (capped at the
    data size). A tensor-parallel group spanning nodes leaves one data rank per node (no hierarchy).
    """
    if gpus_per_node < 1:
        raise ZeroError(f"GPUs per node must be >= 1, got {gpus_per_node}")
    tp = shape.size("x", "y", "z")
    if gpus_per_node % tp:
        return 1
    return math.gcd(gpus_per_node // tp, shape.data)
