"""The largest value each integer option takes (goldfish.app.options applies them as the command line is parsed)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Callable, Mapping

# The largest value each integer option takes, checked as the command line is parsed (one line, exit 2, before any
# work): far above any run this toolkit makes, low enough that a typo (an extra digit, a pasted id) cannot make a run
# allocate memory or loop for days before anything is printed. Keyed by field: --epochs, --seed, ... alike.
_MILLION = 1_000_000
_BILLION = 1_000_000_000
SEED_MOST = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit seed
COUNT_MOST: Mapping[str, int] = MappingProxyType(
    {
        "n_train": 10 * _MILLION,
        "n_heldout": 10 * _MILLION,
        "seq_len": 2**20,  # tokens per row
        "vocab_size": 2**20,
        "extract_len": 2**20,
        "min_doc_tokens": _BILLION,
        "max_doc_tokens": _BILLION,
        "val_tokens": 100 * _BILLION,
        "tokenize_workers": 1024,
        "k": _MILLION,
        "h": 2**16,
        "epochs": _MILLION,
        "batch_size": 2**20,
        "grad_accum": 2**20,
        "warmup_steps": _BILLION,
        "save_every": _BILLION,
        "max_steps": _BILLION,
        "eval_every": _BILLION,
        "zero_quantize_block": 2**20,
        "microbatches": 2**16,
        "pipe_virtual": 1024,
        "suffix_len": 2**20,
        "prefix_len": 2**20,
        "bootstrap": _MILLION,
        "beams": 128,  # each beam keeps its own KV cache: 128 beams of a 32-document batch is 4,096 sequences
        "samples": 10_000,
        "rank": 2**16,
        "threads": 4096,
        "nproc": 1024,
        "init_seed": SEED_MOST,
        "seed": SEED_MOST,
        "sample_seed": SEED_MOST,
    }
)


def at_most(parse: Callable[[str], int], most: int) -> Callable[[str], int]:
    """`parse` (an integer option's parser), refusing values above `most` with a message naming the bound."""

    def bounded(text: str) -> int:
        try:
            value = parse(text)
        except ValueError as error:
            digits = text.strip().lstrip("+")
            if digits.isdigit() and len(digits) > len(str(most)):  # int() refuses over 4,300 digits
                raise ValueError(f"must be at most {most:,}, got a number of {len(digits):,} digits") from None
            raise ValueError(f"expected an integer, got {text!r}" if parse is int else str(error)) from None
        if value > most:
            raise ValueError(f"must be at most {most:,}, got {value:,}")
        return value

    return bounded
