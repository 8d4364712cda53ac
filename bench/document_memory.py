"""Peak memory of `goldfish train` on a jsonl holding one very long document that is not selected.

Two runs of the same small training (micro-llama, 8 training and 4 held-out rows of 64 tokens, one epoch, the tiny
model's BPE fitted on the documents) side by side: on 80 ordinary documents, and on the same 80 plus one document of
`--mb` megabytes. What the long document adds to the peak resident memory (the kernel's ru_maxrss of each run) is
compared with 10x its size: the bound reliability asks of a document nobody trains on. The long document is still
read, counted, tokenized for the tokenizer and deduplicated; it is never held as gigabytes of encodings.

    python bench/document_memory.py                       # a 50 MB document
    python bench/document_memory.py --mb 200 --json bench/results/document_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

WORDS = ("alpha", "beta", "gamma", "delta", "river", "stone", "light", "paper", "quiet", "north", "table", "green")


def write_documents(path: Path, n_small: int, long_mb: float, seed: int) -> int:
    """Write `n_small` documents of 200 words and, when `long_mb` > 0, one of about `long_mb` MB; returns the long
    document's size in bytes (0 without one)."""
    rng = random.Random(seed)
    with path.open("w") as out:
        for i in range(n_small):
            text = " ".join(rng.choice(WORDS) + str(rng.randint(0, 99)) for _ in range(200))
            out.write(json.dumps({"id": f"d{i}", "text": text}) + "\n")
        if long_mb <= 0:
            return 0
        words, size = [], 0
        while size < long_mb * 1e6:
            word = rng.choice(WORDS) + str(rng.randint(0, 999))
            words.append(word)
            size += len(word) + 1
        text = " ".join(words)
        out.write(json.dumps({"id": "long", "text": text}) + "\n")
        return len(text.encode("utf-8"))


def peak_of_run(data: Path, out: Path, threads: int) -> tuple[float, float]:
    """(peak resident MiB, wall seconds) of one `goldfish train` in a child process."""
    command = [sys.executable, "-m", "goldfish", "train", "--out", str(out), "--data", str(data)]
    command += ["--model", "micro-llama", "--n-train", "8", "--n-heldout", "4", "--seq-len", "64", "--epochs", "1"]
    command += ["--no-progress", "--threads", str(threads)]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    error = child.stderr.read().decode() if child.stderr else ""
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"goldfish train failed ({child.returncode}): {error.strip()[-2000:]}")
    return usage.ru_maxrss / 1024, seconds  # Linux reports KiB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=50.0, help="size of the long document in MB (default 50)")
    parser.add_argument("--seed", type=int, default=0)
    common.add_options(parser, threads=1, json=None)
    args = parser.parse_args(argv)
    rows, long_bytes = {}, 0
    with tempfile.TemporaryDirectory(prefix="goldfish-document-memory-") as folder:
        base = Path(folder)
        for name, mb in (("without", 0.0), ("with", args.mb)):
            data = base / f"{name}.jsonl"
            size = write_documents(data, 80, mb, args.seed)
            long_bytes = max(long_bytes, size)
            peak, seconds = peak_of_run(data, base / f"run-{name}", args.threads)
            rows[name] = {"peak_mib": round(peak, 1), "seconds": round(seconds, 1)}
            print(f"{name:>8} the long document: peak {peak:8.1f} MiB, {seconds:6.1f} s", flush=True)
    added = rows["with"]["peak_mib"] - rows["without"]["peak_mib"]
    long_mib = long_bytes / 2**20
    ratio = added / long_mib
    verdict = "within" if ratio <= 10 else "OVER"
    print(f"the {long_mib:.1f} MiB document adds {added:.1f} MiB to the peak: {ratio:.1f}x its size ({verdict} 10x)")
    if args.json:
        common.write_result(
            args.json,
            {"long_document_mib": round(long_mib, 1), "runs": rows, "added_mib": round(added, 1), "ratio": ratio},
        )
    return 0 if ratio <= 10 else 1


if __name__ == "__main__":
    sys.exit(main())
