"""One frozen ParallelPlan per parallelized model (engine/models/layout.py) is what every reader asks; the Grid holds
process groups only.

On a world of 4 (x=2, y=2: every rank of the x*y group reads other rows in the "own" layout, the same rows in the
"shared" one) two copies of one tiny Llama are parallelized on ONE grid. The first runs in the shared layout while the
second runs in the own one at the same time: with the layout on the grid (before the plan) the second would have
skipped its row gathers. Each must give the serial model's loss and gradients on its rows (float32: ~1e-6 relative;
a wrong layout mixes other ranks' rows and is off by O(1e-1)). The plan is frozen, recorded again (not changed) by
rows_layout, and sync_gradients sums over the axes the plan's rows layout names.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from distributed import run_distributed
from tiny_models import tiny_llama

import engine
from engine.core.grid import init
from engine.models.layout import ROWS_MODE, ParallelPlan, plan_of
from engine.models.parallelize import parallelize, rows_layout
from engine.spec import ROWS_LAYOUTS
from engine.training.state import full_state_dict, sync_gradients

VOCAB, SEQ, ROWS = 64, 6, 4
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _loss_sum(model, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits  # (B, T, V)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="sum")


def _serial_grads(serial, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    serial.zero_grad(set_to_none=True)
    _loss_sum(serial, ids).backward()
    return {name: p.grad.clone() for name, p in serial.named_parameters()}


def _worker() -> int:
    grid = init(x=2, y=2)
    serial = tiny_llama(vocab=VOCAB, hidden=32, heads=4, kv_heads=2, positions=16)
    ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=torch.Generator().manual_seed(3))  # the step's rows, (B, T)
    shared_model = parallelize(copy.deepcopy(serial), grid)
    own_model = parallelize(copy.deepcopy(serial), grid)
    assert not any(value in ROWS_LAYOUTS for value in vars(grid).values()), "the grid holds no rows layout"
    assert not hasattr(grid, "rows") and not hasattr(grid, "rows_layout")

    plan = plan_of(shared_model)
    assert isinstance(plan, ParallelPlan) and plan.rows == "own" and plan.shape == grid.shape
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.rows = "shared"
    mine = ids[grid.rank : grid.rank + 1]  # own layout: every rank of the x*y group its own row
    group_rows = ids[:2]  # shared layout: every rank the same rows
    with rows_layout(shared_model, "shared"):
        assert plan_of(shared_model).rows == "shared" and plan_of(own_model).rows == "own"
        assert all(m.__dict__[ROWS_MODE] == "own" for m in own_model.modules() if ROWS_MODE in m.__dict__)
        _loss_sum(shared_model, group_rows).backward()
        _loss_sum(own_model, mine).backward()  # the other model on the same grid, in its own layout meanwhile
        sync_gradients(shared_model, grid)  # summed over the axes the plan's "shared" layout names
    sync_gradients(own_model, grid)
    assert plan_of(shared_model).rows == "own"  # restored

    # shared: the group's rows counted once; own: the 4 ranks' rows together are the step
    for model, rows in ((shared_model, group_rows), (own_model, ids)):
        expected = _serial_grads(serial, rows)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.grad)  # the weights' places hold the gradients: full_state_dict gathers them whole
        grads = full_state_dict(model, grid)
        for name, want in expected.items():
            torch.testing.assert_close(grads[name], want, **TOL, msg=lambda m, n=name: f"{n}: {m}")
    return 1


def test_one_frozen_plan_per_model_and_a_grid_without_layout() -> None:
    assert run_distributed(4, _worker, timeout=300) == [1] * 4


def test_the_plan_is_public() -> None:
    assert engine.ParallelPlan is ParallelPlan and engine.plan_of is plan_of
