"""Where a command runs: the grid it launches or joins, its --nproc workers, its threads, its closing lines."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from goldfish.app.config import Runtime, parse_grid
from goldfish.app.runfile import ResolvedRun

if TYPE_CHECKING:  # the commands import torch, the engine and eval only when they run
    from engine import Grid, GridShape


def launch_shape(runtime: Runtime) -> GridShape:
    """The grid that `--nproc N` workers will build (--grid, or data=N), checked against N before they start."""
    from engine import GridShape

    shape = GridShape(**parse_grid(runtime.grid)) if runtime.grid is not None else GridShape(data=runtime.nproc)
    if shape.world_size != runtime.nproc:
        raise ValueError(
            f"--grid {runtime.grid} needs {shape.world_size} processes but --nproc is {runtime.nproc}: "
            f"choose sizes whose product is {runtime.nproc}, or --nproc {shape.world_size}"
        )
    return shape


def process_shape(runtime: Runtime) -> GridShape | None:
    """The grid this process will join (--grid, or data=WORLD_SIZE under torchrun), None for a single process."""
    from engine import GridShape

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if runtime.grid is None and world == 1:
        return None
    return GridShape(**parse_grid(runtime.grid)) if runtime.grid else GridShape(data=world)


def one_process() -> GridShape:
    from engine import GridShape

    return GridShape()


def launch(run: ResolvedRun, runtime: Runtime) -> int:
    """Run the resolved `run` in `runtime.nproc` local worker processes (goldfish.app.launch)."""
    from goldfish.app.launch import launch_local

    return launch_local(run, runtime.nproc)


def set_threads(runtime: Runtime) -> None:
    """Set torch's CPU threads for this run: --threads, else the cores free now (goldfish.app.threads), which the
    first rank names in one line on stderr."""
    from goldfish.app.threads import apply_threads

    apply_threads(runtime.threads, report=os.environ.get("RANK", "0") == "0")


def resolved_run(command: str, spec: Any, runtime: Runtime, out: Path, folder: Path, **extra: Any) -> ResolvedRun:
    """What a worker runs: the validated spec, the runtime without --nproc, the output folders."""
    return ResolvedRun(command, spec, replace(runtime, nproc=None), str(out), str(folder), **extra)


def logger(grid: Grid | None) -> Callable[..., None]:
    from engine import is_main_process

    return print if is_main_process(grid) else (lambda *a, **k: None)


def reports_here(grid: Grid | None) -> bool:
    """Whether this process prints the run's closing line: the main process, unless it is a worker of a --nproc
    launcher (which prints once for all of them)."""
    from engine import is_main_process
    from goldfish.app.runfile import ERROR_DIR_VARIABLE

    return is_main_process(grid) and ERROR_DIR_VARIABLE not in os.environ


def close_grid(grid: Grid | None) -> None:
    """Destroy a finished run's process groups while the interpreter is still whole: left to interpreter exit, gloo's
    worker threads can still hold work with Python references and abort the process (SIGABRT) as it shuts down."""
    if grid is not None:
        grid.close(destroy_world=True)


@contextmanager
def progress_bars(enabled: bool) -> Iterator[None]:
    """With enabled=False, silence the progress bars of the libraries a command calls (transformers' loading and
    "Writing model shards" bars, huggingface_hub's and datasets' bars) while it runs; their settings are restored
    after. Our own bars take Runtime.progress directly."""
    if enabled:
        yield
        return
    import datasets
    from transformers.utils import logging as hf_logging

    transformers_on, datasets_on = hf_logging.is_progress_bar_enabled(), datasets.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # also huggingface_hub's
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if transformers_on:
            hf_logging.enable_progress_bar()
        if datasets_on:
            datasets.enable_progress_bars()
