"""Peak resident memory per rank of loading an HF safetensors checkpoint at world 4: sharded vs whole-then-slice.

    python bench/loading_memory.py --folder /tmp/goldfish_llama_1b       # makes the checkpoint if it is missing
    python bench/loading_memory.py --folder /tmp/goldfish_llama_1b --json bench/results/loading_memory_cpu.json

The checkpoint: a Llama of about 1.1B parameters (hidden 2048, 16 layers, MLP 8192, vocabulary 32,000, untied),
random bf16 weights written straight to one model.safetensors (about 2.3 GB). Each path runs in 4 fresh gloo
processes on a grid x=2, y=2 and loads in bf16:

    whole    AutoModelForCausalLM.from_pretrained(folder) on every rank, then engine.parallelize (today's path
             before engine/loading.py)
    sharded  engine.loading.load_sharded(folder, grid): meta-device build, each rank reads its own slices

Reported per rank: resident memory (ru_maxrss, which counts touched pages of the memory-mapped file too) before
loading (torch and transformers imported) and at its peak, and the bytes of parameters the rank holds afterwards.
The paths run one after the other, the sharded one first.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

CONFIG = dict(hidden_size=2048, num_hidden_layers=16, intermediate_size=8192, num_attention_heads=32,
              num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=2048)


def make_checkpoint(folder: Path) -> int:
    """Write config.json and a random bf16 model.safetensors; return the parameter count."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**CONFIG)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in LlamaForCausalLM(config).state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    tensors = {k: (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16) for k, shape in shapes.items()}
    for key in tensors:
        if key.endswith("norm.weight"):
            tensors[key] = torch.ones_like(tensors[key])
    folder.mkdir(parents=True, exist_ok=True)
    config.dtype = torch.bfloat16
    config.save_pretrained(folder)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return sum(t.numel() for t in tensors.values())


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rank(rank: int, path: str, folder: str, init_file: str, results) -> None:
    torch.set_num_threads(1)
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    import engine
    from engine.loading import load_sharded

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=4)
    grid = engine.init(x=2, y=2)
    before = _rss()
    if path == "sharded":
        model = load_sharded(folder, grid, dtype=torch.bfloat16)
    else:
        model = engine.parallelize(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16), grid)
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    results.put({"path": path, "rank": rank, "rss_before": before, "rss_peak": _rss(), "param_bytes": held})
    grid.close()
    dist.destroy_process_group()


def measure(path: str, folder: Path) -> list[dict]:
    context = mp.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [context.Process(target=_rank, args=(r, path, str(folder), os.path.join(tmp, "rdv"), results))
                 for r in range(4)]
        for p in procs:
            p.start()
        rows = [results.get(timeout=1800) for _ in procs]
        for p in procs:
            p.join()
    return sorted(rows, key=lambda r: r["rank"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", type=Path, default=Path("/tmp/goldfish_llama_1b"))
    parser.add_argument("--paths", default="sharded,whole")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not (args.folder / "model.safetensors").is_file():
        n = make_checkpoint(args.folder)
        print(f"wrote {args.folder}: {n / 1e9:.2f}B parameters, "
              f"{(args.folder / 'model.safetensors').stat().st_size / 2**30:.2f} GiB")
    size = (args.folder / "model.safetensors").stat().st_size
    rows = []
    for path in args.paths.split(","):
        rows += measure(path, args.folder)
    gib = 2**30
    print(f"checkpoint {size / gib:.2f} GiB (bf16); grid x=2, y=2")
    print(f"{'path':<8} {'rank':>4} {'RSS before GiB':>15} {'RSS peak GiB':>13} {'peak - before':>14} {'params held GiB':>16}")
    for row in rows:
        print(f"{row['path']:<8} {row['rank']:>4} {row['rss_before'] / gib:>15.2f} {row['rss_peak'] / gib:>13.2f} "
              f"{(row['rss_peak'] - row['rss_before']) / gib:>14.2f} {row['param_bytes'] / gib:>16.2f}")
    if args.json:
        args.json.write_text(json.dumps({"checkpoint_bytes": size, "config": CONFIG, "grid": {"x": 2, "y": 2},
                                         "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
