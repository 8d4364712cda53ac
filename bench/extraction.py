"""Benchmark: batched greedy extraction (eval.greedy_decode) vs batch-size-1 HF generate.

A small random Llama decodes the last ``--suffix-len`` tokens of ``--n-docs`` random documents of
``--doc-len`` tokens from the rest (the goldfish split), three ways, timed side by side in one run:
  * HF ``generate(do_sample=False)`` one document at a time (the paper's protocol, batch size 1);
  * ``greedy_decode`` at batch size 1 (our loop, no batching);
  * ``greedy_decode`` at ``--batch-size``;
and, beside them, the prompt pass alone (one forward over the batch's prefixes, which every contender makes and no
batching makes cheaper: the same tokens through the same weights), so the printed bound HF time / prompt-pass time
is the speed-up that batching the decoding steps could reach at most. It prints documents per second for each,
the speed-up of batched over HF batch-1, and checks that all three decoders produce identical ids (exit status 1 if
not). Also times a full ``extract()`` (decode + teacher-forced pass + ROUGE) at the batch size.

    python bench/extraction.py                      # defaults: hidden 256, 4 layers, vocab 2048, 64 x 256
    python bench/extraction.py --device cuda --n-docs 256
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import common
import torch
from transformers import GenerationConfig

from eval.batching import evaluating, left_pad
from eval.decoding import greedy_decode
from eval.extraction import ExtractionConfig, extract


@dataclass
class Doc:
    id: str
    token_ids: list[int]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-docs", type=int, default=64)
    p.add_argument("--doc-len", type=int, default=256, help="tokens per document")
    p.add_argument("--suffix-len", type=int, default=50, help="tokens generated per document")
    p.add_argument("--batch-size", type=int, default=32)
    common.add_options(p, hidden=256, layers=4, heads=4, vocab=2048)
    p.add_argument(
        "--init-range",
        type=float,
        default=0.2,
        help="weight init std; HF's 0.02 gives near-flat logits and degenerate repeated tokens",
    )
    common.add_options(
        p,
        help={
            "threads": "torch CPU threads; 1 by default because OpenMP threads spinning on a "
            "shared, busy CPU slow small matmuls down by 10x or more (0: torch's "
            "default)"
        },
        device="cpu",
        threads=1,
    )
    p.add_argument("--seed", type=int, default=0)
    common.add_options(p, json=None)
    args = common.parse(p, argv)
    if args.doc_len <= args.suffix_len:
        p.error(f"--doc-len ({args.doc_len}) must exceed --suffix-len ({args.suffix_len}) to leave a prefix")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = (
        common.build_llama(
            **common.model_shape(args), seq=max(2048, args.doc_len), initializer_range=args.init_range, seed=args.seed
        )
        .to(args.device)
        .eval()
    )
    gen = torch.Generator().manual_seed(args.seed + 1)
    docs = [
        Doc(f"doc{i}", torch.randint(0, args.vocab, (args.doc_len,), generator=gen).tolist())
        for i in range(args.n_docs)
    ]
    config = ExtractionConfig(suffix_len=args.suffix_len, batch_size=args.batch_size)
    seconds, ids = race(model, [config.split(d.token_ids)[0] for d in docs], args)
    (_, summary), seconds["extract"] = common.timed(
        lambda: extract(
            model, docs, config, decode=lambda ids: " ".join(map(str, ids)), pad_token_id=0, progress=False
        ),
        args.device,
    )
    figures = summarize(args, model, seconds, ids, summary)
    print_figures(args, figures, seconds)
    if args.json:
        common.write_result(args.json, figures, argv)
    return 0 if figures["identical_ids"] else 1


def race(
    model: torch.nn.Module, prefixes: list[list[int]], args: argparse.Namespace
) -> tuple[dict[str, float], dict[str, list[list[int]]]]:
    """Decode `args.suffix_len` tokens after each prefix three ways: HF generate one prefix at a time, greedy_decode
    at batch 1, greedy_decode at args.batch_size. Returns each contender's total seconds and generated ids."""
    n_new = args.suffix_len
    gc = GenerationConfig(do_sample=False, max_new_tokens=n_new, eos_token_id=None, pad_token_id=0)

    def hf_single(chunk: list[list[int]]) -> list[list[int]]:
        out = []
        with torch.no_grad():
            for p in chunk:
                ids = torch.tensor([p], device=args.device)
                out.append(
                    model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)[0, len(p) :].tolist()
                )
        return out

    def prompt_pass(chunk: list[list[int]]) -> list[list[int]]:
        with evaluating(model):
            for start in range(0, len(chunk), args.batch_size):
                ids, mask, positions = left_pad(chunk[start : start + args.batch_size], 0, torch.device(args.device))
                model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        return []

    contenders = {
        "hf": hf_single,
        "single": lambda chunk: greedy_decode(model, chunk, n_new, pad_token_id=0, batch_size=1),
        "batched": lambda chunk: greedy_decode(model, chunk, n_new, pad_token_id=0, batch_size=args.batch_size),
        "prompt": prompt_pass,
    }
    # Warm-up (allocator, kernels) on two documents so no contender pays first-call costs.
    greedy_decode(model, prefixes[:2], 4, pad_token_id=0, batch_size=2)
    hf_single(prefixes[:1])

    # The contenders are interleaved batch by batch, so a change of machine load during the run (other
    # processes on a shared CPU) falls on all of them alike instead of on whichever runs last.
    ids: dict[str, list[list[int]]] = {name: [] for name in contenders}
    seconds = dict.fromkeys(contenders, 0.0)
    for start in range(0, len(prefixes), args.batch_size):
        chunk = prefixes[start : start + args.batch_size]
        for name, decode in contenders.items():
            out, t = common.timed(lambda: decode(chunk), args.device)
            ids[name] += out
            seconds[name] += t
    return seconds, ids


