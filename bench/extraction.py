"""Benchmark: batched greedy extraction (eval.decoding, eval.extraction.extract) vs HF generate, batched and not.

A small random Llama decodes the last ``--suffix-len`` tokens of ``--n-docs`` random documents from the rest (the
goldfish split), timed side by side in one run, batch by batch, so a change of machine load falls on every contender
alike. Two sets of documents (``--prefixes``): equal, every document ``--doc-len`` tokens; unequal, lengths drawn
uniformly from ``--doc-len`` / 2 (at least a 1-token prefix) to ``--doc-len`` (every batch is left-padded).
The contenders:
  * HF ``generate(do_sample=False)`` one document at a time (the paper's protocol, batch size 1);
  * HF ``generate(do_sample=False)`` at ``--batch-size``, left-padded with an attention mask: the strongest
    baseline, the one a user with a batch of documents would write;
  * the same followed by one teacher-forced forward over the whole documents: what extraction with its
    teacher-forced metrics costs with HF (``extract()`` reads both off one shared pass);
  * ``greedy_decode`` at batch size 1 and at ``--batch-size``, and at ``--batch-size`` on torch's own GEMM (MKL on
    x86): where `eval.decoding.ONEDNN_LINEARS` sends the large matmuls to oneDNN (AMD CPUs), the share of the speed-up
    that is the GEMM library rather than the decoder;
  * the prompt pass alone (``greedy_decode`` of one token: the prefixes through the model, which every contender
    makes and batching makes no cheaper), so HF time / prompt-pass time bounds what batching the steps can reach;
  * ``extract()`` at ``--batch-size`` (greedy ids + teacher-forced accuracies + ROUGE, from one shared forced pass)
    on the random documents, which the model does not reproduce (every step is decoded), and on the same prefixes
    followed by the model's own greedy continuation, which it reproduces (the forced pass already holds the ids:
    nothing is left to decode; what a memorized target costs).
It prints documents per second, the speed-ups over HF batched and HF batch 1, and checks that every contender's ids
are identical (exit status 1 if not); last, greedy_decode's speed-up over HF ``generate`` batched at the same batch
size on equal and on unequal prefix lengths. ``--rounds`` repeats the race (each round every batch through every
contender); the figures are each contender's median round, in wall-clock seconds, and also in CPU seconds (the
process's, all its threads: with ``--threads 1`` steadier than wall time on a machine other work shares). The JSON
names the CPU, the GEMM the decoder used and the load average before and after. Threads: torch's default (all
cores), as a user runs it; ``--threads 1`` shows one core.

    python bench/extraction.py                      # defaults: hidden 256, 4 layers, vocab 2048, 64 x 256
    python bench/extraction.py --threads 1 --prefixes unequal
    python bench/extraction.py --device cuda --n-docs 256
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import common
import torch
from transformers import GenerationConfig

import eval.decoding
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
    p.add_argument(
        "--prefixes",
        choices=("equal", "unequal", "both"),
        default="both",
        help="equal: every document --doc-len tokens; unequal: lengths uniform in [--doc-len / 2, --doc-len]",
    )
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
    common.add_options(p, rounds=3, json=None)
    args = common.parse(p, argv)
    if args.doc_len <= args.suffix_len:
        p.error(f"--doc-len ({args.doc_len}) must exceed --suffix-len ({args.suffix_len}) to leave a prefix")
    return args


def documents(args: argparse.Namespace, unequal: bool) -> list[Doc]:
    """`args.n_docs` random documents: `args.doc_len` tokens each, or (unequal) lengths drawn uniformly from
    max(doc_len / 2, suffix_len + 1) to doc_len."""
    gen = torch.Generator().manual_seed(args.seed + 1)
    shortest = max(args.doc_len // 2, args.suffix_len + 1) if unequal else args.doc_len
    lengths = torch.randint(shortest, args.doc_len + 1, (args.n_docs,), generator=gen).tolist()
    return [Doc(f"doc{i}", torch.randint(0, args.vocab, (n,), generator=gen).tolist()) for i, n in enumerate(lengths)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = (
        common.build_llama(
            **common.model_shape(args),
            seq=max(2048, args.doc_len),
            initializer_range=args.init_range,
            seed=args.seed,
            eos_token_id=None,  # generate() would otherwise stop a row at LlamaConfig's default EOS id 2
        )
        .to(args.device)
        .eval()
    )
    config = ExtractionConfig(suffix_len=args.suffix_len, batch_size=args.batch_size, bootstrap=0)
    cases = ("equal", "unequal") if args.prefixes == "both" else (args.prefixes,)
    figures: dict = {
        "device": args.device,
        "threads": torch.get_num_threads(),
        "machine": machine(args.device),
        "onednn_linears": eval.decoding.ONEDNN_LINEARS and args.device == "cpu",
        "rounds": args.rounds,
        "model": model_figures(args, model),
        "load_average_1min_at_start": os.getloadavg()[0],
    }
    print_header(args, figures)
    for case in cases:
        docs = documents(args, unequal=case == "unequal")
        seconds, cpu_seconds, rounds, rows = race(model, docs, config, args)
        figures[case] = summarize(args, docs, seconds, cpu_seconds, rounds, rows)
        print_figures(args, case, figures[case], seconds)
    figures["identical_ids"] = all(figures[case]["identical_ids"] for case in cases)
    figures["load_average_1min_at_end"] = os.getloadavg()[0]
    print(
        f"load average (1 min): {figures['load_average_1min_at_start']:.2f} at the start, "
        f"{figures['load_average_1min_at_end']:.2f} at the end, on {os.cpu_count()} CPUs"
    )
    for case in cases:
        f = figures[case]
        print(
            f"greedy_decode vs HF generate batched, both at batch {args.batch_size}, {case} prefix lengths: "
            f"{f['speedup_batched_vs_hf_batched']:.2f}x wall ({f['speedup_batched_vs_hf_batched_cpu_time']:.2f}x CPU "
            f"time); on torch's GEMM {f['speedup_batched_torch_gemm_vs_hf_batched']:.2f}x; identical ids: "
            f"{f['identical_ids']}"
        )
    if args.json:
        common.write_result(args.json, figures, argv)
    return 0 if figures["identical_ids"] else 1


def machine(device: str) -> dict:
    """The CPU's name (/proc/cpuinfo's model name where there is one), its logical CPUs, the platform and, on a CUDA
    `device`, the GPU's name."""
    name = platform.processor()
    try:
        name = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    found = {"cpu": name, "cpus": os.cpu_count(), "platform": platform.platform()}
    if torch.device(device).type == "cuda":
        found["gpu"] = torch.cuda.get_device_name(device)
    return found


