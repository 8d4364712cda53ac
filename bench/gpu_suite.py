"""One command that proves a GPU install: masks, the `goldfish train` path's speed and MFU, anchors, a profile, the
quick start, `--compile` on and off; one JSON.

Usage:
    python bench/gpu_suite.py --out bench/results/gpu_suite_h100.json   # one GPU: TinyLlama-1.1B's shape (8 min budget)
    python bench/gpu_suite.py --size tiny --out /tmp/suite.json         # any machine, a CPU included

What it runs, in one process (the quick start in a child process, as a user runs it), each part timed:

1. masks: `goldfish.masks.drop_mask` of every strategy (goldfish.strategies.STRATEGIES) on the device equals the CPU's,
   on 8 rows of 2,048 targets with padding and special tokens (on a CPU-only machine the device is the CPU, and the
   JSON says so).
2. train: `goldfish train` (goldfish.app.cli.main, in process) on the TinyLlama-1.1B-shaped model (`--model
   tinyllama-1.1b`: hidden 2048, 22 layers, 32 heads, 4 kv heads, MLP 5632) with a 32,000-token BPE (trained here on
   this Python's standard library, so no network is needed), `--pack` rows of 2,048 tokens, the goldfish loss (hashed,
   k=4, h=13), `--precision bf16` (autocast, fp32 weights and AdamW), batch 4; eager and `--compile`. tokens/s is the
   median of metrics.jsonl's tokens_per_s after the first 2 steps; MFU = tokens/s x the cost model's FLOPs per token
   (engine.planner.cost_model.model_flops_per_token, the PaLM convention) / the device's dense bf16 peak
   (bench/mfu.py's table, or a measured GEMM rate). The first step's time minus the median is the compile time.
3. anchors: the same model (same config) in a plain HF loop (mean cross-entropy over full logits, AdamW, clipping,
   autocast bf16: bench/common.train_step), eager and with `torch.compile(model)` (whole model), on random rows of the
   same shape with plain causal attention (the goldfish path's packed rows are block-causal through position ids).
4. profile: torch.profiler over 2 steps of the engine's training loop with the goldfish loss (the step `goldfish train`
   runs), each op's self time (device time on a GPU, CPU time on a CPU) in one bucket: optimizer (inside torch's
   Optimizer.step / zero_grad ranges), loss (the fused lm_head product and cross-entropy of the goldfish loss, forward
   and backward, and the loss's own reductions), attention (scaled-dot-product and flash/efficient kernels), gemm
   (aten mm/addmm/bmm/baddbmm: the decoder's projections), other (norms, rotary, activations, copies, the rest).
5. peak memory: torch.cuda.max_memory_allocated per part (null on a CPU).
6. quick start: `python -m goldfish compare --out DIR` in a child process, its wall time and exit status (--size tiny:
   a cut-down compare of the micro model, to keep the path alive in seconds).

The numbers a CPU gives at --size tiny only prove the code path; they are not GPU figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import common
import torch
from mfu import peak_tflops

from conventions import IGNORE_INDEX
from data.batch import Row
from engine.planner.cost_model import TransformerShape, model_flops_per_token
from engine.training.train import TrainConfig, train
from goldfish.app.config import MaskSpec
from goldfish.app.training_rows import make_step_loss
from goldfish.masks import drop_mask
from goldfish.strategies import STRATEGIES, default_k_h

MASK = MaskSpec(strategy="hashed", k=4, h=13)
SKIP_STEPS = 2  # metrics' first steps (allocation, autotuning, compilation) are not step times
BUCKETS = ("gemm", "attention", "loss", "optimizer", "other")


@dataclass(frozen=True)
class Size:
    """What one --size runs. model: goldfish's --model name; vocab: the BPE's size (the model's vocabulary)."""

    model: str
    vocab: int
    seq: int
    batch: int
    train_steps: int  # goldfish train --max-steps (the median skips the first SKIP_STEPS)
    anchor_steps: int  # timed steps per anchor, after 2 warm-up steps
    n_train: int  # training documents of the embedded corpus, packed into rows of seq tokens
    tokenizer_chars: int  # characters of standard-library source the BPE learns from (0: the CLI trains its own)
    compare_argv: tuple[str, ...] = field(default=())  # options after `goldfish compare --out DIR`
    budget_s: float = 480.0  # the suite's wall time it must stay within


SIZES = {
    "tinyllama": Size(
        model="tinyllama-1.1b",
        vocab=32000,
        seq=2048,
        batch=4,
        train_steps=10,
        anchor_steps=5,
        n_train=64,
        tokenizer_chars=16_000_000,
    ),
    "tiny": Size(
        model="micro-llama",
        vocab=320,
        seq=64,
        batch=4,
        train_steps=5,
        anchor_steps=2,
        n_train=8,
        tokenizer_chars=0,
        budget_s=120.0,
        compare_argv=tuple(
            "--quick --model micro-llama --n-train 2 --n-heldout 1 --seq-len 48 --suffix-len 16 --vocab-size 320 "
            "--batch-size 2 --epochs 1".split()
        ),
    ),
}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(device: torch.device) -> int | None:
    """Bytes torch allocated at most on `device` since the last reset (None on a CPU: not tracked there)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def reset_memory(device: torch.device) -> None:
    """Free what the previous part left (its compiled graphs too: they may hold its model) and restart the peak."""
    gc.collect()
    torch.compiler.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


# ----- 1. masks ------------------------------------------------------------------------------------------------------


def check_masks(device: torch.device, rows: int = 8, seq: int = 2048, vocab: int = 32000) -> dict[str, Any]:
    """drop_mask of every strategy on `device` against the CPU's: equal, and how many targets each drops."""
    generator = torch.Generator().manual_seed(0)
    targets = torch.randint(0, vocab, (rows, seq), generator=generator)
    targets[:, -5:] = IGNORE_INDEX  # padding at the end of every row
    special = (0, 1, 2)
    out = {}
    for strategy in STRATEGIES:
        k, h = default_k_h(strategy)
        on_cpu = drop_mask(targets, strategy, k, h, special_token_ids=special, seed=3)
        on_device = drop_mask(targets.to(device), strategy, k, h, special_token_ids=special, seed=3).cpu()
        out[strategy] = {"k": k, "h": h, "equal": bool(torch.equal(on_cpu, on_device)), "dropped": int(on_cpu.sum())}
    return {"device": str(device), "rows": rows, "seq": seq, "strategies": out}


# ----- 2. goldfish train ---------------------------------------------------------------------------------------------


def stdlib_texts(chars: int) -> list[str]:
    """Python source of this interpreter's standard library, file by file in name order, up to `chars` characters:
    text any machine with Python has, for a tokenizer of 32,000 tokens without the network."""
    texts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text)
        if total >= chars:
            break
    return texts


