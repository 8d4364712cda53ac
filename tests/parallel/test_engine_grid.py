"""The 4D grid: sizes, rank order, process groups, init from the environment, clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
from itertools import product

import pytest
import torch
import torch.distributed as dist
from distributed import RankFailure, run_distributed

from engine.core import comm
from engine.core.grid import AXES, GROUP_AXES, GridError, GridShape, init


def grids_of(world: int) -> list[tuple[int, int, int, int]]:
    """Every ordered (data, x, y, z) with product `world`."""
    return [g for g in product(range(1, world + 1), repeat=4) if g[0] * g[1] * g[2] * g[3] == world]


def test_grid_counts() -> None:
    # 1 + 4 + 10 + 20 = the 35 ordered grids of the issue
    assert [len(grids_of(w)) for w in (1, 2, 4, 8)] == [1, 4, 10, 20]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_shape_rejects_bad_sizes(bad) -> None:
    with pytest.raises(GridError, match="integer >= 1"):
        GridShape(x=bad)


def test_rank_order_x_fastest() -> None:
    shape = GridShape(data=2, x=2, y=3, z=2)
    assert shape.world_size == 24
    assert shape.coords(1) == {"x": 1, "y": 0, "z": 0, "data": 0, "pipe": 0}
    assert shape.coords(2) == {"x": 0, "y": 1, "z": 0, "data": 0, "pipe": 0}
    assert shape.coords(6) == {"x": 0, "y": 0, "z": 1, "data": 0, "pipe": 0}
    assert shape.coords(12) == {"x": 0, "y": 0, "z": 0, "data": 1, "pipe": 0}
    for r in range(24):
        assert shape.rank(shape.coords(r)) == r
    assert shape.group_ranks(("x",))[:2] == [[0, 1], [2, 3]]
    assert shape.group_ranks(("y",))[0] == [0, 2, 4]
    assert shape.group_ranks(("data",))[0] == [0, 12]
    assert shape.group_ranks(("x", "y"))[0] == [0, 1, 2, 3, 4, 5]
    # every combination partitions the world
    for axes in GROUP_AXES:
        groups = shape.group_ranks(axes)
        assert sorted(r for g in groups for r in g) == list(range(24))
        assert all(len(g) == shape.size(*axes) for g in groups)


def test_the_pipe_axis_is_slowest_and_every_other_group_stays_in_a_stage() -> None:
    shape = GridShape(data=2, x=2, pipe=3)
    assert shape.world_size == 12 and shape.stage_size == 4 and str(shape) == "data=2,x=2,y=1,z=1,pipe=3"
    assert shape.coords(4) == {"x": 0, "y": 0, "z": 0, "data": 0, "pipe": 1}
    assert shape.group_ranks(("pipe",))[0] == [0, 4, 8]
    for axes in GROUP_AXES:
        if "pipe" not in axes:  # the groups of a pipeline stage: ranks 4s .. 4s+3 of stage s
            assert all(len({rank // 4 for rank in group}) == 1 for group in shape.group_ranks(axes))
    assert shape.group_ranks(("x", "y", "z", "data", "pipe")) == [list(range(12))]


def _check_all_grids(world: int) -> int:
    checked = 0
    for data, x, y, z in grids_of(world):
        grid = init(data=data, x=x, y=y, z=z)
        assert grid.world_size == world and grid.rank == dist.get_rank()
        assert grid.device == torch.device("cpu") and grid.backend == "gloo"
        assert grid.shape.rank(grid.coords) == grid.rank
        for axes in GROUP_AXES:
            group = grid.group(*axes)
            assert group.size == grid.size(*axes)
            assert group.ranks[group.rank] == grid.rank
            # members share every coordinate outside `axes`
            for r in group.ranks:
                other = grid.shape.coords(r)
                assert all(other[a] == grid.coords[a] for a in AXES if a not in axes)
            total = comm.all_reduce(torch.tensor([float(grid.rank)]), group)
            assert total.item() == float(sum(group.ranks))
        grid.close()
        checked += 1
    # a second init is independent of the first and of earlier (closed) grids
    a, b = init(data=world), init(x=world)
    assert a.group("data").size == world and b.group("x").size == world and a.group("x").size == 1
    a.close()
    assert comm.all_reduce(torch.ones(1), b.group("x")).item() == world
    b.close()
    return checked


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_every_grid_builds_its_groups(world: int) -> None:
    assert run_distributed(world, _check_all_grids, world) == [len(grids_of(world))] * world


def _wrong_product() -> None:
    init(data=1, x=3, y=1, z=1)


def test_product_must_match_world() -> None:
    with pytest.raises(RankFailure, match=r"needs 3 ranks but the world has 2"):
        run_distributed(2, _wrong_product)


def test_lone_process_becomes_world_of_one() -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS")
    }
    code = (
        "import engine.core.grid as g, torch.distributed as dist\n"
        "grid = g.init()\n"
        "print(grid.world_size, grid.rank, grid.backend, dist.get_world_size())\n"
        "try:\n    g.init(x=2)\nexcept g.GridError as e:\n    print('error:', e)\n"
        "grid.close(destroy_world=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "1 0 gloo 1"
    assert "needs 2 ranks but the world has 1" in lines[1]
