"""engine.spec.ParallelLayout: one validated description of a parallel run from which every axis table is derived.
Plain Python (no torch); the parallel-equals-serial tests (test_shared_rows, test_engine_parallelize, test_zero)
prove that the runtime following these tables gives the serial model's gradients."""

from __future__ import annotations

import pytest

from engine.spec import (
    AXES,
    PLAN_PRECISION,
    PRECISIONS,
    REGIONS,
    TRAIN_PRECISION,
    GridError,
    GridShape,
    ParallelLayout,
    ZeroConfig,
    ZeroError,
    gradient_axes,
    parse_grid_sizes,
    row_gather_axes,
    row_replica_axes,
    row_split_axes,
    vocab_row_axes,
)


def test_bad_settings_are_refused_once_with_the_fix() -> None:
    with pytest.raises(ValueError, match="rows layout must be one of"):
        ParallelLayout(rows="mine")
    with pytest.raises(ValueError, match="precision must be one of"):
        ParallelLayout(precision="fp16")
    with pytest.raises(ZeroError, match="data=1"):
        ParallelLayout(shape=GridShape(x=2), zero=ZeroConfig(stage=1))
    with pytest.raises(GridError, match="GridShape"):
        ParallelLayout(shape=(2, 1, 1, 1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="vocab_parallel"):
        ParallelLayout(vocab_parallel="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot parse grid"):
        ParallelLayout.parse("data=2,w=2")
    with pytest.raises(ValueError, match="twice"):
        parse_grid_sizes("x=2,x=2")


def test_parse_and_defaults() -> None:
    layout = ParallelLayout.parse("data=2,x=2", rows="shared")
    assert layout.shape == GridShape(data=2, x=2)
    assert layout.precision == TRAIN_PRECISION == "fp32" and PLAN_PRECISION in PRECISIONS
    assert layout.to_json()["grid"] == "data=2,x=2,y=1,z=1"


@pytest.mark.parametrize("grid", ["x=2,y=3,z=5,data=7", "x=2,y=2", "z=3,data=2", ""])
def test_rows_split_and_replica_axes_cover_the_grid(grid: str) -> None:
    """Every axis either splits a step's rows or replicates them (the shared layout's x*y), never both, and the
    decoder gathers rows exactly over the axes that the shared layout replicates them on."""
    for rows in ("own", "shared"):
        layout = ParallelLayout.parse(grid, rows=rows)
        split, replica = set(row_split_axes(rows)), set(row_replica_axes(rows))
        assert split | replica == set(AXES) and not split & replica
        assert layout.row_splits * layout.shape.size(*replica) == layout.shape.world_size
        assert set(row_gather_axes(rows)) == ({"x", "y"} if rows == "own" else set())
        assert set(vocab_row_axes(rows)) == {"x", "y", "z"} - replica
        assert layout.group_rows(3) == 3 * (layout.shape.size("x", "y") if rows == "own" else 1)
    shape = ParallelLayout.parse(grid).shape
    assert ParallelLayout.parse(grid, rows="shared").shares_rows == (shape.size("x", "y") > 1)


def test_gradient_axes_sum_over_every_rank_that_saw_other_rows() -> None:
    """A gradient is summed over the axes whose ranks saw different rows (or different heads' shares, "heads"); its
    replicas (ranks that saw the same rows) are not summed. Own rows see every axis; a decoder layer ("layer") sees
    its x*y group's rows; vocabulary shards ("tensor") cover x*y*z already."""
    for rows in ("own", "shared"):
        for region in REGIONS:
            axes = gradient_axes(rows, region)
            assert set(axes) <= set(AXES) and "data" in axes
            assert not set(axes) & set(row_replica_axes(rows)) or region == "heads"
    assert gradient_axes("own", "rows") == AXES and gradient_axes("shared", "rows") == ("z", "data")
    assert gradient_axes("own", "layer") == gradient_axes("shared", "layer") == ("z", "data")
    assert gradient_axes("own", "tensor") == ("data",)
    with pytest.raises(ValueError, match="unknown region"):
        gradient_axes("own", "bogus")


def test_step_rows_are_checked_with_the_other_layout_as_the_hint() -> None:
    layout = ParallelLayout.parse("data=2,x=2")
    layout.check_step_rows(8)
    with pytest.raises(ValueError, match=r"--rows shared\), which needs only multiples of data\*z=2"):
        layout.check_step_rows(6)
    ParallelLayout.parse("data=2,x=2", rows="shared").check_step_rows(6)
    with pytest.raises(ValueError, match="not divisible by data\\*z=2"):
        ParallelLayout.parse("data=2,x=2", rows="shared").check_step_rows(5)


def test_the_trainer_and_the_planner_take_their_tables_from_the_layout() -> None:
    """The trainer's settings become a ParallelLayout, and the planner's readers are the layout's row splits."""
    from engine.planner.plan import readers

    for grid in ("data=2,x=2", "x=2,y=2,z=2"):
        for rows in ("own", "shared"):
            layout = ParallelLayout.parse(grid, rows=rows)
            assert readers(layout.shape, rows) == layout.row_splits
