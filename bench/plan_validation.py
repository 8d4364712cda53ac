"""Validate the planner: run every grid of a small Llama at one world size and compare measured step times
with the predicted ones (the AxoNN paper's validation, at a scale that runs on a laptop).

Usage (4 gloo ranks on CPU; rank 0 prints the table and writes the JSON):

    torchrun --nproc-per-node 4 bench/plan_validation.py --out bench/results/plan_validation.json

Steps: (1) profile this machine with engine.measure (every collective kind for every group size and
placement of the world, plus the GEMM rate with all ranks busy); (2) for each ordered grid, parallelize the
same serial model and time training steps (forward, backward, sync_gradients, clip_grad_norm_, AdamW),
`--iters` iterations of which the first two are dropped (the seed documents time ten and average the last
eight), over `--rounds` interleaved rounds; the slowest rank counts; (3) predict each grid's step time with
engine.plan.step_prediction on the measured profile (compute efficiency 1 against the measured GEMM rate,
memory-bound work at the measured copy rate); (4) report Spearman's and Kendall's rank correlation between
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
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import engine
from engine.cost_model import TransformerShape, ordered_grids
from engine.measure import measure_profile
from engine.parallelize import parallelize
from engine.plan import PlanRequest, step_prediction
from engine.profiles import PROFILES, MachineProfile
from engine.state import clip_grad_norm_, sync_gradients


def average_ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    """Pearson correlation of the average ranks."""
    ra, rb = average_ranks(a), average_ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    norm = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / norm if norm else float("nan")


def kendall(a: list[float], b: list[float]) -> float:
    """Kendall's tau-a: (concordant - discordant) pairs over all pairs."""
    n, score = len(a), 0
    for i in range(n):
        for j in range(i + 1, n):
            s = (a[i] - a[j]) * (b[i] - b[j])
            score += (s > 0) - (s < 0)
    return score / (n * (n - 1) / 2)


def build_config(args: argparse.Namespace):
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=args.hidden, num_attention_heads=args.heads, num_key_value_heads=args.heads,
                       num_hidden_layers=args.layers, intermediate_size=args.intermediate, vocab_size=args.vocab,
                       max_position_embeddings=args.seq, attn_implementation="sdpa")


