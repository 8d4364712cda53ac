"""`goldfish eval`: its options, its settings (the documents and mask of the run record, or of --data), its run."""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from goldfish.app import options as opt
from goldfish.app.commands.option_values import data_of, extraction_of, instruments_of, mask_of, runtime_of
from goldfish.app.commands.processes import launch, launch_shape, logger, process_shape, resolved_run, set_threads
from goldfish.app.config import EVAL_PARTS, DataSpec, EvalSpec, Instruments, MaskSpec, Runtime
from goldfish.app.runfile import ResolvedRun
from goldfish.app.validation import eval_run_record, validate_eval

if TYPE_CHECKING:  # the commands import torch, the engine and eval only when they run
    from torch import nn

    from engine import Grid
    from goldfish.app.eval_result import EvalResult
    from goldfish.app.prepare import Prepared


def eval_spec(args: argparse.Namespace) -> EvalSpec:
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
    from goldfish.app.pretrained import recover_folder
    from goldfish.app.runlock import holds_lock_here, out_lock

    out = Path(args.out)
    runtime = runtime_of(args)
    shape = launch_shape(runtime) if runtime.nproc else process_shape(runtime)
    spec = eval_spec(args)
    for folder in (spec.model, spec.reference):  # a checkpoint a killed save set aside is complete: put it back
        recover_folder(folder)
    validate_eval(spec, runtime, shape, out, overwrite=args.overwrite, locks=holds_lock_here())  # before any work
    # One writer per --out, as for train and compare: two evals into one folder would mix two models' files, and
    # --overwrite must not clear a folder a running train or eval holds. The --nproc launcher holds it for workers.
    with out_lock(out, enabled=holds_lock_here()):
        return _eval_holding_out(spec, runtime, out, overwrite=args.overwrite)


def _eval_holding_out(spec: EvalSpec, runtime: Runtime, out: Path, *, overwrite: bool) -> int:
    from goldfish.app.checks import clear_eval_outputs

    # One process clears an earlier eval's files (--overwrite), once every check has passed: the --nproc launcher,
    # rank 0 under torchrun, or the only process.
    clears = overwrite and os.environ.get("RANK", "0") == "0"
    if runtime.nproc:
        if clears:
            clear_eval_outputs(out)
        return launch(resolved_run("eval", spec, runtime, out, out), runtime)
    return run_eval(resolved_run("eval", spec, runtime, out, out, options={"clear": clears}))


def run_eval(run: ResolvedRun) -> int:
    """Evaluate the resolved run's model on this process's rank (one process, a torchrun rank or a --nproc worker)."""
    from eval.metrics import AUC, EXACT_MATCH, ROUGE_L
    from goldfish.app.checks import check_extraction_fits, clear_eval_outputs
    from goldfish.app.eval_result import EvalResult
    from goldfish.app.evaluation import evaluate_parts
    from goldfish.app.results import ModelResult
    from goldfish.app.run_grid import grid_sizes, start_grid

    spec, runtime, out = run.spec, run.runtime, Path(run.out)
    record = eval_run_record(spec)
    grid = start_grid(runtime.grid)
    log = logger(grid)
    prepared, mask, repeats = _eval_documents(spec, record, log)
    parts = {"train": prepared.split.train, "heldout": prepared.split.heldout}
    chosen = list(parts) if spec.part == "both" else [spec.part]
    prefix_lengths = spec.instruments.prefix_lengths if spec.instruments is not None else ()
    check_extraction_fits({part: parts[part] for part in chosen}, spec.extraction, prefix_lengths)  # before output
    if run.options.get("clear"):
        clear_eval_outputs(out)
    set_threads(runtime)  # after every check: a refusal stays one line
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
            + ", ".join(f"{name} {m[AUC]:.3f}" for name, m in scored.membership["attacks"].items())
        )
    elif not (spec.part == "both" and parts["train"] and parts["heldout"]):
        log(
            "membership inference skipped: it needs training (members) and held-out (non-member) documents; use "
            "--part both with --n-train and --n-heldout > 0"
        )
    result = EvalResult(
        model=scored if scored is not None else ModelResult({}),  # None: a rank other than 0, which writes nothing
        documents=prepared.split.manifest(),  # what was selected and what deduplication removed
        # what the checkpoint had trained when it was written
        checkpoint={"step": record["step"], "exposures": record["exposures"]}
        if record is not None and "step" in record
        else None,
        grid=grid_sizes(grid) if grid is not None else None,
    )
    if grid is not None:
        main = grid.rank == 0
        grid.close(destroy_world=True)
        if not main:
            return 0
    _write_eval_outputs(result, out)
    return 0


def _eval_documents(
    spec: EvalSpec, record: dict[str, Any] | None, log: Callable[..., None]
) -> tuple[Prepared, MaskSpec | None, dict[str, int] | None]:
    """(prepared documents, the mask for kept/dropped accuracy, repeats by id) of `goldfish eval`: the run's own
    documents and mask when the model has a run record, else those of the data options."""
    from goldfish.app.prepare import prepare_data
    from goldfish.app.resume import recorded_data, recorded_mask

    mask, repeats = None, None
    if record is not None:
        # as `train --resume` reads it (a record of an earlier version too); the checkpoint's tokenizer carries the
        # run's chat template (saved with it)
        data_spec = replace(recorded_data(record), tokenizer=str(spec.model), chat_template=None)
        recorded = recorded_mask(record)
        mask = recorded if recorded.strategy else None
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
    from goldfish.app.model_files import initial_model
    from goldfish.app.models import is_tiny_model, load_parallel_model

    tiny = is_tiny_model(spec.model)
    if grid is None:
        model = initial_model(spec.model, prepared, spec.init_seed) if tiny else load_parallel_model(spec.model, None)
        return model.to(runtime.torch_device())
    log(f"evaluating on grid {grid.shape}: documents sharded over data={grid.shape.data}")
    if tiny:
        return parallelize_for_eval(initial_model(spec.model, prepared, spec.init_seed), grid)
    return load_parallel_model(spec.model, grid)


def _write_eval_outputs(result: EvalResult, out: Path) -> None:
    from data.atomic import write_json_atomic
    from goldfish.app.report import write_eval_report

    write_json_atomic(out / "summary.json", result.to_json())
    write_eval_report(result, out)
    print(f"wrote {out}/report.md, {out}/summary.json and per-document rows in {out}/<part>/*.jsonl")


def _reference_model(
    choice: str, record: dict[str, Any] | None, prepared: Prepared, init_seed: int
) -> nn.Module | None:
    """The reference model of the reference-ratio membership attack: 'none', 'auto' (the initial weights of the run
    that trained the model, when its run record says what they were), or a model name/folder."""
    from goldfish.app.model_files import initial_model

    if choice == "none":
        return None
    if choice == "auto":
        if record is None:
            return None
        return initial_model(record["model"], prepared, record.get("init_seed", init_seed))
    return initial_model(choice, prepared, init_seed)


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


def add_eval_parser(sub: Any) -> None:
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
        choices=EVAL_PARTS,
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
            "grid": "under torchrun: the grid as AXIS=SIZE pairs, e.g. data=2, data=2,x=2 or pipe=2 (pipe with data "
            "only); documents are sharded over data, the model over x, y, z or cut into pipe stages (default under "
            "torchrun: data=WORLD_SIZE)"
        },
    )
    evaluate.set_defaults(func=cmd_eval)


def _default_extraction() -> Any:
    from eval.config import ExtractionConfig

    return ExtractionConfig()
