"""The toolkit's packages are named `data`, `eval` and `engine`: a folder or module of that name where the user runs
`goldfish` must never be imported in their place. `--nproc` workers start with the working directory off their
import path (goldfish.app.launch.worker_argv), and `python -m goldfish`, which puts the working directory first, is
refused in one line before it imports anything of the toolkit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_runs import tiny_run

from goldfish.app.cli import main

TINY = tiny_run(n_heldout=2, seq_len=32, vocab_size=300, epochs=1, dedup="off")


def _hostile_folder(folder: Path) -> Path:
    """A working directory with a plain `data/` folder (most ML projects have one) and an `eval` package whose
    import writes a marker file; returns the marker's path (which must never appear)."""
    marker = folder / "impostor-ran"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "train.txt").write_text("a user's own data\n")
    (folder / "eval").mkdir()
    (folder / "eval" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    return marker


@pytest.mark.slow
def test_train_and_eval_with_nproc_ignore_the_working_directorys_data_and_eval(tmp_path, monkeypatch):
    marker = _hostile_folder(tmp_path / "project")
    monkeypatch.chdir(tmp_path / "project")
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), "--nproc", "2", *TINY]) == 0
    assert (run / "checkpoint" / "model.safetensors").exists()
    out = tmp_path / "eval"
    eval_options = ["--suffix-len", "8", "--no-progress", "--threads", "1", "--nproc", "2"]
    assert main(["eval", "--model", str(run / "checkpoint"), "--out", str(out), *eval_options]) == 0
    assert (out / "summary.json").exists()
    assert not marker.exists(), "a worker imported the working directory's eval package"


def test_python_dash_m_goldfish_in_a_folder_that_shadows_the_toolkit_is_one_line(tmp_path):
    marker = _hostile_folder(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "goldfish", "train", "--out", str(tmp_path / "run")],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("goldfish: error: the module 'data' would be imported from"), lines
    assert "run the installed `goldfish` command" in lines[0]
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_an_eval_module_beside_the_toolkit_is_named_in_the_refusal(tmp_path):
    (tmp_path / "eval.py").write_text("raise SystemExit('the impostor ran')\n")
    done = subprocess.run(
        [sys.executable, "-m", "goldfish", "mask", "--text", "hello"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert f"the module 'eval' would be imported from {tmp_path.resolve() / 'eval.py'}" in done.stderr
    assert "impostor" not in done.stderr


def test_a_worker_started_in_a_hostile_folder_imports_only_the_toolkit(tmp_path):
    """A worker, started as the launcher starts it, in a folder with `data/` and a marker-writing `eval/`: it
    imports the whole application (goldfish.app.cli, which imports data, eval and engine), then refuses the missing
    run file in its own words; with the working directory on its path it would die on `data` or run `eval`."""
    from goldfish.app.launch import worker_argv

    marker = _hostile_folder(tmp_path)
    missing = tmp_path / "no-run.json"
    done = subprocess.run(
        [sys.executable, *worker_argv(missing)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("goldfish worker: error:") and "no-run.json" in done.stderr, done.stderr
    assert not marker.exists()
