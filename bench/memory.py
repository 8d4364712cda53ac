"""Per-rank memory of the sharded layers: parameters, gradients and AdamW state, measured against the serial model.

    python bench/memory.py            # world size 4 (gloo, CPU): every grid of 4 ranks

For each grid, every rank builds the same Llama, parallelizes it, runs one training step (so gradients and AdamW
state exist) and counts the bytes its sharded Linear layers hold. The serial model's Linear layers are the
reference; the expected ratio is 1/(X*Y*Z) for weights (biases are split over fewer axes, so a model with biases
sits slightly above it). Unsharded parameters (embeddings, norms, lm_head) are reported separately.
"""

from __future__ import annotations

import argparse
import itertools
import os
import socket

import torch
import torch.multiprocessing as mp
from transformers import LlamaConfig, LlamaForCausalLM

import engine
from engine.linear import ParallelLinear


def _config() -> LlamaConfig:
    return LlamaConfig(vocab_size=2048, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                       num_key_value_heads=4, intermediate_size=768, max_position_embeddings=128)


def _state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, sharded: bool) -> dict[str, int]:
    """Bytes of parameters, gradients and AdamW moments of the Linear layers inside decoder blocks (sharded=True)
    or of every other parameter (sharded=False)."""
    linear_params = {id(p) for name, m in model.named_modules() if "layers." in name
                     and isinstance(m, torch.nn.Linear) for p in m.parameters(recurse=False)}
    totals = {"params": 0, "grads": 0, "adam": 0}
    for p in model.parameters():
        if (id(p) in linear_params) != sharded:
            continue
        totals["params"] += p.numel() * p.element_size()
        totals["grads"] += p.grad.numel() * p.grad.element_size() if p.grad is not None else 0
        state = optimizer.state.get(p, {})
        totals["adam"] += sum(t.numel() * t.element_size() for k, t in state.items() if k in ("exp_avg", "exp_avg_sq"))
    return totals


def _one_step(model: torch.nn.Module, rows: torch.Tensor, grid) -> torch.optim.Optimizer:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = model(input_ids=rows, labels=rows).loss
    loss.backward()
    if grid is not None:
        engine.sync_gradients(model, grid)
    optimizer.step()
    return optimizer


def _worker(rank: int, world: int, port: int, grids: list[tuple[int, int, int, int]], queue) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      LOCAL_RANK=str(rank))
    for data, x, y, z in grids:
        grid = engine.init(data=data, x=x, y=y, z=z)
        torch.manual_seed(0)
        model = engine.parallelize(LlamaForCausalLM(_config()), grid)
        rows = torch.randint(0, 2048, (2, 64), generator=torch.Generator().manual_seed(rank))
        optimizer = _one_step(model, rows, grid)
        assert any(isinstance(m, ParallelLinear) for m in model.modules())
        queue.put(((data, x, y, z), rank, _state_bytes(model, optimizer, True), _state_bytes(model, optimizer, False)))
        grid.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    args = parser.parse_args()
    world = args.world
    grids = [g for g in itertools.product(*[range(1, world + 1)] * 4) if g[0] * g[1] * g[2] * g[3] == world
             and g[1] * g[2] * g[3] > 1]

    torch.manual_seed(0)
    serial = LlamaForCausalLM(_config())
    serial_opt = _one_step(serial, torch.randint(0, 2048, (2, 64)), None)
    reference = _state_bytes(serial, serial_opt, True)
    unsharded = _state_bytes(serial, serial_opt, False)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.Queue()
    procs = [context.Process(target=_worker, args=(r, world, port, grids, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[tuple, list] = {}
    for _ in range(world * len(grids)):
        grid, rank, sharded, rest = queue.get(timeout=900)
        results.setdefault(grid, []).append((rank, sharded, rest))
    for p in procs:
        p.join()

    mib = 1 / 2**20
    print(f"serial decoder Linear layers: params {reference['params'] * mib:.2f} MiB, grads "
          f"{reference['grads'] * mib:.2f} MiB, AdamW {reference['adam'] * mib:.2f} MiB; unsharded rest (embeddings, "
          f"norms, lm_head): params {unsharded['params'] * mib:.2f} MiB")
    print(f"{'grid (data,x,y,z)':<20} {'1/(XYZ)':>8} {'params':>8} {'grads':>8} {'AdamW':>8}   (max over ranks / serial)")
    for grid in grids:
        tp = grid[1] * grid[2] * grid[3]
        ratios = {key: max(s[key] for _, s, _ in results[grid]) / reference[key] for key in ("params", "grads", "adam")}
        print(f"{str(grid):<20} {1 / tp:>8.4f} {ratios['params']:>8.4f} {ratios['grads']:>8.4f} {ratios['adam']:>8.4f}")


if __name__ == "__main__":
    main()
