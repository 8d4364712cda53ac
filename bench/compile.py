"""Benchmark: `--compile` (regional torch.compile of each decoder layer) against eager, step time side by side.

Usage:
    python bench/compile.py                                   # tiny Llama on CPU (about a minute, most of it compiling)
    python bench/compile.py --size tinyllama --precision bf16 # TinyLlama-1.1B's shape on one GPU
    python bench/compile.py --out bench/results/compile_cpu.json

Both contenders run the step `goldfish train` runs: engine.training.train (grid 1) with the goldfish loss
(goldfish.app.training_rows.make_step_loss: hashed mask, k=4, h=13, the chunked per-token loss from the hidden states),
AdamW, clipping; one with TrainConfig(compile=True). They alternate for --rounds rounds of --steps steps each (a
train() call per round and contender, continuing the same model), so drift of a shared machine hits both; a step's
time is the training loop's own (metrics' tokens_per_s, turned back into seconds). The first compiled round's first
step pays the compilation (dynamo tracing, inductor's code generation and C++ or Triton compilation of one layer; the
other layers reuse its graph): "compile_s" is that step's time minus the eager first step's. Inductor keeps compiled
kernels in a cache on disk (TORCHINDUCTOR_CACHE_DIR, default /tmp/torchinductor_$USER), so a second run of this
script compiles faster: "compile_s" says what the run at hand paid. The first losses of both contenders are printed:
the same weights and rows, equal within float32 reassociation (tests/unit/test_compile.py).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from typing import Any

import common
import torch

from data.batch import Row
from engine.training.train import TrainConfig, train
from goldfish.app.config import MaskSpec
from goldfish.app.training_rows import make_step_loss
from goldfish.masks import drop_mask

SIZES = {
    "tiny": dict(hidden=256, layers=4, heads=8, kv_heads=4, intermediate=688, vocab=2048, seq=128, batch=4),
    # TinyLlama-1.1B (the goldfish paper's model)
    "tinyllama": dict(hidden=2048, layers=22, heads=32, kv_heads=4, intermediate=5632, vocab=32000, seq=2048, batch=4),
}
MASK = MaskSpec(strategy="hashed", k=4, h=13)


def examples_of(vocab: int, seq: int, n: int, seed: int = 0) -> list[Row]:
    """`n` random rows of `seq` tokens in the form goldfish train's rows take: input_ids, targets (next ids, -100
    last) and the hashed goldfish mask over the targets (each (seq,))."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        ids = torch.randint(0, vocab, (seq,), generator=generator)
        targets = torch.cat([ids[1:], torch.tensor([-100])])
        rows.append(Row(input_ids=ids, targets=targets, dropped=drop_mask(targets[None], "hashed", 4, 13)[0]))
    return rows


def run_round(model: torch.nn.Module, rows: list[Row], config: TrainConfig) -> tuple[list[float], float]:
    """config.max_steps training steps of `model` through the engine's loop; (seconds of each step, first loss)."""
    history = train(model, rows, make_step_loss(MASK, []), config).history
    tokens = config.batch_size * rows[0].input_ids.numel()
    return [tokens / record["tokens_per_s"] for record in history], history[0]["loss"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast, fp32 weights")
    common.add_options(parser, steps=5, rounds=3, threads=None, device=None, out=None)
    args = common.parse(parser, argv)
    size = dict(SIZES[args.size])
    seq, batch, vocab = size.pop("seq"), size.pop("batch"), size["vocab"]
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    eager = common.build_llama(**size, seq=seq, attn_implementation="sdpa", tie_word_embeddings=False).to(device)
    models = {"eager": eager, "compiled": copy.deepcopy(eager)}
    rows = examples_of(vocab, seq, batch * args.steps)
    configs = {
        name: TrainConfig(
            epochs=1,
            batch_size=batch,
            max_steps=args.steps,
            lr=1e-4,
            precision=args.precision,
            progress=False,
            shuffle=False,
            compile=name == "compiled",
        )
        for name in models
    }
    times: dict[str, list[float]] = {name: [] for name in models}
    first_step: dict[str, float] = {}
    first_loss: dict[str, float] = {}
    for round_index in range(args.rounds):
        for name, model in models.items():
            seconds, loss = run_round(model, rows, configs[name])
            if round_index == 0:
                first_step[name], first_loss[name] = seconds[0], loss
                seconds = seconds[1:]  # the first step of a process warms up (and compiles): not a step time
            times[name] += seconds
    medians = {name: statistics.median(values) for name, values in times.items()}
    tokens = batch * seq
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x {torch.get_num_threads()}"
    compile_s = first_step["compiled"] - first_step["eager"]  # both first steps warm up alike; compiling is the rest
    n_params = sum(p.numel() for p in eager.parameters())
    print(
        f"Llama {args.size}: {n_params / 1e6:.1f}M parameters, batch {batch} x {seq}, {args.precision}, {device_name}"
    )
    print(f"{'path':>9} {'step s':>9} {'tokens/s':>10} {'first step s':>13} {'first loss':>11}")
    for name in models:
        print(
            f"{name:>9} {medians[name]:>9.4f} {tokens / medians[name]:>10.1f} {first_step[name]:>13.2f} "
            f"{first_loss[name]:>11.5f}"
        )
    speedup = medians["eager"] / medians["compiled"]
    print(f"compiled speed-up (eager / compiled step time): {speedup:.3f}; compile time {compile_s:.1f} s")
    result: dict[str, Any] = {
        "device": device_name,
        "size": args.size,
        "n_params": n_params,
        "batch": batch,
        "seq": seq,
        "precision": args.precision,
        "steps_per_round": args.steps,
        "rounds": args.rounds,
        "paths": {
            name: {
                "step_s": medians[name],
                "tokens_per_s": tokens / medians[name],
                "first_step_s": first_step[name],
                "first_loss": first_loss[name],
            }
            for name in models
        },
        "speedup": speedup,
        "compile_s": compile_s,
    }
    if args.out:
        common.write_result(args.out, result, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
