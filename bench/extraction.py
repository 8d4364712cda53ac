"""Benchmark: batched greedy extraction (eval.decoding, eval.extraction.extract) vs batch-size-1 HF generate.

A small random Llama decodes the last ``--suffix-len`` tokens of ``--n-docs`` random documents of ``--doc-len``
tokens from the rest (the goldfish split), timed side by side in one run, batch by batch, so a change of machine
load falls on every contender alike:
  * HF ``generate(do_sample=False)`` one document at a time (the paper's protocol, batch size 1);
  * ``greedy_decode`` at batch size 1 and at ``--batch-size``;
  * the prompt pass alone (``greedy_decode`` of one token: the prefixes through the model, which every contender
    makes and batching makes no cheaper), so HF time / prompt-pass time bounds what batching the steps can reach;
  * ``extract()`` at ``--batch-size`` (greedy ids + teacher-forced accuracies + ROUGE, from one shared forced pass)
    on the random documents, which the model does not reproduce (every step is decoded), and on the same prefixes
    followed by the model's own greedy continuation, which it reproduces (the forced pass already holds the ids:
    nothing is left to decode; what a memorized target costs).
It prints documents per second, the speed-ups over HF batch 1, and checks that every contender's ids are identical
(exit status 1 if not). Threads: torch's default (all cores), as a user runs it; ``--threads 1`` shows one core.

    python bench/extraction.py                      # defaults: hidden 256, 4 layers, vocab 2048, 64 x 256
    python bench/extraction.py --threads 1
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

from eval.decoding import greedy_decode
from eval.extraction import ExtractionConfig, extract
from eval.metrics import EXACT_MATCH


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
            "threads": "torch CPU threads (0: torch's default, all cores); on a shared, busy CPU, OpenMP threads "
            "spinning on taken cores slow small matmuls down, and --threads 1 gives steadier figures"
        },
        device="cpu",
        threads=0,
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
    config = ExtractionConfig(suffix_len=args.suffix_len, batch_size=args.batch_size, bootstrap=0)
    seconds, ids, rows = race(model, docs, config, args)
    figures = summarize(args, model, seconds, ids, rows)
    print_figures(args, figures, seconds)
    if args.json:
        common.write_result(args.json, figures, argv)
    return 0 if figures["identical_ids"] else 1


def race(
    model: torch.nn.Module, docs: list[Doc], config: ExtractionConfig, args: argparse.Namespace
) -> tuple[dict[str, float], dict[str, list[list[int]]], dict[str, list[dict]]]:
    """Decode `args.suffix_len` tokens after each document's prefix with every contender, batch by batch.

    Returns each contender's total seconds, its generated ids (none for the prompt pass) and, for the two extract()
    contenders, their rows."""
    n_new = args.suffix_len
    gc = GenerationConfig(do_sample=False, max_new_tokens=n_new, eos_token_id=None, pad_token_id=0)

    def hf_single(chunk: list[Doc]) -> list[list[int]]:
        out = []
        with torch.no_grad():
            for doc in chunk:
                prefix = config.split(doc.token_ids)[0]
                ids = torch.tensor([prefix], device=args.device)
                out.append(
                    model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)[
                        0, len(prefix) :
                    ].tolist()
                )
        return out

    def decoder(batch_size: int, n_tokens: int):
        def run(chunk: list[Doc]) -> list[list[int]]:
            prefixes = [config.split(d.token_ids)[0] for d in chunk]
            return greedy_decode(model, prefixes, n_tokens, pad_token_id=0, batch_size=batch_size)

        return run

    rows: dict[str, list[dict]] = {"extract": [], "extract_reproduced": []}

    def extractor(name: str):
        def run(chunk: list[Doc]) -> list[list[int]]:
            if name == "extract_reproduced":  # the prefixes followed by the model's own greedy continuation
                chunk = [
                    Doc(d.id, config.split(d.token_ids)[0] + g) for d, g in zip(chunk, ids["batched"][-len(chunk) :])
                ]
            out, _ = extract(
                model, chunk, config, decode=lambda t: " ".join(map(str, t)), pad_token_id=0, progress=False
            )
            rows[name] += out
            return [r["generated_ids"] for r in out]

        return run

    contenders = {
        "hf": hf_single,
        "single": decoder(1, n_new),
        "batched": decoder(args.batch_size, n_new),
        "prompt": decoder(args.batch_size, 1),
        "extract": extractor("extract"),
        "extract_reproduced": extractor("extract_reproduced"),
    }
    # Warm-up (allocator, kernels) on two documents so no contender pays first-call costs.
    for name, run in contenders.items():
        if name != "extract_reproduced":
            run(docs[:2])
    for kept in rows.values():
        kept.clear()

    ids: dict[str, list[list[int]]] = {name: [] for name in contenders}
    seconds = dict.fromkeys(contenders, 0.0)
    for start in range(0, len(docs), args.batch_size):
        chunk = docs[start : start + args.batch_size]
        for name, run in contenders.items():
            out, t = common.timed(lambda: run(chunk), args.device)
            ids[name] += out
            seconds[name] += t
    del ids["prompt"]  # one token each: not a contender for identical ids
    return seconds, ids, rows


def summarize(
    args: argparse.Namespace,
    model: torch.nn.Module,
    seconds: dict[str, float],
    ids: dict[str, list[list[int]]],
    rows: dict[str, list[dict]],
) -> dict:
    """The figures written to --json."""
    n = args.n_docs
    reference = ids["hf"]
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
        "extract_reproduced_batched_docs_per_s": n / seconds["extract_reproduced"],
        "speedup_batched_vs_hf_bs1": seconds["hf"] / seconds["batched"],
        "speedup_extract_vs_hf_bs1": seconds["hf"] / seconds["extract"],
        "speedup_extract_reproduced_vs_hf_bs1": seconds["hf"] / seconds["extract_reproduced"],
        "prompt_pass_docs_per_s": n / seconds["prompt"],
        "speedup_bound_hf_bs1_vs_prompt_pass": seconds["hf"] / seconds["prompt"],
        # Every contender's ids equal HF's; the reproduced documents' suffixes ARE those ids.
        "identical_ids": all(got == reference for got in ids.values()),
        "distinct_generated_ids": len({t for row in ids["batched"] for t in row}),
        "exact_match_vs_random_suffix": sum(r[EXACT_MATCH] for r in rows["extract"]) / max(1, n),
        "exact_match_reproduced": sum(r[EXACT_MATCH] for r in rows["extract_reproduced"]) / max(1, n),
        "load_average_1min_at_end": os.getloadavg()[0],
    }


def print_figures(args: argparse.Namespace, figures: dict, seconds: dict[str, float]) -> None:
    n, n_new, b = args.n_docs, args.suffix_len, args.batch_size
    t_hf = seconds["hf"]
    print(
        f"model: Llama hidden {args.hidden}, {args.layers} layers, vocab {args.vocab} "
        f"({figures['model']['params'] / 1e6:.1f} M params), {args.device}, {figures['threads']} threads"
    )
    print(f"load average (1 min) at the end: {figures['load_average_1min_at_end']:.2f} on {os.cpu_count()} CPUs")
    print(f"{n} documents x {args.doc_len} tokens, prefix {args.doc_len - n_new}, generate {n_new}")
    lines = [
        ("hf", "HF generate, batch 1", ""),
        ("single", "greedy_decode, batch 1", ""),
        ("batched", f"greedy_decode, batch {b}", ""),
        (
            "prompt",
            f"prompt pass alone, batch {b}",
            f"bound on the speed-up: HF / prompt pass = {t_hf / seconds['prompt']:.2f}x",
        ),
        (
            "extract",
            f"extract(), batch {b}",
            "ids + teacher-forced accuracy + ROUGE; not reproduced: all steps decoded",
        ),
        (
            "extract_reproduced",
            f"extract(), batch {b}",
            "the same, on documents the model reproduces: nothing to decode",
        ),
    ]
    for key, label, note in lines:
        t = seconds[key]
        print(f"  {label:<28}: {n / t:8.2f} docs/s ({t:6.2f} s)" + (f"  [{note}]" if note else ""))
    print(f"  speed-up greedy_decode batch {b} vs HF batch 1: {t_hf / seconds['batched']:.2f}x")
    print(
        f"  speed-up extract() vs HF batch 1 (ids only): {t_hf / seconds['extract']:.2f}x not reproduced, "
        f"{t_hf / seconds['extract_reproduced']:.2f}x reproduced"
    )
    print(f"  generated ids identical (HF bs1 == every contender): {figures['identical_ids']}")


if __name__ == "__main__":
    sys.exit(main())
