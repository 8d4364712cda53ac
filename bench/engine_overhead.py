"""Benchmark: the engine's cost on a grid of one rank (1x1x1x1) against a plain PyTorch training loop.

Usage: python bench/engine_overhead.py [--steps 30] [--hidden 256] [--layers 4] [--batch 8] [--seq 256]
                                       [--threads N]

Two copies of the same HF Llama (same seed, fp32, CPU) train side by side in one process:

    plain    forward, loss, backward, torch.nn.utils.clip_grad_norm_, AdamW step
    engine   the model after engine.parallelize(model, grid) on engine.init() (a world of one process,
             gloo), the same step with engine.sync_gradients and engine.clip_grad_norm_

    control  a second plain copy: the A/A ratio control/plain shows how much two identical loops differ
             on this machine (the noise floor that the engine's ratio must be read against)

Steps are interleaved (the order rotates every step) so that all copies see the same machine noise, and
each gets its own warm-up. Prints the median step time of each, the ratio of the medians and the median
of the per-step ratios (the issue's target: engine/plain <= 1.03), and checks that the copies' losses are
identical (on one rank the engine must compute exactly what PyTorch computes).
"""

from __future__ import annotations

import argparse
import copy
import statistics

import common
import torch

import engine

LABELS = {"plain": "plain PyTorch", "engine": "engine 1x1x1x1", "control": "plain copy (A/A)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_options(
        parser,
        help={"steps": "measured steps per copy"},
        steps=30,
        warmup=3,
        vocab=2048,
        hidden=256,
        layers=4,
        seq=256,
        threads=None,
    )
    parser.add_argument("--batch", type=int, default=8)
    args = common.parse(parser)

    grid = engine.init()  # a world of one process: every collective is a no-op
    plain = common.build_llama(**common.model_shape(args), heads=args.hidden // 64)
    models = {"plain": plain, "engine": engine.parallelize(copy.deepcopy(plain), grid), "control": copy.deepcopy(plain)}
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, args.vocab, (args.batch, args.seq), generator=generator) for _ in range(4)]
    times, losses = interleaved_steps(models, {"engine": grid}, batches, args.steps, args.warmup)
    grid.close(destroy_world=True)

    n_params = sum(p.numel() for p in plain.parameters())
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; Llama {n_params / 1e6:.1f}M params (hidden "
        f"{args.hidden}, {args.layers} layers, vocab {args.vocab}), batch {args.batch}x{args.seq}, fp32, "
        f"{args.steps} interleaved steps each after {args.warmup} warm-up"
    )
    print_medians(times)
    same = losses["plain"] == losses["engine"] == losses["control"]
    print(f"losses identical over all {len(losses['plain'])} steps: {same}")
    if not same:
        raise SystemExit("the engine on one rank computed other losses than plain PyTorch")


def interleaved_steps(
    models: dict[str, torch.nn.Module],
    grids: dict[str, engine.Grid],
    batches: list[torch.Tensor],
    steps: int,
    warmup: int,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Train every model `warmup + steps` steps with AdamW, the order of the models rotating every step; return
    the seconds of the `steps` timed steps and the losses of all steps, by model name."""
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, model in models.items()}
    names = list(models)
    losses: dict[str, list[float]] = {name: [] for name in names}
    times: dict[str, list[float]] = {name: [] for name in names}
    for index in range(warmup + steps):
        ids = batches[index % len(batches)]
        for name in names[index % len(names) :] + names[: index % len(names)]:
            loss, seconds = common.timed(
                lambda: common.train_step(models[name], optimizers[name], ids, grids.get(name))
            )
            losses[name].append(float(loss))
            if index >= warmup:
                times[name].append(seconds)
    return times, losses


def print_medians(times: dict[str, list[float]]) -> None:
    """Each copy's median step time, and against plain PyTorch the ratio of medians and the median per-step ratio."""
    plain_ms = statistics.median(times["plain"]) * 1e3
    for name, values in times.items():
        ms = statistics.median(values) * 1e3
        per_step = statistics.median(t / p for t, p in zip(values, times["plain"]))
        note = (
            "" if name == "plain" else (f"  ratio of medians {ms / plain_ms:.3f}, median per-step ratio {per_step:.3f}")
        )
        print(f"{LABELS[name]:<18} median {ms:8.1f} ms{note}")
    print("target: engine/plain <= 1.03; read it against the A/A control's distance from 1")


if __name__ == "__main__":
    main()
