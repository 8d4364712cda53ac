"""The folder a train or compare run writes: refused when it holds another run, staged under --overwrite, swapped
in when the run has finished, cleared after a settings error."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # the commands import torch, the engine and eval only when they run
    from engine import Grid


def run_folder(out: Path, *, overwrite: bool, resuming: bool) -> Path:
    """Where a train/compare run writes: `out` itself, or with --overwrite of a non-empty `out` a staging sibling
    that `publish` swaps in once the new run has finished (so nothing of the old run is touched before that).
    A non-empty `out` without --overwrite (or --resume, which continues a run in place) is refused."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder. Fix: choose a folder for --out")
    if overwrite and resuming:
        raise ValueError(
            "--overwrite and --resume exclude each other: --resume continues the run in --out, "
            "--overwrite replaces it. Fix: give only one of them"
        )
    from goldfish.app.checks import held_names, shown_names

    held = held_names(out)
    if not held or resuming:
        return out
    if not overwrite:
        shown = shown_names(held)
        resume = (
            f", continue an interrupted goldfish train with --resume {out / 'checkpoint'}"
            if (out / "checkpoint").is_dir()
            else ""
        )
        raise ValueError(
            f"--out {out} is not empty (it holds {shown}); refusing to overwrite an earlier run. Fix: "
            f"choose another --out{resume}, or replace the old run with --overwrite (it is kept until the new "
            "run has finished)"
        )
    # beside the folder the run replaces: a symlinked --out is replaced at its target and stays a link
    target = Path(os.path.realpath(out)) if out.is_symlink() else out
    staging = target.with_name(f".{target.name}.overwrite-staging")
    if int(os.environ.get("RANK", "0")) == 0:  # before start_grid: no rank writes into it before this removal
        shutil.rmtree(staging, ignore_errors=True)
    return staging


def cleared_on_settings_error(folder: Path, work: Callable[[], int], *, enabled: bool) -> int:
    """Run `work` (a new train or compare into `folder`) and return its exit status; when it ends in a settings
    error (a ValueError, or exit status 2 from --nproc workers: bad input a rank found after the launcher's checks,
    e.g. a short last step its micro-batches cannot split), first remove what it wrote, so that the corrected command
    finds the folder as it was. Only for a folder that held nothing but the lock when the run began (never a resumed
    or an earlier run's files), and only while it holds no checkpoint and no step's metrics (finished work is kept)."""
    from goldfish.app.launch import SETTINGS_ERROR_EXIT
    from goldfish.app.runlock import LOCK_FILE

    fresh = enabled and (not folder.exists() or {p.name for p in folder.iterdir()} <= {LOCK_FILE})

    def clear() -> None:
        if not fresh or not folder.is_dir():
            return
        # finished work is never removed: a checkpoint, or a step's metrics (a run stopped on a diverged loss)
        if any(folder.rglob("checkpoint")) or any(m.stat().st_size for m in folder.rglob("metrics.jsonl")):
            return
        for path in folder.iterdir():
            if path.name == LOCK_FILE:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()

    try:
        code = work()
    except ValueError:
        clear()
        raise
    if code == SETTINGS_ERROR_EXIT:
        clear()
    return code


def publish(folder: Path, out: Path, grid: Grid | None) -> None:
    """Swap a finished --overwrite staging folder in as `out` (main process only; the old run is removed last)."""
    from data.atomic import replace_directory
    from engine import is_main_process

    if folder != out and is_main_process(grid):
        replace_directory(folder, out)


def discard(folder: Path, out: Path, grid: Grid | None) -> None:
    """After a failed --overwrite run: remove its staging folder, leaving the old run as it was."""
    from engine import is_main_process

    if folder != out and is_main_process(grid):
        shutil.rmtree(folder, ignore_errors=True)
