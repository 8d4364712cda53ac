"""Validate the planner: run every grid of a small Llama at one world size and compare measured step times
with the predicted ones (the AxoNN paper's validation, at a scale that runs on a laptop).

Usage (4 gloo ranks on CPU; rank 0 prints the table and writes the JSON):

    torchrun --nproc-per-node 4 bench/plan_validation.py --out bench/results/plan_validation.json

Steps: (1) profile this machine with engine.planner.measure (every collective kind for every group size and
placement of the world, plus the GEMM rate with all ranks busy); (2) for each ordered grid, parallelize the
same serial model and time training steps (forward, backward, sync_gradients, clip_grad_norm_, AdamW),
`--iters` iterations of which the first two are dropped (the seed documents time ten and average the last
eight), over `--rounds` interleaved rounds; the slowest rank counts; (3) predict each grid's step time with
engine.planner.plan.step_prediction on the measured profile (compute efficiency 1 against the measured GEMM rate,
memory-bound work at the measured copy rate); (4) report Spearman's and Kendall's (tau-b) rank correlation between
predicted and measured order, also for the prediction without its memory-bound term and for
communication alone (the AxoNN paper's model).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
from pathlib import Path

import common
import torch
import torch.distributed as dist
from scipy.stats import kendalltau, rankdata, spearmanr

import engine
from engine.planner.cost_model import ordered_grids
from engine.planner.measure import measure_profile
from engine.planner.plan import PlanRequest, step_prediction
from engine.planner.profiles import PROFILES, MachineProfile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_options(parser, hidden=256, layers=4, heads=8, intermediate=688, vocab=2048, seq=128)
    parser.add_argument("--rows", type=int, default=2, help="sequences per rank per step")
    parser.add_argument("--iters", type=int, default=10, help="iterations per grid and round; the first 2 are dropped")
    common.add_options(parser, help={"rounds": "interleaved passes over all grids"}, rounds=2)
    parser.add_argument("--profile", default=None, help="a measured profile JSON to reuse instead of measuring")
    common.add_options(parser, help={"out": "write the table and correlations as JSON"}, out=None)
    args = common.parse(parser)
    if args.iters < 3:
        parser.error("--iters must be >= 3 (the first two are dropped)")
    torch.set_num_threads(1)
    grid0 = engine.init(data=int(os.environ.get("WORLD_SIZE", "1")))
    world, rank = grid0.world_size, grid0.rank
    grid0.close()

    profile = load_or_measure_profile(args.profile, args.hidden)
    serial = common.build_llama(**common.model_shape(args), attn_implementation="sdpa")
    shapes = [(g.data, g.x, g.y, g.z) for g in ordered_grids(world)]
    measured_times: dict[tuple, list[float]] = {s: [] for s in shapes}
    for _ in range(args.rounds):
        for s in shapes:
            measured_times[s] += time_grid(serial, s, args)[2:]
    if rank == 0:
        model_shape = engine.planner_shape(serial.config)
        request = PlanRequest(
            shape=model_shape,
            gpus=world,
            global_batch=world * args.rows,
            seq=args.seq,
            profile=profile,
            compute_efficiency=1.0,
            precision="fp32",
            checkpointing="off",
        )
        rows = [grid_row(request, s, measured_times[s]) for s in shapes]
        print(
            f"{world} ranks, Llama {model_shape.n_params / 1e6:.1f}M parameters, {args.rows} x {args.seq} tokens "
            f"per rank; profile: GEMM {profile.peak_tflops * 1e3:.1f} Gflop/s and copy "
            f"{profile.memory_gbps:.1f} GB/s "
            f"per rank, {len(profile.measured)} measured collectives"
        )
        print_table(rows)
        correlations = rank_correlations(rows)
        print_correlations(correlations, len(rows))
        if args.out:
            common.write_result(
                args.out, {"args": vars(args), **correlations, "grids": rows, "profile": profile.to_json()}
            )
            print(f"wrote {args.out}")
    dist.destroy_process_group()
    return 0


def load_or_measure_profile(path: str | None, gemm_size: int) -> MachineProfile:
    """The profile JSON at `path`, or this machine's, measured by all ranks and broadcast from rank 0."""
    if path:
        return MachineProfile.from_json(json.loads(Path(path).read_text()))
    measured = measure_profile(
        PROFILES["perlmutter"], small_bytes=1 << 10, large_bytes=1 << 22, iters=20, gemm_size=gemm_size
    )
    box = [measured.to_json() if measured is not None else None]
    dist.broadcast_object_list(box, src=0)
    return MachineProfile.from_json(box[0])


