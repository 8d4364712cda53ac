"""--compile on a grid (engine/models/compile.py through engine.training.train): equal to the eager run.

On data=2,x=2 (4 gloo processes), a tiny float32 Llama trains 2 SGD steps with the goldfish loss `goldfish train` runs
(hashed mask, k=4, h=4: the vocabulary-parallel per-token losses, the kept targets' mean), compiled and eager, in each
engine path compile composes with: plain, activation checkpointing, ZeRO 2 and ZeRO 3 (FSDP2 around each layer) with
activation checkpointing; on y=2,z=2 (heads split over y, rows over z) with activation checkpointing; on pipe=2. Losses,
gradient norms and the weights' change (SGD: lr times the clipped gradients, so it compares the gradients) must agree
within the bound derived in tests/unit/test_compile.py: 2 * LAYERS * HIDDEN * eps times the largest magnitude of the
quantity (of any weight's change, for the weights).
Slow: each worker compiles the tensor-parallel layer's pieces once (20-30 s per grid on 2 cores, inductor's cache warm).
"""

from __future__ import annotations

import pytest
import torch
from distributed import run_distributed
from tiny_models import tiny_llama

from data.batch import Row
from engine.core.grid import init
from engine.models.parallelize import parallelize
from engine.training.state import full_state_dict
from engine.training.train import TrainConfig, train
from goldfish.app.config import MaskSpec
from goldfish.app.training_rows import make_step_loss
from goldfish.masks import drop_mask

VOCAB, HIDDEN, LAYERS, SEQ, ROWS = 96, 32, 2, 16, 8
EPS = torch.finfo(torch.float32).eps
SCALE_TOL = 2 * LAYERS * HIDDEN * EPS  # tests/unit/test_compile.py derives it
MASK = MaskSpec(strategy="hashed", k=4, h=4)
PATHS = {
    "plain": {},
    "checkpointing": {"activation_checkpointing": True},
    "zero2": {"zero": 2},
    "zero3+checkpointing": {"zero": 3, "activation_checkpointing": True},
}


def _model() -> torch.nn.Module:
    return tiny_llama(vocab=VOCAB, hidden=HIDDEN, heads=4, kv_heads=2, positions=SEQ, dtype=torch.float32)


def _examples() -> list[Row]:
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(2 * ROWS):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=generator)
        targets = torch.cat([ids[1:], torch.tensor([-100])])
        dropped = drop_mask(targets[None], MASK.strategy, MASK.k, MASK.h)[0]
        out.append(Row(input_ids=ids, targets=targets, dropped=dropped))
    return out


def _run(grid, compile_layers: bool, settings: dict) -> tuple[list[dict], dict[str, torch.Tensor]]:
    model = parallelize(_model(), grid)
    config = TrainConfig(
        epochs=1, batch_size=ROWS, lr=0.5, optimizer="sgd", progress=False, compile=compile_layers, **settings
    )
    history = train(model, _examples(), make_step_loss(MASK, []), config, grid=grid).history
    return history, full_state_dict(model, grid)


def _close(actual: float | torch.Tensor, expected: float | torch.Tensor, what: str, scale: float | None = None) -> None:
    """|actual - expected| <= SCALE_TOL * scale (default: max|expected|)."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    bound = SCALE_TOL * (expected.abs().max().item() if scale is None else scale)
    error = (actual - expected).abs().max().item()
    assert error <= bound, f"{what}: max error {error:.3g} > bound {bound:.3g}"


def _worker(shape: tuple[int, ...], paths: dict[str, dict]) -> int:
    """Every path of `paths` on the grid (data, x, y, z[, pipe]), eager then compiled, compared."""
    grid = init(**dict(zip(("data", "x", "y", "z", "pipe"), shape)))
    initial = {k: v.clone() for k, v in _model().state_dict().items()}
    try:
        for name, settings in paths.items():
            eager_history, eager_weights = _run(grid, False, settings)
            history, weights = _run(grid, True, settings)
            for eager, compiled in zip(eager_history, history):
                for key in ("loss", "all_loss", "dropped_loss", "grad_norm"):
                    _close(compiled[key], eager[key], f"{name} step {eager['step']} {key}")
            # SGD: weight change = -lr * (clipped) gradients, compared at the scale of the largest change (see
            # tests/unit/test_compile.py: why a tensor's own scale is too small for q and k)
            changes = {key: eager_weights[key] - start for key, start in initial.items()}
            scale = max(change.abs().max().item() for change in changes.values())
            for key, start in initial.items():
                _close(weights[key] - start, changes[key], f"{name} {key}", scale)
    finally:
        grid.close()
    return len(paths)


@pytest.mark.slow
def test_compiled_equals_eager_on_data2_x2() -> None:
    assert run_distributed(4, _worker, (2, 2, 1, 1), PATHS, timeout=900.0) == [len(PATHS)] * 4


@pytest.mark.slow
def test_compiled_equals_eager_on_y2_z2() -> None:
    """The y and z splits of the decoder's Linears (heads over y, rows over z), with activation checkpointing."""
    paths = {"checkpointing": {"activation_checkpointing": True}}
    assert run_distributed(4, _worker, (1, 1, 2, 2), paths, timeout=900.0) == [1] * 4


@pytest.mark.slow
def test_compiled_equals_eager_on_two_pipeline_stages() -> None:
    """pipe=2 (one decoder layer per stage): torch.distributed.pipelining's stages call the same layer modules, so
    their compiled forward; 1f1b, and gpipe with activation checkpointing. zero-bubble is refused (tests/unit)."""
    paths = {"1f1b": {"pipe_schedule": "1f1b"}, "gpipe": {"pipe_schedule": "gpipe", "activation_checkpointing": True}}
    assert run_distributed(2, _worker, (1, 1, 1, 1, 2), paths, timeout=900.0) == [2] * 2
