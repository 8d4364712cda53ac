"""--report-to tensorboard: the event files hold the scalars of metrics.jsonl."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_runs import tiny_run

from goldfish.app.tracking import check_report_to, scalars


def test_scalars_keep_numbers_only() -> None:
    record = {"step": 3, "loss": 1.5, "n_tokens": 10, "bytes_sent": {"data": 4}, "dropped_loss": None, "ok": True}
    assert scalars(record) == {"loss": 1.5, "n_tokens": 10.0}
    with pytest.raises(ValueError, match="choose one of"):
        check_report_to("wandb")


@pytest.mark.slow  # a whole `goldfish train` in a subprocess (about 15 s on a quiet 2-core CPU)
def test_tensorboard_holds_the_metrics(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), OMP_NUM_THREADS="1")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "goldfish",
            "train",
            *tiny_run(n_heldout=0, seq_len=32, vocab_size=None, epochs=2, threads=None, report_to="tensorboard"),
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == set().union(*(scalars(r) for r in records))
    for tag in ("loss", "lr", "grad_norm"):
        logged = [(e.step, e.value) for e in events.Scalars(tag)]
        # event files store float32
        assert logged == [(r["step"], pytest.approx(r[tag], rel=1e-6)) for r in records]
