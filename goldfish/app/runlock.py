"""One run per --out at a time: an advisory lock (fcntl.flock) on OUT/.goldfish.lock, held for the run's life.

Two runs writing into one folder would interleave metrics.jsonl and overwrite each other's checkpoint. The lock is
the kernel's: it is released when the holding process exits, however it dies (a killed run never leaves a stale
lock). Under `--nproc` the launching process holds it for its workers; under a plain torchrun, rank 0 does.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

LOCK_FILE = ".goldfish.lock"


def holds_lock_here() -> bool:
    """Whether this process is the one to hold the --out lock: not a worker of an `--nproc` launcher (the launcher
    holds it), and rank 0 under a plain torchrun (one holder for all ranks)."""
    from goldfish.app.launch import ERROR_DIR_VARIABLE  # set for the workers launch_local starts

    return ERROR_DIR_VARIABLE not in os.environ and os.environ.get("RANK", "0") == "0"


@contextmanager
def out_lock(out: Path, enabled: bool = True) -> Iterator[None]:
    """Hold the lock of run folder `out` (created if missing) while the block runs; ValueError, in one line, when
    another run holds it. A folder created here that holds nothing but the lock afterwards (the run failed before
    writing anything) is removed again. enabled False: do nothing (another process holds it for this run)."""
    if not enabled:
        yield
        return
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder. Fix: choose a folder for --out")
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        handle = (out / LOCK_FILE).open("a")
    except OSError as error:
        raise ValueError(
            f"--out {out}: cannot write there ({error.strerror}). Fix: choose a folder you can write to"
        ) from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(
                f"--out {out} is in use by another goldfish run (it holds {out / LOCK_FILE}); two runs would "
                "interleave metrics.jsonl and overwrite each other's checkpoint. Fix: wait for that run to end "
                "or stop it, or choose another --out"
            ) from None
        yield
    finally:
        handle.close()  # releases the lock
        if created and out.is_dir() and {p.name for p in out.iterdir()} <= {LOCK_FILE}:
            shutil.rmtree(out, ignore_errors=True)