def time_grid(serial, shape: tuple[int, int, int, int], args: argparse.Namespace) -> list[float]:
    """Per-iteration step seconds (slowest rank) of the model parallelized on `shape`."""
    data, x, y, z = shape
    grid = engine.init(data=data, x=x, y=y, z=z)
    try:
        model = engine.parallelize(copy.deepcopy(serial), grid)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(grid.rank)
        ids = torch.randint(0, args.vocab, (args.rows, args.seq), generator=gen)
        return [
            common.slowest_rank_seconds(lambda: common.train_step(model, optimizer, ids, grid))[1]
            for _ in range(args.iters)
        ]
    finally:
        grid.close()


def grid_row(request: PlanRequest, shape: tuple[int, int, int, int], measured: list[float]) -> dict:
    """The planner's predicted step time of `shape` (and its parts) beside the measured one."""
    plan = step_prediction(request, engine.GridShape(*shape), grad_accum=1)
    return {
        "grid": dict(zip(("data", "x", "y", "z"), shape)),
        "predicted_s": plan.step_s,
        "predicted_compute_s": plan.compute_s,
        "predicted_memory_s": plan.memory_s,
        "predicted_comm_s": plan.comm_s,
        "measured_s": statistics.fmean(measured),
        "measured_stdev_s": statistics.stdev(measured) if len(measured) > 1 else 0.0,
    }


def print_table(rows: list[dict]) -> None:
    """The grids in predicted order, with both ranks (1-based; ties share their average rank)."""
    p_rank, m_rank = rankdata([r["predicted_s"] for r in rows]), rankdata([r["measured_s"] for r in rows])
    print(
        f"{'grid (data,x,y,z)':>18} {'predicted s':>12} {'compute':>8} {'memory':>8} {'comm':>8} "
        f"{'measured s':>11} {'+-':>7} {'pred rank':>9} {'meas rank':>9}"
    )
    for r, pr, mr in sorted(zip(rows, p_rank, m_rank), key=lambda t: t[1]):
        g = r["grid"]
        print(
            f"{g['data']:>8},{g['x']},{g['y']},{g['z']:<3}     {r['predicted_s']:>12.4f} "
            f"{r['predicted_compute_s']:>8.4f} {r['predicted_memory_s']:>8.4f} {r['predicted_comm_s']:>8.4f} "
            f"{r['measured_s']:>11.4f} {r['measured_stdev_s']:>7.4f} {pr:>9.1f} {mr:>9.1f}"
        )


def print_correlations(correlations: dict, n_grids: int) -> None:
    no_memory, comm = correlations["without_memory_term"], correlations["communication_only"]
    print(
        f"Spearman rank correlation {correlations['spearman']:.3f}, Kendall tau {correlations['kendall']:.3f} "
        f"over {n_grids} grids (without the memory-bound term: {no_memory['spearman']:.3f} / "
        f"{no_memory['kendall']:.3f}; communication alone: {comm['spearman']:.3f} / {comm['kendall']:.3f})"
    )


def rank_correlations(rows: list[dict]) -> dict:
    """Spearman's rho and Kendall's tau (tau-b: with no ties, the plain (concordant - discordant) / pairs) between
    measured step times and the prediction, the prediction without its memory-bound term, and communication alone."""
    measured = [r["measured_s"] for r in rows]

    def both(predicted: list[float]) -> dict[str, float]:
        return {
            "spearman": float(spearmanr(predicted, measured).statistic),
            "kendall": float(kendalltau(predicted, measured).statistic),
        }

    return {
        **both([r["predicted_s"] for r in rows]),
        "without_memory_term": both([r["predicted_s"] - r["predicted_memory_s"] for r in rows]),
        "communication_only": both([r["predicted_comm_s"] for r in rows]),
    }


if __name__ == "__main__":
    sys.exit(main())
