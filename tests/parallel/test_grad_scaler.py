"""fp16 loss scaling on a grid (engine/training/scaler.py), on 2 gloo ranks at x=2 and at data=2 under ZeRO 2.

Scaling by a power of two and unscaling are exact, so a step under GridGradScaler must give bit for bit the weights of
the same step unscaled; an overflow in one rank's shard must make every rank skip the step and back off the scale.
torch's own GradScaler is run beside it to show both failures the class exists for.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from distributed import run_distributed

from engine.core.grid import init
from engine.core.placement import local_shard
from engine.memory.zero import shard_data_axis
from engine.models.layout import unplace_parameters
from engine.models.miniature import miniature_config
from engine.models.parallelize import parallelize
from engine.spec import ZeroConfig
from engine.training.scaler import GridGradScaler
from engine.training.state import full_state_dict, sync_gradients

SCALE = 2.0**10


def _serial() -> torch.nn.Module:
    import transformers

    config = miniature_config(transformers.LlamaConfig(), shards=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def _scaler_steps(_: int) -> dict[str, bool]:
    grid = init(x=2)
    serial = _serial()
    ids = torch.randint(0, serial.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))

    def step(model: torch.nn.Module, scaler: torch.amp.GradScaler | None, overflow: bool = False) -> None:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model(input_ids=ids).logits.float().square().mean()
        (scaler.scale(loss) if scaler is not None else loss).backward()
        sync_gradients(model, grid)
        if overflow and grid.coord("x") == 1:  # one element of rank 1's shard of a split weight overflows
            local_shard(model.model.layers[0].mlp.down_proj.weight.grad)[0, 0] = float("inf")
        if scaler is None:
            optimizer.step()
            return
        scaler.step(optimizer)
        scaler.update()

    out = {}
    unscaled = parallelize(copy.deepcopy(serial), grid)
    step(unscaled, None)
    scaled = parallelize(copy.deepcopy(serial), grid)
    scaler = GridGradScaler(grid, init_scale=SCALE)
    step(scaled, scaler)
    a, b = full_state_dict(unscaled, grid), full_state_dict(scaled, grid)
    out["placed: the same step as unscaled"] = all(torch.equal(a[k], b[k]) for k in a)
    out["the scale kept"] = scaler.get_scale() == SCALE

    before = full_state_dict(scaled, grid)
    step(scaled, scaler, overflow=True)
    after = full_state_dict(scaled, grid)
    out["overflow on one rank: every rank skips"] = all(torch.equal(before[k], after[k]) for k in before)
    out["overflow on one rank: every rank backs off"] = scaler.get_scale() == SCALE / 2

    plain = parallelize(copy.deepcopy(serial), grid)
    unplace_parameters(plain)  # plain shards: torch's GradScaler runs, each rank on its own shards
    before = full_state_dict(plain, grid)
    step(plain, torch.amp.GradScaler("cpu", init_scale=SCALE), overflow=True)
    changed = [not torch.equal(before[k], v) for k, v in full_state_dict(plain, grid).items()]
    out["torch's GradScaler: the ranks part (rank 0 steps, rank 1 skips)"] = any(changed) and not all(changed)
    # every gradient placed: torch's GradScaler runs, and DTensor reduces its overflow flag over the mesh dims the
    # FIRST gradient is sharded on (the embedding's: over x when vocabulary-parallel, over nothing when replicated)
    for vocab_parallel, what in ((True, "sharded: every rank skips"), (False, "replicated: the ranks part")):
        placed = parallelize(copy.deepcopy(serial), grid, vocab_parallel=vocab_parallel)
        before = full_state_dict(placed, grid)
        step(placed, torch.amp.GradScaler("cpu", init_scale=SCALE), overflow=True)
        changed = [not torch.equal(before[k], v) for k, v in full_state_dict(placed, grid).items()]
        out[f"torch's GradScaler, first gradient {what}"] = (
            not any(changed) if vocab_parallel else any(changed) and not all(changed)
        )

    copied = pickle.loads(pickle.dumps(scaler))  # torch's scalers pickle (checkpoints, deep copies of plugins)
    out["pickled: the same state"] = copied.state_dict() == scaler.state_dict()

    loaded = torch.amp.GradScaler("cpu", init_scale=8.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=7)
    loaded.load_state_dict({**loaded.state_dict(), "_growth_tracker": 5})
    out["like: every setting and the growth tracker"] = GridGradScaler.like(loaded, grid).state_dict() == {
        "scale": 8.0,
        "growth_factor": 3.0,
        "backoff_factor": 0.25,
        "growth_interval": 7,
        "_growth_tracker": 5,
    }
    out["like: disabled stays disabled"] = not GridGradScaler.like(
        torch.amp.GradScaler("cpu", enabled=False), grid
    ).is_enabled()
    grid.close()
    return out


def test_grid_grad_scaler() -> None:
    """Unscaling placed gradients is exact, and an overflow in one rank's shard skips the step everywhere (torch's
    GradScaler: the ranks part on plain shards, and on placed gradients unless the first is sharded on every axis)."""
    for out in run_distributed(2, _scaler_steps, 0):
        assert all(out.values()), out


def _zero_steps(_: int) -> dict[str, bool]:
    grid = init(data=2)
    serial = _serial()
    ids = torch.randint(0, serial.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1 + grid.rank))
    out = {}
    weights = []
    for overflow in (False, True):
        model = shard_data_axis(parallelize(copy.deepcopy(serial), grid), grid, ZeroConfig(stage=2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = GridGradScaler(grid, init_scale=SCALE)
        scaler.scale(model(input_ids=ids).logits.float().square().mean()).backward()
        sync_gradients(model, grid)
        grad = model.model.layers[0].mlp.down_proj.weight.grad  # ZeRO's DTensor: this rank's rows
        if overflow and grid.rank == 1:
            grad.to_local()[0, 0] = float("inf")
        scaler.step(optimizer)
        scaler.update()
        weights.append(full_state_dict(model, grid))
        out[f"overflow {overflow}: scale"] = scaler.get_scale() == (SCALE / 2 if overflow else SCALE)
    initial = full_state_dict(parallelize(copy.deepcopy(serial), grid), grid)
    out["a step without overflow changes the weights"] = any(
        not torch.equal(initial[k], weights[0][k]) for k in initial
    )
    out["overflow on rank 1's chunk: every rank skips"] = all(torch.equal(initial[k], weights[1][k]) for k in initial)
    grid.close()
    return out


def test_grid_grad_scaler_under_zero() -> None:
    """Under ZeRO 2 each data rank holds a chunk of the reduced gradients: an overflow in one rank's chunk skips the
    step on every rank."""
    for out in run_distributed(2, _zero_steps, 0):
        assert all(out.values()), out


def _strategies_scale_over_the_grid(_: int) -> dict[str, bool]:
    import lightning.pytorch as pl
    from lightning.fabric import Fabric
    from lightning.fabric.plugins.precision.amp import MixedPrecision as FabricMixedPrecision
    from lightning.pytorch.plugins.precision import MixedPrecision as TrainerMixedPrecision

    from engine.integrations.lightning import EngineStrategy
    from engine.integrations.lightning_trainer import EngineTrainerStrategy

    out = {}
    plugin = FabricMixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=8.0))
    fabric = Fabric(accelerator="cpu", devices=1, strategy=EngineStrategy(), plugins=[plugin])
    fabric.launch()  # the strategy's setup_environment: the grid, then the scaler
    scaler = fabric.strategy.precision.scaler
    out["Fabric: a GridGradScaler with the plugin's scale"] = (
        isinstance(scaler, GridGradScaler) and scaler.get_scale() == 8
    )
    fabric.strategy.teardown()
    plugin = TrainerMixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=8.0))
    trainer = pl.Trainer(accelerator="cpu", devices=1, strategy=EngineTrainerStrategy(), plugins=[plugin], logger=False)
    trainer.strategy.setup_environment()  # what Trainer.fit runs first
    scaler = trainer.strategy.precision_plugin.scaler
    out["Trainer: a GridGradScaler with the plugin's scale"] = (
        isinstance(scaler, GridGradScaler) and scaler.get_scale() == 8
    )
    trainer.strategy.teardown()
    return out


def test_lightning_strategies_scale_over_the_grid() -> None:
    """Both Lightning strategies give a "16-mixed" plugin a GridGradScaler in its scaler's state when they start."""
    pytest.importorskip("lightning", reason="needs the lightning extra: pip install -e '.[lightning]'")
    for out in run_distributed(1, _strategies_scale_over_the_grid, 0):
        assert all(out.values()), out
