"""The corpus data pipeline: tokenization and row-building speed, peak memory at two corpus sizes 10x apart, and the
share of a training step spent waiting for rows.

Two background corpora are written as JSON lines from the Python standard library's source (documents of about
2,000 characters; the large one holds 10x the documents of the small one). For each:

    tokenize   tokens/s of `data.corpus.tokenize_corpus` into a fresh cache (batched map, --workers processes)
    rows       tokens/s of building packed rows with goldfish masks (data.background, hashed k=4 h=13)
    peak       peak resident memory (MiB) of `goldfish train --background FILE --max-steps 3` in its own process
               (tokenizer trained, corpus tokenized from the cache, 3 steps of tiny-llama)

and, on the large corpus, the share of `--steps` training steps of the tiny model spent building rows (the engine
reads rows in its own thread: the time in the rows' __getitem__ over the step's wall time).

    python bench/data_pipeline.py --out bench/results/data_pipeline.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import common  # noqa: E402


def write_corpus(path: Path, n_docs: int, chars: int = 2000) -> int:
    """n_docs documents of `chars` characters cut from the standard library's source (cycled when it runs out)."""
    from data.corpus import stdlib_files

    written = 0
    with path.open("w") as handle:
        while written < n_docs:
            for file in stdlib_files():
                text = file.read_text(encoding="utf-8", errors="replace")
                for start in range(0, len(text) - chars + 1, chars):
                    # the cycle number keeps repeated passes distinct texts
                    handle.write(
                        json.dumps({"text": f"# pass {written // 10**6}\n" + text[start : start + chars]}) + "\n"
                    )
                    written += 1
                    if written == n_docs:
                        return written
    return written


def peak_memory_mib(corpus: Path, out: Path) -> float:
    """Peak RSS of a 3-step `goldfish train --background` run in a child process (it reports its own peak)."""
    code = (
        "import resource, sys; from goldfish.app.cli import main; code = main(sys.argv[1:]); "
        "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024); sys.exit(code)"
    )
    command = [
        sys.executable,
        "-c",
        code,
        "train",
        "--background",
        str(corpus),
        "--max-steps",
        "3",
        "--seq-len",
        "256",
        "--batch-size",
        "8",
        "--n-train",
        "4",
        "--n-heldout",
        "2",
        "--pack",
        "--max-doc-tokens",
        "400",
        "--no-progress",
        "--out",
        str(out),
        "--overwrite",
        "--cache-dir",
        str(out.parent / "cache"),  # beside the run, never the user's cache
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return float(next(line.split()[1] for line in result.stdout.splitlines() if line.startswith("PEAK")))


def measure(corpus: Path, workers: int, tokenizer, steps: int | None) -> dict:
    import torch

    from data.background import build_background
    from data.corpus import tokenize_corpus
    from engine.training import train as engine_train
    from goldfish.app.config import DataSpec, MaskSpec
    from goldfish.app.data_settings import background_spec, row_mask
    from goldfish.app.models import build_tiny_model
    from goldfish.app.training_rows import make_step_loss

    with tempfile.TemporaryDirectory() as cache:
        started = time.perf_counter()
        tokenized = tokenize_corpus(str(corpus), tokenizer, workers=workers, cache_dir=cache, progress=False)
        tokenize_s = time.perf_counter() - started
        spec = DataSpec(background=str(corpus), seq_len=256, val_tokens=0)
        train = engine_train.TrainConfig(batch_size=8, shuffle=False, progress=False, max_steps=steps or 0)
        special = sorted(set(tokenizer.all_special_ids))
        mask = MaskSpec("hashed", 4, 13)
        settings, rows_mask = background_spec(spec), row_mask(mask, special)
        background = build_background(settings, tokenized, [], [], tokenizer, rows_mask, train, tokenizer.pad_token_id)
        rows = background.rows
        n_rows = min(400, len(rows))
        started = time.perf_counter()
        for row in range(n_rows):
            rows[row]
        rows_s = time.perf_counter() - started
        result = {
            "n_documents": len(tokenized),
            "n_tokens": tokenized.n_tokens,
            "tokenize_tokens_per_s": round(tokenized.n_tokens / tokenize_s),
            "rows_tokens_per_s": round(n_rows * spec.seq_len / rows_s),
        }
        if steps:
            waited = [0.0]

            class Timed(torch.utils.data.Dataset):
                def __len__(self):
                    return len(rows)

                def __getitem__(self, index):
                    t0 = time.perf_counter()
                    try:
                        return rows[index]
                    finally:
                        waited[0] += time.perf_counter() - t0

            model = build_tiny_model(
                "tiny-llama",
                vocab_size=len(tokenizer),
                max_positions=256,
                seed=0,
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
            started = time.perf_counter()
            engine_train.train(model, Timed(), make_step_loss(mask, special), train)
            total = time.perf_counter() - started
            result |= {
                "train_steps": steps,
                "train_s": round(total, 2),
                "data_wait_s": round(waited[0], 3),
                "data_wait_share": round(waited[0] / total, 4),
            }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small-docs", type=int, default=600, help="documents of the small corpus (large: 10x)")
    parser.add_argument("--workers", type=int, default=2, help="tokenization processes")
    parser.add_argument("--steps", type=int, default=20, help="training steps for the data-wait share")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args()

    import data

    tokenizer = data.train_bpe_tokenizer((d.text for d in data.default_corpus()), vocab_size=2048)
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, n_docs in (("small", args.small_docs), ("large", 10 * args.small_docs)):
            corpus = Path(folder) / f"{name}.jsonl"
            write_corpus(corpus, n_docs)
            results[name] = measure(corpus, args.workers, tokenizer, args.steps if name == "large" else None)
            results[name]["peak_rss_mib"] = round(peak_memory_mib(corpus, Path(folder) / f"run-{name}"), 1)
            results[name]["corpus_mib"] = round(corpus.stat().st_size / 2**20, 2)
            print(name, json.dumps(results[name]), flush=True)
    results["peak_ratio_large_over_small"] = round(
        results["large"]["peak_rss_mib"] / results["small"]["peak_rss_mib"], 3
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    results["machine"] = {
        "cpus": os.cpu_count(),
        "threads": __import__("torch").get_num_threads(),
        "max_rss_of_this_script_mib": round(peak),
    }
    print(json.dumps(results, indent=2))
    if args.out:
        common.write_result(args.out, results)


if __name__ == "__main__":
    main()
