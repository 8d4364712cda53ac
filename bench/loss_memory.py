"""Peak memory of the training loss: full logits + cross-entropy vs engine.core.vocab_parallel.token_losses in chunks.

    python bench/loss_memory.py                      # vocabulary 128,256, hidden 512, 1,024 tokens, CPU
    python bench/loss_memory.py --json bench/results/loss_memory_cpu.json

Each variant runs in a fresh process: build hidden states (N, H) and an lm_head weight (V, H) in float32, then one
forward and backward of the per-token losses (summed). Reported: the peak resident memory the loss adds on top of
its inputs (ru_maxrss after the step minus ru_maxrss before it), and the float32 size of one (N, V) logits tensor
for scale. The full-logits path keeps the logits and their log-softmax for backward and builds their gradient; the
chunked loss holds a few (chunk, V) tensors at a time, so its peak falls with the chunk size. The per-token losses
of every variant are checked against the full-logits ones. One process: the vocabulary-parallel case divides V by
x*y*z on each rank on top of this (see engine/core/vocab_parallel.py), not measured here.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def _inputs(tokens: int, hidden: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    h = (torch.randn(tokens, hidden, generator=gen) * 0.5).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=gen) * 0.02).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=gen)
    return h, w, targets


def _measure(variant: str, tokens: int, hidden: int, vocab: int, chunk: int, queue) -> None:
    torch.set_num_threads(2)
    from engine.core.vocab_parallel import token_losses

    h, w, targets = _inputs(tokens, hidden, vocab)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # bytes (Linux reports KiB)
    started = time.perf_counter()
    if variant == "full logits":
        losses = F.cross_entropy(F.linear(h, w), targets, reduction="none")
    else:
        losses = token_losses(h, w, targets, chunk_tokens=chunk)
    losses.sum().backward()
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    queue.put(
        {
            "variant": variant,
            "chunk": chunk,
            "peak_extra_bytes": after - before,
            "seconds": seconds,
            "losses": losses.detach()[:64].tolist(),
        }
    )


def run(tokens: int, hidden: int, vocab: int, chunks: list[int]) -> list[dict]:
    context = mp.get_context("spawn")
    rows = []
    for variant, chunk in [("full logits", tokens)] + [("chunked", c) for c in chunks]:
        queue = context.Queue()
        process = context.Process(target=_measure, args=(variant, tokens, hidden, vocab, chunk, queue))
        process.start()
        rows.append(queue.get())
        process.join()
    reference = torch.tensor(rows[0]["losses"])
    for row in rows:
        row["max_loss_difference"] = float((torch.tensor(row.pop("losses")) - reference).abs().max())
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--chunks", default="1024,512,256,128,64")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    rows = run(args.tokens, args.hidden, args.vocab, chunks)
    logits_bytes = args.tokens * args.vocab * 4
    print(
        f"tokens {args.tokens}, hidden {args.hidden}, vocabulary {args.vocab}: one float32 logits tensor = "
        f"{logits_bytes / 2**20:.0f} MiB"
    )
    print(f"{'variant':<12} {'chunk':>6} {'peak extra MiB':>15} {'x logits':>9} {'seconds':>8} {'max |dloss|':>12}")
    for row in rows:
        print(
            f"{row['variant']:<12} {row['chunk']:>6} {row['peak_extra_bytes'] / 2**20:>15.0f} "
            f"{row['peak_extra_bytes'] / logits_bytes:>9.2f} {row['seconds']:>8.1f} {row['max_loss_difference']:>12.2e}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "tokens": args.tokens,
                    "hidden": args.hidden,
                    "vocab": args.vocab,
                    "logits_bytes": logits_bytes,
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
