"""Work split over the data axis of a grid, with the results gathered back in order (e.g. sharded evaluation).

Every rank of a tensor-parallel group (the x*y*z ranks that share a data index), and every stage's rank of a
pipeline, gets the same contiguous block, so a parallel model's collectives pair up; the blocks of the data indices
are balanced and in order, and the rows of every block come back to rank 0 in that order. An error on one rank is
raised on every rank. Knows nothing of what the work is.
"""

from __future__ import annotations

import traceback
from typing import Any, Callable, Sequence

from engine.core import comm
from engine.core.grid import GRID_AXES, Grid

TENSOR_AXES = ("x", "y", "z")  # the axes whose ranks share one data shard and run the same forward passes
SHARING_AXES = (*TENSOR_AXES, "pipe")  # every axis whose ranks share one data shard (a pipeline's stages too)


class ShardedRunError(RuntimeError):
    """A rank failed while working on its block; raised on every rank, with each failing rank's message."""


def shard_bounds(n_items: int, n_shards: int, index: int) -> tuple[int, int]:
    """[start, end) of block `index` when `n_items` are cut into `n_shards` contiguous blocks in order.

    Block sizes differ by at most one (the first n_items % n_shards blocks get the extra item); with fewer items
    than blocks the last blocks are empty.
    """
    if n_items < 0 or n_shards < 1 or not 0 <= index < n_shards:
        raise ValueError(f"cannot take block {index} of {n_items} items in {n_shards} blocks")
    size, extra = divmod(n_items, n_shards)
    start = index * size + min(index, extra)
    return start, start + size + (1 if index < extra else 0)


def shard(items: Sequence[Any], grid: Grid | None) -> list[Any]:
    """This rank's data-parallel block of `items` (all of them for grid None): contiguous, in order, balanced over
    the data axis; the same block on every rank of a tensor-parallel group."""
    if grid is None:
        return list(items)
    start, end = shard_bounds(len(items), grid.size("data"), grid.coord("data"))
    return list(items[start:end])


def _is_group_leader(grid: Grid) -> bool:
    return all(grid.coord(axis) == 0 for axis in SHARING_AXES)


def gather_rows(rows: Sequence[Any], grid: Grid | None) -> list[Any] | None:
    """Every data block's rows on rank 0, concatenated in data-index order (= document order for blocks made by
    `shard`); None on the other ranks. Only the first rank of each tensor-parallel group and pipeline contributes
    (its peers hold the same rows). Rows must be picklable. A collective over the whole world: every rank calls it."""
    if grid is None or grid.is_trivial:
        return list(rows)
    mine = (grid.coord("data"), list(rows)) if _is_group_leader(grid) else None
    received = comm.gather_objects(mine, grid.group(*GRID_AXES))
    if received is None:
        return None
    blocks = sorted(item for item in received if item is not None)
    if [index for index, _ in blocks] != list(range(grid.size("data"))):
        raise ShardedRunError(
            f"expected one block per data index 0..{grid.size('data') - 1}, got {[index for index, _ in blocks]}"
        )
    return [row for _, block in blocks for row in block]


def run_sharded(
    fn: Callable[[list[Any]], Sequence[Any]], documents: Sequence[Any], grid: Grid | None
) -> list[Any] | None:
    """Run ``fn(block)`` on this rank's block of `documents` (see `shard`) and return all blocks' rows on rank 0 in
    document order, None elsewhere (grid None: ``fn(documents)``).

    ``fn`` returns a list of rows for its block (any length, e.g. one row per document). Ranks of one
    tensor-parallel group run it on the same block, so a parallel model's collectives pair up; different data
    groups may do different amounts of work (or none). If ``fn`` raises on any rank, every rank raises
    ShardedRunError naming the failing ranks.
    """
    if grid is None:
        return list(fn(list(documents)))
    block = shard(documents, grid)
    rows: list[Any] = []
    failure = None
    try:
        rows = list(fn(block))
    except Exception as error:  # noqa: BLE001 - reported to every rank below, then raised
        failure = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
    failures = comm.all_gather_objects(failure, grid.group(*GRID_AXES))
    failed = {rank: message for rank, message in enumerate(failures) if message is not None}
    if failed:
        first = min(failed)
        raise ShardedRunError(f"evaluation failed on rank(s) {sorted(failed)}; rank {first}: {failed[first]}")
    return gather_rows(rows, grid)
