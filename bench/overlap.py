"""Benchmark: step time of a parallelized Llama with the engine's overlap on and off.

Usage (rank 0 prints; 4 gloo ranks on CPU, or NCCL ranks on GPUs):

    torchrun --nproc-per-node 4 bench/overlap.py --grids 1,1,2,2 1,2,1,2 1,1,1,4 --out bench/results/overlap.json

For each grid (data,x,y,z) the same serial model is parallelized twice, with overlap=True and overlap=False
(engine.parallelize: the weight gather runs behind the weight-gradient product and the weight-gradient
reduce-scatter behind the input-gradient product, in every ParallelLinear's backward). Both copies take the
same steps on the same batch, alternating in rounds so machine drift hits both; the slowest rank's time
counts and the median over steps is reported with the ratio off/on (> 1: overlap pays). The first loss of
both copies must be identical (overlap changes the schedule, not the numbers).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import engine
from engine.parallelize import parallelize
from engine.state import clip_grad_norm_, sync_gradients


def parse_grid(text: str) -> tuple[int, int, int, int]:
    parts = text.split(",")
    if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"a grid is data,x,y,z with positive integers, got {text!r}")
    return tuple(int(p) for p in parts)  # type: ignore[return-value]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grids", type=parse_grid, nargs="+", default=[(1, 1, 2, 2), (1, 2, 1, 2), (1, 1, 1, 4)])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=1376)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rows", type=int, default=2, help="sequences per rank")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per setting and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(1)
    config = LlamaConfig(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.heads, intermediate_size=args.intermediate, vocab_size=args.vocab,
                         max_position_embeddings=args.seq, attn_implementation="sdpa")
    torch.manual_seed(0)
    serial = LlamaForCausalLM(config)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    results = []
    for shape in args.grids:
        data, x, y, z = shape
        if data * x * y * z != world:
            raise SystemExit(f"grid {shape} needs {data * x * y * z} ranks, the world has {world}")
        grid = engine.init(data=data, x=x, y=y, z=z)
        device = grid.device
        ids = torch.randint(0, args.vocab, (args.rows, args.seq), generator=torch.Generator().manual_seed(grid.rank))
        ids = ids.to(device)
        models = {flag: parallelize(copy.deepcopy(serial).to(device), grid, overlap=flag) for flag in (True, False)}
        optimizers = {flag: torch.optim.AdamW(m.parameters(), lr=1e-4) for flag, m in models.items()}

        def step(flag: bool) -> tuple[float, float]:
            model = models[flag]
            dist.barrier()
            start = time.perf_counter()
            logits = model(input_ids=ids).logits
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, args.vocab), ids[:, 1:].reshape(-1))
            loss.backward()
            sync_gradients(model, grid)
            clip_grad_norm_(model, 1.0, grid)
            optimizers[flag].step()
            optimizers[flag].zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            return float(elapsed), float(loss)

        first = {flag: step(flag)[1] for flag in (True, False)}
        if first[True] != first[False]:
            raise SystemExit(f"grid {shape}: overlap changed the first loss ({first[True]} vs {first[False]})")
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for flag in (True, False):
                times[flag] += [step(flag)[0] for _ in range(args.steps)]
        on, off = statistics.median(times[True]), statistics.median(times[False])
        results.append({"grid": dict(zip(("data", "x", "y", "z"), shape)), "overlap_on_s": on, "overlap_off_s": off,
                        "off_over_on": off / on})
        grid.close()
    if dist.get_rank() == 0:
        backend = dist.get_backend()
        print(f"Llama {config.hidden_size}h x {config.num_hidden_layers} layers, {args.rows} x {args.seq} tokens per "
              f"rank, {world} ranks on {backend}")
        print(f"{'grid (data,x,y,z)':>18} {'overlap on s':>13} {'off s':>9} {'off/on':>7}")
        for r in results:
            g = r["grid"]
            print(f"{g['data']:>10},{g['x']},{g['y']},{g['z']:<3} {r['overlap_on_s']:>13.4f} "
                  f"{r['overlap_off_s']:>9.4f} "
                  f"{r['off_over_on']:>7.3f}")
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "backend": backend, "world": world,
                                                  "args": {k: v for k, v in vars(args).items() if k != "grids"},
                                                  "results": results}, indent=1) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
