"""The "shared" rows layout (TrainConfig.rows, engine/models/parallelize.py): every rank of an x*y group reads the same
rows.

Reference: the serial model on the same global batch. On each grid a parallelized copy of the same tiny model (Llama
with attention and MLP biases and tied embeddings, or GPT-2) takes SGD steps through the training loop's own step
(engine.training.train's row split, forward/backward, loss and token sums, sync_gradients, clipping; only AdamW is
swapped for SGD, which keeps every constant factor visible): the per-step losses, the gradient norms and the weights
after the steps equal the serial run's. Batches are chosen so that the own layout could NOT split them (not a multiple
of the world size) wherever the grid allows. The loss runs either through model(...).logits or through the fused
vocabulary-parallel loss (engine.core.vocab_parallel.causal_lm_token_losses); vocabulary-parallel embeddings (the
default on tensor-parallel grids) and whole ones both. ZeRO 2/3 and activation checkpointing are covered on some grids,
and engine.training.train itself (AdamW) on others. Processes are spawned once per world size; grids loop inside the
workers. Float32 models: differences stay ~1e-6 relative; a row counted X*Y times or a missing term is O(1e-1).
"""

from __future__ import annotations

import contextlib
import sys

import pytest
import torch
import torch.nn.functional as F
from distributed import run_distributed
from tiny_models import tiny_gpt2, tiny_llama

from engine.core.grid import init
from engine.core.vocab_parallel import causal_lm_token_losses
from engine.memory.activation import checkpoint_decoder_layers
from engine.memory.offload import ActivationOffload
from engine.models.parallelize import parallelize, rows_layout
from engine.planner.cost_model import ordered_grids
from engine.training.state import full_state_dict
from engine.training.train import (
    StepLoss,
    TrainConfig,
    _all_reduce_sums,
    _forward_backward,
    _step_rows,
    _sync_and_clip,
    prepare_zero,
    steps_per_epoch,
    train,
)

VOCAB, SEQ = 96, 8
STEPS, LR = 3, 0.2
TOL = {"rtol": 1e-4, "atol": 1e-5}


def llama():
    return tiny_llama(vocab=VOCAB, hidden=64, heads=8, kv_heads=4, positions=32, mlp_bias=True, tied=True)


def gpt2():
    return tiny_gpt2(vocab=VOCAB, hidden=32)


MODELS = {"llama": llama, "gpt2": gpt2}


def _examples(n: int):
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=generator)
        targets = torch.cat([ids[1:], torch.tensor([-100])])
        targets[torch.rand(SEQ, generator=generator) < 0.2] = -100  # uneven token counts per row
        out.append({"input_ids": ids, "targets": targets})
    return out


def _logits_loss(model, batch) -> StepLoss:
    logits = model(input_ids=batch["input_ids"]).logits
    flat = F.cross_entropy(logits.flatten(0, 1).float(), batch["targets"].flatten(), reduction="sum")
    return StepLoss(loss_sum=flat, n_tokens=int((batch["targets"] != -100).sum()))


def _fused_loss(model, batch) -> StepLoss:
    losses = causal_lm_token_losses(model, batch["input_ids"], batch["targets"], chunk_tokens=5)
    return StepLoss(loss_sum=losses.sum(), n_tokens=int((batch["targets"] != -100).sum()))


LOSSES = {"logits": _logits_loss, "fused": _fused_loss}


def sgd_run(model, examples, loss_fn, config: TrainConfig, grid, steps: int = STEPS) -> tuple[list[float], list[float]]:
    """`steps` optimizer steps of engine.training.train's step with SGD instead of AdamW; (losses, grad norms) per
    step."""
    if config.activation_checkpointing:
        checkpoint_decoder_layers(model)
    prepare_zero(model, config, grid)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    per_epoch = steps_per_epoch(len(examples), config.batch_size)
    losses, norms = [], []
    model.train()
    for step in range(steps):
        epoch, index = divmod(step, per_epoch)
        optimizer.zero_grad(set_to_none=True)
        with rows_layout(model, config.rows):
            rows = _step_rows(len(examples), config, epoch, index, grid)
            cpu = torch.device("cpu")
            sums = _forward_backward(
                model,
                examples,
                rows,
                step,
                loss_fn,
                config,
                cpu,
                contextlib.nullcontext(),
                ActivationOffload(False, cpu),
            )
            sums.totals = _all_reduce_sums(sums.totals, grid, config.rows)
            norms.append(_sync_and_clip(model, sums.n_tokens, config, grid))
        optimizer.step()
        losses.append(float(sums.totals[0] / sums.totals[1]))
    return losses, norms