def race(
    model: torch.nn.Module, docs: list[Doc], config: ExtractionConfig, args: argparse.Namespace
) -> tuple[dict[str, float], dict[str, float], list[dict[str, list[list[int]]]], dict[str, list[dict]]]:
    """Decode `args.suffix_len` tokens after each document's prefix with every contender, batch by batch, in
    `args.rounds` rounds.

    Returns each contender's median round in wall-clock and in CPU seconds, each round's generated ids (none for
    the prompt pass) and, for the two extract() contenders, their rows (of the last round)."""
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

    def hf_batched(chunk: list[Doc]) -> list[list[int]]:
        # Left padding by hand (what a tokenizer with padding_side="left" returns): (b, L) ids and 0/1 mask.
        prefixes = [config.split(d.token_ids)[0] for d in chunk]
        width = max(len(p) for p in prefixes)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prefixes], device=args.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prefixes], device=args.device)
        with torch.no_grad():
            return model.generate(ids, attention_mask=mask, generation_config=gc)[:, width:].tolist()

    def hf_batched_forced(chunk: list[Doc]) -> list[list[int]]:
        # What extraction with its teacher-forced metrics costs with HF: generate batched, then one forward over the
        # whole documents (right-padded: causal attention keeps padding out of every real position) for the
        # teacher-forced predictions that extract() reads off its one shared pass.
        out = hf_batched(chunk)
        width = max(len(d.token_ids) for d in chunk)
        ids = torch.tensor([d.token_ids + [0] * (width - len(d.token_ids)) for d in chunk], device=args.device)
        mask = torch.tensor([[1] * len(d.token_ids) + [0] * (width - len(d.token_ids)) for d in chunk])
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask.to(args.device)).logits.argmax(dim=-1)
        return out

    def decoder(batch_size: int, n_tokens: int, onednn: bool = eval.decoding.ONEDNN_LINEARS):
        def run(chunk: list[Doc]) -> list[list[int]]:
            prefixes = [config.split(d.token_ids)[0] for d in chunk]
            setting, eval.decoding.ONEDNN_LINEARS = eval.decoding.ONEDNN_LINEARS, onednn
            try:
                return greedy_decode(model, prefixes, n_tokens, pad_token_id=0, batch_size=batch_size)
            finally:
                eval.decoding.ONEDNN_LINEARS = setting

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
        "hf_batched": hf_batched,
        "hf_batched_forced": hf_batched_forced,
        "single": decoder(1, n_new),
        "batched": decoder(args.batch_size, n_new),
        "batched_torch_gemm": decoder(args.batch_size, n_new, onednn=False),
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

    wall: dict[str, list[float]] = {name: [] for name in contenders}
    cpu: dict[str, list[float]] = {name: [] for name in contenders}
    rounds: list[dict[str, list[list[int]]]] = []
    for _ in range(args.rounds):
        for kept in rows.values():  # the last round's rows are returned
            kept.clear()
        ids: dict[str, list[list[int]]] = {name: [] for name in contenders}
        for name in contenders:
            wall[name].append(0.0)
            cpu[name].append(0.0)
        for start in range(0, len(docs), args.batch_size):
            chunk = docs[start : start + args.batch_size]
            for name, run in contenders.items():
                cpu_start = time.process_time()
                out, t = common.timed(lambda: run(chunk), args.device)
                cpu[name][-1] += time.process_time() - cpu_start
                wall[name][-1] += t
                ids[name] += out
        del ids["prompt"]  # one token each: not a contender for identical ids
        rounds.append(ids)
    median = {name: statistics.median(times) for name, times in wall.items()}
    return median, {name: statistics.median(times) for name, times in cpu.items()}, rounds, rows