def make_tokenizer(size: Size, folder: Path) -> Path | None:
    """A BPE of size.vocab tokens saved in `folder` (None: let goldfish train its own on the corpus)."""
    if not size.tokenizer_chars:
        return None
    import data

    tokenizer = data.train_bpe_tokenizer(stdlib_texts(size.tokenizer_chars), vocab_size=size.vocab)
    tokenizer.save_pretrained(folder)
    return folder


def train_argv(size: Size, out: Path, tokenizer: Path | None, device: torch.device, compiled: bool) -> list[str]:
    """`goldfish train` options of the suite's run (--compile when `compiled`)."""
    argv = ["train", "--out", str(out), "--model", size.model, "--data", "default", "--pack"]
    argv += ["--n-train", str(size.n_train), "--n-heldout", "1", "--seq-len", str(size.seq)]
    argv += ["--batch-size", str(size.batch), "--max-steps", str(size.train_steps), "--epochs", "1000"]
    argv += ["--strategy", MASK.strategy, "--k", str(MASK.k), "--h", str(MASK.h)]
    argv += ["--precision", "bf16", "--device", str(device), "--no-progress"]
    argv += ["--tokenizer", str(tokenizer)] if tokenizer is not None else ["--vocab-size", str(size.vocab)]
    return argv + (["--compile"] if compiled else [])