def _config(batch: int, rows: str = "shared", **extra) -> TrainConfig:
    return TrainConfig(epochs=2, batch_size=batch, lr=LR, max_grad_norm=None, progress=False, rows=rows, **extra)


_SERIAL: dict = {}


def serial(name: str, loss: str, batch: int, grad_accum: int = 1) -> dict:
    key = (name, loss, batch, grad_accum)
    if key not in _SERIAL:
        model = MODELS[name]()
        losses, norms = sgd_run(model, _examples(2 * batch), LOSSES[loss], _config(batch, grad_accum=grad_accum), None)
        _SERIAL[key] = {
            "losses": losses,
            "norms": norms,
            "weights": {k: v.clone() for k, v in model.state_dict().items()},
        }
    return _SERIAL[key]


def check_case(
    dims: tuple[int, int, int, int],
    name: str,
    loss: str,
    vocab_parallel: bool | None = None,
    zero: int = 0,
    checkpointing: bool = False,
    grad_accum: int = 1,
) -> None:
    data, x, y, z = dims
    batch = 2 * data * z  # 2 rows per x*y group: a multiple of the world size (own layout) only when x*y <= 2
    what = (
        f"{name} {loss} grid data={data},x={x},y={y},z={z} vocab_parallel={vocab_parallel} zero={zero} "
        f"ckpt={checkpointing} accum={grad_accum}"
    )
    reference = serial(name, loss, batch, grad_accum)
    grid = init(data=data, x=x, y=y, z=z)
    try:
        model = parallelize(MODELS[name](), grid, vocab_parallel=vocab_parallel)
        config = _config(batch, zero=zero, activation_checkpointing=checkpointing, grad_accum=grad_accum)
        losses, norms = sgd_run(model, _examples(2 * batch), LOSSES[loss], config, grid)
        assert losses == pytest.approx(reference["losses"], rel=1e-5), what
        assert norms == pytest.approx(reference["norms"], rel=1e-4), what
        weights = full_state_dict(model, grid)
        assert weights.keys() == reference["weights"].keys()
        for key, value in reference["weights"].items():
            torch.testing.assert_close(weights[key], value, **TOL, msg=lambda m: f"{what} {key}: {m}")
    finally:
        grid.close()


def check_train(dims: tuple[int, int, int, int], name: str, **extra) -> None:
    """engine.training.train itself (AdamW, clipping) in the shared layout: the serial run's losses and gradient
    norms."""
    data, x, y, z = dims
    batch = 2 * data * z
    config = TrainConfig(epochs=1, batch_size=batch, lr=1e-2, max_grad_norm=1.0, progress=False, rows="shared", **extra)
    serial_config = TrainConfig(epochs=1, batch_size=batch, lr=1e-2, max_grad_norm=1.0, progress=False)
    reference = train(MODELS[name](), _examples(2 * batch), _logits_loss, serial_config).history
    grid = init(data=data, x=x, y=y, z=z)
    try:
        history = train(
            parallelize(MODELS[name](), grid), _examples(2 * batch), _logits_loss, config, grid=grid
        ).history
        for mine, theirs in zip(history, reference, strict=True):
            assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-5), (dims, extra)
            assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4), (dims, extra)
            assert mine["n_tokens"] == theirs["n_tokens"], (dims, extra)
    finally:
        grid.close()


def _plain(grid=None) -> torch.nn.Module:
    """Two Linears (ParallelLinears in their default mode on a grid): no decoder stack, rows gathered by the layers."""
    from engine.core.linear import ParallelLinear

    torch.manual_seed(0)
    if grid is None:
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    return torch.nn.Sequential(ParallelLinear(8, 16, grid=grid), torch.nn.Tanh(), ParallelLinear(16, 4, grid=grid))


def _plain_loss(model, batch) -> StepLoss:
    return StepLoss(loss_sum=(model(batch["x"]) - batch["y"]).square().sum(), n_tokens=batch["y"].numel())


def check_plain(dims: tuple[int, int, int, int]) -> None:
    """Default-mode ParallelLinears skip their row gather in the shared layout: SGD steps equal the serial ones."""
    generator = torch.Generator().manual_seed(2)
    examples = [
        {"x": torch.randn(3, 8, generator=generator), "y": torch.randn(3, 4, generator=generator)}
        for _ in range(2 * dims[0] * dims[3])
    ]
    config = _config(dims[0] * dims[3])
    serial_model = _plain()
    reference = sum(sgd_run(serial_model, examples, _plain_loss, config, None), [])  # losses, then norms
    grid = init(data=dims[0], x=dims[1], y=dims[2], z=dims[3])
    try:
        model = _plain(grid)
        assert sum(sgd_run(model, examples, _plain_loss, config, grid), []) == pytest.approx(reference, rel=1e-5), dims
        weights = full_state_dict(model, grid)
        for key, value in serial_model.state_dict().items():
            torch.testing.assert_close(weights[key], value, **TOL, msg=lambda m: f"plain {dims} {key}: {m}")
    finally:
        grid.close()


