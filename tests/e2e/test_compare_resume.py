"""`goldfish compare --seeds ... --resume`: a seed that finished is read back instead of trained again, an unfinished
one runs, and the combination equals the uninterrupted run's; a seed of other settings is run again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_runs import tiny_run

from goldfish.app.cli import main

SETTINGS = tiny_run(n_train=4, n_heldout=2, epochs=3, repeats="1,2", suffix_len=16, bootstrap=20, seeds="0,1")


def _combined(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    return {key: summary[key] for key in ("combined", "per_seed", "seeds", "documents")}


@pytest.mark.slow  # three tiny two-seed comparisons: about 25 s
def test_resume_reads_back_finished_seeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole = tmp_path / "whole"
    assert main(["compare", *SETTINGS, "--out", str(whole)]) == 0
    # the same run, stopped after seed 0: seed 1's folder holds no summary (it is written last)
    cut = tmp_path / "cut"
    assert main(["compare", *SETTINGS, "--out", str(cut)]) == 0
    (cut / "seed-1" / "summary.json").unlink()
    (cut / "summary.json").unlink()
    seed0_report = (cut / "seed-0" / "report.md").read_text()
    capsys.readouterr()
    assert main(["compare", *SETTINGS, "--resume", "--out", str(cut)]) == 0
    log = capsys.readouterr().out
    assert "seed 0 (1 of 2): finished in OUT/seed-0, read back" in log
    assert "seed 1 (2 of 2): OUT/seed-1" in log
    assert _combined(cut) == _combined(whole)
    assert (cut / "seed-0" / "report.md").read_text() == seed0_report  # written again from the same rows
    # other settings: no seed is finished for them, both run again
    capsys.readouterr()
    assert main(["compare", *SETTINGS, "--lr", "0.002", "--resume", "--out", str(cut)]) == 0
    assert "read back" not in capsys.readouterr().out