def run_goldfish_train(
    size: Size, folder: Path, tokenizer: Path | None, device: torch.device, compiled: bool, peak: float
) -> dict[str, Any]:
    """One `goldfish train` run in this process: its figures from metrics.jsonl and the model's config."""
    from goldfish.app.cli import main as goldfish_main

    out = folder / ("train-compiled" if compiled else "train-eager")
    argv = train_argv(size, out, tokenizer, device, compiled)
    reset_memory(device)
    started = time.perf_counter()
    status = goldfish_main(argv)
    wall = time.perf_counter() - started
    if status != 0:
        raise RuntimeError(f"goldfish {' '.join(argv)} exited with status {status}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    config = json.loads((out / "checkpoint" / "config.json").read_text())
    shape = TransformerShape.from_hf_config(_hf_config(config), name=size.model)
    tokens_per_step = size.batch * size.seq
    rates = [r["tokens_per_s"] for r in records[SKIP_STEPS:]] or [records[-1]["tokens_per_s"]]
    tokens_per_s = statistics.median(rates)
    flops = model_flops_per_token(shape, size.seq)
    return {
        "argv": argv,
        "wall_s": wall,
        "steps": len(records),
        "tokens_per_s": tokens_per_s,
        "step_s": tokens_per_step / tokens_per_s,
        "first_step_s": tokens_per_step / records[0]["tokens_per_s"],
        "mfu": flops * tokens_per_s / (peak * 1e12),
        "peak_memory_bytes": peak_memory(device),
        "losses": [r["loss"] for r in records],
        "config": config,
    }


def _hf_config(config: dict[str, Any]) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**{k: v for k, v in config.items() if k not in ("architectures", "transformers_version")})


# ----- 3. anchors ----------------------------------------------------------------------------------------------------


def run_anchor(config: dict[str, Any], size: Size, device: torch.device, compiled: bool, peak: float) -> dict[str, Any]:
    """The plain HF loop on the run's model config: eager or torch.compile(model); step time, MFU, first step."""
    from transformers import LlamaForCausalLM

    reset_memory(device)
    torch.manual_seed(0)
    hf_config = _hf_config(config)
    hf_config._attn_implementation = "sdpa"
    with device:  # built on the device: a 1.1B model's random init on a CPU takes seconds
        model = LlamaForCausalLM(hf_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    runner = torch.compile(model) if compiled else model
    ids = torch.randint(0, hf_config.vocab_size, (size.batch, size.seq), device=device)
    step: Callable[[], object] = lambda: common.train_step(runner, optimizer, ids, autocast=True)  # noqa: E731
    _, first = common.timed(step, device)
    common.repeat_seconds(step, 1, device)  # a second warm-up step
    seconds = statistics.median(common.repeat_seconds(step, size.anchor_steps, device))
    shape = TransformerShape.from_hf_config(hf_config)
    tokens_per_s = size.batch * size.seq / seconds
    result = {
        "step_s": seconds,
        "tokens_per_s": tokens_per_s,
        "first_step_s": first,
        "mfu": model_flops_per_token(shape, size.seq) * tokens_per_s / (peak * 1e12),
        "peak_memory_bytes": peak_memory(device),
    }
    return result  # the model and its optimizer's state are freed with this frame


# ----- 4. profile ----------------------------------------------------------------------------------------------------


LOSS_RANGE = "gpu_suite::loss"  # the profiler range around the loss head's forward (profile_steps)


def bucket_of(name: str, ancestors: list[str]) -> str:
    """The bucket of one profiled op by its name and the names of the ranges around it."""
    lowered = name.lower()
    if any(a.startswith("Optimizer.") for a in ancestors) or name.startswith("Optimizer."):
        return "optimizer"
    if any(a == LOSS_RANGE or "ChunkedVocabCE" in a for a in ancestors):  # the fused head + cross-entropy
        return "loss"
    if "attention" in lowered or "flash" in lowered:
        return "attention"
    if lowered.split("::")[-1] in ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "matmul"):
        return "gemm"
    if any(word in lowered for word in ("cross_entropy", "nll_loss", "log_softmax", "logsumexp")):
        return "loss"
    return "other"