def _worker(cases: list[tuple[str, tuple, dict]]) -> int:
    for kind, args, options in cases:
        if kind == "sgd":
            check_case(*args, **options)
        elif kind == "plain":
            check_plain(*args)
        else:
            check_train(*args, **options)
    return len(cases)


def world4_cases() -> list[tuple[str, tuple, dict]]:
    """Every grid of world 4: Llama (fused loss or logits, in turn; the whole lm_head on some), GPT-2 on a sample,
    ZeRO 3 and 2 on data >= 2 grids, activation checkpointing and micro-batches on some."""
    cases = []
    for index, g in enumerate(ordered_grids(4)):
        dims = (g.data, g.x, g.y, g.z)
        options = {"vocab_parallel": False} if index % 3 == 2 else {}
        cases.append(("sgd", (dims, "llama", ("fused", "logits")[index % 2]), options))
        if index % 3 == 0:
            cases.append(("sgd", (dims, "gpt2", "logits"), {}))
    cases.append(("sgd", ((2, 2, 1, 1), "llama", "fused"), {"zero": 3, "checkpointing": True}))
    cases.append(("sgd", ((2, 1, 2, 1), "gpt2", "logits"), {"zero": 2}))
    cases.append(("sgd", ((1, 2, 2, 1), "llama", "logits"), {"checkpointing": True, "grad_accum": 2}))
    cases.append(("plain", ((1, 2, 2, 1),), {}))
    cases.append(("plain", ((1, 1, 2, 2),), {}))
    cases.append(("train", ((1, 2, 2, 1), "llama"), {}))
    cases.append(("train", ((2, 1, 2, 1), "llama"), {"zero": 3, "activation_checkpointing": True}))
    return cases


def test_shared_rows_match_serial_on_every_world4_grid() -> None:
    cases = world4_cases()
    assert run_distributed(4, _worker, cases, timeout=600) == [len(cases)] * 4


@pytest.mark.slow
def test_shared_rows_match_serial_on_a_sample_of_world8() -> None:
    cases = [
        ("sgd", ((1, 2, 2, 2), "llama", "fused"), {}),
        ("sgd", ((2, 2, 2, 1), "llama", "logits"), {"vocab_parallel": False}),
        ("sgd", ((1, 2, 4, 1), "gpt2", "logits"), {}),
        ("sgd", ((2, 4, 1, 1), "llama", "fused"), {"zero": 2}),
        ("train", ((1, 4, 2, 1), "llama"), {}),
    ]
    assert run_distributed(8, _worker, cases, timeout=900) == [len(cases)] * 8


def _errors_worker() -> list[str]:
    grid = init(data=2, x=2, y=1, z=1)
    messages = []
    try:
        for rows, batch in (("own", 2), ("shared", 3), ("own", 3)):
            try:
                train(
                    parallelize(llama(), grid),
                    _examples(6),
                    _logits_loss,
                    TrainConfig(epochs=1, batch_size=batch, progress=False, rows=rows),
                    grid=grid,
                )
                messages.append("")
            except ValueError as error:
                messages.append(str(error))
        return messages
    finally:
        grid.close()


def test_batches_that_do_not_split_name_the_other_layout() -> None:
    own, shared, neither = run_distributed(4, _errors_worker)[0]
    # 2 rows on data=2,x=2: not a multiple of the world (4), but of data*z (2): the shared layout is the fix
    assert "not divisible by the world size 4" in own and "--rows shared" in own and "data*z=2" in own
    assert "not divisible by data*z=2" in shared and "--rows own" not in shared
    assert "not divisible by the world size 4" in neither and "--rows shared" not in neither  # 3 rows: no layout
    assert all("\n" not in m for m in (own, shared, neither))


def test_rows_layout_is_validated() -> None:
    with pytest.raises(ValueError, match="rows"):
        TrainConfig(rows="mine")
    with pytest.raises(ValueError, match="rows layout"):
        with rows_layout(torch.nn.Linear(2, 2), "both"):
            pass


if __name__ == "__main__":  # python tests/parallel/test_shared_rows.py: the world-4 cases, verbose
    sys.exit(pytest.main([__file__, "-x", "-q", "-k", "world4"]))
