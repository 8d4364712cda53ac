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
import os
import statistics
import sys

import common
import torch
import torch.distributed as dist

import engine


def parse_grid(text: str) -> tuple[int, int, int, int]:
    parts = text.split(",")
    if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"a grid is data,x,y,z with positive integers, got {text!r}")
    return tuple(int(p) for p in parts)  # type: ignore[return-value]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grids", type=parse_grid, nargs="+", default=[(1, 1, 2, 2), (1, 2, 1, 2), (1, 1, 1, 4)])
    common.add_options(parser, hidden=512, layers=4, heads=8, intermediate=1376, vocab=2048, seq=128)
    parser.add_argument("--rows", type=int, default=2, help="sequences per rank")
    common.add_options(parser, help={"steps": "timed steps per setting and round"}, steps=4, rounds=3, out=None)
    args = common.parse(parser)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for shape in args.grids:
        if shape[0] * shape[1] * shape[2] * shape[3] != world:
            raise SystemExit(
                f"grid {shape} needs {shape[0] * shape[1] * shape[2] * shape[3]} ranks, the world has {world}"
            )
    if not torch.cuda.is_available():
        torch.set_num_threads(1)

    serial = common.build_llama(**common.model_shape(args), attn_implementation="sdpa")
    results = [compare_overlap(serial, shape, args) for shape in args.grids]
    if dist.get_rank() == 0:
        backend = dist.get_backend()
        print(
            f"Llama {serial.config.hidden_size}h x {serial.config.num_hidden_layers} layers, {args.rows} x "
            f"{args.seq} tokens per rank, {world} ranks on {backend}"
        )
        print(f"{'grid (data,x,y,z)':>18} {'overlap on s':>13} {'off s':>9} {'off/on':>7}")
        for r in results:
            g = r["grid"]
            print(
                f"{g['data']:>10},{g['x']},{g['y']},{g['z']:<3} {r['overlap_on_s']:>13.4f} "
                f"{r['overlap_off_s']:>9.4f} "
                f"{r['off_over_on']:>7.3f}"
            )
        if args.out:
            common.write_result(
                args.out,
                {
                    "backend": backend,
                    "world": world,
                    "args": {k: v for k, v in vars(args).items() if k != "grids"},
                    "results": results,
                },
            )
    dist.destroy_process_group()
    return 0


def compare_overlap(serial: torch.nn.Module, shape: tuple[int, int, int, int], args: argparse.Namespace) -> dict:
    """Median step seconds (slowest rank) of `serial` parallelized on `shape` with overlap on and off."""
    grid = engine.init(**dict(zip(("data", "x", "y", "z"), shape)))
    device = grid.device
    ids = torch.randint(0, args.vocab, (args.rows, args.seq), generator=torch.Generator().manual_seed(grid.rank))
    ids = ids.to(device)
    models = {flag: engine.parallelize(copy.deepcopy(serial).to(device), grid, overlap=flag) for flag in (True, False)}
    optimizers = {flag: torch.optim.AdamW(m.parameters(), lr=1e-4) for flag, m in models.items()}

    def step(flag: bool) -> tuple[torch.Tensor, float]:
        return common.slowest_rank_seconds(lambda: common.train_step(models[flag], optimizers[flag], ids, grid), device)

    first = {flag: float(step(flag)[0]) for flag in (True, False)}
    if first[True] != first[False]:
        raise SystemExit(f"grid {shape}: overlap changed the first loss ({first[True]} vs {first[False]})")
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):
        for flag in (True, False):
            times[flag] += [step(flag)[1] for _ in range(args.steps)]
    grid.close()
    on, off = statistics.median(times[True]), statistics.median(times[False])
    return {
        "grid": dict(zip(("data", "x", "y", "z"), shape)),
        "overlap_on_s": on,
        "overlap_off_s": off,
        "off_over_on": off / on,
    }


if __name__ == "__main__":
    sys.exit(main())
