"""`--nproc N` launches: every settings error is one line on stderr and exit 2 before any worker process starts,
a worker's own error reaches the user once (not once per rank plus the launcher's traceback), and --no-progress
silences every progress bar."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tiny_runs import tiny_run

from goldfish.app.cli import main

TINY = tiny_run(n_heldout=0, seq_len=32, vocab_size=300, epochs=2)


def _one_line_error(capsys) -> str:
    """The command's stderr, asserted to be exactly one line and to come from the launching process."""
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert "launching" not in err  # no worker process was started
    return err


@pytest.mark.parametrize("command", ["train", "compare"])
@pytest.mark.parametrize(
    "settings, expected",
    [
        (["--grid", "data=2", "--zero", "1", "--offload-optimizer"], "optimizer offload needs ZeRO stage 2 or 3"),
        (["--grid", "x=2", "--zero", "2"], "has data=1"),
        (["--grid", "data=2", "--batch-size", "3"], "a step holds 3 sequences, not divisible by the world size 2"),
        (["--grid", "x=2", "--batch-size", "3"], "or share rows within each x*y group (--rows shared)"),
        (["--optimizer", "sgd", "--zero", "1"], "ZeRO stage 1 partitions AdamW's moments and SGD keeps none"),
    ],
)
def test_settings_the_workers_would_refuse_fail_in_the_launcher(command, settings, expected, tmp_path, capsys):
    argv = [command, "--out", str(tmp_path / "run"), "--nproc", "2", *TINY, *settings]
    assert main(argv) == 2
    err = _one_line_error(capsys)
    assert err.startswith(f"goldfish {command}: error: ") and expected in err, err
    assert not (tmp_path / "run").exists()


def test_missing_and_malformed_documents_fail_in_the_launcher(tmp_path, capsys):
    missing = tmp_path / "missing.jsonl"
    assert main(["train", "--out", str(tmp_path / "a"), "--nproc", "2", "--data", str(missing), *TINY]) == 2
    assert f"{missing}: no such file or folder" in _one_line_error(capsys)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\nnot json\n')
    assert main(["compare", "--out", str(tmp_path / "b"), "--nproc", "2", "--data", str(bad), *TINY]) == 2
    assert f"{bad}, line 2: malformed JSON" in _one_line_error(capsys)


def test_resume_with_other_settings_fails_in_the_launcher(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *TINY]) == 0  # a finished one-process run to continue
    capsys.readouterr()
    assert (
        main(["train", "--out", str(run), "--resume", str(run / "checkpoint"), "--nproc", "2", *TINY, "--epochs", "3"])
        == 2
    )
    err = _one_line_error(capsys)
    assert "other settings that shape the experiment" in err and "--epochs 2 -> 3" in err
    assert (
        main(
            [
                "train",
                "--out",
                str(run),
                "--resume",
                str(run / "checkpoint"),
                "--nproc",
                "2",
                *TINY,
                "--optimizer",
                "sgd",
            ]
        )
        == 2
    )
    assert "--optimizer adamw -> sgd" in _one_line_error(capsys)


def test_an_error_found_by_the_workers_is_printed_once(tmp_path):
    """3 documents at batch 2 over data=2: the launcher passes the full steps; the short last step (1 sequence) is
    refused by both workers. The user sees that error once, exit 2, and no traceback."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "goldfish",
            "train",
            "--out",
            str(tmp_path / "run"),
            "--nproc",
            "2",
            "--grid",
            "data=2",
            *TINY,
            "--n-train",
            "3",
            "--epochs",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert errors == [
        "goldfish train: error: a step holds 1 sequences, not divisible by the world size 2: choose a "
        "batch size and a document count that are multiples of 2"
    ], result.stderr
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_no_progress_silences_every_bar_and_progress_is_on_by_default(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "quiet"), *TINY, "--epochs", "1", "--save-every", "1"]) == 0
    err = capsys.readouterr().err
    assert "it/s" not in err and "Writing model shards" not in err and "%|" not in err, err
    loud = tiny_run(n_heldout=0, seq_len=32, vocab_size=300, epochs=1, no_progress=False)
    assert main(["train", "--out", str(tmp_path / "loud"), *loud]) == 0
    err = capsys.readouterr().err
    assert "train:" in err and "Writing model shards" in err  # our bar and transformers' bar
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()  # --no-progress restored the library's setting after the run
