"""What a careless or hostile user meets: a killed `--nproc` launcher, the launcher's sockets, the permissions of
outputs, argparse's errors, bad values that used to end in a traceback, silent skips of data files, background
caches, and `goldfish eval` into a used folder. Each case is refused in one line (exit 2) or handled as documented.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from goldfish.app.cli import main

TINY = [
    "--model",
    "micro-llama",
    "--n-train",
    "4",
    "--n-heldout",
    "0",
    "--seq-len",
    "32",
    "--vocab-size",
    "300",
    "--batch-size",
    "2",
    "--no-progress",
    "--threads",
    "1",
]

LONG = ["--epochs", "100000", "--dedup", "off"]
LINUX = sys.platform.startswith("linux")
_LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def _children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for its new parent to reap it has ended)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _listening(pids: list[int]) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) of the TCP sockets the processes listen on."""
    inodes = set()
    for pid in pids:
        for fd in (Path("/proc") / str(pid) / "fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    addresses = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                addresses.append(fields[1].split(":")[0])
    return addresses


def _start_long_run(out: Path) -> subprocess.Popen:
    """`goldfish train --nproc 2` for far longer than a test waits, in its own process group; returns once both
    workers have trained a step (metrics.jsonl has a line)."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "goldfish", "train", "--out", str(out), "--nproc", "2", *TINY, *LONG],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip():
        if launcher.poll() is not None:
            pytest.fail(f"the run ended early: {launcher.stderr.read().decode()[-3000:]}")
        if time.monotonic() > deadline:
            os.killpg(launcher.pid, signal.SIGKILL)
            pytest.fail("the workers did not train a step in 300 s")
        time.sleep(0.2)
    return launcher


def _assert_workers_die(workers: list[int], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [pid for pid in workers if _alive(pid)]
    for pid in survivors:  # do not leave them training on a failed test
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"workers {survivors} outlived their launcher by {seconds} s"


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_a_launcher_killed_with_sigkill_takes_its_workers_and_listens_on_loopback_only(tmp_path):
    launcher = _start_long_run(tmp_path / "run")
    workers = _children(launcher.pid)
    assert len(workers) == 2, workers
    # the store the workers meet in, and every socket the workers listen on, are reachable from this machine only
    addresses = _listening([launcher.pid])
    assert addresses and set(addresses) <= _LOOPBACK, addresses
    assert set(_listening(workers)) <= _LOOPBACK, _listening(workers)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    _assert_workers_die(workers)


@pytest.mark.skipif(not LINUX, reason="reads /proc")
def test_a_launcher_whose_process_group_is_killed_takes_its_workers(tmp_path):
    launcher = _start_long_run(tmp_path / "run")
    workers = _children(launcher.pid)
    assert len(workers) == 2, workers
    os.killpg(launcher.pid, signal.SIGKILL)  # what a scheduler or a terminal does to a job
    launcher.wait()
    _assert_workers_die(workers)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["train", "--out", "o", "--repeats", "1,x"], "goldfish train: error: --repeats: cannot parse repeats '1,x'"),
        (["train", "--out", "o", "--k", "x"], "goldfish train: error: --k: expected an integer, got 'x'"),
        (["train", "--out", "o", "--lr", "fast"], "goldfish train: error: --lr: expected a number, got 'fast'"),
        (["eval", "--model", "m", "--out", "o", "--prefix-lengths", "1,a"], "goldfish eval: error: --prefix-lengths:"),
        (["train", "--out", "o", "--threads", "-1"], "goldfish train: error: --threads: must be >= 1, got -1"),
        (["compare", "--nproc", "0"], "goldfish compare: error: --nproc: must be >= 1, got 0"),
        (["train", "--out", "o", "--strategy", "nope"], "goldfish train: error: --strategy: invalid choice: 'nope'"),
        (["eval", "--out", "o"], "goldfish eval: error: the following arguments are required: --model"),
        (["plan", "--gpus", "x"], "goldfish plan: error: --gpus: expected an integer, got 'x'"),
    ],
)
def test_argparse_errors_are_one_line_naming_the_option_without_python_names(argv, expected, capsys):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2
    err = _one_line(capsys)
    assert err.startswith(expected), err
    assert err.endswith(f"(see goldfish {argv[0]} --help)"), err
    assert "usage:" not in err and "parse_" not in err and "<lambda>" not in err, err


def test_outputs_take_the_users_umask(tmp_path):
    """Every file of a run, the atomically written ones (run.json, checkpoint files) included, is 0666 less the
    umask: 0640 under umask 027, not mkstemp's 0600."""
    old = os.umask(0o027)
    try:
        assert main(["train", "--out", str(tmp_path / "run"), *TINY, "--epochs", "1", "--dedup", "off"]) == 0
    finally:
        os.umask(old)
    modes = {str(p.relative_to(tmp_path)): p.stat().st_mode & 0o777 for p in tmp_path.rglob("*") if p.is_file()}
    assert "run/run.json" in modes and "run/checkpoint/model.safetensors" in modes, sorted(modes)
    assert set(modes.values()) == {0o640}, {name: oct(mode) for name, mode in modes.items()}