def profile_steps(config: dict[str, Any], size: Size, device: torch.device) -> dict[str, Any]:
    """Where 2 steps of the engine's loop with the goldfish loss spend their time, by bucket (fractions of the
    profiled ops' self time, and seconds)."""
    from torch.profiler import ProfilerActivity, profile, record_function
    from transformers import LlamaForCausalLM

    reset_memory(device)
    torch.manual_seed(0)
    hf_config = _hf_config(config)
    hf_config._attn_implementation = "sdpa"
    with device:  # built on the device: a 1.1B model's random init on a CPU takes seconds
        model = LlamaForCausalLM(hf_config)
    generator = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(size.batch):
        ids = torch.randint(0, hf_config.vocab_size, (size.seq,), generator=generator)
        targets = torch.cat([ids[1:], torch.tensor([IGNORE_INDEX])])
        rows.append(Row(input_ids=ids, targets=targets, dropped=drop_mask(targets, "hashed", MASK.k, MASK.h)))
    loss = make_step_loss(MASK, [])
    # the loss head computes the per-token losses (engine.core.vocab_parallel: the lm_head product and cross-entropy
    # chunk by chunk); a profiler range around its forward marks them (its backward is the _ChunkedVocabCE node)
    head, ranges = model.get_output_embeddings(), []
    head.register_forward_pre_hook(lambda module, args: ranges.append(record_function(LOSS_RANGE).__enter__()))
    head.register_forward_hook(lambda module, args, output: ranges.pop().__exit__(None, None, None))

    def config_of(steps: int) -> TrainConfig:
        return TrainConfig(batch_size=size.batch, max_steps=steps, epochs=steps, precision="bf16", progress=False)

    train(model, rows, loss, config_of(1))  # warm-up: allocations, AdamW's state
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    synchronize(device)
    started = time.perf_counter()
    with profile(activities=activities) as prof:
        train(model, rows, loss, config_of(2))
        synchronize(device)
    wall = time.perf_counter() - started
    seconds = dict.fromkeys(BUCKETS, 0.0)
    for event in prof.events():
        self_us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if self_us <= 0:
            continue
        ancestors, parent = [], event.cpu_parent
        while parent is not None:
            ancestors.append(parent.name)
            parent = parent.cpu_parent
        seconds[bucket_of(event.name, ancestors)] += self_us / 1e6
    total = sum(seconds.values())
    del model
    return {
        "basis": "device self time" if cuda else "CPU self time",
        "steps": 2,
        "wall_s": wall,
        "seconds": seconds,
        "fractions": {k: (v / total if total else 0.0) for k, v in seconds.items()},
    }


# ----- 6. quick start ------------------------------------------------------------------------------------------------


def run_quickstart(size: Size, folder: Path, device: torch.device) -> dict[str, Any]:
    """`python -m goldfish compare --out DIR [size's options]` in a child process: wall time and exit status."""
    argv = [sys.executable, "-m", "goldfish", "compare", "--out", str(folder / "compare"), "--no-progress"]
    argv += [*size.compare_argv, "--device", str(device)]
    log = folder / "compare.log"
    started = time.perf_counter()
    with log.open("w") as handle:
        status = subprocess.run(argv, stdout=handle, stderr=subprocess.STDOUT, check=False).returncode
    wall = time.perf_counter() - started
    tail = log.read_text().splitlines()[-5:]
    return {"argv": argv[1:], "wall_s": wall, "exit_status": status, "log_tail": tail}


# ----- the suite -----------------------------------------------------------------------------------------------------


