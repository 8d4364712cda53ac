"""`goldfish train`: its options, its settings (a new run, or --resume with the checkpoint's own), its run."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from goldfish.app import options as opt
from goldfish.app.commands.option_values import data_of, lora_of, mask_defaults, mask_of, runtime_of, train_config_of
from goldfish.app.commands.processes import (
    close_grid,
    launch,
    launch_shape,
    logger,
    process_shape,
    reports_here,
    resolved_run,
    set_threads,
)
from goldfish.app.commands.run_folder import cleared_on_settings_error, discard, publish, run_folder
from goldfish.app.config import Runtime, TrainSpec
from goldfish.app.presets import model_defaults
from goldfish.app.resume import read_run_record, recorded_spec, resume_folder, resumed_spec
from goldfish.app.runfile import ResolvedRun
from goldfish.app.validation import validate_train

if TYPE_CHECKING:  # the commands import torch, the engine and eval only when they run
    from engine import GridShape


def train_spec(args: argparse.Namespace, shape: GridShape | None) -> TrainSpec:
    """A new run's settings: the options typed, over the training defaults of the model (presets.model_defaults),
    over the command's defaults (TrainSpec's). `shape`: the grid's sizes (None: one process)."""
    model_options = opt.MODEL.values(args)
    return TrainSpec(
        model=model_options["model"],
        init_seed=model_options["init_seed"],
        data=data_of(args),
        mask=mask_of(args),
        train=train_config_of(args, model_defaults(model_options["model"])(TrainSpec().train), shape),
        lora=lora_of(args),
    )


def cmd_train(args: argparse.Namespace) -> int:
    from goldfish.app.runlock import holds_lock_here, out_lock

    runtime = runtime_of(args)
    resume = resume_folder(args.resume)
    # Resolved, then validated in one pass before anything is written to --out: the grid the workers or this process
    # will run on, the spec (a resume's: the checkpoint's settings with the typed options), the run to resume.
    shape = launch_shape(runtime) if runtime.nproc else process_shape(runtime)
    saved = _saved_spec(resume)
    out = _train_out(args, resume)
    spec = resumed_spec(saved, args, shape) if saved is not None else train_spec(args, shape)
    validate_train(spec, runtime, shape, resume, saved)
    with out_lock(out, enabled=holds_lock_here()):  # one run per --out; the --nproc launcher holds it for workers
        # an interrupted --overwrite run continues in its staging folder, which replaces --out once it has finished
        staging = resume.resolve().parent if resume is not None and _overwrites(resume, out) else None
        folder = staging or run_folder(out, overwrite=args.overwrite, resuming=resume is not None)
        run = resolved_run("train", spec, runtime, out, folder, resume=None if resume is None else str(resume))
        work = (lambda: launch(run, runtime)) if runtime.nproc else (lambda: run_train(run))
        try:
            return cleared_on_settings_error(folder, work, enabled=resume is None and holds_lock_here())
        except KeyboardInterrupt:  # a second Ctrl-C, or one before training began: no traceback, what is kept
            from goldfish.app.interrupt import INTERRUPTED_EXIT, interrupted_line

            if os.environ.get("RANK", "0") == "0":
                print(interrupted_line(folder, runtime, runtime.nproc), file=sys.stderr)
            return INTERRUPTED_EXIT


def _overwrites(resume: Path, out: Path) -> bool:
    """Whether checkpoint `resume` is in the staging folder of an --overwrite run that replaces `out`."""
    from goldfish.app.interrupt import overwritten_by

    target = overwritten_by(resume)
    return target is not None and target == out.resolve()


def run_train(run: ResolvedRun) -> int:
    """Train the resolved run on this process's rank (one process, a torchrun rank or a --nproc worker)."""
    from engine import TrainingStopped
    from goldfish.app.interrupt import INTERRUPTED_EXIT, interrupted_line
    from goldfish.app.model_files import initial_model
    from goldfish.app.prepare import prepare_data
    from goldfish.app.run_grid import start_grid
    from goldfish.app.training import train_model

    spec, runtime, out, folder = run.spec, run.runtime, Path(run.out), Path(run.folder)
    set_threads(runtime)
    grid = start_grid(runtime.grid)
    log = logger(grid)
    try:
        prepared = prepare_data(spec.data, spec.model, log=log)
        # on a pipe grid train_model builds it (from a folder of safetensors weights, each rank only its own stages)
        pipelined = grid is not None and grid.shape.pipe > 1
        model = None if pipelined else initial_model(spec.model, prepared, spec.init_seed)
        if grid is None:
            model = model.to(runtime.torch_device())
        train_model(
            spec,
            folder,
            prepared=prepared,
            model=model,
            grid=grid,
            log=log,
            resume_from=None if run.resume is None else Path(run.resume),
            report_to=runtime.report_to,
            verify=runtime.verify,
            stop_on_ctrl_c=True,
        )
    except TrainingStopped:  # Ctrl-C: the checkpoint of the last step is written; an --overwrite run's staging kept
        close_grid(grid)
        if reports_here(grid):  # a --nproc launcher prints it for its workers
            print(interrupted_line(folder, runtime, None), file=sys.stderr)
        return INTERRUPTED_EXIT
    except BaseException as error:
        if not (isinstance(error, KeyboardInterrupt) and (folder / "checkpoint").is_dir()):  # keep finished steps
            discard(folder, out, grid)
        raise
    publish(folder, out, grid)
    close_grid(grid)
    log(f"wrote {out / 'checkpoint'} (HF checkpoint + tokenizer) and {out / 'metrics.jsonl'}")
    return 0


def _saved_spec(resume: Path | None) -> TrainSpec | None:
    """--resume: the checkpoint's settings (its run record; goldfish.app.resume), which the typed options go over."""
    return None if resume is None else recorded_spec(read_run_record(resume))


def _train_out(args: argparse.Namespace, resume: Path | None) -> Path:
    """--out, or with --resume alone the run folder the checkpoint is in (a run writes OUT/checkpoint)."""
    if args.out is not None:
        return Path(args.out)
    if resume is None:
        raise ValueError("--out is missing: give the run folder to write, e.g. --out runs/a")
    from goldfish.app.interrupt import overwritten_by

    return overwritten_by(resume) or resume.resolve().parent  # an --overwrite run's staging: the folder it replaces


def add_train_parser(sub: Any) -> None:
    train = sub.add_parser("train", help="fine-tune a causal LM with the standard or a goldfish loss")
    train.add_argument(
        "--out",
        default=None,
        help="run folder: checkpoint/, metrics.jsonl, run.json (with --resume: default the checkpoint's run folder)",
    )
    train.add_argument(
        "--resume",
        default=None,
        help="a checkpoint/ folder of an interrupted run: continues it with the checkpoint's own settings (options "
        "that change the experiment are refused; see docs/cli.md)",
    )
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a non-empty --out (the old run stays untouched until the new one has finished); "
        "without it a non-empty --out is refused",
    )
    defaults = TrainSpec()
    opt.MODEL.add_to(train, defaults)
    opt.MASK.add_to(train, mask_defaults(defaults.mask))
    opt.DATA.add_to(train, defaults.data)
    opt.TRAINING.add_to(train, defaults.train)
    opt.LORA.add_to(train, defaults.lora)
    opt.RUNTIME.add_to(train, Runtime())
    train.set_defaults(func=cmd_train, parser=train)