def model_figures(args: argparse.Namespace, model: torch.nn.Module) -> dict:
    return {
        "hidden": args.hidden,
        "layers": args.layers,
        "heads": args.heads,
        "vocab": args.vocab,
        "params": sum(p.numel() for p in model.parameters()),
    }


def summarize(
    args: argparse.Namespace,
    docs: list[Doc],
    seconds: dict[str, float],
    cpu_seconds: dict[str, float],
    rounds: list[dict[str, list[list[int]]]],
    rows: dict[str, list[dict]],
) -> dict:
    """The figures of one set of documents, written to --json. Ids: every round's must equal the first round's HF
    batch 1; rows_differing_from_hf_bs1 counts the most rows any round had differing."""
    n = len(docs)
    prefix_lens = [len(d.token_ids) - args.suffix_len for d in docs]
    ids = rounds[0]
    reference = ids["hf"]
    return {
        "n_docs": n,
        "prefix_len_min": min(prefix_lens),
        "prefix_len_max": max(prefix_lens),
        "suffix_len": args.suffix_len,
        "batch_size": args.batch_size,
        "hf_generate_bs1_docs_per_s": n / seconds["hf"],
        "hf_generate_batched_docs_per_s": n / seconds["hf_batched"],
        "greedy_decode_bs1_docs_per_s": n / seconds["single"],
        "greedy_decode_batched_docs_per_s": n / seconds["batched"],
        "greedy_decode_batched_torch_gemm_docs_per_s": n / seconds["batched_torch_gemm"],
        "extract_batched_docs_per_s": n / seconds["extract"],
        "extract_reproduced_batched_docs_per_s": n / seconds["extract_reproduced"],
        "speedup_batched_vs_hf_batched": seconds["hf_batched"] / seconds["batched"],
        "speedup_batched_vs_hf_batched_cpu_time": cpu_seconds["hf_batched"] / cpu_seconds["batched"],
        "speedup_batched_torch_gemm_vs_hf_batched": seconds["hf_batched"] / seconds["batched_torch_gemm"],
        "speedup_extract_vs_hf_batched": seconds["hf_batched"] / seconds["extract"],
        "hf_generate_batched_and_forced_pass_docs_per_s": n / seconds["hf_batched_forced"],
        "speedup_extract_vs_hf_batched_and_forced_pass": seconds["hf_batched_forced"] / seconds["extract"],
        "speedup_batched_vs_hf_bs1": seconds["hf"] / seconds["batched"],
        "speedup_extract_vs_hf_bs1": seconds["hf"] / seconds["extract"],
        "speedup_extract_reproduced_vs_hf_bs1": seconds["hf"] / seconds["extract_reproduced"],
        "prompt_pass_docs_per_s": n / seconds["prompt"],
        "speedup_bound_hf_bs1_vs_prompt_pass": seconds["hf"] / seconds["prompt"],
        "speedup_bound_hf_batched_vs_prompt_pass": seconds["hf_batched"] / seconds["prompt"],
        # Every contender's ids equal HF's; the reproduced documents' suffixes ARE those ids.
        "identical_ids": all(got == reference for r in rounds for got in r.values()),
        "rows_differing_from_hf_bs1": {
            name: max(sum(a != b for a, b in zip(r[name], reference)) for r in rounds) for name in ids if name != "hf"
        },
        "distinct_generated_ids": len({t for row in ids["batched"] for t in row}),
        "exact_match_vs_random_suffix": sum(r[EXACT_MATCH] for r in rows["extract"]) / max(1, n),
        "exact_match_reproduced": sum(r[EXACT_MATCH] for r in rows["extract_reproduced"]) / max(1, n),
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
    }


