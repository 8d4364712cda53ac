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
import time

import torch
import torch.nn.functional as F

import engine


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                         num_key_value_heads=args.hidden // 64, max_position_embeddings=args.seq)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="measured steps per copy")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    grid = engine.init()  # a world of one process: every collective is a no-op
    plain = build_model(args)
    models = {"plain": plain, "engine": engine.parallelize(copy.deepcopy(plain), grid),
              "control": copy.deepcopy(plain)}
    n_params = sum(p.numel() for p in plain.parameters())
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, model in models.items()}
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, args.vocab, (args.batch, args.seq), generator=generator) for _ in range(4)]

    def step(name: str, index: int) -> tuple[float, float]:
        model, optimizer = models[name], optimizers[name]
        ids = batches[index % len(batches)]
        start = time.perf_counter()
        logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        if name == "engine":
            engine.sync_gradients(model, grid)
            engine.clip_grad_norm_(model, 1.0, grid)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start, loss.item()

    names = list(models)
    losses: dict[str, list[float]] = {name: [] for name in names}
    times: dict[str, list[float]] = {name: [] for name in names}
    for index in range(args.warmup + args.steps):
        for name in names[index % 3:] + names[:index % 3]:
            seconds, loss = step(name, index)
            losses[name].append(loss)
            if index >= args.warmup:
                times[name].append(seconds)
    grid.close(destroy_world=True)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; Llama {n_params / 1e6:.1f}M params (hidden "
          f"{args.hidden}, {args.layers} layers, vocab {args.vocab}), batch {args.batch}x{args.seq}, fp32, "
          f"{args.steps} interleaved steps each after {args.warmup} warm-up")
    plain_ms = statistics.median(times["plain"]) * 1e3
    labels = {"plain": "plain PyTorch", "engine": "engine 1x1x1x1", "control": "plain copy (A/A)"}
    for name in names:
        ms = statistics.median(times[name]) * 1e3
        per_step = statistics.median(t / p for t, p in zip(times[name], times["plain"]))
        note = "" if name == "plain" else (f"  ratio of medians {ms / plain_ms:.3f}, median per-step ratio "
                                           f"{per_step:.3f}")
        print(f"{labels[name]:<18} median {ms:8.1f} ms{note}")
    print("target: engine/plain <= 1.03; read it against the A/A control's distance from 1")
    same = losses["plain"] == losses["engine"] == losses["control"]
    print(f"losses identical over all {len(losses['plain'])} steps: {same}")
    if not same:
        raise SystemExit("the engine on one rank computed other losses than plain PyTorch")


if __name__ == "__main__":
    main()
