"""`goldfish train --compile`: the goldfish loss and its logged figures equal the eager run's within the bound of
tests/unit/test_compile.py (float32 reductions that inductor's fused kernels add in another order: 2 * layers *
hidden * eps of each figure's magnitude, micro-llama: 2 layers, hidden 64), the run record says compile; the zero-bubble
pipeline schedule is refused in one line before any worker starts.
"""

from __future__ import annotations

import json

import pytest
import torch
from tiny_runs import tiny_run

from goldfish.app.cli import main

RUN = tiny_run(n_train=4, n_heldout=0, seq_len=32, vocab_size=320, batch_size=2, epochs=2) + [
    "--optimizer",
    "sgd",
    "--lr",
    "0.5",
]
TOL = 2 * 2 * 64 * torch.finfo(torch.float32).eps


@pytest.mark.slow
def test_compiled_run_logs_the_eager_losses(tmp_path) -> None:
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    assert main(["train", "--out", str(eager), *RUN]) == 0
    assert main(["train", "--out", str(compiled), "--compile", *RUN]) == 0
    logs = [
        [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (eager, compiled)
    ]
    assert len(logs[0]) == len(logs[1]) > 1
    for expected, actual in zip(*logs):
        for key in ("loss", "all_loss", "dropped_loss", "grad_norm"):
            assert actual[key] == pytest.approx(expected[key], rel=TOL, abs=0), (expected["step"], key)
        assert actual["n_tokens"] == expected["n_tokens"]  # the same mask: the same kept targets
    record = json.loads((compiled / "checkpoint" / "goldfish_run.json").read_text())
    assert record["train"]["compile"] is True


def test_compile_with_zero_bubble_is_refused_in_the_launcher(tmp_path, capsys) -> None:
    pipe = ["--grid", "pipe=2", "--pipe-schedule", "zero-bubble"]
    argv = ["train", "--out", str(tmp_path / "run"), "--nproc", "2", *pipe, "--compile", *RUN]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "zero-bubble with --compile is not supported" in err, err
    assert not (tmp_path / "run").exists()
