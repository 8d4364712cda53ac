"""`--nproc N`: run a resolved goldfish command in N local worker processes, and report a failure in one line.

The launcher has parsed and validated the command; it writes the result once (goldfish.app.runfile) and each worker
runs it from that file (goldfish.app.worker), parsing no command line of its own.

The launcher starts the workers itself (the environment torchrun gives them: RANK, WORLD_SIZE, MASTER_ADDR, ...)
and hosts the store they meet in, a torch TCPStore served from a socket bound to 127.0.0.1: nothing outside this
machine can reach it (torch's own rendezvous listens on every interface, unauthenticated). When one worker fails,
the others are stopped (SIGTERM, SIGKILL after STOP_GRACE_SECONDS) and the failing worker's own one-line error is
printed once, instead of one copy per rank plus a launcher traceback: a worker started here writes its error line
(and, for an unexpected exception, its traceback) into a folder named by GOLDFISH_ERROR_DIR and exits without
printing it; the launcher reads it back.

Workers die with their launcher (`die_with_launcher`): a launcher killed with SIGKILL, with its process group, or by
the OOM killer leaves no worker training and publishing checkpoints on its own.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Iterator, Sequence

from goldfish.app.interrupt import INTERRUPTED_EXIT, STOPPING, interrupted_line
from goldfish.app.runfile import ERROR_DIR_VARIABLE, ResolvedRun, write_run

LAUNCHER_VARIABLE = "GOLDFISH_LAUNCHER_PID"  # in a worker: the pid of the launcher it must not outlive
SETTINGS_ERROR_EXIT = 2  # bad input (a ValueError): the launcher also exits with 2
CRASH_EXIT = 1
LOOPBACK = "127.0.0.1"
MONITOR_SECONDS = 0.1  # how often the launcher looks at its workers
STOP_GRACE_SECONDS = 10.0  # a stopped worker's time to exit after SIGTERM, before SIGKILL
WATCH_SECONDS = 0.5  # how often a worker checks that its launcher is alive (where the kernel cannot tell it)
STORE_TIMEOUT = timedelta(minutes=10)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@contextmanager
def _loopback_store() -> Iterator[int]:
    """A TCPStore server for the workers on 127.0.0.1 only; yields its port. The socket is bound here and handed to
    the store, which otherwise binds every interface whatever host it is given."""
    from torch.distributed import TCPStore

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((LOOPBACK, 0))
        listener.listen(128)
        port = listener.getsockname()[1]
    except BaseException:
        listener.close()
        raise
    fd = listener.detach()  # the store owns the descriptor from here and closes it
    try:
        store = TCPStore(
            LOOPBACK, port, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT, master_listen_fd=fd
        )
    except BaseException:
        os.close(fd)
        raise
    try:
        yield port
    finally:
        del store  # the server stops with its last reference


def worker_environment(nproc: int, port: int, error_dir: Path) -> dict[str, str]:
    """The environment every worker of a `launch_local` shares (RANK, LOCAL_RANK and ROLE_RANK are added per
    worker): torchrun's variables, with the store on 127.0.0.1:`port` hosted by the launcher
    (TORCHELASTIC_USE_AGENT_STORE: every rank connects to it, none serves another)."""
    return os.environ | {
        "MASTER_ADDR": LOOPBACK,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "ROLE_WORLD_SIZE": str(nproc),
        "GROUP_RANK": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": f"goldfish-{os.getpid()}",
        # One thread per worker unless the user chose (torchrun's default too): N workers on N cores otherwise
        # oversubscribe them.
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        # Idle OpenMP threads sleep instead of spinning on cores the other workers need (goldfish.app.threads).
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
        ERROR_DIR_VARIABLE: str(error_dir),
        LAUNCHER_VARIABLE: str(os.getpid()),
    }


# Python 3.10 has no -P: the same interpreter started with -c has '' (the working directory) first on sys.path, which
# the bootstrap drops before it imports anything of the toolkit.
_SAFE_PATH_BOOTSTRAP = "import sys; sys.path.pop(0); from goldfish.app.worker import main; sys.exit(main(sys.argv[1:]))"


def worker_argv(run_file: Path) -> list[str]:
    """The interpreter arguments that start one worker on `run_file`, with the working directory kept off its
    import path: the toolkit's packages are named `data`, `eval` and `engine`, so a folder of that name where the
    user runs `goldfish` would otherwise be imported in their place (and its code run). `-P` (Python >= 3.11) is
    safe-path mode; on 3.10 a bootstrap removes the entry instead."""
    if sys.version_info >= (3, 11):
        return ["-P", "-m", "goldfish.app.worker", str(run_file)]
    return ["-c", _SAFE_PATH_BOOTSTRAP, str(run_file)]


def launch_local(run: ResolvedRun, nproc: int) -> int:
    """Run the resolved `run` in `nproc` local processes (gloo on CPU, NCCL on GPUs) and wait for them: each is
    `python -P -m goldfish.app.worker RUN_FILE` (goldfish.app.runfile; `worker_argv`), the file written here once.

    Returns 0 when every worker succeeded; otherwise prints `goldfish <command>: error: <the failing worker's
    error>` once on stderr and returns 2 for a settings error, 1 for a crash; 130 after Ctrl-C. Ctrl-C stops the
    workers, but a train's workers it forwards to: they stop after the same step with its checkpoint, and the line
    printed says how to resume (a second Ctrl-C stops them at once)."""
    command = run.command
    remove_orphaned_worker_folders()
    error_dir = Path(tempfile.mkdtemp(prefix=f"{WORKER_FOLDER_PREFIX}{os.getpid()}-"))
    run_file = write_run(run, error_dir / "run.json")
    argv = worker_argv(run_file)
    print(f"launching {nproc} processes: {sys.executable} {' '.join(argv)}", file=sys.stderr)
    workers: list[subprocess.Popen] = []
    forwarded = False  # a train's Ctrl-C, forwarded to its workers
    with _loopback_store() as port:
        shared = worker_environment(nproc, port, error_dir)
        try:
            for rank in range(nproc):
                environment = shared | {"RANK": str(rank), "LOCAL_RANK": str(rank), "ROLE_RANK": str(rank)}
                # Own session, as torchrun does: Ctrl-C reaches the launcher alone, which stops the workers.
                workers.append(subprocess.Popen([sys.executable, *argv], env=environment, start_new_session=True))
            try:
                codes, stopped = _wait(workers)
            except KeyboardInterrupt:
                if command != "train" or not workers:
                    raise
                # train: every worker stops after the same step and writes its checkpoint (goldfish.app.interrupt)
                print(STOPPING, file=sys.stderr, flush=True)
                forwarded = True
                for worker in workers:
                    if worker.poll() is None:
                        worker.send_signal(signal.SIGINT)
                codes, stopped = _wait(workers, expected=(0, INTERRUPTED_EXIT))
        except KeyboardInterrupt:  # Ctrl-C reaches the launcher alone (the workers have their own sessions)
            _stop(workers)
            shutil.rmtree(error_dir, ignore_errors=True)
            if command == "train":
                print(interrupted_line(Path(run.folder), run.runtime, nproc), file=sys.stderr)
            else:
                print(f"goldfish {command}: interrupted; the workers were stopped", file=sys.stderr)
            return INTERRUPTED_EXIT
        finally:
            _stop(workers)  # whatever ended the launcher's wait: no worker outlives it
    failures = {rank: code for rank, code in codes.items() if code != 0}
    if not failures:
        shutil.rmtree(error_dir, ignore_errors=True)
        return 0
    # stopped by the Ctrl-C, with their checkpoint; or some ranks before training began, their peers then failing
    # on the closed connection: the line says what the folder keeps either way
    if forwarded and INTERRUPTED_EXIT in failures.values():
        shutil.rmtree(error_dir, ignore_errors=True)
        print(interrupted_line(Path(run.folder), run.runtime, nproc), file=sys.stderr)
        return INTERRUPTED_EXIT
    message, code = _failure_report(failures, stopped, error_dir)
    print(f"goldfish {command}: error: {message}", file=sys.stderr)
    return code


WORKER_FOLDER_PREFIX = "goldfish-workers-"  # + the launcher's pid + "-": a temporary folder per launch


def remove_orphaned_worker_folders(root: Path | None = None) -> list[Path]:
    """Remove the worker folders (run file, error lines) that launchers killed with SIGKILL left behind: those in
    `root` (default: the temporary folder) that this user owns and whose launcher pid no longer runs. Returns them.
    A launcher that exits in any other way removes its own folder."""
    removed = []
    for folder in sorted((root or Path(tempfile.gettempdir())).glob(f"{WORKER_FOLDER_PREFIX}*-*")):
        pid = folder.name[len(WORKER_FOLDER_PREFIX) :].split("-", 1)[0]
        try:
            if not pid.isdigit() or folder.is_symlink() or folder.stat().st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)  # raises when no process has that pid
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        except OSError:  # another user's process (PermissionError), or the folder vanished meanwhile
            continue
    return removed


def _wait(workers: Sequence[subprocess.Popen], expected: tuple[int, ...] = (0,)) -> tuple[dict[int, int], set[int]]:
    """Wait until every worker ended with an `expected` exit code or one failed; then stop the others. Returns
    ({rank: exit code}, the ranks this stopped). Ctrl-C'd train workers end with 130 once all have written their
    checkpoint: `expected` (0, 130) lets the last of them finish instead of stopping them."""
    while True:
        codes = {rank: worker.poll() for rank, worker in enumerate(workers)}
        if any(code is not None and code not in expected for code in codes.values()):
            stopped = {rank for rank, code in codes.items() if code is None}
            _stop(workers)
            return {rank: worker.returncode for rank, worker in enumerate(workers)}, stopped
        if all(code is not None for code in codes.values()):
            return codes, set()  # type: ignore[return-value]
        time.sleep(MONITOR_SECONDS)


def _stop(workers: Sequence[subprocess.Popen]) -> None:
    """SIGTERM every running worker, SIGKILL those still running STOP_GRACE_SECONDS later, and reap them all."""
    running = [worker for worker in workers if worker.poll() is None]
    for worker in running:
        worker.terminate()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for worker in running:
        try:
            worker.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _failure_report(failures: dict[int, int], stopped: set[int], error_dir: Path) -> tuple[str, int]:
    """The one line that explains a failed launch, and the exit code. `failures`: {rank: non-zero exit code} (a
    negative code is the signal that ended the worker); `stopped`: the ranks the launcher stopped after the failure.

    A worker killed by a signal from outside is the cause whatever its peers wrote after it vanished. Otherwise a
    settings error (every rank usually finds the same) is reported from the lowest rank that found it, and any other
    error from the rank that wrote first: a crash on one rank makes its peers fail afterwards on a closed
    connection."""
    lines = {int(path.stem.removeprefix("rank")): path for path in error_dir.glob("rank*.txt")}
    killed = [rank for rank, code in failures.items() if code < 0 and rank not in stopped and rank not in lines]
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
    ended = {rank: code for rank, code in failures.items() if rank not in stopped} or failures
    signalled = sorted(rank for rank, code in ended.items() if code < 0)
    rank = signalled[0] if signalled else min(ended)
    code = ended[rank]
    how = f"was killed by signal {_signal_name(code)}" if code < 0 else f"exited with code {code}"
    return (
        f"worker rank {rank} {how} without an error message (out of memory, or killed from outside?); the "
        "other workers were stopped",
        CRASH_EXIT,
    )


def die_with_launcher() -> None:
    """In a worker started by `launch_local`: end this process as soon as its launcher is gone (killed with SIGKILL,
    with its process group, by the OOM killer), so that no worker trains and publishes checkpoints on its own and a
    `--resume` never runs beside one. Anywhere else a no-op.

    On Linux the kernel kills the worker when its parent dies (prctl PR_SET_PDEATHSIG); everywhere a daemon thread
    checks every WATCH_SECONDS that the parent is still the launcher (an orphan is adopted by another process)."""
    launcher = os.environ.get(LAUNCHER_VARIABLE)
    if not launcher or ERROR_DIR_VARIABLE not in os.environ:
        return
    launcher_pid = int(launcher)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != launcher_pid:  # the launcher died before this process asked to die with it
        os._exit(CRASH_EXIT)
    watch = threading.Thread(target=_watch_launcher, args=(launcher_pid,), name="goldfish-launcher-watch", daemon=True)
    watch.start()


def _watch_launcher(launcher_pid: int) -> None:
    while os.getppid() == launcher_pid:
        time.sleep(WATCH_SECONDS)
    os._exit(CRASH_EXIT)  # the launcher is gone: nobody waits for this worker's result


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
