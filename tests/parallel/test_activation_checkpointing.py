"""Activation checkpointing of decoder layers (engine/memory/activation.py): same loss and gradients as without it.

Float64 models. The recomputation runs the same operations on the same numbers, so losses are bit-identical;
gradients that sum three or more contributions (e.g. a tied embedding: lookup, lm_head, and the residual stream
into the first layer) may add them in another order, so they are compared at 1e-12 relative (a wrong or missing
term is O(1e-2) or more).

Serial: the loss and every gradient are bit-identical, each decoder layer really runs twice per step, and the
activations kept for backward shrink. Parallel: on every grid of world 4 (and a sample of world 8), for a Llama
with attention biases and tied embeddings and for GPT-2, the parallelized model with checkpointing gives the same
gradients (after sync_gradients, gathered to serial shapes) as the same parallelized model without it.
"""

from __future__ import annotations

import copy
from itertools import product

import pytest
import torch
import torch.nn.functional as F
from distributed import run_distributed
from tiny_models import tiny_gpt2, tiny_llama
from tiny_runs import tiny_run

from engine.core.grid import init
from engine.core.linear import ParallelLinear, ShardingError
from engine.memory.activation import checkpoint_decoder_layers, is_checkpointed
from engine.models.parallelize import parallelize
from engine.training.state import sync_gradients

ROWS, SEQ, VOCAB = 2, 8, 128
TOL = {"rtol": 1e-12, "atol": 1e-14}


def llama(seed: int = 0):
    return tiny_llama(vocab=VOCAB, seed=seed, mlp_bias=True, tied=True, dtype=torch.float64)


def gpt2(seed: int = 0):
    return tiny_gpt2(vocab=VOCAB, seed=seed, dropout=0.1, dtype=torch.float64)  # dropout on: RNG replayed


MODELS = {"llama": llama, "gpt2": gpt2}


def batch(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (world * ROWS, SEQ), generator=gen)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (world * ROWS,), generator=gen)
    return ids, (torch.arange(SEQ)[None, :] < lengths[:, None]).long()


def loss_sum(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=mask).logits
    targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), targets.reshape(-1), reduction="sum")


def grads_of(model, grid=None) -> dict[str, torch.Tensor]:
    modules = dict(model.named_modules())
    out = {}
    for name, param in model.named_parameters():
        owner, _, attr = name.rpartition(".")
        grad = param.grad
        if grid is not None and isinstance(modules[owner], ParallelLinear):
            layer = modules[owner]
            grad = layer.gather_weight(grad) if attr == "weight" else layer.gather_bias(grad)
        out[name] = grad
    return out


def step(model, ids, mask, grid=None, seed: int = 3) -> tuple[float, dict[str, torch.Tensor]]:
    model.train()
    torch.manual_seed(seed)  # the same dropout draws with and without checkpointing
    loss = loss_sum(model, ids, mask)
    loss.backward()
    if grid is not None:
        sync_gradients(model, grid)
    return loss.item(), grads_of(model, grid)


@pytest.mark.parametrize("name", list(MODELS))
def test_serial_gradients_equal_and_layers_recomputed(name: str) -> None:
    plain = MODELS[name]()
    checkpointed = copy.deepcopy(plain)
    assert checkpoint_decoder_layers(checkpointed) == 2
    assert checkpoint_decoder_layers(checkpointed) == 2 and is_checkpointed(checkpointed)  # idempotent
    assert not is_checkpointed(plain)
    layers = checkpointed.model.layers if name == "llama" else checkpointed.transformer.h
    calls = []
    layers[0].register_forward_pre_hook(lambda *a: calls.append(1))
    ids, mask = batch(1)

    saved: dict[str, int] = {}

    def measure(model, key):
        total = [0]

        def pack(t):
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            result = step(model, ids, mask)
        saved[key] = total[0]
        return result

    loss, grads = measure(plain, "plain")
    loss_ckpt, grads_ckpt = measure(checkpointed, "checkpointed")
    assert loss == loss_ckpt
    assert grads.keys() == grads_ckpt.keys()
    for key in grads:
        torch.testing.assert_close(grads[key], grads_ckpt[key], **TOL, msg=key)
    assert len(calls) == 2, "the checkpointed layer should run once in forward and once in backward"
    assert saved["checkpointed"] < 0.6 * saved["plain"], saved


def test_model_without_decoder_layers_is_refused() -> None:
    with pytest.raises(ShardingError, match="no decoder layers"):
        checkpoint_decoder_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def _worker(shapes: list[tuple[int, int, int, int]]) -> int:
    done = 0
    for shape in shapes:
        data, x, y, z = shape
        grid = init(data=data, x=x, y=y, z=z)
        try:
            mine = slice(grid.rank * ROWS, (grid.rank + 1) * ROWS)
            ids, mask = batch(grid.world_size)
            for name, make in MODELS.items():
                plain = parallelize(make(), grid)
                checkpointed = parallelize(make(), grid)
                checkpoint_decoder_layers(checkpointed)
                # one seed on every rank: the ranks of an x*y group must draw the same dropout (they run the
                # same rows); GPT-2's dropout thus checks that the recomputation replays the RNG
                loss, grads = step(plain, ids[mine], mask[mine], grid)
                loss_ckpt, grads_ckpt = step(checkpointed, ids[mine], mask[mine], grid)
                assert loss == pytest.approx(loss_ckpt, rel=1e-12, abs=0), (shape, name)
                for key in grads:
                    torch.testing.assert_close(grads[key], grads_ckpt[key], **TOL, msg=f"{shape} {name} {key}")
            done += 1
        finally:
            grid.close()
    return done


def grids_of(world: int) -> list[tuple[int, int, int, int]]:
    return [g for g in product(range(1, world + 1), repeat=4) if g[0] * g[1] * g[2] * g[3] == world]


def test_every_grid_of_world_4() -> None:
    shapes = grids_of(4)
    assert run_distributed(4, _worker, shapes) == [len(shapes)] * 4


@pytest.mark.slow
def test_sample_of_world_8() -> None:
    shapes = [(2, 2, 2, 1), (1, 2, 2, 2), (2, 1, 2, 2)]
    assert run_distributed(8, _worker, shapes) == [len(shapes)] * 8


def test_goldfish_train_option_gives_the_same_losses_and_is_recorded(tmp_path) -> None:
    import json

    from goldfish.app.cli import main

    records = [
        {"id": f"doc{i}", "text": " ".join(f"word{(i * 7 + j) % 53} token{j % 11}" for j in range(80))}
        for i in range(4)
    ]
    data_file = tmp_path / "docs.jsonl"
    data_file.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    common = tiny_run(
        data=data_file, id_field="id", n_heldout=0, seq_len=32, vocab_size=300, epochs=2, strategy="hashed", k=3
    )
    plain, checkpointed = tmp_path / "plain", tmp_path / "ckpt"
    assert main(["train", "--out", str(plain), *common]) == 0
    assert main(["train", "--out", str(checkpointed), "--activation-checkpointing", *common]) == 0
    metrics = [
        [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (plain, checkpointed)
    ]
    for key in ("loss", "all_loss", "dropped_loss", "grad_norm"):
        assert [m[key] for m in metrics[0]] == [m[key] for m in metrics[1]], key
    record = json.loads((checkpointed / "checkpoint" / "goldfish_run.json").read_text())
    assert record["train"]["activation_checkpointing"] is True
