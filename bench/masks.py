"""Benchmark: goldfish mask throughput and its cost relative to one training step.

Usage: python bench/masks.py [--repeats 20] [--threads N]

Prints, for each strategy, the mask throughput in tokens/s on (8, 2048) and (64, 2048) batches, then
times the mask of a small Llama's training batch (8 x 256) against that model's training step
(forward + goldfish loss + backward + AdamW step, fp32, on CPU) in the same run, and prints the ratio.
Times are medians over --repeats runs after warm-up.
"""

from __future__ import annotations

import argparse

import common
import torch

from goldfish.loss import goldfish_loss
from goldfish.masks import STRATEGIES, causal_targets, drop_mask


def parse_shape(text: str) -> tuple[int, int]:
    rows, _, length = text.partition("x")
    try:
        return int(rows), int(length)
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must look like 8x2048, got {text!r}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", type=parse_shape, nargs="+", default=[(8, 2048), (64, 2048)])
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=["hashed", "hashed-reference"])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--h", type=int, default=13)
    parser.add_argument("--batch", type=int, default=8, help="training batch rows")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--step-repeats", type=int, default=10)
    common.add_options(
        parser,
        help={"vocab": "Llama vocabulary (also the mask benchmark's)", "seq": "training sequence length"},
        vocab=2048,
        hidden=256,
        layers=4,
        seq=256,
        threads=None,
    )
    args = common.parse(parser)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, k={args.k}, h={args.h}")

    generator = torch.Generator().manual_seed(0)
    print_mask_throughput(args, generator)
    model = common.build_llama(
        **common.model_shape(args), heads=args.hidden // 64, bos_token_id=1, eos_token_id=2, pad_token_id=0
    )
    input_ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=generator)
    targets = causal_targets(input_ids)
    step_seconds = common.median_seconds(
        goldfish_step(model, input_ids, drop_mask(targets, "hashed", args.k, args.h)), args.step_repeats
    )
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"\ntraining step: Llama {n_params / 1e6:.1f}M params (hidden {args.hidden}, {args.layers} layers, "
        f"vocab {args.vocab}), batch {args.batch}x{args.seq}, fp32: {step_seconds * 1e3:.1f} ms"
    )
    print(f"{'strategy':<18}{'mask ms':>10}{'step ms':>10}{'mask/step':>12}")
    for strategy in args.strategies:
        mask_seconds = common.median_seconds(lambda: drop_mask(targets, strategy, args.k, args.h), args.repeats)
        ratio = mask_seconds / step_seconds
        print(f"{strategy:<18}{mask_seconds * 1e3:>10.3f}{step_seconds * 1e3:>10.1f}{ratio:>12.2%}")


def print_mask_throughput(args: argparse.Namespace, generator: torch.Generator) -> None:
    """Median seconds and tokens/s of each strategy's mask on random targets of each of args.shapes."""
    print("\nmask throughput (median of %d)" % args.repeats)
    print(f"{'strategy':<18}{'shape':>12}{'ms':>10}{'Mtokens/s':>12}")
    for strategy in args.strategies:
        for rows, length in args.shapes:
            targets = torch.randint(0, args.vocab, (rows, length), generator=generator)
            seconds = common.median_seconds(lambda: drop_mask(targets, strategy, args.k, args.h), args.repeats)
            print(f"{strategy:<18}{f'{rows}x{length}':>12}{seconds * 1e3:>10.2f}{rows * length / seconds / 1e6:>12.2f}")


def goldfish_step(model: torch.nn.Module, input_ids: torch.Tensor, dropped: torch.Tensor):
    """A training step of `model` on `input_ids` (rows, seq) with the goldfish loss of mask `dropped`: forward,
    loss, backward, AdamW step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    targets = causal_targets(input_ids)

    def step() -> None:
        logits = model(input_ids=input_ids).logits
        goldfish_loss(logits, targets, dropped).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


if __name__ == "__main__":
    main()
