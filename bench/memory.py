"""Per-rank memory of parameters, gradients and AdamW state for every grid and ZeRO stage, beside the prediction.

    python bench/memory.py --world 4 --json bench/results/memory_world4.json

For each ordered grid of the world size and each ZeRO stage the grid allows (stages 1-3 need data >= 2; at
data >= 4 also stage 3 with a hierarchy of node size 2, and stage 2 and 3 with optimizer offload), every rank
builds the same Llama, parallelizes it, partitions it (engine.zero.shard_data_axis), and runs `--steps`
training steps (forward, backward, sync_gradients, clip_grad_norm_, AdamW step) on gloo. Reported per setting:
the bytes of parameters, gradients and AdamW moments the rank holds between steps (engine.zero.held_bytes, the
largest rank) beside engine.cost_model.zero_held_bytes (must be equal), the bytes sent per step by the
largest sender beside engine.cost_model.llama_step_collectives (must be equal), and the median step time on
gloo (CPU processes sharing the machine's cores: it shows what each stage adds, not GPU speed).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

import engine
from engine.cost_model import TransformerShape, bytes_by_group, llama_step_collectives, ordered_grids, zero_held_bytes
from engine.grid import GridShape
from engine.zero import ZeroConfig, held_bytes, make_adamw, shard_data_axis

ROWS, SEQ = 2, 64  # per rank


def _config() -> LlamaConfig:
    return LlamaConfig(vocab_size=2048, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                       num_key_value_heads=4, intermediate_size=768, max_position_embeddings=128)


def settings(world: int) -> list[tuple[tuple[int, int, int, int], dict]]:
    out = []
    for g in ordered_grids(world):
        dims = (g.data, g.x, g.y, g.z)
        out.append((dims, {"stage": 0}))
        if g.data >= 2:
            out += [(dims, {"stage": s}) for s in (1, 2, 3)]
        if g.data >= 4:
            out += [(dims, {"stage": 3, "node_size": 2}), (dims, {"stage": 2, "offload": True}),
                    (dims, {"stage": 3, "offload": True})]
    return out


def _step(model, optimizer, rows, grid) -> None:
    optimizer.zero_grad(set_to_none=True)
    logits = model(input_ids=rows).logits
    F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1)).backward()
    engine.sync_gradients(model, grid)
    engine.clip_grad_norm_(model, 1.0, grid)
    optimizer.step()


def _worker(rank: int, world: int, port: int, cases: list, steps: int, queue) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      LOCAL_RANK=str(rank))
    for dims, zero_args in cases:
        data, x, y, z = dims
        grid = engine.init(data=data, x=x, y=y, z=z)
        zero = ZeroConfig(**zero_args)
        torch.manual_seed(0)
        model = shard_data_axis(engine.parallelize(LlamaForCausalLM(_config()), grid), grid, zero)
        optimizer = make_adamw(model, [{"params": list(model.parameters())}], lr=1e-3)
        rows = torch.randint(0, 2048, (ROWS, SEQ), generator=torch.Generator().manual_seed(rank))
        times, sent = [], {}
        for i in range(steps + 1):  # the first step builds state (and FSDP's lazy init): not timed
            grid.traffic.reset()
            grid.traffic.enabled = True
            started = time.perf_counter()
            _step(model, optimizer, rows, grid)
            if i:
                times.append(time.perf_counter() - started)
            grid.traffic.enabled = False
            sent = grid.traffic.reset()
        queue.put((dims, zero_args, rank, grid.coord("data"), held_bytes(model, optimizer), sent,
                   statistics.median(times)))
        grid.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, nargs="+", default=[4])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per setting (default: %(default)s)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write every row as JSON")
    args = parser.parse_args()
    shape = TransformerShape.from_hf_config(_config())
    rows_out = []
    for world in args.world:
        cases = settings(world)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        context = mp.get_context("spawn")
        queue = context.Queue()
        procs = [context.Process(target=_worker, args=(r, world, port, cases, args.steps, queue))
                 for r in range(world)]
        for p in procs:
            p.start()
        results: dict[tuple, list] = {}
        for _ in range(world * len(cases)):
            dims, zero_args, rank, data_rank, held, sent, seconds = queue.get(timeout=3600)
            results.setdefault((dims, tuple(sorted(zero_args.items()))), []).append(
                (rank, data_rank, held, sent, seconds))
        for p in procs:
            p.join()
        for dims, zero_args in cases:
            per_rank = results[(dims, tuple(sorted(zero_args.items())))]
            grid, zero = GridShape(*dims), ZeroConfig(**zero_args)
            held = {k: max(r[2][k] for r in per_rank) for k in ("params", "grads", "optimizer")}
            predicted = {k: max(zero_held_bytes(shape, grid, zero, data_rank=r[1])[k] for r in per_rank)
                         for k in held}
            sent = max(sum(r[3].values()) for r in per_rank)
            predicted_sent = max(sum(bytes_by_group(llama_step_collectives(
                shape, grid, rows_per_rank=ROWS, seq=SEQ, param_bytes=4, act_bytes=4, stream_bytes=4,
                zero=zero if zero.stage else None, data_rank=r[1])).values()) for r in per_rank)
            rows_out.append({"world": world, "grid": dict(zip(("data", "x", "y", "z"), dims)), "zero": zero.to_json(),
                             "held_bytes": held, "predicted_held_bytes": predicted, "sent_bytes": sent,
                             "predicted_sent_bytes": predicted_sent,
                             "step_s": statistics.median(r[4] for r in per_rank)})

    serial = zero_held_bytes(shape, GridShape())
    mib = 1 / 2 ** 20
    print(f"serial Llama ({shape.n_params / 1e6:.2f}M parameters): params {serial['params'] * mib:.2f} MiB, grads "
          f"{serial['grads'] * mib:.2f} MiB, AdamW {serial['optimizer'] * mib:.2f} MiB; per rank below: largest rank, "
          "MiB held between steps (= predicted?), MiB sent per step (= predicted?), median step seconds on gloo")
    print(f"{'world':>5} {'grid (data,x,y,z)':<18} {'zero':<14} {'params':>8} {'grads':>8} {'AdamW':>8} {'=pred':>5} "
          f"{'sent':>8} {'=pred':>5} {'step s':>7}")
    for row in rows_out:
        z = row["zero"]
        label = f"{z['stage']}" + (f" node {z['node_size']}" if z["node_size"] > 1 else "") + \
            (" offload" if z["offload"] else "")
        held = row["held_bytes"]
        print(f"{row['world']:>5} {str(tuple(row['grid'].values())):<18} {label:<14} {held['params'] * mib:>8.2f} "
              f"{held['grads'] * mib:>8.2f} {held['optimizer'] * mib:>8.2f} "
              f"{'yes' if held == row['predicted_held_bytes'] else 'NO':>5} {row['sent_bytes'] * mib:>8.2f} "
              f"{'yes' if row['sent_bytes'] == row['predicted_sent_bytes'] else 'NO':>5} {row['step_s']:>7.3f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"model": shape.__dict__, "rows_per_rank": ROWS, "seq": SEQ,
                                               "rows": rows_out}, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
