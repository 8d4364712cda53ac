"""The engine grid a run trains or evaluates on: started from --grid under torchrun, and its sizes as records
name them."""

from __future__ import annotations

import os

import engine
from engine import AXES, Grid
from goldfish.app.config import parse_grid


def start_grid(text: str | None) -> Grid | None:
    """The engine grid of a parallel run (under torchrun), or None for a single process.

    With no --grid under torchrun, every rank is a data-parallel replica (data = world size).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if text is None and world == 1:
        return None
    sizes = parse_grid(text) if text else {"data": world}
    return engine.init(**sizes)


def grid_sizes(grid: Grid) -> dict[str, int]:
    """{axis: size} of an engine grid, as recorded in run records and summaries (pipe only when it is > 1)."""
    sizes = {axis: getattr(grid.shape, axis) for axis in AXES}
    return {**sizes, "pipe": grid.shape.pipe} if grid.shape.pipe > 1 else sizes
