"""The command-line settings of the smallest `goldfish train` run the CLI tests start (micro-llama, 4 training
documents of 48 tokens, a 320-token vocabulary): one list, which each test file extends with what it varies."""

from __future__ import annotations

TINY_RUN = [
    "--model",
    "micro-llama",
    "--n-train",
    "4",
    "--n-heldout",
    "2",
    "--seq-len",
    "48",
    "--vocab-size",
    "320",
    "--batch-size",
    "2",
    "--no-progress",
    "--threads",
    "1",
]
