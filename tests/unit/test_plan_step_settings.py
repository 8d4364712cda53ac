"""StepSettings, the one object the cost model's step functions take: its checks, its defaults, its use as a cache
key, and PlanRequest.step_settings (the settings of a prediction: the global batch split over the GPUs reading
different rows and the micro-batches, the request's precision).

References: the element bytes of engine.spec.PRECISIONS and the rows layouts of engine.spec; values by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.planner.cost_model import NAMED_SHAPES, StepSettings
from engine.planner.plan import PlanRequest
from engine.planner.profiles import PROFILES
from engine.spec import GridShape


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rows_per_rank": 0}, "StepSettings.rows_per_rank must be an integer >= 1, got 0"),
        ({"seq": 1.5}, "StepSettings.seq must be an integer >= 1, got 1.5"),
        ({"act_bytes": True}, "StepSettings.act_bytes must be an integer >= 1, got True"),
        ({"grad_accum": -1}, "StepSettings.grad_accum must be an integer >= 0, got -1"),
        ({"mask_bytes": -8}, "StepSettings.mask_bytes must be an integer >= 0, got -8"),
        ({"vocab_parallel": "yes"}, "StepSettings.vocab_parallel must be None, True or False, got 'yes'"),
        ({"rows": "mine"}, "StepSettings.rows must be a rows layout of ('own', 'shared'), got 'mine'"),
        ({"bytes_per_param": 0}, "StepSettings.bytes_per_param must be a positive number, got 0"),
    ],
)
def test_refuses_impossible_settings_in_one_line(fields: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        StepSettings(**{"rows_per_rank": 1, "seq": 8, **fields})
    assert str(error.value) == message


def test_defaults_and_the_residual_stream() -> None:
    step = StepSettings(rows_per_rank=2, seq=16, act_bytes=4)
    assert (step.param_bytes, step.stream_bytes, step.grad_accum, step.rows, step.vocab_parallel) == (
        2,
        4,  # the residual stream defaults to the products' size
        1,
        "own",
        None,
    )
    assert replace(step, act_bytes=2).stream_bytes == 4  # resolved once: a replace keeps it
    assert replace(step, grad_accum=0).grad_accum == 0  # no passes: the optimizer's share alone


def test_tokens_of_the_decoder_in_each_rows_layout() -> None:
    grid = GridShape(data=2, x=2, y=3)
    assert StepSettings(rows_per_rank=2, seq=16).decoder_tokens(grid) == 2 * 3 * 2 * 16  # the x*y group's rows
    assert StepSettings(rows_per_rank=2, seq=16, rows="shared").decoder_tokens(grid) == 2 * 16


def test_equal_settings_are_one_cache_key() -> None:
    one = StepSettings(rows_per_rank=1, seq=8, recompute=True)
    cache = {(GridShape(x=2), one): "work"}
    assert cache[(GridShape(x=2), StepSettings(rows_per_rank=1, seq=8, recompute=True))] == "work"
    assert (GridShape(x=2), replace(one, recompute=False)) not in cache


def test_a_request_builds_the_settings_of_its_predictions() -> None:
    request = PlanRequest(
        shape=NAMED_SHAPES["8B"], gpus=64, global_batch=128, seq=4096, profile=PROFILES["dgx-h100"], mask_bytes=8
    )
    grid = GridShape(data=8, x=2, z=4)
    # own rows: 128 rows over 64 GPUs and 2 micro-batches; bf16 autocast: fp32 weights and stream, bf16 products
    assert request.step_settings(grid, "own", 2, True) == StepSettings(
        rows_per_rank=1,
        seq=4096,
        param_bytes=4,
        act_bytes=2,
        stream_bytes=4,
        grad_accum=2,
        mask_bytes=8,
        recompute=True,
    )
    # shared rows: the x*y group of 2 reads the same rows, so 32 GPUs read different ones: 4 rows per micro-batch
    assert request.step_settings(grid, "shared", 1, False).rows_per_rank == 4
