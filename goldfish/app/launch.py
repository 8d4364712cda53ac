"""`--nproc N`: run a goldfish command again in N local worker processes, and report a failure in one line.

The workers are started by torch's elastic launcher (what `torchrun --standalone` runs), called as a library so
that a failed run ends with the failing worker's own one-line error, printed once, instead of one copy per rank
plus the launcher's traceback. A worker started here writes its error line (and, for an unexpected exception, its
traceback) into a folder named by GOLDFISH_ERROR_DIR and exits without printing it; the launcher reads it back.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

ERROR_DIR_VARIABLE = "GOLDFISH_ERROR_DIR"
SETTINGS_ERROR_EXIT = 2  # bad input (a ValueError): the launcher also exits with 2
CRASH_EXIT = 1


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Set environment variables for the worker processes started inside, and restore the old values after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def _quiet_elastic_logs() -> Iterator[None]:
    """The elastic agent logs every worker failure with its own traceback at ERROR level; the launcher reports the
    failure itself, so those records are held back while it runs (the logger's level is restored after)."""
    logger = logging.getLogger("torch.distributed.elastic")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def launch_local(argv: Sequence[str], nproc: int, command: str) -> int:
    """Run `python -m goldfish <argv>` in `nproc` local processes (gloo on CPU, NCCL on GPUs) and wait for them.

    Returns 0 when every worker succeeded; otherwise prints `goldfish <command>: error: <the failing worker's
    error>` once on stderr and returns 2 for a settings error, 1 for a crash."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    error_dir = Path(tempfile.mkdtemp(prefix="goldfish-workers-"))
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"goldfish-{os.getpid()}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
    )
    # One thread per worker unless the user chose (torchrun's default too): N workers on N cores otherwise
    # oversubscribe them.
    threads = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    print(f"launching {nproc} processes: {sys.executable} -m goldfish {' '.join(argv)}", file=sys.stderr)
    try:
        with _environment(**{ERROR_DIR_VARIABLE: str(error_dir)}, **threads), _quiet_elastic_logs():
            elastic_launch(config, sys.executable)("-m", "goldfish", *argv)
    except ChildFailedError as failed:
        message, code = _failure_report(failed, error_dir)
        print(f"goldfish {command}: error: {message}", file=sys.stderr)
        return code
    else:
        shutil.rmtree(error_dir, ignore_errors=True)
    return 0


def _failure_report(failed, error_dir: Path) -> tuple[str, int]:
    """The one line that explains a failed launch, and the exit code.

    A worker killed by a signal (not the launcher's own SIGTERM) is the cause whatever its peers wrote after it
    vanished. Otherwise a settings error (every rank usually finds the same) is reported from the lowest rank that
    found it, and any other error from the rank that wrote first: a crash on one rank makes its peers fail
    afterwards on a closed connection."""
    lines = {int(path.stem.removeprefix("rank")): path for path in error_dir.glob("rank*.txt")}
    killed = [
        rank
        for rank, failure in failed.failures.items()
        if failure.exitcode < 0 and failure.signal_name() != "SIGTERM" and rank not in lines
    ]
    if lines and not killed:
        settings = [rank for rank in lines if (error_dir / f"rank{rank}.settings").exists()]
        rank = min(settings) if settings else min(lines, key=lambda r: (lines[r].stat().st_mtime_ns, r))
        texts = {path.read_text().strip() for path in lines.values()}
        where = "" if len(texts) == 1 and len(lines) > 1 else f"rank {rank}: "
        trace = error_dir / f"rank{rank}.traceback"
        tail = f" (traceback: {trace})" if trace.exists() else ""
        message = where + lines[rank].read_text().strip() + tail
        if not tail:
            shutil.rmtree(error_dir, ignore_errors=True)
        return message, SETTINGS_ERROR_EXIT if settings else CRASH_EXIT
    shutil.rmtree(error_dir, ignore_errors=True)
    # The agent stops the surviving workers with SIGTERM: a worker that ended by another signal was the cause.
    signalled = sorted(
        (rank, failure)
        for rank, failure in failed.failures.items()
        if failure.exitcode < 0 and failure.signal_name() != "SIGTERM"
    )
    rank, failure = signalled[0] if signalled else min(failed.failures.items())
    how = (
        f"was killed by signal {failure.signal_name()}"
        if failure.exitcode < 0
        else f"exited with code {failure.exitcode}"
    )
    return (
        f"worker rank {rank} {how} without an error message (out of memory, or killed from outside?); the "
        "other workers were stopped",
        CRASH_EXIT,
    )


def report_worker_error(error: BaseException, settings_error: bool) -> bool:
    """In a worker started by launch_local: write the error's one line (and the traceback of an unexpected error)
    for the launcher and return True; anywhere else return False (the caller prints as usual)."""
    folder = os.environ.get(ERROR_DIR_VARIABLE)
    if not folder:
        return False
    rank = os.environ.get("RANK", "0")
    text = str(error) if settings_error else f"{type(error).__name__}: {error}"
    base = Path(folder) / f"rank{rank}"
    if settings_error:
        base.with_suffix(".settings").write_text("")
    else:
        base.with_suffix(".traceback").write_text("".join(traceback.format_exception(error)))
    # the line last: the launcher reads a rank's line only once everything beside it is written
    partial = base.with_suffix(".partial")
    partial.write_text(text.splitlines()[0] if text else type(error).__name__)
    partial.rename(base.with_suffix(".txt"))
    return True
