"""The CPU thread count a run chooses without --threads (goldfish.app.threads), and bench/threads.py kept alive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from goldfish.app.launch import worker_environment
from goldfish.app.threads import (
    ThreadChoice,
    choose_threads,
    decide_threads,
    free_cores,
    usable_cores,
    wait_policy_environment,
)

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize(
    "usable, free, expected",
    [
        (2, 2.0, 2),  # quiet
        (2, 1.8, 2),  # a little background noise still leaves two cores
        (2, 1.6, 1),  # a core more than a quarter taken: one thread fewer
        (2, 1.0, 1),
        (2, 0.0, 1),  # every core taken: one thread, never zero
        (8, 5.3, 5),
        (8, 5.8, 6),
        (4, 9.0, 4),  # never more than the usable cores
    ],
)
def test_threads_follow_the_free_cores(usable, free, expected):
    assert choose_threads(usable, free) == expected


def test_an_explicit_choice_wins_and_omp_num_threads_is_left_to_torch():
    assert decide_threads(3, {"OMP_NUM_THREADS": "1"}, usable=2, free=0.0) == ThreadChoice(3, 3, "--threads")
    omp = decide_threads(None, {"OMP_NUM_THREADS": "4"}, usable=2, free=2.0)
    assert omp.threads is None and omp.line() == "threads: 4 (OMP_NUM_THREADS=4)"


def test_the_choice_is_one_line_naming_the_free_cores():
    busy = decide_threads(None, {}, usable=2, free=0.1)
    assert busy.threads == 1 and busy.line() == "threads: 1 (0.1 of 2 cores free; --threads N to set)"
    assert decide_threads(None, {}, usable=2, free=None).threads == 2  # load unknown: torch's default
    assert decide_threads(None, {}, usable=1, free=None).threads == 1


def test_free_cores_counts_at_most_the_usable_ones():
    free = free_cores(0.05)
    assert free is None or 0.0 <= free <= usable_cores() + 1e-9


def test_passive_wait_policy_on_a_busy_machine_unless_the_user_chose_one():
    environ: dict[str, str] = {}
    wait_policy_environment(environ)
    assert environ == {"OMP_WAIT_POLICY": "PASSIVE"}
    environ = {"OMP_WAIT_POLICY": "ACTIVE"}
    wait_policy_environment(environ)
    assert environ == {"OMP_WAIT_POLICY": "ACTIVE"}
    environ = {}
    wait_policy_environment(environ, busy=False)  # an idle machine keeps OpenMP's spinning wait: faster there
    assert environ == {}


def test_workers_get_one_passive_thread_each(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    env = worker_environment(2, 29500, tmp_path)
    assert env["OMP_NUM_THREADS"] == "1" and env["OMP_WAIT_POLICY"] == "PASSIVE"


def test_the_command_sets_the_wait_policy_before_torch_loads():
    """The entry point's first lines leave OMP_WAIT_POLICY for libgomp, before anything has loaded torch."""
    code = (
        "import os, sys\nfrom goldfish.app import entry, threads\nthreads.machine_is_busy = lambda: True\n"
        "try:\n    entry.main(['train', '--help'])\n"
        "except SystemExit:\n    pass\nprint(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "PASSIVE False", done.stderr


@pytest.mark.slow
def test_bench_threads_runs_at_tiny_size(tmp_path):
    """bench/threads.py end to end on the micro model, one round, a short load (keeps it from rotting)."""
    out = tmp_path / "threads.json"
    argv = ["--model", "micro-llama", "--epochs", "1", "--rounds", "1", "--load-seconds", "60", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "threads.py"), *argv], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    figures = json.loads(out.read_text())
    for condition in ("quiet", "loaded"):
        assert set(figures[condition]["step_ms"]) == {"default", "1", "2", "old-default"}
        assert all(ms > 0 for ms in figures[condition]["step_ms"].values())
    assert "threads:" in figures["loaded"]["default_line"]


def test_only_a_count_the_command_chose_is_printed(capsys, monkeypatch):
    import torch

    from goldfish.app.threads import apply_threads

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        assert apply_threads(1).threads == 1 and capsys.readouterr().err == ""  # --threads 1: said by the user
        chosen = apply_threads(None)
        said = capsys.readouterr().err
        assert said.startswith(chosen.line() + "; ") and said.count("\n") == 1, said
        assert torch.get_num_threads() == chosen.threads
        assert apply_threads(None, report=False) and capsys.readouterr().err == ""  # not the first rank
    finally:
        torch.set_num_threads(before)
