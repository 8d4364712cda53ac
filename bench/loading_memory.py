"""Peak resident memory per rank of loading an HF safetensors checkpoint at world 4: sharded vs whole-then-slice.

    python bench/loading_memory.py --folder /tmp/goldfish_llama_1b       # makes the checkpoint if it is missing
    python bench/loading_memory.py --folder /tmp/goldfish_llama_1b --json bench/results/loading_memory_cpu.json

The checkpoint: a Llama of about 1.1B parameters (hidden 2048, 16 layers, MLP 8192, vocabulary 32,000, untied),
random bf16 weights written straight to one model.safetensors (about 2.3 GB). Each path runs in 4 fresh gloo
processes on a grid x=2, y=2 and loads in bf16:

    whole    AutoModelForCausalLM.from_pretrained(folder) on every rank, then engine.parallelize (today's path
             before engine/training/loading.py)
    sharded  engine.training.loading.load_sharded(folder, grid): meta-device build, each rank reads its own slices

Reported per rank: resident memory (/proc/self/status VmRSS, which counts touched pages of the memory-mapped file
too) before loading (torch and transformers imported), and its peak while loading (VmHWM, reset just before), and
the bytes of parameters the rank holds afterwards.
The paths run one after the other, the sharded one first.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

CONFIG = dict(
    hidden_size=2048,
    num_hidden_layers=16,
    intermediate_size=8192,
    num_attention_heads=32,
    num_key_value_heads=32,
    vocab_size=32000,
    tie_word_embeddings=False,
    max_position_embeddings=2048,
)


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


def _status(field: str) -> int:
    """A byte count of /proc/self/status (VmRSS: resident now; VmHWM: its peak since the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


class _Sampler:
    """Peak anonymous (private) and file-backed resident memory, sampled every 5 ms in a thread: VmHWM alone mixes
    the two, and pages of a memory-mapped checkpoint count as resident while touched."""

    def __init__(self) -> None:
        import threading

        self.peak = {"RssAnon": 0, "RssFile": 0}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for field in self.peak:
                self.peak[field] = max(self.peak[field], _status(field))
            self.stop.wait(0.005)

    def finish(self) -> dict[str, int]:
        self.stop.set()
        self.thread.join()
        return self.peak


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM := VmRSS (ru_maxrss cannot be reset)


def _rank(rank: int, path: str, folder: str, init_file: str, results, dtype_name: str = "bfloat16") -> None:
    torch.set_num_threads(1)
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    import engine
    from engine.core.placement import local_shard
    from engine.training.loading import load_sharded

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=4)
    grid = engine.init(x=2, y=2)
    before = _status("VmRSS")
    anon_before = _status("RssAnon")
    _reset_peak()
    sampler = _Sampler()
    if path == "sharded":
        model = load_sharded(folder, grid, dtype=getattr(torch, dtype_name))
    else:
        model = engine.parallelize(AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype_name)), grid)
    held = sum(local_shard(p).numel() * p.element_size() for p in model.parameters())  # this rank's shards
    peak = _status("VmHWM")
    sampled = sampler.finish()
    results.put(
        {
            "path": path,
            "rank": rank,
            "rss_before": before,
            "rss_peak": peak,
            "param_bytes": held,
            "anon_before": anon_before,
            "anon_peak": sampled["RssAnon"],
            "file_peak": sampled["RssFile"],
        }
    )
    grid.close()
    dist.destroy_process_group()


def measure(path: str, folder: Path, dtype_name: str = "bfloat16") -> list[dict]:
    context = mp.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            context.Process(target=_rank, args=(r, path, str(folder), os.path.join(tmp, "rdv"), results, dtype_name))
            for r in range(4)
        ]
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
    parser.add_argument("--dtype", default="bfloat16", help="dtype the model is loaded in (the app loads float32)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not (args.folder / "model.safetensors").is_file():
        n = make_checkpoint(args.folder)
        print(
            f"wrote {args.folder}: {n / 1e9:.2f}B parameters, "
            f"{(args.folder / 'model.safetensors').stat().st_size / 2**30:.2f} GiB"
        )
    size = (args.folder / "model.safetensors").stat().st_size
    rows = []
    for path in args.paths.split(","):
        rows += measure(path, args.folder, args.dtype)
    gib = 2**30
    print(f"checkpoint {size / gib:.2f} GiB (bf16), loaded as {args.dtype}; grid x=2, y=2")
    print(
        f"{'path':<8} {'rank':>4} {'RSS before':>10} {'RSS peak':>9} {'anon peak - before':>19} "
        f"{'file-backed peak':>17} {'params held':>12}   (GiB)"
    )
    for row in rows:
        print(
            f"{row['path']:<8} {row['rank']:>4} {row['rss_before'] / gib:>10.2f} {row['rss_peak'] / gib:>9.2f} "
            f"{(row['anon_peak'] - row['anon_before']) / gib:>19.2f} {row['file_peak'] / gib:>17.2f} "
            f"{row['param_bytes'] / gib:>12.2f}"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "checkpoint_bytes": size,
                    "config": CONFIG,
                    "dtype": args.dtype,
                    "grid": {"x": 2, "y": 2},
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