def print_header(args: argparse.Namespace, figures: dict) -> None:
    print(
        f"model: Llama hidden {args.hidden}, {args.layers} layers, vocab {args.vocab} "
        f"({figures['model']['params'] / 1e6:.1f} M params), {args.device}, {figures['threads']} threads, "
        f"{args.rounds} round(s), medians"
    )
    gemm = "oneDNN" if figures["onednn_linears"] else "torch's own"
    print(f"CPU: {figures['machine']['cpu']}; greedy_decode's and extract()'s large matmuls on {gemm} GEMM")


def print_figures(args: argparse.Namespace, case: str, figures: dict, seconds: dict[str, float]) -> None:
    n, n_new, b = figures["n_docs"], args.suffix_len, args.batch_size
    t_hf, t_hfb = seconds["hf"], seconds["hf_batched"]
    low, high = figures["prefix_len_min"], figures["prefix_len_max"]
    prefix = f"prefix {low}" if low == high else f"prefixes {low}-{high}"
    print(f"{case} prefix lengths: {n} documents, {prefix}, generate {n_new}")
    lines = [
        ("hf", "HF generate, batch 1", ""),
        ("hf_batched", f"HF generate, batch {b}", "left-padded, attention mask"),
        ("hf_batched_forced", f"HF generate + forced, b. {b}", "+ one teacher-forced pass: extraction's metrics"),
        ("single", "greedy_decode, batch 1", ""),
        ("batched", f"greedy_decode, batch {b}", ""),
        ("batched_torch_gemm", "greedy_decode, torch GEMM", f"batch {b} on torch's own GEMM (MKL on x86)"),
        (
            "prompt",
            f"prompt pass alone, batch {b}",
            f"bound on the speed-up over HF batch {b}: {t_hfb / seconds['prompt']:.2f}x",
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
    print(f"  speed-up greedy_decode batch {b} vs HF generate batch {b}: {t_hfb / seconds['batched']:.2f}x")
    print(f"  speed-up extract() batch {b} vs HF generate batch {b} (ids only): {t_hfb / seconds['extract']:.2f}x")
    print(
        f"  speed-up extract() batch {b} vs HF generate + teacher-forced pass batch {b}: "
        f"{seconds['hf_batched_forced'] / seconds['extract']:.2f}x"
    )
    print(f"  speed-up greedy_decode batch {b} vs HF batch 1: {t_hf / seconds['batched']:.2f}x")
    print(f"  generated ids identical (HF bs1 == every contender): {figures['identical_ids']}")
    if not figures["identical_ids"]:
        print(f"  rows that differ from HF batch 1: {figures['rows_differing_from_hf_bs1']}")


if __name__ == "__main__":
    sys.exit(main())
