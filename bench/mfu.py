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

MFU = model FLOPs per token (engine.cost_model.model_flops_per_token: 6 x matmul weights + 12 x layers x
seq x hidden for attention, no causal discount, the PaLM convention) x tokens/s / peak. Peak: --peak-tflops,
or the dense bf16 peak of a known GPU (A100 312, H100/H200/GH200 989, MI250X GCD 191.5 Tflop/s), or on CPU
and unknown GPUs the measured rate of a large bf16 GEMM (so CPU MFU is relative to what this CPU's GEMM
reaches, not to a datasheet).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import engine
from engine.cost_model import TransformerShape, model_flops_per_token
from engine.parallelize import parallelize
from engine.state import clip_grad_norm_, sync_gradients

SIZES = {
    # hidden, layers, heads, kv heads, intermediate, vocab, tied, seq, batch
    "tiny": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                 intermediate_size=688, vocab_size=2048, tie_word_embeddings=False, seq=128, batch=2),
    # the shape of meta-llama/Llama-3.2-1B (config.json): 1.24B parameters with tied embeddings
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True, seq=2048, batch=4),
}
GPU_PEAK_TFLOPS = {"A100": 312.0, "H100": 989.0, "H200": 989.0, "GH200": 989.0, "MI250X": 191.5}


def gemm_tflops(device: torch.device, dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 2 * n ** 3 * repeats / (time.perf_counter() - start) / 1e12


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


def make_step(model, optimizer, ids: torch.Tensor, precision: str, grid) -> callable:
    vocab = model.config.vocab_size
    autocast = torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16, enabled=precision == "autocast")

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        if grid is not None:
            sync_gradients(model, grid)
            clip_grad_norm_(model, 1.0, grid)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.item()

    return step


def timed(step, device: torch.device, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - start)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: per size)")
    parser.add_argument("--batch", type=int, default=None, help="sequences per step (default: per size)")
    parser.add_argument("--precision", choices=["autocast", "bf16", "fp32"], default="autocast")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per path and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", default=None, help="write the results as JSON")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import LlamaConfig, LlamaForCausalLM

    size = dict(SIZES[args.size])
    default_seq, default_batch = size.pop("seq"), size.pop("batch")
    seq, batch = args.seq or default_seq, args.batch or default_batch
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    config = LlamaConfig(**size, max_position_embeddings=seq, attn_implementation="sdpa")
    shape = TransformerShape.from_hf_config(config, name=f"Llama {args.size}")
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    torch.manual_seed(0)
    plain = LlamaForCausalLM(config).to(device=device, dtype=dtype)
    grid = engine.init(backend="nccl" if device.type == "cuda" else "gloo")
    parallel = parallelize(copy.deepcopy(plain), grid)
    ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)
    steps = {"engine": make_step(parallel, torch.optim.AdamW(parallel.parameters(), lr=1e-4), ids, args.precision,
                                 grid),
             "plain": make_step(plain, torch.optim.AdamW(plain.parameters(), lr=1e-4), ids, args.precision, None)}
    first = {name: step() for name, step in steps.items()}  # same weights, same batch: the same first loss
    for step in steps.values():
        timed(step, device, max(0, args.warmup - 1))
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            times[name] += timed(step, device, args.steps)
    peak, peak_source = peak_tflops(device, args.peak_tflops)
    flops_per_token = model_flops_per_token(shape, seq)
    rows = {}
    for name, values in times.items():
        median = statistics.median(values)
        tokens_per_s = batch * seq / median
        rows[name] = {"step_s": median, "tokens_per_s": tokens_per_s,
                      "mfu": flops_per_token * tokens_per_s / (peak * 1e12), "first_loss": first[name]}
    ratio = rows["engine"]["step_s"] / rows["plain"]["step_s"]
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x {torch.get_num_threads()}"
    print(f"{shape.name}: {shape.n_params / 1e6:.1f}M parameters, batch {batch} x {seq}, {args.precision}, "
          f"{device_name}; peak {peak:.3g} Tflop/s ({peak_source})")
    print(f"{'path':>8} {'step s':>10} {'tokens/s':>12} {'MFU':>7} {'first loss':>11}")
    for name, r in rows.items():
        print(f"{name:>8} {r['step_s']:>10.4f} {r['tokens_per_s']:>12.1f} {r['mfu']:>7.1%} {r['first_loss']:>11.5f}")
    print(f"engine / plain step time: {ratio:.3f}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "device": device_name,
                                              "model": shape.name, "n_params": shape.n_params, "batch": batch,
                                              "seq": seq, "precision": args.precision, "peak_tflops": peak,
                                              "peak_source": peak_source, "paths": rows,
                                              "engine_over_plain": ratio}, indent=1) + "\n")
    grid.close(destroy_world=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
