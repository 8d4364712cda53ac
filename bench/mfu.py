"""Benchmark: tokens/s and model-FLOPs utilisation (MFU) of a Llama training step through the engine
(grid 1x1x1x1) against a plain PyTorch loop on the same model.

Usage:
    python bench/mfu.py                          # tiny Llama on CPU (seconds; keeps the code path alive)
    python bench/mfu.py --size 1b --steps 20     # ~1.2B Llama (Llama-3.2-1B shape) on one GPU
    python bench/mfu.py --out bench/results/mfu_cpu.json

One step = forward, cross-entropy, backward, gradient sync and clipping (engine.sync_gradients and
engine.clip_grad_norm_ on the engine path; torch.nn.utils.clip_grad_norm_ on the plain one), AdamW step.
Precision "autocast" (default) keeps fp32 weights and runs matmuls in bf16 under torch.autocast, as
`goldfish train --precision bf16` does; "bf16" holds the weights in bf16. The two paths alternate in
rounds (so drift of a shared machine hits both) and the median step counts.

MFU = model FLOPs per token (engine.planner.cost_model.model_flops_per_token: 6 x matmul weights + 12 x layers x
seq x hidden for attention, no causal discount, the PaLM convention) x tokens/s / peak. Peak: --peak-tflops,
or the dense bf16 peak of a known GPU (A100 312, H100/H200/GH200 989, MI250X GCD 191.5 Tflop/s), or on CPU
and unknown GPUs the measured rate of a large bf16 GEMM (so CPU MFU is relative to what this CPU's GEMM
reaches, not to a datasheet).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from typing import Callable

import common
import torch

import engine
from engine.planner.cost_model import model_flops_per_token

SIZES = {
    "tiny": dict(
        hidden=256,
        layers=4,
        heads=8,
        kv_heads=8,
        intermediate=688,
        vocab=2048,
        tie_word_embeddings=False,
        seq=128,
        batch=2,
    ),
    # the shape of meta-llama/Llama-3.2-1B (config.json): 1.24B parameters with tied embeddings
    "1b": dict(
        hidden=2048,
        layers=16,
        heads=32,
        kv_heads=8,
        intermediate=8192,
        vocab=128256,
        tie_word_embeddings=True,
        seq=2048,
        batch=4,
    ),
}
GPU_PEAK_TFLOPS = {"A100": 312.0, "H100": 989.0, "H200": 989.0, "GH200": 989.0, "MI250X": 191.5}


def gemm_tflops(device: torch.device, dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b

    def products() -> None:
        for _ in range(repeats):
            a @ b

    _, seconds = common.timed(products, device)
    return 2 * n**3 * repeats / seconds / 1e12


def peak_tflops(device: torch.device, given: float | None) -> tuple[float, str]:
    if given:
        return given, "given"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, value in GPU_PEAK_TFLOPS.items():
            if key in name:
                return value, f"datasheet dense bf16 of {name}"
    n = 4096 if device.type == "cuda" else 1024
    return gemm_tflops(device, torch.bfloat16, n), f"measured bf16 GEMM {n}^3 on {device.type}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    common.add_options(
        parser,
        help={"seq": "tokens per sequence (default: per size)", "steps": "timed steps per path and round"},
        seq=None,
    )
    parser.add_argument("--batch", type=int, default=None, help="sequences per step (default: per size)")
    parser.add_argument("--precision", choices=["autocast", "bf16", "fp32"], default="autocast")
    common.add_options(parser, steps=4, rounds=2, warmup=2)
    parser.add_argument("--peak-tflops", type=float, default=None)
    common.add_options(
        parser,
        help={"device": "torch device (default: cuda if available, else cpu)"},
        threads=None,
        device=None,
        out=None,
    )
    args = common.parse(parser)

    size = dict(SIZES[args.size])
    default_seq, default_batch = size.pop("seq"), size.pop("batch")
    seq, batch = args.seq or default_seq, args.batch or default_batch
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    plain = common.build_llama(**size, seq=seq, attn_implementation="sdpa").to(device=device, dtype=dtype)
    shape = engine.planner_shape(plain.config, name=f"Llama {args.size}")
    grid = engine.init(backend="nccl" if device.type == "cuda" else "gloo")
    ids = torch.randint(0, plain.config.vocab_size, (batch, seq), device=device)
    steps = {
        "engine": make_step(engine.parallelize(copy.deepcopy(plain), grid), ids, args.precision, grid),
        "plain": make_step(plain, ids, args.precision, None),
    }
    first = {name: step() for name, step in steps.items()}  # same weights, same batch: the same first loss
    times = alternate(steps, device, args)
    peak, peak_source = peak_tflops(device, args.peak_tflops)
    rows = {
        name: figures(values, batch * seq, model_flops_per_token(shape, seq), peak, first[name])
        for name, values in times.items()
    }
    ratio = rows["engine"]["step_s"] / rows["plain"]["step_s"]
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x {torch.get_num_threads()}"
    print(
        f"{shape.name}: {shape.n_params / 1e6:.1f}M parameters, batch {batch} x {seq}, {args.precision}, "
        f"{device_name}; peak {peak:.3g} Tflop/s ({peak_source})"
    )
    print(f"{'path':>8} {'step s':>10} {'tokens/s':>12} {'MFU':>7} {'first loss':>11}")
    for name, r in rows.items():
        print(f"{name:>8} {r['step_s']:>10.4f} {r['tokens_per_s']:>12.1f} {r['mfu']:>7.1%} {r['first_loss']:>11.5f}")
    print(f"engine / plain step time: {ratio:.3f}")
    if args.out:
        common.write_result(
            args.out,
            {
                "device": device_name,
                "model": shape.name,
                "n_params": shape.n_params,
                "batch": batch,
                "seq": seq,
                "precision": args.precision,
                "peak_tflops": peak,
                "peak_source": peak_source,
                "paths": rows,
                "engine_over_plain": ratio,
            },
        )
    grid.close(destroy_world=True)
    return 0


def make_step(
    model: torch.nn.Module, ids: torch.Tensor, precision: str, grid: engine.Grid | None
) -> Callable[[], float]:
    """One AdamW training step of `model` on `ids` per call, returning the loss (autocast precision: bf16
    matmuls over fp32 weights)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return lambda: common.train_step(model, optimizer, ids, grid, autocast=precision == "autocast").item()


def alternate(
    steps: dict[str, Callable[[], float]], device: torch.device, args: argparse.Namespace
) -> dict[str, list[float]]:
    """Warm each path up (the first step already ran), then time `args.steps` steps of each path in turn for
    `args.rounds` rounds. Returns the step seconds by path."""
    for step in steps.values():
        common.repeat_seconds(step, max(0, args.warmup - 1), device)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            times[name] += common.repeat_seconds(step, args.steps, device)
    return times


def figures(
    step_seconds: list[float], tokens_per_step: int, flops_per_token: float, peak_tflops: float, first_loss: float
) -> dict[str, float]:
    """Median step seconds, tokens/s and MFU (model flops per second over the peak) of one path."""
    median = statistics.median(step_seconds)
    tokens_per_s = tokens_per_step / median
    mfu = flops_per_token * tokens_per_s / (peak_tflops * 1e12)
    return {"step_s": median, "tokens_per_s": tokens_per_s, "mfu": mfu, "first_loss": first_loss}


if __name__ == "__main__":
    sys.exit(main())