def timed_part(results: dict[str, Any], name: str, fn: Callable[[], dict[str, Any]]) -> None:
    """results[name] = fn() with its wall time in "part_s"; prints one line per part."""
    started = time.perf_counter()
    results[name] = fn()
    results[name]["part_s"] = time.perf_counter() - started
    print(f"[gpu_suite] {name}: {results[name]['part_s']:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tinyllama")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's peak (default: per device)")
    parser.add_argument("--keep", default=None, help="keep the runs' folders here (default: a temporary folder)")
    common.add_options(parser, device=None, out=None)
    args = common.parse(parser, argv)
    size = SIZES[args.size]
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    peak, peak_source = peak_tflops(device, args.peak_tflops)
    results: dict[str, Any] = {
        "size": args.size,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x {torch.get_num_threads()}",
        "gpu": device.type == "cuda",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "peak_tflops": peak,
        "peak_source": peak_source,
        "model": size.model,
        "seq": size.seq,
        "batch": size.batch,
        "precision": "bf16 autocast, fp32 weights and AdamW",
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.keep) if args.keep else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        timed_part(results, "masks", lambda: check_masks(device))
        tokenizer = make_tokenizer(size, folder / "tokenizer")
        timed_part(results, "train_eager", lambda: run_goldfish_train(size, folder, tokenizer, device, False, peak))
        timed_part(results, "train_compiled", lambda: run_goldfish_train(size, folder, tokenizer, device, True, peak))
        config = results["train_eager"]["config"]
        timed_part(results, "hf_eager", lambda: run_anchor(config, size, device, False, peak))
        timed_part(results, "hf_compiled", lambda: run_anchor(config, size, device, True, peak))
        timed_part(results, "profile", lambda: profile_steps(config, size, device))
        timed_part(results, "quickstart", lambda: run_quickstart(size, folder, device))
    results["wall_s"] = time.perf_counter() - started
    results["all_masks_equal"] = all(s["equal"] for s in results["masks"]["strategies"].values())
    eager, compiled = results["train_eager"], results["train_compiled"]
    results["compile_speedup"] = eager["step_s"] / compiled["step_s"]
    results["compile_s"] = compiled["first_step_s"] - eager["first_step_s"]  # first steps warm up alike
    anchors = results["hf_compiled"], results["hf_eager"]
    results["hf_compile_s"] = anchors[0]["first_step_s"] - anchors[1]["first_step_s"]
    results["within_budget"] = results["wall_s"] <= size.budget_s
    print_summary(results)
    if args.out:
        common.write_result(args.out, results, argv)
    return 0 if results["all_masks_equal"] and results["quickstart"]["exit_status"] == 0 else 1


def print_summary(results: dict[str, Any]) -> None:
    print(f"{results['model']} on {results['device']} (peak {results['peak_tflops']:.4g} Tflop/s)")
    print(f"masks equal to the CPU's: {results['all_masks_equal']}")
    print(f"{'path':>28} {'step s':>9} {'tokens/s':>11} {'MFU':>7} {'first step s':>13} {'peak GiB':>9}")
    for key, label in (
        ("train_eager", "goldfish train"),
        ("train_compiled", "goldfish train --compile"),
        ("hf_eager", "HF loop, eager"),
        ("hf_compiled", "HF loop, torch.compile"),
    ):
        r = results[key]
        memory = r["peak_memory_bytes"]
        gib = f"{memory / 2**30:.2f}" if memory is not None else "-"
        print(
            f"{label:>28} {r['step_s']:>9.4f} {r['tokens_per_s']:>11.1f} {r['mfu']:>7.1%} {r['first_step_s']:>13.2f} "
            f"{gib:>9}"
        )
    fractions = results["profile"]["fractions"]
    print("step time (" + results["profile"]["basis"] + "): " + ", ".join(f"{k} {v:.0%}" for k, v in fractions.items()))
    quick = results["quickstart"]
    print(f"quick start goldfish compare: {quick['wall_s']:.1f} s, exit {quick['exit_status']}")
    print(f"compile time: --compile {results['compile_s']:.1f} s, HF torch.compile {results['hf_compile_s']:.1f} s")
    print(f"suite wall time: {results['wall_s']:.1f} s (within budget: {results['within_budget']})")


if __name__ == "__main__":
    sys.exit(main())
