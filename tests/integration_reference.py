"""The `goldfish train` run that the Lightning, HF Trainer and accelerate examples are compared with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_runs import tiny_run

# Small enough for a loaded 2-core machine: 4 optimizer steps of 8 sequences of 32 tokens, 2 micro-batches each.
# SGD, so that final weights differ exactly as much as the gradients did (AdamW's first steps move a weight by about
# lr whatever its gradient, so a weight whose gradient nearly cancels lands a CPU-dependent fraction of lr away);
# lr 0.5 moves the weights by about 1 in norm per step (gradient norms 1.4-2.2), so a wrong gradient shows. The
# clipping threshold 100 never engages (the norm is still computed and logged by every loop): an engaged clip
# coefficient would carry the norm's rounding (2e-5 relative on x=2) into every weight.
SETTINGS = tiny_run(
    n_train=8,
    n_heldout=4,
    seq_len=32,
    vocab_size=None,
    batch_size=8,
    epochs=4,
    no_progress=False,  # the example scripts take the run's settings, not the CLI's display options
    threads=None,
    grad_accum=2,
    strategy="hashed",
    k=4,
    h=13,
    optimizer="sgd",
    lr=0.5,
    max_grad_norm=100,
)
KEYS = ("loss", "all_loss", "dropped_loss", "grad_norm")


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def assert_same_losses(
    run: list[dict], expected: list[dict], *, keys: tuple[str, ...] = KEYS, exact: bool = False
) -> None:
    """Equal per step: exactly, or to float32 rounding.

    The gradient norm drifts most on a tensor-parallel grid (3.5e-6 relative at step 1 on x=2, where
    `goldfish train --nproc 2 --grid x=2` logs the very same norm as the examples, so the drift is the
    engine's products and sums split over shards, not the integration's).
    """
    assert [r["step"] for r in run] == [r["step"] for r in expected]
    for got, want in zip(run, expected):
        for key in keys:
            if exact:
                assert got[key] == want[key], (got["step"], key)
            else:
                rel = 2e-5 if key == "grad_norm" else 2e-6
                assert got[key] == pytest.approx(want[key], rel=rel, abs=1e-6), (got["step"], key, got, want)


def assert_same_weights(folder: Path, reference_checkpoint: Path) -> None:
    """The HF folder holds the reference run's final weights, to float32 rounding through 4 SGD steps.

    Each step moves a weight by lr x its gradient, so two runs' weights differ by lr x their summed gradient
    differences: float32 rounding of the split products and sums, ~1e-7 of a weight's total update (at most 0.2,
    lm_head). 1e-6 holds on any CPU, while a gradient wrong by 1% in any tensor moves it by more: the smallest
    total update of a tensor in this run is 1.7e-4 (layer 1's q_proj), so 1% of it is 1.7e-6."""
    import torch
    from transformers import AutoModelForCausalLM

    got = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    want = AutoModelForCausalLM.from_pretrained(reference_checkpoint).state_dict()
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-6, msg=key)