def summarize(
    args: argparse.Namespace,
    model: torch.nn.Module,
    seconds: dict[str, float],
    ids: dict[str, list[list[int]]],
    summary: dict,
) -> dict:
    """The figures written to --json."""
    n = args.n_docs
    return {
        "device": args.device,
        "threads": torch.get_num_threads(),
        "model": {
            "hidden": args.hidden,
            "layers": args.layers,
            "heads": args.heads,
            "vocab": args.vocab,
            "params": sum(p.numel() for p in model.parameters()),
        },
        "n_docs": n,
        "doc_len": args.doc_len,
        "suffix_len": args.suffix_len,
        "batch_size": args.batch_size,
        "hf_generate_bs1_docs_per_s": n / seconds["hf"],
        "greedy_decode_bs1_docs_per_s": n / seconds["single"],
        "greedy_decode_batched_docs_per_s": n / seconds["batched"],
        "extract_batched_docs_per_s": n / seconds["extract"],
        "speedup_batched_vs_hf_bs1": seconds["hf"] / seconds["batched"],
        "prompt_pass_docs_per_s": n / seconds["prompt"],
        "speedup_bound_hf_bs1_vs_prompt_pass": seconds["hf"] / seconds["prompt"],
        "identical_ids": ids["hf"] == ids["single"] == ids["batched"],  # the prompt pass returns no ids
        "distinct_generated_ids": len({t for row in ids["batched"] for t in row}),
        "exact_match_vs_random_suffix": summary["exact_match"],
        "load_average_1min_at_end": os.getloadavg()[0],
    }


def print_figures(args: argparse.Namespace, figures: dict, seconds: dict[str, float]) -> None:
    n, n_new = args.n_docs, args.suffix_len
    t_hf, t_single, t_batched, t_extract = (seconds[k] for k in ("hf", "single", "batched", "extract"))
    print(
        f"model: Llama hidden {args.hidden}, {args.layers} layers, vocab {args.vocab} "
        f"({figures['model']['params'] / 1e6:.1f} M params), {args.device}, {figures['threads']} threads"
    )
    print(f"load average (1 min) at the end: {figures['load_average_1min_at_end']:.2f} on {os.cpu_count()} CPUs")
    print(f"{n} documents x {args.doc_len} tokens, prefix {args.doc_len - n_new}, generate {n_new}")
    print(f"  HF generate, batch 1         : {n / t_hf:8.2f} docs/s  ({t_hf:.2f} s)")
    print(f"  greedy_decode, batch 1       : {n / t_single:8.2f} docs/s  ({t_single:.2f} s)")
    print(f"  greedy_decode, batch {args.batch_size:<3}     : {n / t_batched:8.2f} docs/s  ({t_batched:.2f} s)")
    print(
        f"  extract(), batch {args.batch_size:<3}         : {n / t_extract:8.2f} docs/s  ({t_extract:.2f} s)"
        "  [decode + teacher-forced pass + ROUGE]"
    )
    t_prompt = seconds["prompt"]
    print(
        f"  prompt pass alone, batch {args.batch_size:<3}: {n / t_prompt:8.2f} docs/s  ({t_prompt:.2f} s)"
        f"  [bound on the speed-up: HF / prompt pass = {t_hf / t_prompt:.2f}x]"
    )
    print(f"  speed-up batched vs HF batch 1: {t_hf / t_batched:.2f}x")
    print(f"  generated ids identical (HF bs1 == ours bs1 == ours batched): {figures['identical_ids']}")


if __name__ == "__main__":
    sys.exit(main())
