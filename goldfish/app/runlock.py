"""One run per --out at a time: an advisory lock (fcntl.flock) on OUT/.goldfish.lock, held for the run's life.

Two runs writing into one folder would interleave metrics.jsonl and overwrite each other's checkpoint. The lock is
the kernel's: it is released when the holding process exits, however it dies (a killed run never leaves a stale
lock). Under `--nproc` the launching process holds it for its workers; under a plain torchrun, rank 0 does.

A run that ends removes the lock file while it still holds the lock, so finished run folders hold no stray
`.goldfish.lock`; a taker checks after locking that the file it locked is still the one at OUT/.goldfish.lock (not
one a releasing run has just unlinked), so two runs never hold the lock at once. A killed run leaves its empty file,
which the next run takes over.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

LOCK_FILE = ".goldfish.lock"
_TAKE_TRIES = 100  # a releasing run unlinks the file between our open and our flock: open it again


def holds_lock_here() -> bool:
    """Whether this process is the one to hold the --out lock: not a worker of an `--nproc` launcher (the launcher
    holds it), and rank 0 under a plain torchrun (one holder for all ranks)."""
    from goldfish.app.runfile import ERROR_DIR_VARIABLE  # set for the workers launch_local starts

    return ERROR_DIR_VARIABLE not in os.environ and os.environ.get("RANK", "0") == "0"


@contextmanager
def out_lock(out: Path, enabled: bool = True) -> Iterator[None]:
    """Hold the lock of run folder `out` (created if missing) while the block runs; ValueError, in one line, when
    another run holds it. The lock file is removed as the lock is released, and a folder created here that holds
    nothing else afterwards (the run failed before writing anything) is removed again. enabled False: do nothing
    (another process holds it for this run)."""
    if not enabled:
        yield
        return
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder. Fix: choose a folder for --out")
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        handle = _take(out / LOCK_FILE)
    except BlockingIOError:
        raise _in_use(out) from None
    except OSError as error:
        raise ValueError(
            f"--out {out}: cannot write there ({error.strerror}). Fix: choose a folder you can write to"
        ) from None
    try:
        yield
    finally:
        _release(handle, out / LOCK_FILE)
        if created and out.is_dir() and {p.name for p in out.iterdir()} <= {LOCK_FILE}:
            shutil.rmtree(out, ignore_errors=True)


def check_out_free(out: Path) -> None:
    """Refuse (ValueError, one line) a run folder whose lock another run holds, without taking it or writing
    anything: a command's validation asks before any work, then `out_lock` takes the lock for the work (and still
    refuses a run that took it in between)."""
    path = out / LOCK_FILE
    try:
        handle = path.open("r")  # read only: a folder that is free stays as it was
    except OSError:
        return  # no lock file (or none readable): nothing holds it, or out_lock says why it cannot take it
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released as the file is closed
    except BlockingIOError:
        raise _in_use(out) from None
    finally:
        handle.close()


def _in_use(out: Path) -> ValueError:
    return ValueError(
        f"--out {out} is in use by another goldfish run (it holds {out / LOCK_FILE}); two runs would "
        "interleave metrics.jsonl and overwrite each other's checkpoint. Fix: wait for that run to end "
        "or stop it, or choose another --out"
    )


def _same_file(handle: IO[str], path: Path) -> bool:
    """Whether `path` still names the file `handle` has open."""
    try:
        there = path.stat()
    except FileNotFoundError:
        return False
    here = os.fstat(handle.fileno())
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _take(path: Path) -> IO[str]:
    """The open, locked lock file at `path`; BlockingIOError when another process holds it, OSError when it cannot
    be written."""
    for _ in range(_TAKE_TRIES):
        handle = path.open("a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            handle.close()
            raise
        if _same_file(handle, path):
            return handle
        handle.close()  # we locked a file a releasing run had just unlinked: take the one now at `path`
    raise BlockingIOError(f"{path} kept changing while it was taken")


def _release(handle: IO[str], path: Path) -> None:
    """Remove the lock file while we still hold it (only if it is still ours: an --overwrite run may have replaced
    the folder meanwhile), then release the lock."""
    try:
        if _same_file(handle, path):
            path.unlink()
    except OSError:
        pass  # a lock file left behind is harmless: the next run takes it over
    finally:
        handle.close()  # releases the lock
