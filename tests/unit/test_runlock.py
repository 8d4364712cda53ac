"""The --out lock leaves no file behind: a run removes OUT/.goldfish.lock as it releases it, only while it is still
its own, and a taker never holds a lock file a releasing run has just unlinked."""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest

from goldfish.app import runlock
from goldfish.app.runlock import LOCK_FILE, out_lock


def test_a_released_lock_leaves_no_file_and_keeps_the_runs_files(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    with out_lock(out):
        assert (out / LOCK_FILE).exists()
        with pytest.raises(ValueError, match="in use by another goldfish run"):
            with out_lock(out):
                pass
        assert (out / LOCK_FILE).exists()  # a refused taker removes nothing
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]
    with out_lock(out):  # taken again at once
        pass
    assert not (out / LOCK_FILE).exists()


def test_a_killed_runs_leftover_lock_file_is_taken_over_and_removed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_text("")  # what a run killed with SIGKILL leaves
    (out / "run.json").write_text("{}")
    with out_lock(out):
        pass
    assert sorted(p.name for p in out.iterdir()) == ["run.json"]


def test_a_lock_file_that_is_no_longer_ours_is_left_alone(tmp_path: Path) -> None:
    """An --overwrite run swaps a new folder in over OUT while it holds OUT's lock: the file then at the lock's path
    is another's, never removed by the release."""
    out = tmp_path / "run"
    out.mkdir()
    with out_lock(out):
        (out / LOCK_FILE).unlink()
        (out / LOCK_FILE).write_text("someone else's")
    assert (out / LOCK_FILE).read_text() == "someone else's"


def test_a_taker_never_holds_a_file_a_releasing_run_unlinked(tmp_path: Path, monkeypatch) -> None:
    """The race the removal opens: B opens the lock file, A unlinks it and releases, B's flock succeeds on the
    unlinked file while C creates and locks a new one. B must notice and take the file at the path instead."""
    out = tmp_path / "run"
    out.mkdir()
    path = out / LOCK_FILE
    path.write_text("")
    flock = fcntl.flock
    raced = []

    def racing_flock(handle, operation) -> None:
        if not raced:  # between B's open and B's flock: A releases (unlink) and C takes a new file
            raced.append(True)
            path.unlink()
            holder = path.open("a")
            flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
            raced.append(holder)
        flock(handle, operation)

    monkeypatch.setattr(runlock.fcntl, "flock", racing_flock)
    with pytest.raises(ValueError, match="in use by another goldfish run"):
        with out_lock(out):
            pass
    raced[1].close()
    assert path.exists()  # C's file: the refused taker removed nothing