def time_grid(serial, shape: tuple[int, int, int, int], args: argparse.Namespace) -> list[float]:
    """Per-iteration step seconds (slowest rank) of the model parallelized on `shape`."""
    data, x, y, z = shape
    grid = engine.init(data=data, x=x, y=y, z=z)
    try:
        model = parallelize(copy.deepcopy(serial), grid)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(grid.rank)
        ids = torch.randint(0, args.vocab, (args.rows, args.seq), generator=gen)
        times = []
        for _ in range(args.iters):
            dist.barrier()
            start = time.perf_counter()
            logits = model(input_ids=ids).logits
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, args.vocab), ids[:, 1:].reshape(-1))
            loss.backward()
            sync_gradients(model, grid)
            clip_grad_norm_(model, 1.0, grid)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            times.append(float(elapsed))
        return times
    finally:
        grid.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=688)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rows", type=int, default=2, help="sequences per rank per step")
    parser.add_argument("--iters", type=int, default=10, help="iterations per grid and round; the first 2 are dropped")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved passes over all grids")
    parser.add_argument("--profile", default=None, help="a measured profile JSON to reuse instead of measuring")
    parser.add_argument("--out", default=None, help="write the table and correlations as JSON")
    args = parser.parse_args()
    if args.iters < 3:
        parser.error("--iters must be >= 3 (the first two are dropped)")
    torch.set_num_threads(1)
    grid0 = engine.init(data=int(os.environ.get("WORLD_SIZE", "1")))
    world, rank = grid0.world_size, grid0.rank
    grid0.close()

    if args.profile:
        profile = MachineProfile.from_json(json.loads(Path(args.profile).read_text()))
    else:
        measured = measure_profile(PROFILES["perlmutter"], small_bytes=1 << 10, large_bytes=1 << 22, iters=20,
                                   gemm_size=args.hidden)
        box = [measured.to_json() if measured is not None else None]
        dist.broadcast_object_list(box, src=0)
        profile = MachineProfile.from_json(box[0])

    from transformers import LlamaForCausalLM
    config = build_config(args)
    torch.manual_seed(0)
    serial = LlamaForCausalLM(config)
    shapes = [(g.data, g.x, g.y, g.z) for g in ordered_grids(world)]
    measured_times: dict[tuple, list[float]] = {s: [] for s in shapes}
    for _ in range(args.rounds):
        for s in shapes:
            measured_times[s] += time_grid(serial, s, args)[2:]
    if rank == 0:
        model_shape = TransformerShape.from_hf_config(config)
        request = PlanRequest(shape=model_shape, gpus=world, global_batch=world * args.rows, seq=args.seq,
                              profile=profile, compute_efficiency=1.0, precision="fp32", checkpointing="off")
        rows = []
        for s in shapes:
            plan = step_prediction(request, engine.GridShape(*s), grad_accum=1)
            rows.append({"grid": dict(zip(("data", "x", "y", "z"), s)), "predicted_s": plan.step_s,
                         "predicted_compute_s": plan.compute_s, "predicted_memory_s": plan.memory_s,
                         "predicted_comm_s": plan.comm_s,
                         "measured_s": statistics.fmean(measured_times[s]),
                         "measured_stdev_s": statistics.stdev(measured_times[s]) if len(measured_times[s]) > 1
                         else 0.0})
        predicted = [r["predicted_s"] for r in rows]
        actual = [r["measured_s"] for r in rows]
        p_rank, m_rank = average_ranks(predicted), average_ranks(actual)
        print(f"{world} ranks, Llama {model_shape.n_params / 1e6:.1f}M parameters, {args.rows} x {args.seq} tokens "
              f"per rank; profile: GEMM {profile.peak_tflops * 1e3:.1f} Gflop/s and copy "
              f"{profile.memory_gbps:.1f} GB/s "
              f"per rank, {len(profile.measured)} measured collectives")
        print(f"{'grid (data,x,y,z)':>18} {'predicted s':>12} {'compute':>8} {'memory':>8} {'comm':>8} "
              f"{'measured s':>11} {'+-':>7} {'pred rank':>9} {'meas rank':>9}")
        for r, pr, mr in sorted(zip(rows, p_rank, m_rank), key=lambda t: t[1]):
            g = r["grid"]
            print(f"{g['data']:>8},{g['x']},{g['y']},{g['z']:<3}     {r['predicted_s']:>12.4f} "
                  f"{r['predicted_compute_s']:>8.4f} {r['predicted_memory_s']:>8.4f} {r['predicted_comm_s']:>8.4f} "
                  f"{r['measured_s']:>11.4f} {r['measured_stdev_s']:>7.4f} {pr:>9.1f} {mr:>9.1f}")
        rho, tau = spearman(predicted, actual), kendall(predicted, actual)
        no_memory = [r["predicted_s"] - r["predicted_memory_s"] for r in rows]
        rho_nm, tau_nm = spearman(no_memory, actual), kendall(no_memory, actual)
        comm_only = [r["predicted_comm_s"] for r in rows]
        rho_c, tau_c = spearman(comm_only, actual), kendall(comm_only, actual)
        print(f"Spearman rank correlation {rho:.3f}, Kendall tau {tau:.3f} over {len(rows)} grids "
              f"(without the memory-bound term: {rho_nm:.3f} / {tau_nm:.3f}; communication alone: "
              f"{rho_c:.3f} / {tau_c:.3f})")
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "args": vars(args),
                                                  "spearman": rho, "kendall": tau,
                                                  "without_memory_term": {"spearman": rho_nm, "kendall": tau_nm},
                                                  "communication_only": {"spearman": rho_c, "kendall": tau_c},
                                                  "grids": rows,
                                                  "profile": profile.to_json()}, indent=1) + "\n")
            print(f"wrote {args.out}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
