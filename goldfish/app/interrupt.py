"""Ctrl-C during `goldfish train`: the run stops after the step in progress, writes that step's checkpoint, and says
in one line the command that continues it.

The first Ctrl-C (SIGINT) only sets a flag that the training loop reads after each optimizer step
(engine.training.train's `stop`); the loop then writes the checkpoint of the steps done, atomically as every
checkpoint, and raises TrainingStopped. A second Ctrl-C stops at once (KeyboardInterrupt), keeping the last checkpoint
written before. Under `--nproc` the launcher, which alone receives the terminal's Ctrl-C, forwards it to its workers
(goldfish.app.launch); under a plain torchrun every rank receives it. The ranks agree on the step through the loop.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Callable, Iterator

from goldfish.app import options as opt
from goldfish.app.config import RUN_FILE, Runtime

INTERRUPTED_EXIT = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
STOPPING = (
    "\nstopping after the step in progress, to write its checkpoint (Ctrl-C again: stop at once, keeping only the "
    "checkpoint written before)"
)
STAGING_SUFFIX = ".overwrite-staging"  # an --overwrite run trains in .NAME.overwrite-staging beside NAME


class StopRequest:
    """The flag a Ctrl-C sets: called by the training loop after each step."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self) -> bool:
        return self.requested


@contextmanager
def ctrl_c_stops(announce: bool) -> Iterator[Callable[[], bool]]:
    """While the block runs, the first SIGINT asks the training loop to stop after its step (`announce`: say so on
    stderr, on one process of the run) and a second raises KeyboardInterrupt. Yields the flag for
    engine.training.train's `stop`. A SIGINT the process ignores (started in the background) stays ignored, and
    off the main thread (where Python cannot take signals) nothing changes."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        yield request
        return

    from goldfish.app.runfile import ERROR_DIR_VARIABLE

    announce = announce and ERROR_DIR_VARIABLE not in os.environ  # a --nproc launcher says it for its workers

    def on_sigint(signum: int, frame: object) -> None:
        if request.requested:
            raise KeyboardInterrupt
        request.requested = True
        if announce:
            print(STOPPING, file=sys.stderr, flush=True)

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield request
    finally:
        signal.signal(signal.SIGINT, previous)


def checkpoint_step(checkpoint: Path) -> int | None:
    """The step of a goldfish train checkpoint folder (its run record), None when there is none."""
    try:
        return int(json.loads((checkpoint / RUN_FILE).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resume_command(checkpoint: Path, runtime: Runtime, nproc: int | None) -> str:
    """The command that continues the run of `checkpoint` as it ran: `--resume` (which takes every setting of the
    run from the checkpoint) and the runtime options the run was started with (they are not recorded)."""
    words = ["goldfish", "train", "--resume", str(checkpoint)]
    default = Runtime()
    chosen = {f.name: getattr(runtime, f.name) for f in fields(Runtime)} | {"nproc": nproc}
    for option in opt.RUNTIME.options:
        value = chosen[option.field]
        if value == getattr(default, option.field):
            continue
        words += [option.flag] if option.switch else [option.flag, str(value)]
    if os.environ.get("WORLD_SIZE", "1") != "1" and nproc is None:  # a plain torchrun: its own launch line
        return "torchrun <the same options> -m " + shlex.join(words)
    return shlex.join(words)


def interrupted_line(folder: Path, runtime: Runtime, nproc: int | None) -> str:
    """The one line an interrupted `goldfish train` ends with: the step its checkpoint in `folder` holds and the
    command that continues it, or that no step was kept."""
    checkpoint = folder / "checkpoint"
    step = checkpoint_step(checkpoint)
    if step is None:
        return (
            "goldfish train: interrupted before its first checkpoint; nothing was kept. Fix: start it again with the "
            "same command"
        )
    command = resume_command(checkpoint, runtime, nproc)
    return f"goldfish train: interrupted after step {step} (its checkpoint: {checkpoint}). Continue with: {command}"


def overwritten_by(checkpoint: Path) -> Path | None:
    """The run folder that the --overwrite run of `checkpoint` replaces once finished, when the checkpoint is in
    an --overwrite staging folder (.NAME.overwrite-staging/checkpoint); None otherwise."""
    staging = checkpoint.resolve().parent
    name = staging.name
    if name.startswith(".") and name.endswith(STAGING_SUFFIX) and len(name) > len(STAGING_SUFFIX) + 1:
        return staging.with_name(name[1 : -len(STAGING_SUFFIX)])
    return None
